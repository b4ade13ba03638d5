"""Do two revisions of cupy_kernels/ compile to the same machine code? (CPU only, no GPU.)

Builds, at each git revision, every kernel instantiation the launchers of the working tree can
pick, with NVRTC as CuPy does (``-std=c++17 -arch=sm_90 -ftz=true``; the sm_90a sources as
``sources.sm90a_module`` does), disassembles each cubin with cuobjdump and compares the SASS of
every kernel (whitespace-normalized: cuobjdump pads columns to the widest line of the cubin). A
move that changes no launched kernel prints ``identical`` for each and exits 0.

    python3 scripts/compare_kernel_sass.py BEFORE [AFTER] [--quick] [--only TEXT]
    (AFTER: the working tree; --only: the instantiations whose name expression holds TEXT)

Each ``cupy_kernels/*.cu`` of a revision is built with the name expressions whose template it
defines; sm_90a-only sources (those that test ``GDN_SM90A``) are built for sm_90a as well. A
kernel counts as unchanged when each of its builds in AFTER equals a build of the same
architecture in BEFORE (a kernel that BEFORE compiled in several files, such as gdn_fused_prep
in chunk.cu's three builds, matches any of them).

Tools, outside the project's dependencies (PyPI): ``nvidia-cuda-nvrtc-cu12``,
``nvidia-cuda-runtime-cu12`` (CUDA headers), ``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm``;
point at them with ``NVRTC_LIB`` (libnvrtc.so), ``CUDA_INCLUDE`` and ``PATH`` (cuobjdump, nvdisasm)
where they are not found in this interpreter's site-packages. The full run (about 370
instantiations per revision) takes 10-20 minutes on two cores; ``--quick`` builds a tenth.
"""

from __future__ import annotations

import ctypes
import glob
import itertools
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cupy_kernels import chunk_plan, recurrent_kernel, sources  # noqa: E402 - after the path


def _site(pattern: str) -> str | None:
    found = sorted(glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", pattern)))
    return found[-1] if found else None


def expressions(quick: bool) -> list[str]:
    """Name expressions of the instantiations the working tree's launchers can pick."""
    out: list[str] = []
    for ctype, C, tc in itertools.product(chunk_plan.CTYPES.values(), chunk_plan.CHUNK_SIZES, ("false", "true")):
        out += [f"gdn_chunk_intra<{ctype}, {C}, {tc}>", f"gdn_chunk_output<{ctype}, {C}, {tc}>"]
    out += [f"gdn_chunk_state<{C}, {tc}>" for C, tc in itertools.product(chunk_plan.CHUNK_SIZES, ("false", "true"))]
    out += [f"gdn_fused_state<{w}, {ks}>" for w, ks in ((1, 1), (2, 1), (4, 1), (2, 2))]
    shapes = [(128, 128), (60, 100), (256, 64), (8, 8), (256, 256), (32, 16)]
    recurrent = set()
    for dt, dbl, vf, (K, V), mode in itertools.product(range(4), (False, True), (False, True), shapes, range(3)):
        for name in recurrent_kernel.VARIANTS if mode == recurrent_kernel.MODE_DECODE else [None]:
            recurrent.add(
                recurrent_kernel.select_plan(dt, dbl, vf, mode, name, 1, 1, K, V, 132).kernel.name_expression()
            )
    out += sorted(recurrent)
    return out[::10] if quick else out


class Nvrtc:
    def __init__(self) -> None:
        lib = os.environ.get("NVRTC_LIB") or _site("nvidia/cuda_nvrtc/lib/libnvrtc.so.*")
        include = os.environ.get("CUDA_INCLUDE") or _site("nvidia/cuda_runtime/include")
        if not lib or not include:
            raise SystemExit("NVRTC or the CUDA headers not found: set NVRTC_LIB and CUDA_INCLUDE (see --help)")
        self.lib, self.include = ctypes.CDLL(lib), include
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def _check(self, rc: int, prog: ctypes.c_void_p | None = None) -> None:
        if rc == 0:
            return
        log = b""
        if prog is not None:
            size = ctypes.c_size_t()
            self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            self.lib.nvrtcGetProgramLog(prog, buf)
            log = buf.value
        raise RuntimeError(f"{self.lib.nvrtcGetErrorString(rc).decode()}: {log.decode()[-3000:]}")

    def cubin(self, text: str, name: str, arch: str, defines: list[str], exprs: list[str]) -> bytes:
        prog = ctypes.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), name.encode(), 0, None, None))
        try:
            for expr in exprs:
                self._check(self.lib.nvrtcAddNameExpression(prog, expr.encode()))
            opts = ["-std=c++17", f"-arch={arch}", "-ftz=true", f"-I{self.include}", *defines]
            argv = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
            self._check(self.lib.nvrtcCompileProgram(prog, len(opts), argv), prog)
            size = ctypes.c_size_t()
            self._check(self.lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)))
            buf = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetCUBIN(prog, buf))
            return buf.raw
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


