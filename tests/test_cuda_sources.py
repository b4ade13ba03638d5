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


def test_kernel_sources_exist():
    names = {s.name for s in SOURCES}
    assert {"recurrent.cu", "chunk.cu"} <= names, names
