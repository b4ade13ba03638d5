"""What the command line prints: a progress line rewritten in place on a terminal and nothing of it
elsewhere (a pipe, a file, a CI log, pytest's capture hold the results alone), and failures laid
out to be read at 120 columns."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import cli
from gdn_verify.console import ProgressDisplay, compile_progress, format_failure
from gdn_verify.core.property import Measurement
from gdn_verify.runners.check import Failure, PropertyResult

ROOT = Path(__file__).resolve().parent.parent


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_no_status_line_is_written(capsys):
    """Before, a status line came after 30 s without output and forced ones (compile progress, each
    tenth of a report) at once: a redirected log kept ``varlen_equals_separate  26 examples ...``."""
    clock, log = Clock(), io.StringIO()
    display = ProgressDisplay(log, clock=clock)
    for examples in range(1, 50):
        clock.now += 5  # long silences: minutes without a result line
        display.update(f"  matches_reference {examples:4d} examples")
    display.update("compiling 12 shape classes: 0/12 (0 s)", force=True)
    compile_progress(display)(12, 12, 90.0)
    display.print("  matches_reference   passed")  # results are written, terminal or not
    display.clear()
    assert log.getvalue() == "" and capsys.readouterr().out == "  matches_reference   passed\n"


def test_on_a_terminal_the_status_line_is_rewritten_in_place(capsys):
    clock, tty = Clock(), Terminal()
    display = ProgressDisplay(tty, clock=clock)
    display.update("  determinism    1 examples")  # at once: a terminal shows where the run is
    display.update("  determinism    2 examples")  # within 0.1 s of the last: not drawn
    clock.now += 1
    display.update("  determinism    3 examples")
    assert tty.getvalue().count("\r") == 2 and "\n" not in tty.getvalue() and "3 examples" in tty.getvalue()
    display.print("  determinism   passed")
    assert tty.getvalue().endswith("\r" + " " * 118 + "\r") and capsys.readouterr().out == "  determinism   passed\n"


# Lines a redirected ``check`` may hold: the header, a line per property, a failure's block, the
# closing counts and time. A progress line ("  varlen_equals_separate  26 examples worst 0.00e+00")
# is none of them.
RESULT_LINE = re.compile(
    r"gdn-verify check: impl=.*"
    r"|  [a-z_]+ +(passed|failed|unsupported|timeout|error) +\d+ examples  .*\d\.\ds.*"
    r"|FAILED [a-z_]+: .*"
    r"|  (minimal example|parameters|kind|likely cause|replay): .*"
    r"|  (worst (token|final state)|also over|bounds, uniform|kappa_o=).*"  # a failed comparison's details
    r"|\d+ passed, \d+ failed, \d+ unsupported.*"
    r"|time: .*"
)


def test_a_check_redirected_to_a_file_holds_results_only(tmp_path):
    """``check > log 2>&1`` with a failure among the results: every line is a result line."""
    with (tmp_path / "log").open("w") as log:
        done = subprocess.run(
            [sys.executable, str(ROOT / "cli.py"), "check", "--impl", "planted:off_by_one_final_state", "--seed",
             "1", "--max-examples", "10", "--properties", "determinism,matches_reference,varlen_equals_separate"],
            cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, timeout=300,
        )  # fmt: skip
    text = (tmp_path / "log").read_text()
    assert done.returncode == 1, text
    assert "FAILED matches_reference: " in text and "varlen_equals_separate   passed" in text
    assert "\r" not in text
    assert [line for line in text.splitlines() if not RESULT_LINE.fullmatch(line)] == []


def test_a_check_on_a_terminal_shows_its_progress(tmp_path, monkeypatch):
    """The same command with stderr a terminal: the status line is drawn there, the results go to stdout."""
    monkeypatch.chdir(tmp_path)
    out, tty = io.StringIO(), Terminal()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(tty):
        status = cli.main(["check", "--impl", "numpy", "--seed", "1", "--max-examples", "10", "--properties",
                           "determinism"])  # fmt: skip
    assert status == 0, out.getvalue() + tty.getvalue()
    assert re.search(r"\r  determinism +\d+ examples", tty.getvalue()), tty.getvalue()
    assert "determinism              passed" in out.getvalue() and " examples worst" not in out.getvalue()


def failed(message: str) -> PropertyResult:
    r = PropertyResult("matches_reference", "failed", 3)
    r.failure = Failure(message, None, {}, Measurement(1.0, 1.47e-5), description="B=1 T=1 H=1 HV=1 K=2 V=2")
    return r


def test_a_failure_message_s_further_lines_are_indented_under_its_first():
    """The first line is ``FAILED name: <first line>``; the message's other lines (how the bound is
    made up, a kernel's own multi-line message) stay below it, indented, before the minimal example."""
    message = "state error 1 > tolerance 1.47e-05 (against the oracle)\ntolerance: uniform model; kappa_s=1.87"
    text = format_failure(failed(message), "gdn-verify replay /c.npz --impl x")
    assert text.splitlines() == [
        "FAILED matches_reference: state error 1 > tolerance 1.47e-05 (against the oracle)",
        "  tolerance: uniform model; kappa_s=1.87",
        "  minimal example: B=1 T=1 H=1 HV=1 K=2 V=2",
        "  replay: gdn-verify replay /c.npz --impl x",
    ]
    # pytest names the property and says FAILED itself: the message starts the report.
    assert format_failure(failed(message), None, headline=False).splitlines()[:2] == [
        "state error 1 > tolerance 1.47e-05 (against the oracle)",
        "  tolerance: uniform model; kappa_s=1.87",
    ]


def test_a_passed_gradient_property_shows_each_gradients_closest_approach():
    """The worst example had dg at 0; the line shows dg's own worst (0.40), not the worst example's."""
    from gdn_verify.console import format_result

    worst = Measurement(0.5, 1.0, "dq 0.5/1, dg 0/2", parts={"dq": (0.5, 1.0), "dg": (0.0, 2.0)})
    closest = {"dq": (0.5, 1.0), "dg": (0.8, 2.0)}
    r = PropertyResult("grad_matches_reference", "passed", 3, worst=worst, worst_parts=closest)
    assert "of their bounds at most: dq 0.50, dg 0.40" in format_result(r)
    r.status = "failed"  # a failure shows its own example's gradients
    assert "dq 0.5/1, dg 0/2" in format_result(r)


def test_a_failed_comparison_leads_with_its_worst_metric_and_says_each_part_once(tmp_path):
    """The FAILED line is the worst metric against its bound (one terminal line); where it is worst,
    the other metrics over their bounds, the bound's algorithm-aware part (its cause said once,
    not per metric) and the condition numbers follow on their own lines."""
    from gdn_verify.api import check

    result = check(
        "planted:gate_ignored", dtype="float32", properties=["matches_reference"], seed=1, cases_dir=tmp_path
    )["matches_reference"]
    assert result.status == "failed"
    first, *rest = result.failure.message.splitlines()
    assert first.startswith("output_rms error ") and first.endswith("(against the oracle)")
    assert len("FAILED matches_reference: " + first) <= 120
    assert rest[0].startswith("worst token ") and rest[-1].startswith("kappa_o=")
    assert any(line.startswith("also over: output_token error ") for line in rest)
    cause = [line for line in rest if line.startswith("bounds, uniform + the float32 chunk-local gate cumsum")]
    assert len(cause) == 1 and result.failure.message.count("chunk-local gate cumsum") == 1
