"""Every CUDA source under ``cupy_kernels/`` compiles with nvcc (no GPU needed): the sm_90 ones for
sm_90, the wgmma ones (and the tests' wgmma probe) for sm_90a; each is what NVRTC gets once its
local headers are spliced in (``sources.source``); no ``.cu`` grows past ~1,200 lines."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cupy_kernels import sources

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "cupy_kernels"
SM90A = {"chunk_wgmma.cu"}  # built only for sm_90a (-DGDN_SM90A, as sources.sm90a_module)
SOURCES = sorted(KERNELS.glob("*.cu"))
SM90_SOURCES = [s for s in SOURCES if s.name not in SM90A]
SM90A_SOURCES = [KERNELS / name for name in sorted(SM90A)] + [ROOT / "tests" / "cuda" / "wgmma_probe.cu"]
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: kernel sources not compiled")


@needs_nvcc
@pytest.mark.parametrize("source", SM90_SOURCES, ids=[s.name for s in SM90_SOURCES])
def test_compiles_for_sm90(source, tmp_path):
    # -std=c++17 and the same macro CuPy's NVRTC build sees; -c only, nothing is run. Without
    # __CUDACC_RTC__ each file instantiates every form its launcher picks.
    cmd = [NVCC, "-arch=sm_90", "-std=c++17", "-c", str(source), "-o", str(tmp_path / "kernel.o")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr


@needs_nvcc
@pytest.mark.parametrize("source", SM90A_SOURCES, ids=[s.name for s in SM90A_SOURCES])
def test_compiles_for_sm90a(source, tmp_path):
    # The wgmma state kernels exist only in the sm_90a build. ptxas -v also says whether it kept
    # the wgmma pipeline: C7511 means every wgmma waits for the previous one (seen once, from
    # products over sub-ranges of one accumulator: 2026-11-23).
    arch = "-gencode=arch=compute_90a,code=sm_90a"
    cmd = [NVCC, arch, "-DGDN_SM90A", "-std=c++17", "-Xptxas", "-v", "-c", str(source), "-o", str(tmp_path / "k.o")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    serialized = [line for line in result.stderr.splitlines() if "C7511" in line]
    assert not serialized, "\n".join(serialized)


@needs_nvcc
def test_wgmma_source_refuses_plain_sm90(tmp_path):
    source = KERNELS / "chunk_wgmma.cu"
    cmd = [NVCC, "-arch=sm_90", "-std=c++17", "-E", str(source), "-o", str(tmp_path / "k.ii")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode != 0 and "sm_90a only" in result.stderr


@needs_nvcc
@pytest.mark.parametrize("source", SOURCES + SM90A_SOURCES[1:], ids=[s.name for s in SOURCES + SM90A_SOURCES[1:]])
def test_spliced_source_is_self_contained(source, tmp_path):
    """What NVRTC compiles: no local include left, and it preprocesses alone (in an empty folder,
    where a local include could not be found), with #line directives naming the real files."""
    text = sources.source(source)
    assert not re.search(r'^\s*#\s*include\s+"', text, re.M), "a local include was not spliced"
    (tmp_path / source.name).write_text(text)
    cmd = [NVCC, "-std=c++17", "-DGDN_SM90A", "-E", source.name, "-o", "k.ii"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    if "chunk_common.cuh" in source.read_text() or source.parent.name == "cuda":
        assert '#line 1 "chunk_common.cuh"' in text


def test_splice_includes_each_header_once_and_keeps_line_numbers(tmp_path):
    (tmp_path / "a.cuh").write_text('#include "b.cuh"\nint a;\n')
    (tmp_path / "b.cuh").write_text("int b;\n")
    (tmp_path / "k.cu").write_text('// k\n#include "a.cuh"\n#include "b.cuh"\nint k;\n#include <cstdio>\n')
    text = sources.source(tmp_path / "k.cu")
    assert text.count("int b;") == 1 and "#include <cstdio>" in text
    assert text.splitlines() == [
        "// k",
        '#line 1 "a.cuh"',
        '#line 1 "b.cuh"',
        "int b;",
        '#line 2 "a.cuh"',
        "int a;",
        '#line 3 "k.cu"',
        "",
        "int k;",
        "#include <cstdio>",
    ]


def test_kernel_sources_exist_and_stay_small():
    names = {s.name for s in SOURCES}
    assert {"recurrent.cu", "chunk_three_kernel.cu", "chunk_fused_prep.cu", "chunk_fused.cu", "chunk_wgmma.cu"} <= names
    assert (KERNELS / "chunk_common.cuh").is_file()
    sizes = {s.name: len(s.read_text().splitlines()) for s in SOURCES}
    assert max(sizes.values()) <= 1200, sizes


@needs_nvcc
def test_recurrent_kernels_do_not_spill(tmp_path):
    """Every form of the recurrent kernel the launcher picks keeps its state in registers: a
    register cap (``rows-cs``'s MINB 6: 80 registers) or a change that adds registers would
    otherwise turn the state tile into local-memory traffic, unseen by any correctness test."""
    cmd = [NVCC, "-arch=sm_90", "-std=c++17", "-Xptxas", "-v", "-c", str(KERNELS / "recurrent.cu")]
    result = subprocess.run(cmd + ["-o", str(tmp_path / "k.o")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    spills = re.findall(r"(\d+) bytes spill stores", result.stderr)
    assert spills and all(n == "0" for n in spills), result.stderr
