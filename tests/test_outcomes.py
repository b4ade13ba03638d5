"""Outcomes a broken plug-in meets: timeout, error with its traceback, misuse, warnings, output paths, Ctrl-C.

Each test reproduces an item of issue 13's Why list that used to go wrong: a hung kernel was
never timed out, a wrong signature gave three property failures, "raised X" hid the kernel's
traceback, numpy warnings flooded the console, a read-only --json path crashed after the whole
run, Ctrl-C left nothing, and --database silently overrode --seed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gdn_verify import api
from gdn_verify.core.implementation import ConfigurationError
from gdn_verify.runners.check import RunSettings, run_property
from gdn_verify.runners.guard import Guard, KernelTimeout

jsonschema = pytest.importorskip("jsonschema")  # test-only; a bare GPU image may lack it

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "gdn_verify" / "schema" / "result.schema.json").read_text())

KERNELS = textwrap.dedent("""
    import inspect
    import time
    import warnings

    import numpy as np

    from gdn_verify.implementations import numpy_impl


    def good(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
             use_qk_l2norm_in_kernel=False, cu_seqlens=None):
        return numpy_impl.recurrent_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state,
                                                     use_qk_l2norm_in_kernel, cu_seqlens)


    def hangs(q, k, v, g, beta, **kw):
        if q.shape[1] > 3:
            while True:
                time.sleep(0.02)
        return good(q, k, v, g, beta, **kw)


    def wrong_signature(q, k, v, g):
        return None


    class NoSignature:
        # like a C extension: no inspectable signature, so misuse shows at the first call
        @property
        def __signature__(self):
            raise ValueError("no signature")

        def __call__(self, q, k, v, g):
            return None


    no_signature = NoSignature()


    def _inner(x):
        raise RuntimeError("kernel exploded inside _inner")


    def crashes(q, k, v, g, beta, **kw):
        if q.shape[1] > 2:
            _inner(q)
        return good(q, k, v, g, beta, **kw)


    _context = {"lost": False}


    def loses_context(q, k, v, g, beta, **kw):
        # a sticky CUDA error: from the first example with 3 <= T <= 6 on, every call fails alike
        if 3 <= q.shape[1] <= 6 or _context["lost"]:
            _context["lost"] = True
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return good(q, k, v, g, beta, **kw)


    def noisy(q, k, v, g, beta, **kw):
        for _ in range(20):
            np.exp(np.float32(1e4) * np.ones(3, np.float32))  # RuntimeWarning: overflow
        return good(q, k, v, g, beta, **kw)
