"""The CUDA sources of ``cupy_kernels`` and how they are built at run time.

:func:`source` is a kernel file's text as NVRTC compiles it: the file with each local
``#include "..."`` (a path relative to the including file, such as ``chunk_common.cuh``) spliced
in once, between ``#line`` directives so that NVRTC's messages name the real file and line. NVRTC
gets one self-contained string, so CuPy's kernel cache, which keys on that string, sees a header
change too (an ``-I`` include would not). :func:`raw_module` builds it for the current device with
CuPy's ``RawModule`` (the sm_90 / sm_80 ... build every path but the wgmma one uses);
:func:`sm90a_module` builds it for sm_90a through NVRTC directly.

Imports only the standard library; CuPy is imported by the builders, on first use.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')


def source(path: str | Path) -> str:
    """The text of ``path`` (relative to ``cupy_kernels/`` unless absolute) with its local includes
    spliced in, each file at most once."""
    path = Path(path)
    return _splice(path if path.is_absolute() else HERE / path, set())


def _splice(path: Path, seen: set[Path]) -> str:
    path = path.resolve()
    seen.add(path)
    lines = path.read_text().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    out: list[str] = []
    for number, line in enumerate(lines, 1):
        match = _INCLUDE.match(line)
        if match is None:
            out.append(line)
            continue
        header = (path.parent / match.group(1)).resolve()
        if header in seen:
            out.append("")  # already spliced: an empty line keeps the numbering
            continue
        out.append(f'#line 1 "{header.name}"')
        out.append(_splice(header, seen).rstrip("\n"))
        out.append(f'#line {number + 1} "{path.name}"')
    return "\n".join(out) + "\n"


@functools.cache
def raw_module(name: str, name_expressions: tuple[str, ...]) -> tuple[Any, ...]:
    """The kernels ``name_expressions`` of source ``name``, compiled once per process by CuPy's
    ``RawModule`` for the current device (``-std=c++17``; CuPy also caches the binary on disk)."""
    import cupy

    module = cupy.RawModule(code=source(name), options=("-std=c++17",), name_expressions=name_expressions)
    return tuple(module.get_function(expr) for expr in name_expressions)


@functools.cache
def sm90a_module(path: str | Path):
    """Source ``path`` built for sm_90a (``-DGDN_SM90A``: wgmma) as a ``cupy.RawModule``.

    CuPy's RawModule always appends ``-arch`` for the device's plain sm_90, which has no wgmma, so
    this goes through CuPy's NVRTC binding with CuPy's own include options, and caches the cubin
    beside CuPy's kernel cache (keyed by source, options and NVRTC version). Raises RuntimeError
    with NVRTC's log where the build fails."""
    import cupy
    from cupy_backends.cuda.libs import nvrtc

    try:
        from cupy._core.core import assemble_cupy_compiler_options

        options = assemble_cupy_compiler_options(("--std=c++17",))
    except (ImportError, AttributeError):  # a CuPy without it: CUDA's headers from CUDA_PATH
        options = ("--std=c++17", f"-I{os.path.join(cupy.cuda.get_cuda_path() or '/usr/local/cuda', 'include')}")
    options += ("-arch=sm_90a", "-DGDN_SM90A", "-ftz=true", "--device-as-default-execution-space")  # as CuPy
    name = Path(path).name
    text = source(path)
    key = hashlib.sha256("\0".join((text, *options, repr(nvrtc.getVersion()))).encode()).hexdigest()[:32]
    cache = os.environ.get("CUPY_CACHE_DIR") or os.path.expanduser("~/.cupy/kernel_cache")  # as CuPy's
    cubin_path = Path(cache) / f"gdn_{Path(name).stem}_sm90a_{key}.cubin"
    if not cubin_path.exists():
        prog = nvrtc.createProgram(text, name, (), ())
        try:
            try:
                nvrtc.compileProgram(prog, options)
            except nvrtc.NVRTCError as e:
                raise RuntimeError(f"NVRTC could not build {name} for sm_90a: {nvrtc.getProgramLog(prog)}") from e
            cubin = nvrtc.getCUBIN(prog)
        finally:
            nvrtc.destroyProgram(prog)
        cubin_path.parent.mkdir(parents=True, exist_ok=True)
        part = cubin_path.with_name(f"{cubin_path.name}.{os.getpid()}.part")  # concurrent builders: last rename wins
        part.write_bytes(cubin)
        os.replace(part, cubin_path)
    return cupy.RawModule(path=str(cubin_path))
