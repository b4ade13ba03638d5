"""The bad-metadata corpus (``tests/bad_inputs.py``), every case in its own process (GPU only).

A process per case: a CUDA error (an illegal address, say) poisons the context of the process
it happens in, and must not fail, or hide in, the cases after it.
``scripts/gpu-machine/gpu_session.sh`` (phase memcheck_corpus) also runs the whole corpus in one
process under compute-sanitizer memcheck.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.bad_inputs import CASES

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_case(cp, name):
    result = subprocess.run(
        [sys.executable, "-m", "tests.bad_inputs", name], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert f"PASS {name}" in result.stdout
