"""The backend each kernel call ran on (gdn_verify.core.backends), ``check --backend``, and a
library's own refusal reported as such (gdn_verify.runners.guard)."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gdn_verify import api
from gdn_verify.core import backends
from gdn_verify.core.implementation import ConfigurationError, Implementation
from tests.backend_fakes import fake_fla_backends

ROOT = Path(__file__).resolve().parents[1]
FAKES = Path(__file__).resolve().parent / "backend_fakes"


# -- the record ---------------------------------------------------------------------------------


def test_a_call_that_shows_nothing_is_unknown_and_says_why():
    with backends.recording() as record:
        pass
    ran = record.ran()
    assert ran is not None and ran.names == (backends.UNKNOWN,)
    assert "no Triton launch" in ran.why
    assert record.ran(raised=True) is None  # raised before anything ran: no backend, not counted


def test_what_the_adapter_notes_wins_over_its_declaration():
    with backends.recording() as record:
        backends.note("cupy-fused", "cupy-context-parallel")
    ran = record.ran("numpy")
    assert ran is not None and ran.label == "cupy-fused+cupy-context-parallel"
    assert ran.ran_on("cupy-context-parallel") and ran.ran_on("cupy-fused") and not ran.ran_on("cupy-wgmma")
    backends.note("triton")  # outside a recording: ignored, no error


def test_a_token_step_call_without_tokens_ran_no_kernel_and_is_no_fallback():
    """vLLM's packed decode and FlashInfer's decode adapters launch once per token: a call with no
    token launches nothing, which was "unknown" in the H100 sweeps of 2026-12-05 (6 of 20 calls)."""
    import numpy as np

    from gdn_verify.implementations.flashinfer import NumpyOps, token_steps

    with backends.recording() as record:
        assert list(token_steps(NumpyOps(), np.array([0, 0, 0]), like=np.zeros(1))) == []
    ran = record.ran("flashinfer-decode")
    assert ran is not None and ran.names == (backends.NO_KERNEL,) and ran.ran_on("triton")
    with backends.recording() as record:
        steps = list(token_steps(NumpyOps(), np.array([0, 2, 3]), like=np.zeros(1)))
    assert len(steps) == 2 and record.ran("flashinfer-decode").names == ("flashinfer-decode",)


def test_a_hook_that_cannot_be_installed_leaves_the_call_running_and_says_why(monkeypatch):
    class Frozen(type):
        def __setattr__(cls, name, value):
            raise AttributeError("read-only launcher")

    class JITFunction(metaclass=Frozen):
        def run(self, *args, grid, warmup, **kw):
            return "launched"

    monkeypatch.setitem(sys.modules, "triton.runtime.jit", type(sys)("triton.runtime.jit"))
    sys.modules["triton.runtime.jit"].JITFunction = JITFunction  # type: ignore[attr-defined]
    monkeypatch.setattr(backends, "_install_failures", {})
    with backends.recording() as record:
        assert JITFunction().run(grid=(1,), warmup=False) == "launched"
    ran = record.ran()
    assert ran is not None and ran.names == (backends.UNKNOWN,)
    assert "JITFunction.run: cannot hook (AttributeError: read-only launcher)" in ran.why


def test_the_tally_counts_calls_per_backend_and_lists_kernels():
    tally = backends.Tally().add(
        [backends.Ran(("triton",), ("a_kernel", "b_kernel")), backends.Ran(("triton",), ("b_kernel",))]
    )
    assert tally.calls == {"triton": 2}
    assert tally.describe() == "triton (2 Triton kernels: a_kernel, b_kernel)"
    tally.merge(backends.Tally().add([backends.Ran(("flash_qla",))]))
    assert tally.describe().startswith("triton 2 calls, flash_qla 1 call")


def test_our_chunked_kernels_path_is_named_from_the_label_the_plan_gives():
    from cupy_kernels.chunk_plan import ChunkPlan  # pure: no GPU needed

    def names(path: str, segments: str = "") -> tuple[str, ...]:
        return backends.cupy_chunk_names(ChunkPlan(path, True, 4, 2, ()).label + segments)

    assert names("three-kernel") == ("cupy-three-kernel",)
    assert names("fused") == ("cupy-fused",)
    assert names("wgmma") == ("cupy-wgmma",)
    assert names("fused", ", context-parallel x 3") == ("cupy-fused", "cupy-context-parallel")
    assert names("wgmma", ", context-parallel x 2") == ("cupy-wgmma", "cupy-context-parallel")
    assert backends.cupy_chunk_names("") == (backends.UNKNOWN,)  # no call yet


def test_every_backend_an_adapter_declares_or_notes_is_a_known_name():
    sources = (ROOT / "gdn_verify" / "implementations").glob("*.py")
    declared = {
        name
        for path in sources
        for name in re.findall(r"""(?:backend=|"backend": |backends\.note\()"([^"]+)\"""", path.read_text())
    }
    assert {"flashinfer-cp", "flashinfer-decode", "flash_qla", "cupy-recurrent"} <= declared
    assert declared <= set(backends.BACKENDS)


def test_an_unknown_backend_name_is_a_configuration_error():
    with pytest.raises(ConfigurationError) as info:
        api.check("numpy", properties=["matches_reference"], max_examples=1, backend="flashqla")
    assert info.value.field == "backend" and "flash_qla" in info.value.message


# -- FLA >= 0.6's dispatch (a registry of the same shape) -----------------------------------------


@pytest.fixture
def fake_dispatch(monkeypatch):
    if "fla.backends" in sys.modules and sys.modules["fla.backends"] is not fake_fla_backends:
        pytest.skip("the real fla.backends is imported in this process")
    monkeypatch.setitem(sys.modules, "fla.backends", fake_fla_backends)
    return Implementation("fake-fla", {"chunk": fake_fla_backends.gated_delta_rule}, "numpy")


def _check(impl, dims, backend=None):
    return api.check(impl, properties=["matches_reference"], dims=dims, max_examples=3, seed=1, backend=backend)


def test_the_dispatched_backend_is_recorded_and_passes_backend(fake_dispatch):
    result = _check(fake_dispatch, [fake_fla_backends.ACCEPTED_K], backend="flash_qla")
    assert result.passed, result.report()
    calls = result.backends().calls
    assert set(calls) == {"flash_qla"} and calls["flash_qla"] >= 3
    assert result.as_dict()["results"][0]["backend"]["calls"] == dict(calls)
    assert result.as_dict()["backend"]["required"] == "flash_qla"


def test_a_fallback_is_recorded_with_the_reason_and_fails_backend(fake_dispatch):
    recorded = _check(fake_dispatch, [16])  # K = 16: the backend declines, the default runs
    assert recorded.passed, recorded.report()
    tally = recorded.backends()
    assert set(tally.calls) == {"numpy"}
    assert list(tally.declined) == ["flash_qla declined: head size K=16, needs 32"]

    required = _check(fake_dispatch, [16], backend="flash_qla")
    (r,) = required.results
    assert r.status == "failed" and r.failure is not None
    assert r.failure.message == "ran on numpy, not flash_qla (fallback: flash_qla declined: head size K=16, needs 32)"
    assert r.failure.cause == ""  # no numeric cause is sought for a fallback


# -- a library's own refusal ------------------------------------------------------------------------


@pytest.fixture
def refusing_lib(monkeypatch):
    monkeypatch.syspath_prepend(str(FAKES))
    return importlib.import_module("fake_refusing_lib")


def _declaring(fn, library: str = "fake_refusing_lib", **extra) -> Implementation:
    """A plug-in as an adapter makes one: ``fn`` in the native convention, its library declared."""
    return Implementation("declared", {"chunk": fn}, "numpy", extra={"library": library, **extra})


def test_a_raise_in_the_librarys_own_code_is_its_refusal(refusing_lib):
    result = api.check(_declaring(refusing_lib.gdn), properties=["matches_reference"], max_examples=2, seed=1)
    (r,) = result.results
    assert r.status == "error" and r.failure is not None
    assert r.failure.message == f"fake_refusing_lib refused: {refusing_lib.MESSAGE}"
    assert r.backends.calls == {}  # it ran on no backend


def test_a_raise_inside_another_library_or_an_undeclared_one_is_no_refusal(refusing_lib):
    for impl in (_declaring(refusing_lib.gdn_numpy_error), refusing_lib.gdn):  # NumPy raised; nothing declared
        (r,) = api.check(impl, properties=["matches_reference"], max_examples=2, seed=1).results
        assert r.status == "error" and r.failure is not None
        assert r.failure.message.startswith("raised "), r.failure.message


def test_a_librarys_kernel_triton_cannot_compile_is_named_with_the_triton_version(refusing_lib):
    triton = pytest.importorskip("triton")
    (r,) = api.check(
        _declaring(refusing_lib.gdn_not_compiling), properties=["matches_reference"], max_examples=1
    ).results
    assert r.status == "error" and r.failure is not None
    assert r.failure.message == (
        f"fake_refusing_lib's kernel does not compile with the installed Triton {triton.__version__}: "
        f"{refusing_lib.COMPILE_MESSAGE}"
    )
    # a user's own kernel that does not compile is its own error, said as it came
    (r,) = api.check(refusing_lib.gdn_not_compiling, properties=["matches_reference"], max_examples=1).results
    assert r.failure is not None and r.failure.message.startswith("raised CompilationError"), r.failure.message


def test_an_adapters_declared_library_counts_its_modules(refusing_lib):
    impl = _declaring(lambda **kw: refusing_lib.gdn(**kw), "somelib", library_modules=("fake_refusing_lib",))
    (r,) = api.check(impl, properties=["matches_reference"], max_examples=1, seed=1).results
    assert r.failure is not None and r.failure.message.startswith("somelib refused: "), r.failure.message


# -- Triton's launches, under the interpreter ---------------------------------------------------------


@pytest.mark.interpreter
def test_triton_kernels_launched_are_recorded_under_the_interpreter(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "gdn_verify", "check", "--impl", "tests/triton_gdn.py:recurrent", "--array", "torch"]
    argv += ["--dims", "16", "--max-examples", "3", "--max-tokens", "64", "--properties", "matches_reference"]
    argv += ["--seed", "1", "--cases", str(tmp_path)]

    def run(*extra: str) -> tuple[int, dict, str]:
        out = tmp_path / "out.json"
        done = subprocess.run(
            [*argv, *extra, "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
        )
        return done.returncode, json.loads(out.read_text()), done.stdout + done.stderr

    code, doc, text = run("--backend", "triton")
    assert code == 0, text
    assert set(doc["backend"]["calls"]) == {"triton"} and doc["backend"]["kernels"] == ["_recurrent_kernel"]
    assert "; backend: triton (1 Triton kernel: _recurrent_kernel) (required: triton)" in text

    code, doc, text = run("--backend", "flash_qla")
    assert code == 1, text
    (row,) = doc["results"]
    assert row["status"] == "failed" and row["failure"]["message"] == "ran on triton, not flash_qla (fallback)"


# -- the pytest plugin ----------------------------------------------------------------------------------


def test_the_pytest_plugin_takes_gdn_backend(tmp_path):
    from tests.test_pytest_plugin import run_pytest

    done = run_pytest(
        tmp_path, "--gdn-impl", "numpy", "--gdn-properties", "matches_reference", "--gdn-max-examples", "2",
        "--gdn-seed", "1", "--gdn-backend", "triton", quiet=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "backend triton required" in done.stdout and "ran on numpy, not triton (fallback)" in done.stdout
    done = run_pytest(tmp_path, "--gdn-impl", "numpy", "--gdn-backend", "trition")
    assert done.returncode == 4 and "--gdn-backend: 'trition'" in done.stderr, done.stderr
