"""Triton's interpreter on the CPU: a user's own Triton GDN kernel under a reduced ``check``.

Each check runs in a child process with ``TRITON_INTERPRET=1`` (Triton decides at decoration
whether a kernel is interpreted), on ``tests/triton_gdn.py``, a kernel that needs every
workaround of ``gdn_verify.implementations.interpreter``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gdn_verify.core.implementation import ConfigurationError
from gdn_verify.implementations import interpreter

pytest.importorskip("torch", reason="the interpreter tests need torch (pip install -e '.[test]')")
triton = pytest.importorskip("triton", reason="the interpreter tests need Triton (pip install -e '.[test]')")

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "tests/triton_gdn.py"
REDUCED = ["--array", "torch", "--dims", "16", "--max-examples", "3", "--max-tokens", "64"]


def _check(tmp_path: Path, fn: str, dtype: str, properties: str) -> tuple[int, dict, str]:
    out = tmp_path / f"{fn}-{dtype}.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "gdn_verify", "check", "--impl", f"{KERNEL}:{fn}", "--dtype", dtype]
    argv += [*REDUCED, "--properties", properties, "--seed", "1", "--json", str(out), "--cases", str(tmp_path)]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    return done.returncode, json.loads(out.read_text()), done.stdout + done.stderr


def _statuses(doc: dict) -> dict[str, str]:
    return {row["name"]: row["status"] for row in doc["results"]}


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_correct_triton_kernel_passes_under_the_interpreter(tmp_path, dtype):
    code, doc, text = _check(tmp_path, "recurrent", dtype, "matches_reference,head_mapping")
    assert code == 0, text
    assert set(_statuses(doc).values()) == {"passed"}, text
    assert "Triton interpreter on the CPU" in text  # the header says what the interpreter cannot show
    assert "bfloat16 inputs are widened to float32" in text
    assert doc["environment"]["triton_interpret"] is True


@pytest.mark.interpreter
def test_a_kernel_that_ignores_the_gate_fails_under_the_interpreter(tmp_path):
    code, doc, text = _check(tmp_path, "gate_ignored", "float32", "matches_reference")
    assert code == 1, text
    assert _statuses(doc) == {"matches_reference": "failed"}, text


def test_another_triton_version_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(triton, "__version__", "9.0.0")
    monkeypatch.setattr(interpreter, "_installed", False)
    with pytest.raises(ConfigurationError, match=r"written for Triton 3\.7, not 9\.0\.0"):
        interpreter.install()


def test_configs_are_chosen_without_timing_and_can_be_pinned(monkeypatch):
    configs = ["a", "b", "c"]
    assert interpreter.chosen_config(configs) == "a"
    monkeypatch.setattr(interpreter, "CONFIG", 4)
    assert interpreter.chosen_config(configs) == "b"


def test_only_range_loops_become_int32_loops():
    import ast

    src = "def f(n):\n for i in range(n): pass\n for j in tl.range(0, n): pass\n for s in tl.static_range(4): pass\n"
    tree = interpreter._LoopRewriter(ast.NodeTransformer()).visit(ast.parse(src))
    wrapped = [
        loop.target.id
        for loop in ast.walk(tree)
        if isinstance(loop, ast.For)
        and isinstance(loop.iter, ast.Call)
        and getattr(loop.iter.func, "id", "") == interpreter._LOOP
    ]
    assert wrapped == ["i", "j"]


def test_widening_rounds_outputs_back_only_when_q_was_bfloat16():
    """A bfloat16 optional argument (``initial_state``) beside float32 inputs is widened like any
    bfloat16 tensor, but ``o`` keeps the inputs' float32: rounding it would add a bfloat16 error the
    kernel never made (``optional_dtypes`` under the interpreter, FLA 0.6.0, 2026-12-05)."""
    import torch

    seen = {}

    def kernel(q, initial_state=None):
        seen["state"] = initial_state.dtype
        return q * (1 + 2**-12), initial_state.clone()

    wide = interpreter.widen_bfloat16(kernel)
    q, state = torch.ones(4), torch.ones(2, dtype=torch.bfloat16)
    o, final = wide(q=q, initial_state=state)
    assert seen["state"] == torch.float32  # the kernel saw the widened state
    assert o.dtype == torch.float32 and o[0].item() == 1 + 2**-12  # not rounded to bfloat16 (1.0 there)
    o, _ = wide(q=q.to(torch.bfloat16), initial_state=state)
    assert o.dtype == torch.bfloat16  # a bfloat16 call's output is the caller's dtype
