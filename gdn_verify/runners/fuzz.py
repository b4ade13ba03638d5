"""A fuzz campaign: cycle over the properties with Hypothesis until a time budget is spent.

Each round runs every remaining property through :func:`check.run_property` with as many
examples as the remaining time allows (estimated from the previous round). The budget is a
deadline for the whole campaign, its closing included: an example starts only if it would end
within the budget were it as long as the longest its property has taken (``RunSettings.deadline``),
and the oracles' worker processes are stopped within it. It is overrun only by an example longer
than any of its property's before it (a property's first, a kernel call compiling a new shape) or
by the shrinking of a failure just found, which runs to its end. Python's start and imports
before the campaign (about 2 s) are not part of it.

The example database is persistent, one directory per implementation and property, so a
failure found once is replayed first the next time. Rounds draw fresh random examples; a fixed
``seed`` makes the campaign reproducible instead (Hypothesis then switches the database off). A
failing property is recorded (shrunk case saved as ``.npz``), as is one that timed out or on
which the kernel raised, and dropped from later rounds; a misuse (the kernel cannot take the
arguments) ends the campaign. Every property's verdict, merged over the rounds, is in
``FuzzReport.properties``. Progress and findings are reported through callbacks; the campaign
returns a :class:`FuzzReport`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gdn_verify.core import processes
from gdn_verify.core.implementation import ConfigurationError, Implementation
from gdn_verify.core.property import Measurement, Property
from gdn_verify.runners.check import CASES_DIR, NOT_PASSED, PropertyResult, RunSettings, run_property
from gdn_verify.runners.guard import DEFAULT_TIMEOUT, Guard

DATABASE_DIR = Path(".gdn_verify") / "hypothesis"
# Two examples per property in the first round: every property is visited early even for a
# kernel that compiles per shape (FLA's chunked kernels took 20-40 s a case on an H100, where
# five each covered 3 of 14 properties in 10 minutes). Hypothesis starts every run with its
# simplest example, so the second is the first that says what a case costs.
FIRST_ROUND_EXAMPLES = 2
MAX_EXAMPLES_PER_CALL = 2000
_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_budget(text: str | float) -> float:
    """Seconds in ``"90s"``, ``"30m"``, ``"1h"``, ``"1.5h"`` or a number of seconds."""
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh])\s*", str(text))
        if not match:
            raise ConfigurationError("budget", f"{text!r}: expected a number with a unit s, m or h (90s, 30m, 1h)")
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not seconds > 0:
        raise ConfigurationError("budget", f"{text!r}: must be positive")
    return seconds


def format_seconds(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


@dataclass
class FuzzReport:
    """A campaign's outcome; ``failures`` are the results of properties that failed, timed out,
    raised or misused (minimal cases saved); ``properties`` every property's verdict so far;
    ``worst`` the example furthest over (or nearest to) its bound, failing ones included
    (``(property, measurement)``; :attr:`worst_failed` says whether it failed)."""

    cases: int = 0
    rounds: int = 0
    elapsed: float = 0.0
    budget: float = 0.0
    worst: tuple[str, Measurement] | None = None
    failures: list[PropertyResult] = field(default_factory=list)
    unsupported: list[PropertyResult] = field(default_factory=list)
    first_failure_case: int | None = None  # campaign-wide case number of the first failing case
    properties: dict[str, PropertyResult] = field(default_factory=dict)

    def merge(self, r: PropertyResult) -> None:
        """Fold one round's verdict on a property into ``properties``."""
        old = self.properties.get(r.name)
        if old is None:
            self.properties[r.name] = r
            return
        r.examples += old.examples
        r.unsupported += old.unsupported
        r.seconds += old.seconds
        r.warnings += old.warnings
        r.warning = r.warning or old.warning
        r.above_uniform += old.above_uniform
        for status, n in old.example_counts.items():
            r.example_counts[status] = r.example_counts.get(status, 0) + n
        if old.worst is not None and (r.worst is None or (r.failure is None and old.worst.ratio > r.worst.ratio)):
            r.worst = old.worst
        self.properties[r.name] = r

    def note_worst(self, candidate: tuple[str, Measurement] | None) -> None:
        """Keep ``candidate`` (property, measurement) as the campaign's worst if its ratio is larger."""
        if candidate is not None and (self.worst is None or candidate[1].ratio > self.worst[1].ratio):
            self.worst = candidate

    compile_seconds: float = 0.0  # shape classes compiled up front (before the campaign's own time)
    shape_classes: int | None = None  # size of the shape pool (None: shapes drawn freely)
    workers: int = 1
    worker_errors: list[str] = field(default_factory=list)  # workers that ended without a report

    @property
    def seconds(self) -> float:
        """Wall-clock time of the whole campaign, compilation included."""
        return self.elapsed + self.compile_seconds

    @property
    def worst_failed(self) -> bool:
        """Whether ``worst`` is a failing property's minimal example (compared by value: a worker's
        report arrives pickled)."""
        w = self.worst
        return w is not None and any(
            r.name == w[0] and r.failure is not None and r.failure.measurement == w[1] for r in self.failures
        )

    def describe_worst(self) -> str:
        """``0.0152 of bound (error_growth)``, ``6.8e+04 of bound (matches_reference, failed)`` or ``-``."""
        w = self.worst
        if w is None:
            return "-"
        return f"{w[1].ratio:.3g} of bound ({w[0]}{', failed' if self.worst_failed else ''})"

    def status_line(self, now_running: str) -> str:
        return (
            f"[fuzz] {format_seconds(self.elapsed)}/{format_seconds(self.budget)}  cases {self.cases}"
            f"  worst {self.describe_worst()}  failures {len(self.failures)}  now {now_running}"
        )


