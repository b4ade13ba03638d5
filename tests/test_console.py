"""The progress display: rewritten in place on a terminal, and off one (a pipe, a file, a CI log)
a status line only after a silence, so that captured logs hold the results, not every update."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from gdn_verify.console import ProgressDisplay

ROOT = Path(__file__).resolve().parent.parent


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_a_status_line_comes_only_after_a_silence(capsys):
    clock, log = Clock(), io.StringIO()
    display = ProgressDisplay(log, interval=30, clock=clock)
    for examples in range(1, 50):  # updates as fast as examples run: none in the first 30 s
        clock.now += 0.5
        display.update(f"  matches_reference {examples:4d} examples")
    assert log.getvalue() == ""
    clock.now += 10  # 34.5 s of silence
    display.update("  matches_reference   60 examples")
    display.update("  matches_reference   61 examples")
    assert log.getvalue() == "  matches_reference   60 examples\n"
    clock.now += 20
    display.print("  matches_reference   passed")  # a result line is output too: the silence starts again
    clock.now += 20
    display.update("  determinism    3 examples")
    assert log.getvalue().count("\n") == 1 and capsys.readouterr().out == "  matches_reference   passed\n"
    display.update("compiling 12 shape classes: 0/12 (0 s)", force=True)  # forced: shown at once
    assert log.getvalue().splitlines()[-1] == "compiling 12 shape classes: 0/12 (0 s)"


def test_on_a_terminal_the_status_line_is_rewritten_in_place(capsys):
    clock, tty = Clock(), Terminal()
    display = ProgressDisplay(tty, clock=clock)
    display.update("  determinism    1 examples")  # at once: a terminal shows where the run is
    clock.now += 1
    display.update("  determinism    2 examples")
    assert tty.getvalue().count("\r") == 2 and "\n" not in tty.getvalue()
    display.print("  determinism   passed")
    assert tty.getvalue().endswith("\r" + " " * 118 + "\r") and capsys.readouterr().out == "  determinism   passed\n"


def test_a_captured_check_has_no_progress_lines(tmp_path):
    """A short ``check`` with stdout and stderr captured: result lines only, no repeated updates."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "check", "--impl", "numpy", "--seed", "1", "--max-examples", "10",
         "--properties", "determinism,matches_reference"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "matches_reference        passed" in done.stdout
    assert " examples" not in done.stderr, done.stderr


def test_a_passed_gradient_property_shows_each_gradients_closest_approach():
    """The worst example had dg at 0; the line shows dg's own worst (0.40), not the worst example's."""
    from gdn_verify.console import format_result
    from gdn_verify.core.property import Measurement
    from gdn_verify.runners.check import PropertyResult

    worst = Measurement(0.5, 1.0, "dq 0.5/1, dg 0/2", parts={"dq": (0.5, 1.0), "dg": (0.0, 2.0)})
    closest = {"dq": (0.5, 1.0), "dg": (0.8, 2.0)}
    r = PropertyResult("grad_matches_reference", "passed", 3, worst=worst, worst_parts=closest)
    assert "of their bounds at most: dq 0.50, dg 0.40" in format_result(r)
    r.status = "failed"  # a failure shows its own example's gradients
    assert "dq 0.5/1, dg 0/2" in format_result(r)
