"""How results look on a terminal: the one progress display, the one failure and replay formatter.

Used by the command line and the pytest plugin; the runners themselves never print.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from gdn_verify.core.property import Measurement

if TYPE_CHECKING:
    from gdn_verify.core.backends import Tally
    from gdn_verify.core.implementation import Implementation
    from gdn_verify.runners.check import PropertyResult


def number(x: float | None) -> str:
    """A measured number to 3 significant digits (``-`` for None)."""
    return "-" if x is None else f"{x:.3g}"


def margin(m: Measurement | None) -> str:
    """How far a failure lies over its bound: error / bound, and error / uniform bound where they differ."""
    if m is None:
        return "margin n/a (non-numeric failure)"
    text = f"margin {m.ratio:.3g}x"
    if m.uniform is not None and m.uniform_ratio != m.ratio:
        text += f", {m.uniform_ratio:.3g}x the uniform bound"
    return text


class ProgressDisplay:
    """One status line on ``stream`` (stderr), rewritten in place, on a terminal only. Elsewhere (a
    pipe, a file, a CI log, pytest's capture) each status line would stay for good, so none is
    written: what is redirected holds the results alone.

    ``update(text)`` is throttled to ten a second (``force``: shown at once); ``print(line)`` writes
    a permanent line (to stdout) above the status line, terminal or not.
    """

    def __init__(self, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        self.live = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.interval = 0.1
        self.clock = clock
        self.last = float("-inf")
        self.shown = False

    def update(self, text: str, force: bool = False) -> None:
        if not self.live:
            return
        now = self.clock()
        if not force and now - self.last < self.interval:
            return
        self.last = now
        self.stream.write("\r" + text[:118].ljust(118))
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r" + " " * 118 + "\r")
            self.stream.flush()
            self.shown = False

    def print(self, line: str, stream: TextIO | None = None) -> None:
        self.clear()
        out = stream if stream is not None else sys.stdout
        out.write(line + "\n")
        out.flush()


def replay_command(case: str | Path, impl: Implementation, convention: str = "native") -> str:
    """``gdn-verify replay /absolute/case.npz --impl NAME [--array A] [--convention spec|backward]``: works
    from any folder."""
    from gdn_verify.implementations import is_plugin

    words = ["gdn-verify", "replay", str(Path(case).resolve()), "--impl", impl.name]
    plugin = is_plugin(impl.name)
    if plugin and impl.array != "numpy":
        words += ["--array", impl.array]
    if plugin and convention != "native":
        words += ["--convention", convention]
    return " ".join(shlex.quote(w) for w in words)


def format_counts(counts: dict[str, int]) -> str:
    """``3 passed, 1 failed, 0 unsupported`` and any timeout, error or misuse that occurred."""
    shown = [s for s in counts if s in ("passed", "failed", "unsupported") or counts[s]]
    return ", ".join(f"{counts[s]} {s}" for s in shown)


def format_result(r: PropertyResult) -> str:
    """One line per property: status, examples, worst error against its bound, seconds, note, and
    the warnings raised meanwhile as one count (never one line each). A passed property with parts
    (a backward's gradients) shows how close each part came to its bound on any example, not the
    worst example's parts."""
    worst = ""
    if r.worst is not None and r.status in ("passed", "failed"):
        if r.worst.bound:
            detail = r.worst.detail.split(";")[0]
            if r.worst_parts and r.status == "passed":
                ratios = (f"{n} {Measurement.ratio_of(e, b):.2f}" for n, (e, b) in r.worst_parts.items())
                detail = "of their bounds at most: " + ", ".join(ratios)
            worst = f"worst {r.worst.error:.2e} (bound {r.worst.bound:.2e}, {detail})"
        elif r.status == "failed":
            worst = f"max difference {r.worst.error:.2e} (exact contract)"
        else:
            worst = f"exact ({r.worst.detail})"
    notes = [n for n in (r.note, r.warning) if n]
    note = f"  [{'; '.join(notes)}]" if notes else ""
    return f"  {r.label:<24} {r.status:<11} {r.examples:4d} examples  {worst}  {r.seconds:.1f}s{note}"


def format_failure(r: PropertyResult, replay: str | None, headline: bool = True) -> str:
    """A property that did not pass (failed, timeout, error, misuse): the message's first line after
    ``FAILED name:``, its further lines (how the bound is made up, a kernel's own message) indented
    below it, the minimal example (for a timeout: the example that hung), its parameters, the
    kernel's own traceback (error) and the replay command. ``headline=False`` leaves ``FAILED
    name:`` off the first line, for a report that names the property and says FAILED itself
    (pytest's); other statuses keep their word (``TIMEOUT: ...``)."""
    f = r.failure
    assert f is not None
    example = "example that hung" if f.status == "timeout" else "minimal example"
    message, *details = f.message.splitlines() or [""]
    if headline:
        first = f"{f.status.upper()} {r.label}: {message}"
    else:
        first = message if f.status == "failed" else f"{f.status.upper()}: {message}"
    lines = [first, *("  " + line for line in details), f"  {example}: {f.describe()}"]
    if f.params:
        lines.append(f"  parameters: {f.params}")
    if f.kind:
        lines.append(f"  kind: {f.kind}" + ("" if f.cause else " (no known mistake reproduces it)"))
    if f.cause:
        lines.append(f"  likely cause: {f.cause}")
    if f.traceback:
        lines += ["    " + line for line in f.traceback.splitlines()]
    if replay:
        lines.append(f"  replay: {replay}")
    return "\n".join(lines)


def format_configs_summary(results: list[PropertyResult]) -> str:
    """``check --all-configs``: how many (kernel, config) pairs ran and which failed, by label."""
    pairs = {(r.config["kernel"], r.config["config"]) for r in results if r.config and "index" in r.config}
    failed = [r.label for r in results if r.config and r.status not in ("passed", "unsupported")]
    text = f"all configs: {len(pairs)} (kernel, config) pairs run"
    return text + (f"; not passed: {', '.join(failed)}" if failed else "; every one passed")


def format_backends(tally: Tally, required: str | None = None) -> str:
    """ "backend: triton (3 Triton kernels: a, b, c)": what every call of a check ran on, and the
    backend ``--backend`` required, if any."""
    line = f"backend: {tally.describe() or 'no kernel call recorded'}"
    return line + (f" (required: {required})" if required else "")


def duration(seconds: float) -> str:
    """``"7 min 2 s"``, ``"41 s"``: a wall-clock time as a person reads it."""
    s = int(round(seconds))
    return f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"


def format_time_split(split: dict[str, float], seconds: float, startup: float | None = None) -> str:
    """``time: compile 1 min 35 s, kernel 40 s, oracle 60 s, ours 20 s of 3 min 35 s`` (in the split's
    order), then ``; 4 s before it`` when ``startup`` (the process's start to the check's) is known."""
    parts = ", ".join(f"{label} {duration(t)}" for label, t in split.items() if t >= 0.5 or label == "ours")
    before = "" if startup is None else f"; {duration(startup)} before it (Python's start, imports, the command line)"
    return f"time: {parts} of {duration(seconds)}{before}"


def compile_progress(display: ProgressDisplay) -> Callable[[int, int, float], None]:
    """The ``on_compile`` callback showing ``compiling 12 shape classes: 5/12 (41 s)`` on ``display``."""

    def show(done: int, planned: int, seconds: float) -> None:
        text = f"compiling {planned} shape classes: {done}/{planned} ({duration(seconds)})"
        display.update(text, force=done in (0, planned))  # the first and the last always show

    return show