def _counting(prop: Property, report: FuzzReport) -> Property:
    """``prop`` with its check counting cases and noting the first failing one."""

    def check(impl, problem, params):
        report.cases += 1
        try:
            return prop.check(impl, problem, params)
        except (AssertionError, ArithmeticError, ValueError, RuntimeError):
            if report.first_failure_case is None:
                report.first_failure_case = report.cases
            raise

    return Property(prop.name, prop.summary, prop.strategy, check, prop.max_examples, prop.unsupported_by, prop.form)


def _database(database: Path | str, slug: str, prop: str) -> str:
    """A directory per implementation and property; a Redis database keys its entries itself."""
    return str(database) if str(database).startswith("redis://") else str(Path(database) / slug / prop)


def run_fuzz(
    impl: Implementation,
    properties: list[Property],
    seconds: float,
    *,
    seed: int | None = None,
    database: Path | str = DATABASE_DIR,
    cases_dir: Path = CASES_DIR,
    progress: Callable[[FuzzReport, str], None] | None = None,
    on_result: Callable[[PropertyResult], None] | None = None,
    on_round: Callable[[FuzzReport], None] | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
) -> FuzzReport:
    """Run a campaign of ``seconds`` (its deadline: see the module's docstring); ``progress(report,
    property)`` after each example, ``on_result`` for each property that does not pass or turns out
    unsupported (as soon as it does), ``on_round`` after each property run (to save partial
    results); ``timeout`` per kernel call (runners.guard)."""
    report = FuzzReport(budget=seconds)
    guard = Guard(timeout)
    start = time.monotonic()
    remaining = [_counting(p, report) for p in properties]
    names = [p.name for p in properties]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", impl.name)
    longest: dict[str, float] = {}  # the longest one example of each property took, its drawing included
    tick = [start]  # when the example now running began

    def on_example(name: str, examples: int, worst: Measurement | None) -> None:
        now = time.monotonic()
        longest[name] = max(longest.get(name, 0.0), now - tick[0])
        tick[0] = now
        report.note_worst(None if worst is None else (name, worst))
        report.elapsed = now - start
        if progress is not None:
            progress(report, name)

    per_example: dict[str, float] = {}
    try:
        ran = True
        while remaining and ran:
            ran = False
            for prop in list(remaining):
                left = seconds - (time.monotonic() - start)
                # Room for one more example as long as the longest this property has taken: none starts
                # that would end past the budget. One not yet timed gets its first look while any time
                # is left (every property is visited early, however short the budget).
                reserve = longest.get(prop.name, 0.0)
                if left <= reserve:
                    continue  # a quicker property may still fit
                share = left / len(remaining)
                n = FIRST_ROUND_EXAMPLES if prop.name not in per_example else int(share / per_example[prop.name])
                n = max(1, min(n, MAX_EXAMPLES_PER_CALL))
                # One database directory per implementation and property: Hypothesis keys saved examples
                # by the test function's source, which run_property shares across properties.
                round_seed = None if seed is None else seed + 7919 * report.rounds + names.index(prop.name)
                run = RunSettings(
                    max_examples=n,
                    seed=round_seed,
                    database=_database(database, slug, prop.name),
                    cases_dir=cases_dir,
                    timeout=guard.timeout,
                    deadline=start + seconds - reserve,
                )
                tick[0] = time.monotonic()
                result = run_property(prop, impl, run, progress=on_example, guard=guard)
                ran = True
                per_example[prop.name] = result.seconds / max(result.examples, 1)
                report.merge(result)
                if result.failure is not None and result.failure.measurement is not None:
                    report.note_worst((prop.name, result.failure.measurement))  # the worst over all includes it
                if result.status != "passed":
                    remaining.remove(prop)
                    (report.failures if result.status in NOT_PASSED else report.unsupported).append(result)
                    if on_result is not None:
                        on_result(result)
                if on_round is not None:
                    on_round(report)
                if result.status == "misuse":
                    remaining.clear()  # every other property would fail alike
                    break
            report.rounds += int(ran)
    finally:
        guard.close()
        processes.shutdown()  # the oracles' worker processes: their stopping is part of the campaign's time
    report.elapsed = time.monotonic() - start
    return report


def merge_reports(reports: list[FuzzReport]) -> FuzzReport:
    """One report for campaigns run side by side (workers): cases add up, times are the longest."""
    merged = FuzzReport(workers=len(reports))
    for r in reports:
        merged.cases += r.cases
        merged.rounds = max(merged.rounds, r.rounds)
        merged.elapsed = max(merged.elapsed, r.elapsed)
        merged.budget = max(merged.budget, r.budget)
        merged.compile_seconds = max(merged.compile_seconds, r.compile_seconds)
        if r.shape_classes is not None:
            merged.shape_classes = max(merged.shape_classes or 0, r.shape_classes)
        merged.note_worst(r.worst)
        merged.failures += r.failures
        merged.unsupported += [u for u in r.unsupported if u.name not in {x.name for x in merged.unsupported}]
        merged.worker_errors += r.worker_errors
        merged.properties.update(r.properties)  # shards run disjoint properties
    return merged