""")


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "kernels.py").write_text(KERNELS)
    return tmp_path


def cli(*args, cwd, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )


def validate(doc: dict) -> dict:
    jsonschema.Draft202012Validator(SCHEMA).validate(doc)
    return doc


# --- the guard itself ------------------------------------------------------------------------


def test_the_first_call_of_a_shape_class_may_compile_a_later_one_may_not_hang():
    guard = Guard(timeout=0.1)

    def slow(x):
        time.sleep(0.3)
        return x

    import numpy as np

    a = np.zeros((1, 5, 2, 4))
    assert guard.call(slow, (a,), {}) is a  # 0.3 s > 0.1 s, but the first call of the shape class compiles
    with pytest.raises(KernelTimeout, match="did not return within 0.1s"):
        guard.call(slow, (np.zeros((1, 9, 2, 4)),), {})  # other T, same shape class: compiled already
    guard.close()


def test_a_kernel_slow_everywhere_is_not_a_hang():
    guard = Guard(timeout=0.05)
    guard.slowest = 0.03  # compiled calls have taken 30 ms: the limit is 10x that, not 50 ms
    guard.seen.add(("x",))
    assert guard.limit(("x",)) == pytest.approx(0.3)
    assert Guard(timeout=None).limit(("x",)) is None


# --- statuses on the command line -------------------------------------------------------------


def test_a_hanging_plugin_is_a_timeout_and_the_run_goes_on(folder):
    out = folder / "r.json"
    start = time.monotonic()
    done = cli(
        "check", "--impl", "kernels:hangs", "--properties", "matches_reference,determinism", "--max-examples", "10",
        "--seed", "1", "--timeout", "0.3", "--json", str(out), cwd=folder, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert time.monotonic() - start < 60
    assert "TIMEOUT matches_reference: the kernel call did not return within" in done.stdout
    assert "example that hung: B=" in done.stdout and "replay: gdn-verify replay /" in done.stdout
    assert "determinism" in done.stdout  # the run went on to the next property
    assert "2 timeout" in done.stdout and "Traceback" not in done.stderr
    doc = validate(json.loads(out.read_text()))
    assert doc["status"] == "complete" and doc["totals"]["timeout"] == 2
    assert [r["status"] for r in doc["results"]] == ["timeout", "timeout"]
    assert doc["results"][0]["failure"]["case"].startswith("/")


@pytest.mark.parametrize("fn", ["wrong_signature", "no_signature"])
def test_a_wrong_signature_is_one_misuse_line(fn, folder):
    out = folder / "r.json"
    done = cli(
        "check", "--impl", f"kernels:{fn}", "--properties", "matches_reference,determinism,linearity",
        "--max-examples", "5", "--json", str(out), cwd=folder,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("error: --impl: ") and len(done.stderr.strip().splitlines()) == 1
    assert "argument" in done.stderr and "Traceback" not in done.stderr
    assert "FAILED" not in done.stdout and "MISUSE" not in done.stdout
    if fn == "wrong_signature":  # refused from its signature with the other options: before the header
        assert done.stdout == "" and not out.exists()
    if fn == "no_signature":  # found at the first call: one property, status misuse, the run stopped
        doc = validate(json.loads(out.read_text()))
        assert doc["status"] == "misuse" and [r["status"] for r in doc["results"]] == ["misuse"]


def test_a_wrong_signature_is_a_configuration_error_in_python(folder, monkeypatch):
    monkeypatch.syspath_prepend(str(folder))
    import kernels

    with pytest.raises(ConfigurationError, match="^impl: .*cannot take the native"):
        api.check(kernels.wrong_signature, properties=["matches_reference"])
    # **kwargs and callables without a signature are given the benefit of the doubt
    api.implementation(lambda *a, **kw: None).check_signatures()
    api.implementation(kernels.no_signature).check_signatures()


def test_a_raising_kernel_is_an_error_with_its_own_traceback(folder):
    out = folder / "r.json"
    done = cli(
        "check", "--impl", "kernels:crashes", "--properties", "matches_reference", "--max-examples", "10",
        "--seed", "1", "--json", str(out), cwd=folder,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ERROR matches_reference: raised RuntimeError: kernel exploded inside _inner" in done.stdout
    tb = done.stdout.split("Traceback (the kernel's frames):", 1)[1].split("replay:", 1)[0]
    assert "in crashes" in tb and "in _inner" in tb
    assert "gdn_verify" not in tb and "hypothesis" not in tb  # trimmed to the user's frames
    row = validate(json.loads(out.read_text()))["results"][0]
    assert row["status"] == "error" and "_inner" in row["failure"]["traceback"]
    assert row["examples_by_status"]["error"] >= 1


def test_a_lost_gpu_context_stops_the_run_at_its_first_example_and_names_what_did_not_run(folder):
    out = folder / "r.json"
    done = cli(
        "check", "--impl", "kernels:loses_context", "--properties", "matches_reference,determinism,state_continuation",
        "--max-examples", "20", "--seed", "1", "--json", str(out), cwd=folder,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "illegal memory access was encountered; the GPU context is lost" in done.stdout
    # the example that raised first (3 <= T <= 6), not a "minimal" one shrunk on a dead context (T <= 1)
    shown = done.stdout.split("minimal example:", 1)[1].split(";", 1)[0]
    assert 3 <= int(shown.split("T=", 1)[1].split()[0]) <= 6, shown
    assert "not run: determinism, state_continuation (the GPU context was lost in matches_reference)" in done.stderr
    doc = validate(json.loads(out.read_text()))
    assert doc["status"] == "stopped" and doc["not_run"] == ["determinism", "state_continuation"]
    assert [r["name"] for r in doc["results"]] == ["matches_reference"]
    assert doc["results"][0]["status"] == "error" and doc["results"][0]["failure"]["case"]


def test_warnings_from_the_kernel_are_counted_not_streamed(folder):
    done = cli(
        "check", "--impl", "kernels:noisy", "--properties", "matches_reference,determinism", "--max-examples", "10",
        "--seed", "1", cwd=folder,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    output = done.stdout + done.stderr
    assert len(output.splitlines()) < 10  # 20 warnings per call used to print a line each
    lines = [line for line in done.stdout.splitlines() if "RuntimeWarning: overflow encountered" in line]
    assert len(lines) == 2  # one summary per property, on its line
    assert "x RuntimeWarning: overflow encountered in exp (kernels.py:" in lines[0]
    count = int(lines[0].split("[")[-1].split(" warnings")[0].split("; ")[-1])
    assert count >= 200


def test_warnings_in_a_fuzz_campaign_make_one_line(folder):
    done = cli("fuzz", "--impl", "kernels:noisy", "--budget", "4s", "--properties", "determinism", cwd=folder)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "overflow" not in done.stderr
    assert len([line for line in done.stdout.splitlines() if "RuntimeWarning" in line]) == 1


# --- output paths, Ctrl-C, --database -----------------------------------------------------------


def _not_writable(tmp_path: Path) -> Path:
    """A folder nobody can create files in, even root: its parent is a regular file."""
    (tmp_path / "a_file").write_text("")
    return tmp_path / "a_file" / "sub"


@pytest.mark.parametrize(
    "command",
    [
        ["check", "--impl", "numpy", "--properties", "matches_reference", "--json"],
        ["fuzz", "--impl", "numpy", "--budget", "5s", "--json"],
        ["selftest", "--json"],
        ["report", "--impl", "numpy", "--quick", "--out"],
    ],
)
def test_an_unwritable_output_path_exits_2_before_running(command, tmp_path):
    start = time.monotonic()
    done = cli(*command, str(_not_writable(tmp_path) / ("r.json" if command[-1] == "--json" else "")), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(f"error: {command[-1]}: ") and "cannot write there" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert "passed" not in done.stdout and "caught" not in done.stdout  # nothing ran
    assert time.monotonic() - start < 30


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can write into read-only folders")
def test_json_in_a_read_only_folder_exits_2(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    done = cli("check", "--impl", "numpy", "--properties", "determinism", "--json", str(ro / "r.json"), cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("error: --json: ")


def _default_sigint() -> None:
    """In the child: SIGINT as a terminal's Ctrl-C meets it. A job started in the background
    (``cmd &`` in a script, as some CI runners do) inherits SIGINT ignored, and Python then
    installs no KeyboardInterrupt handler: the signal would be dropped, not tested."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _check_stopped_by(sig: int, tmp_path: Path) -> tuple[int, str, dict]:
    """A numpy check with --json, sent ``sig`` once its first property's verdict is out: the
    exit status, stderr and the JSON document it left."""
    out = tmp_path / "r.json"
    proc = subprocess.Popen(
        [sys.executable, "-u", str(ROOT / "cli.py"), "check", "--impl", "numpy", "--seed", "1", "--max-examples",
         "400", "--properties", "determinism,matches_reference,varlen_equals_separate", "--json", str(out)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("  determinism") and "passed" in line:  # the first property's verdict
                break
        else:
            pytest.fail("no property line before the end")
        proc.send_signal(sig)
        rest, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert "Traceback" not in err, rest + err
    return proc.returncode, err, validate(json.loads(out.read_text()))


def test_ctrl_c_during_check_leaves_a_valid_partial_json(tmp_path):
    code, err, doc = _check_stopped_by(signal.SIGINT, tmp_path)
    assert code == 130, err
    assert err.strip().splitlines()[-1] == "gdn-verify: interrupted"
    assert doc["status"] == "interrupted" and doc["kind"] == "check"
    assert [r["name"] for r in doc["results"]][:1] == ["determinism"] and doc["totals"]["passed"] >= 1


def test_sigterm_during_check_saves_the_partial_json_and_exits_143(tmp_path):
    """``timeout``, a cancelled CI job or a batch scheduler stops a run with SIGTERM; before, the
    process died where it stood and its JSON said ``running`` (seen on an H200, 2026-11-28)."""
    code, err, doc = _check_stopped_by(signal.SIGTERM, tmp_path)
    assert code == 143, err
    assert err.strip().splitlines()[-1] == "gdn-verify: interrupted (SIGTERM)"
    assert doc["status"] == "interrupted" and doc["totals"]["passed"] >= 1


SWALLOWING_GC = textwrap.dedent("""
    import gc, os, runpy, signal, sys, threading, time
    start = time.monotonic()
    fired = []
    def ctrl_c_inside_gc(phase, info):  # the KeyboardInterrupt is raised in here, and gc drops it
        # main thread only: Python runs signal handlers there, so a collection that a helper thread
        # triggers would see the interrupt land after its callback (CI, 2026-11-28)
        main = threading.current_thread() is threading.main_thread()
        if phase == "start" and main and not fired and time.monotonic() - start > 2.0:
            fired.append(True)
            try:
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(1000):  # the handler runs at one of these bytecodes, inside the callback
                    pass
            except KeyboardInterrupt:
                sys.stderr.write("raised inside the gc callback\\n")
                raise
    gc.callbacks.append(ctrl_c_inside_gc)
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(sys.argv[0]))  # as `python cli.py` would
    runpy.run_path(sys.argv[0], run_name="__main__")
""")


def test_a_ctrl_c_lost_in_a_gc_callback_still_interrupts(tmp_path):
    """CI, 2026-11-23: the KeyboardInterrupt landed in Hypothesis's gc callback, was printed as
    "Exception ignored" and lost, and the check ran to completion (exit 0)."""
    out = tmp_path / "r.json"
    done = subprocess.run(
        [sys.executable, "-c", SWALLOWING_GC, str(ROOT / "cli.py"), "check", "--impl", "numpy", "--seed", "1",
         "--max-examples", "400", "--properties", "matches_reference,varlen_equals_separate", "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, preexec_fn=_default_sigint,
    )  # fmt: skip
    assert "raised inside the gc callback" in done.stderr, "not swallowed by gc: the test proves nothing"
    assert done.returncode == 130, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert json.loads(out.read_text())["status"] == "interrupted"


def test_ctrl_c_during_a_two_worker_fuzz_keeps_the_workers_verdicts(tmp_path):
    """The parent hears each worker's verdicts after every property run and saves them as they come."""
    out = tmp_path / "r.json"
    proc = subprocess.Popen(
        [sys.executable, "-u", str(ROOT / "cli.py"), "fuzz", "--impl", "numpy", "--budget", "5m", "--workers", "2",
         "--max-tokens", "64", "--database", str(tmp_path / "db"), "--json", str(out)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        saved: list = []
        while time.monotonic() < deadline and len(saved) < 2 and proc.poll() is None:
            time.sleep(0.5)
            with contextlib.suppress(OSError, ValueError):  # absent, or caught mid-write
                saved = json.loads(out.read_text())["results"]
        assert len(saved) >= 2, "no worker verdicts were saved while the campaign ran"
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, rest + err
    doc = validate(json.loads(out.read_text()))
    assert doc["status"] == "interrupted" and doc["campaign"]["workers"] == 2
    assert doc["totals"]["passed"] >= 2 and doc["campaign"]["cases"] >= len(doc["results"])


def _library_check_hit_during_ctrl_c(*_):
    """What Hypothesis 6.155 did in CI: an internal assertion failed while a Ctrl-C unwound it."""
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        raise AssertionError("assert state._runner is not None")  # noqa: B904 - chained implicitly, as there


def _determinism(**changes):
    impl = api.implementation("numpy")
    return dataclasses.replace(api.catalogue_for(impl)["determinism"], **changes), impl


@pytest.mark.parametrize("where", ["check", "strategy"])
def test_a_ctrl_c_turned_into_another_exception_is_still_an_interruption(where, tmp_path):
    prop, impl = _determinism()
    if where == "check":
        prop = dataclasses.replace(prop, check=_library_check_hit_during_ctrl_c)
    else:
        draw = prop.strategy
        prop = dataclasses.replace(prop, strategy=lambda impl: draw(impl).map(_library_check_hit_during_ctrl_c))
    with pytest.raises(KeyboardInterrupt):
        run_property(prop, impl, RunSettings(max_examples=5, seed=1, cases_dir=tmp_path))


def test_the_same_exception_without_a_ctrl_c_is_a_failure(tmp_path):
    def fails(*_):
        raise AssertionError("assert state._runner is not None")

    prop, impl = _determinism(check=fails)
    assert run_property(prop, impl, RunSettings(max_examples=5, seed=1, cases_dir=tmp_path)).status == "failed"


def test_database_overriding_seed_is_said(tmp_path):
    done = cli(
        "check", "--impl", "numpy", "--properties", "determinism", "--max-examples", "2", "--seed", "7",
        "--database", str(tmp_path / "db"), cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--database" in done.stderr and "ignores --seed 7" in done.stderr
    assert len(done.stderr.strip().splitlines()) <= 2  # the warning (and at most the progress line)


def test_the_plugin_reports_a_timeout(folder):
    # The tree under test after the folder: not another checkout the package may be installed from.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--gdn-impl", "kernels:hangs",
         "--gdn-properties", "matches_reference", "--gdn-max-examples", "5", "--gdn-seed", "1", "--gdn-timeout",
         "0.3"],
        cwd=folder, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "gdn-verify::matches_reference - TIMEOUT:" in done.stdout  # the outcome word, once
    usage = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--gdn-impl", "kernels:wrong_signature"],
        cwd=folder, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert usage.returncode == 4 and "cannot take the native" in usage.stderr
