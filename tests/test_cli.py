"""The command line as a user meets it: exit codes, messages, plug-ins, replay."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def cli(*args, cwd=ROOT, env_path=None):
    env = None
    if env_path is not None:
        env = {**os.environ, "PYTHONPATH": str(env_path)}
    return subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600
    )


@pytest.fixture
def plugins(tmp_path):
    (tmp_path / "my_kernels.py").write_text(
        textwrap.dedent("""
        import numpy as np
        from gdn_verify.implementations import numpy_impl

        def good(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                 use_qk_l2norm_in_kernel=False, cu_seqlens=None):
            return numpy_impl.recurrent_gated_delta_rule(q, k, v, g, beta, scale, initial_state,
                                                         output_final_state, use_qk_l2norm_in_kernel, cu_seqlens)

        def no_varlen(q, k, v, g, beta, cu_seqlens=None, **kw):
            if cu_seqlens is not None:
                raise NotImplementedError("varlen")
            return good(q, k, v, g, beta, **kw)

        def wrong_shape(q, k, v, g, beta, **kw):
            o, s = good(q, k, v, g, beta, **kw)
            return o[:, :, :1], s

        def crashes(*a, **kw):
            raise RuntimeError("kernel exploded")
    """)
    )
    return tmp_path


@pytest.mark.parametrize(
    "args, message",
    [
        (["check", "--impl", "nonsense"], "unknown"),
        (["check", "--impl", "no_such_module:fn"], "cannot import module"),
        (["check", "--impl", "my_kernels:missing"], "has no function"),
        (["check", "--impl", "numpy", "--dtype", "int8"], "--dtype"),
        (["check", "--impl", "numpy", "--properties", "matches_reference,bogus"], "--properties"),
        (["check", "--impl", "numpy", "--max-examples", "0"], "--max-examples"),
        (["check", "--impl", "numpy", "--max-tokens", "10"], "--max-tokens"),
        (["check", "--impl", "planted:not_a_bug"], "unknown bug"),
        (["replay", "missing.npz", "--impl", "numpy"], "CASE: 'missing.npz': no such case file"),
        (["replay", "my_kernels.py", "--impl", "numpy"], "not a case file that check saved"),
        (["check", "--impl", "./no_such_file.py:good"], "no such file (give FILE.py:FUNCTION"),
        (["check", "--impl", "numpy", "--dims", "a,b"], "--dims"),
        (["check", "--impl", "numpy", "--array", "torch"], "--array"),
        (["fuzz", "--impl", "numpy", "--budget", "soon"], "budget"),
        (["fuzz", "--impl", "numpy", "--workers", "two"], "--workers: 'two': expected a number of processes"),
        (["fuzz", "--impl", "numpy", "--properties", "bogus"], "--properties: unknown bogus"),
        (
            ["check", "--impl", "my_kernels:good", "--array", "torch", "--grad", "--scale"],
            "--scale: the scale tier checks the forward pass",
        ),
        (["selftest", "--max-examples", "0"], "--max-examples: 0: must be at least 1"),
        (["check", "--impl", "numpy", "--scale"], "--scale: the scale tier needs a GPU"),
        pytest.param(
            ["check", "--impl", "numpy", "--sanitize"],
            "--sanitize: compute-sanitizer is not on PATH",
            marks=pytest.mark.skipif(shutil.which("compute-sanitizer") is not None, reason="compute-sanitizer is here"),
        ),
    ],
)
def test_misuse_exits_2_with_one_line(args, message, plugins):
    result = cli(*args, cwd=plugins)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert result.stdout.strip() == ""  # no run header echoing the bad value first


def test_a_plugin_given_as_a_file_path_loads(plugins):
    result = cli(
        "check", "--impl", "./my_kernels.py:good", "--properties", "determinism", "--max-examples", "3", cwd=plugins
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


def test_plugin_passes_and_unsupported_features_are_reported(plugins):
    good = cli("check", "--impl", "my_kernels:good", "--max-examples", "5", "--seed", "1", cwd=plugins)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "0 failed" in good.stdout
    partial = cli(
        "check",
        "--impl",
        "my_kernels:no_varlen",
        "--max-examples",
        "5",
        "--seed",
        "1",
        "--properties",
        "varlen_equals_separate,matches_reference",
        cwd=plugins,
    )
    assert partial.returncode == 0, partial.stdout + partial.stderr
    assert "varlen_equals_separate   unsupported" in partial.stdout


@pytest.mark.parametrize("fn, text", [("wrong_shape", "output contract"), ("crashes", "raised RuntimeError")])
def test_broken_plugins_are_violations_not_crashes(fn, text, plugins):
    result = cli(
        "check",
        "--impl",
        f"my_kernels:{fn}",
        "--max-examples",
        "3",
        "--seed",
        "1",
        "--properties",
        "matches_reference",
        cwd=plugins,
    )
    assert result.returncode == 1
    assert text in result.stdout and "Traceback" not in result.stderr
    assert "replay: gdn-verify replay /" in result.stdout


def test_failure_prints_minimal_example_and_replays(tmp_path):
    result = cli(
        "check",
        "--impl",
        "planted:off_by_one_final_state",
        "--seed",
        "3",
        "--json",
        str(tmp_path / "r.json"),
        "--properties",
        "matches_reference",
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert "FAILED matches_reference" in result.stdout and "minimal example: B=" in result.stdout
    command = next(line for line in result.stdout.splitlines() if "replay:" in line).split("replay: ")[1]
    case = command.split()[2]
    again = cli("replay", case, "--impl", "planted:off_by_one_final_state", cwd=tmp_path)
    assert again.returncode == 1
    # the same likely cause as check names
    assert "likely cause: the final state missing the last token" in again.stdout, again.stdout
    assert "likely cause: the final state missing the last token" in result.stdout
    fixed = cli("replay", case, "--impl", "numpy", cwd=tmp_path)
    assert fixed.returncode == 0 and "passed" in fixed.stdout
    assert (tmp_path / "r.json").exists()


def test_default_impl_says_which(tmp_path):
    result = cli("check", "--max-examples", "2", "--properties", "determinism", cwd=tmp_path)
    assert result.returncode == 0
    assert "no --impl given" in result.stderr


def test_console_script_and_module_are_the_same_command_line(tmp_path):
    script = Path(sys.executable).with_name("gdn-verify")
    if not script.exists():
        pytest.skip("the package is not installed in this environment (pip install -e .)")
    for command in ([str(script)], [sys.executable, "-m", "gdn_verify"]):
        done = subprocess.run([*command, "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert done.returncode == 0 and "check" in done.stdout and "replay" in done.stdout
    done = subprocess.run(
        [
            str(script),
            "check",
            "--impl",
            "numpy",
            "--max-examples",
            "2",
            "--properties",
            "matches_reference,determinism",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_bench_checks_its_output_paths_before_measuring(tmp_path):
    """A bad --json path is refused up front (exit 2, one line), before any GPU work is attempted."""
    folder = tmp_path / "taken"
    folder.mkdir()
    result = cli("bench", "--what", "prefill", "--json", str(folder))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "json" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_plugin_with_the_readme_signature_is_told_which_keyword_it_lacks(tmp_path):
    # Exactly FLA's signature as the README gives it: no state_v_first, no in-kernel gate options.
    (tmp_path / "fla_signature.py").write_text(
        "from gdn_verify.implementations import numpy_impl\n\n\n"
        "def gdn(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,\n"
        "        use_qk_l2norm_in_kernel=False, cu_seqlens=None):\n"
        "    return numpy_impl.chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state,\n"
        "                                             output_final_state, use_qk_l2norm_in_kernel, cu_seqlens)\n"
    )
    out = tmp_path / "r.json"
    result = cli(
        "check", "--impl", "fla_signature:gdn", "--max-examples", "30", "--seed", "2", "--json", str(out),
        "--properties", "state_layout,in_kernel_gate,in_kernel_beta_sigmoid,matches_reference", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    assert rows["state_layout"]["note"].startswith("needs state_v_first= (not in")
    assert rows["in_kernel_gate"]["note"].startswith("needs use_gate_in_kernel=, A_log=, dt_bias=")
    assert rows["in_kernel_beta_sigmoid"]["status"] == "unsupported"
    dropped = rows["matches_reference"]["unsupported_reasons"]
    assert set(dropped) == {"needs state_v_first="} and dropped["needs state_v_first="] > 0
    assert f"examples unsupported (needs state_v_first=: {dropped['needs state_v_first=']}): optional" in result.stdout
    assert "take them in the signature to have them checked" in result.stdout  # that this is fine, and the way in
    assert "raised NotImplementedError" not in result.stdout


def test_version_is_printed_by_every_entry_point(capsys):
    """``gdn-verify --version``, ``python -m gdn_verify --version`` and ``gdn_verify.__version__`` agree
    with the installed package's metadata."""
    import subprocess
    import sys
    from importlib import metadata

    import gdn_verify
    from cli import main

    assert gdn_verify.__version__ == metadata.version("gdn-verify")
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"gdn-verify {gdn_verify.__version__}"
    out = subprocess.run([sys.executable, "-m", "gdn_verify", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"gdn-verify {gdn_verify.__version__}"


def test_selftest_prints_the_seed_it_runs_with(monkeypatch, capsys):
    """Without --seed, selftest draws one, prints it and runs with it: a failing run can be repeated."""
    import re

    import cli

    used = []
    monkeypatch.setattr(cli.api, "selftest_resolved", lambda run, **kw: used.append(run.seed))
    cli.main(["selftest"])
    printed = re.search(r"seed=(\d+)", capsys.readouterr().out)
    assert printed is not None and used == [int(printed.group(1))]


def test_selftest_shortens_a_long_message_at_a_word(monkeypatch, capsys):
    """A caught bug's message is shortened to 80 characters between words, never mid-word."""
    from types import SimpleNamespace

    import cli

    words = " ".join(f"word{i:02d}" for i in range(40))  # 279 characters, no word longer than 6
    failure = SimpleNamespace(message=words, measurement=None, cause_model="")
    row = SimpleNamespace(
        bug="a_bug",
        caught_by=SimpleNamespace(name="matches_reference", failure=failure),
        seconds=1.0,
        cause_verdict="right",
        description="",
        not_applicable="",
    )
    monkeypatch.setattr(cli.api, "selftest_resolved", lambda run, **kw: kw["on_bug"](row))
    monkeypatch.setattr(cli.api, "selftest_document", lambda *a, **kw: {})
    cli.main(["selftest"])
    line = next(x for x in capsys.readouterr().out.splitlines() if "a_bug" in x)
    shown = line.split("): ", 1)[1]
    assert shown.endswith(" ...") and all(w in words.split() for w in shown.removesuffix(" ...").split())


# One BLAS thread for the command line, set before NumPy loads -------------------------------------
BLAS_THREADS_AT_NUMPY = textwrap.dedent("""
    import importlib.abc, os, runpy, sys

    class AtNumPy(importlib.abc.MetaPathFinder):
        # What OpenBLAS will read: the variable at the moment NumPy is first imported.
        def find_spec(self, name, path=None, target=None):
            if name == "numpy":
                sys.meta_path.remove(self)
                sys.stderr.write(f"numpy loads with {os.environ.get('OPENBLAS_NUM_THREADS')}\\n")
            return None

    sys.meta_path.insert(0, AtNumPy())
    entry, sys.argv = sys.argv[1], sys.argv[1:]
    if entry == "-m":
        runpy.run_module("gdn_verify", run_name="__main__", alter_sys=True)
    elif entry == "library":  # gdn_verify as a program or pytest imports it
        import gdn_verify.api, gdn_verify.pytest_plugin
    else:
        sys.path.insert(0, os.path.dirname(entry))
        runpy.run_path(entry, run_name="__main__")
""")


@pytest.mark.parametrize("entry", [str(ROOT / "cli.py"), "-m", "library"])
@pytest.mark.parametrize("given", [None, "3"])
def test_the_command_line_gives_openblas_one_thread_unless_told_otherwise(entry, given, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    done = subprocess.run(
        [sys.executable, "-c", BLAS_THREADS_AT_NUMPY, entry, "--version"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    expected = given if given is not None else (None if entry == "library" else "1")
    assert f"numpy loads with {expected}\n" in done.stderr


# Ctrl-C before the first property runs ---------------------------------------------------------
CTRL_C_DURING_IMPORTS = textwrap.dedent("""
    import importlib.abc, os, runpy, signal, sys

    class CtrlCAtHypothesis(importlib.abc.MetaPathFinder):
        # A Ctrl-C at the moment the command line imports Hypothesis: start-up, before main() runs.
        def find_spec(self, name, path=None, target=None):
            if name == "hypothesis":
                sys.meta_path.remove(self)
                os.kill(os.getpid(), signal.SIGINT)
            return None

    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, whatever the parent ignores
    sys.meta_path.insert(0, CtrlCAtHypothesis())
    entry, sys.argv = sys.argv[1], sys.argv[1:]
    if entry == "-m":  # python -m gdn_verify, as the gdn-verify script: gdn_verify._cli imported from a package
        runpy.run_module("gdn_verify", run_name="__main__", alter_sys=True)
    else:  # python cli.py
        sys.path.insert(0, os.path.dirname(entry))
        runpy.run_path(entry, run_name="__main__")
""")


@pytest.mark.parametrize("entry", [str(ROOT / "cli.py"), "-m"])
def test_ctrl_c_while_the_command_line_imports_is_one_line_and_exit_130(entry, tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C_DURING_IMPORTS, entry, "check", "--impl", "numpy"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr == "gdn-verify: interrupted\n" and done.stdout == ""


@pytest.mark.parametrize("where", ["build_parser", "implementation"])
def test_ctrl_c_during_start_up_is_one_line_and_exit_130(where, monkeypatch, capsys, tmp_path):
    """Building the parser (it lists the implementations) and resolving --impl (it imports torch,
    CuPy or FLA) come before the first property: a Ctrl-C there is the same one line."""
    import cli

    def interrupted(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(
        *((cli, "build_parser") if where == "build_parser" else (cli.implementations, "resolve")), interrupted
    )
    out = tmp_path / "r.json"
    try:
        code = cli.main(["check", "--impl", "numpy", "--json", str(out)])
    except KeyboardInterrupt:
        pytest.fail("the Ctrl-C escaped main() (a traceback for the user)")
    assert code == 130
    captured = capsys.readouterr()
    assert captured.err == "gdn-verify: interrupted\n" and captured.out == ""
    assert not out.exists()  # nothing had run, so nothing was written


def test_report_writes_into_an_ignored_folder_by_default(tmp_path):
    """``report`` without --out writes under .gdn_verify/ (git-ignored), not into the tracked reports/."""
    from gdn_verify import report

    out = report.options(["numpy"], dtypes=["float32"], quick=True).out
    assert out.parent == Path(".gdn_verify") / "reports" and out.name.startswith("report-")
    if shutil.which("git") is None:
        pytest.skip("git is not on PATH")
    ignored = subprocess.run(["git", "check-ignore", "-q", str(out / "index.html")], cwd=ROOT)
    assert ignored.returncode == 0, f"{out} is not ignored by git"
    assert "default: .gdn_verify/reports/" in " ".join(cli("report", "--help").stdout.split())
