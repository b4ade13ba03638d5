"""Every ``.cu`` source under ``cupy_kernels/`` compiles for sm_90 with nvcc (no GPU needed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SOURCES = sorted((Path(__file__).resolve().parent.parent / "cupy_kernels").glob("*.cu"))
NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: kernel sources not compiled")
@pytest.mark.parametrize("source", SOURCES, ids=[s.name for s in SOURCES])
def test_compiles_for_sm90(source, tmp_path):
    # -std=c++17 and the same macro CuPy's NVRTC build sees; -c only, nothing is run.
    cmd = [NVCC, "-arch=sm_90", "-std=c++17", "-c", str(source), "-o", str(tmp_path / "kernel.o")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: kernel sources not compiled")
def test_chunk_compiles_for_sm90a(tmp_path):
    # The wgmma state kernels exist only in the sm_90a build (-DGDN_SM90A, as chunk.sm90a_module).
    # ptxas -v also says whether it kept the wgmma pipeline: C7511 means every wgmma waits for the
    # previous one (seen once, from products over sub-ranges of one accumulator: 2026-11-23).
    source = SOURCES[0].with_name("chunk.cu")
    arch = "-gencode=arch=compute_90a,code=sm_90a"
    cmd = [NVCC, arch, "-DGDN_SM90A", "-std=c++17", "-Xptxas", "-v", "-c", str(source), "-o", str(tmp_path / "k.o")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    serialized = [line for line in result.stderr.splitlines() if "C7511" in line]
    assert not serialized, "\n".join(serialized)


def test_kernel_sources_exist():
    names = {s.name for s in SOURCES}
    assert {"recurrent.cu", "chunk.cu"} <= names, names