def sass(cubin: bytes, tmp: Path) -> dict[str, str]:
    """Per-kernel SASS of a cubin, whitespace-normalized."""
    path = tmp / "k.cubin"
    path.write_bytes(cubin)
    text = subprocess.run(["cuobjdump", "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    kernels: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        match = re.match(r"\s+Function : (\S+)", line)
        if match:
            current = kernels.setdefault(match.group(1), [])
        elif current is not None and "headerflags" not in line:
            current.append(" ".join(line.split()))
    return {name: "\n".join(lines) for name, lines in kernels.items()}


def build(tree: Path, exprs: list[str], nvrtc: Nvrtc, tmp: Path) -> dict[tuple[str, str], list[str]]:
    """``{(kernel, arch): [SASS of each build]}`` of every cupy_kernels/*.cu under ``tree``."""
    out: dict[tuple[str, str], list[str]] = {}
    for path in sorted((tree / "cupy_kernels").glob("*.cu")):
        text = sources.source(path)
        defined = [e for e in exprs if re.search(rf"\b{re.escape(e.split('<')[0].split('::')[-1])}\s*\(", text)]
        builds = [("sm_90", [], defined)]
        if "GDN_SM90A" in text:
            builds.append(("sm_90a", ["-DGDN_SM90A", "--device-as-default-execution-space"], []))
        for arch, defines, wanted in builds:  # wanted: the templates this file defines
            try:
                cubin = nvrtc.cubin(text, path.name, arch, defines, wanted)
            except RuntimeError as e:
                if arch == "sm_90" and "GDN_SM90A" in text and "#error" in str(e):
                    continue  # an sm_90a-only source refusing the plain build
                raise
            for kernel, code in sass(cubin, tmp).items():
                out.setdefault((kernel, arch), []).append(code)
            print(f"  {path.name} {arch}: {len(wanted)} expressions", flush=True)
    return out


def checkout(rev: str, tmp: Path) -> Path:
    tree = tmp / rev.replace("/", "_")
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "cupy_kernels"], capture_output=True, check=True)
    (tmp / "a.tar").write_bytes(archive.stdout)
    with tarfile.open(tmp / "a.tar") as tar:
        tar.extractall(tree)
    return tree


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    only = argv[argv.index("--only") + 1] if "--only" in argv[:-1] else ""
    revs = [a for a in argv if not a.startswith("--") and a != only]
    if not revs or len(revs) > 2 or shutil.which("cuobjdump") is None:
        raise SystemExit(__doc__)
    nvrtc, exprs = Nvrtc(), [e for e in expressions(quick) if only in e]
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        print(f"{revs[0]}:")
        before = build(checkout(revs[0], tmp), exprs, nvrtc, tmp)
        print(f"{revs[1] if len(revs) > 1 else 'working tree'}:")
        after = build(checkout(revs[1], tmp) if len(revs) > 1 else ROOT, exprs, nvrtc, tmp)
    changed = 0
    for key in sorted(after):
        missing = [code for code in after[key] if code not in before.get(key, [])]
        if key not in before:
            print(f"new      {key[1]} {key[0]}")
        elif missing:
            changed += 1
            print(f"CHANGED  {key[1]} {key[0]}")
    gone = sorted(set(before) - set(after))
    for key in gone:
        print(f"gone     {key[1]} {key[0]}")
    same = len(after) - changed - len(set(after) - set(before))
    print(f"{same} kernels identical, {changed} changed, {len(set(after) - set(before))} new, {len(gone)} gone")
    return 1 if changed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
