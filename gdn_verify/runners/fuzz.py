"""``cli.py fuzz``: a long Hypothesis campaign, cycling over the properties until a time budget is spent.

Each round runs every remaining property through ``check.run_property`` with
as many examples as the remaining time allows (estimated from the previous round), so a round
overruns the budget by at most about one property's share. The example database is persistent
(default ``.gdn_verify/hypothesis``), one directory per implementation and property, so a
failure found once is replayed first the next time. Rounds draw fresh random examples; a fixed
``seed`` makes the campaign reproducible instead, but ``hypothesis.seed`` switches the database off.
A failing property is reported (shrunk case saved as ``.npz`` plus a replay command) and dropped from later rounds.

On an implementation taking GPU arrays, ``matches_reference`` and ``gate_extremes`` draw large
problems (``gdn_verify.properties.large``) checked against the ``cupy-oracle`` float64 GPU oracle.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from gdn_verify import implementations
from gdn_verify.runners.check import CASES_DIR, CheckOptions, run_property
from gdn_verify.implementations import ConfigurationError, Implementation
from gdn_verify.core.problem import DTYPES, Problem
from gdn_verify.properties import large
from gdn_verify.properties.native import PROPERTIES, Measurement, Property, Violation

DATABASE_DIR = Path(".gdn_verify") / "hypothesis"
# Two examples per property in the first round: every property is visited early even for a
# kernel that compiles per shape (FLA's chunked kernels took 20-40 s a case on an H100, where
# five each covered 3 of 14 properties in 10 minutes). Hypothesis starts every run with its
# simplest example, so the second is the first that says what a case costs.
FIRST_ROUND_EXAMPLES = 2
MAX_EXAMPLES_PER_CALL = 2000
_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_budget(text: str) -> float:
    """Seconds in ``"90s"``, ``"30m"``, ``"1h"`` or ``"1.5h"``; :class:`ConfigurationError` otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh])\s*", str(text))
    if not match:
        raise ConfigurationError(f"--budget {text!r}: expected a number with a unit s, m or h (90s, 30m, 1h)")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not seconds > 0:
        raise ConfigurationError(f"--budget {text!r}: must be positive")
    return seconds


@dataclass
class FuzzFailure:
    prop: str
    message: str
    case_path: Path | None
    problem: str


@dataclass
class FuzzReport:
    cases: int = 0
    rounds: int = 0
    elapsed: float = 0.0
    worst: tuple[str, Measurement] | None = None
    failures: list[FuzzFailure] = field(default_factory=list)
    first_failure_case: int | None = None  # campaign-wide case number of the first failing case


class _Counting:
    """Wraps a property's check to count cases and note the first failing one."""

    def __init__(self, report: FuzzReport):
        self.report = report

    def wrap(self, prop: Property) -> Property:
        def check(impl, problem, params):
            self.report.cases += 1
            try:
                return prop.check(impl, problem, params)
            except (Violation, AssertionError, ArithmeticError, ValueError, RuntimeError):
                if self.report.first_failure_case is None:
                    self.report.first_failure_case = self.report.cases
                raise

        return Property(prop.name, prop.summary, prop.strategy, check, prop.max_examples)


def _format_seconds(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


class _ProgressLine:
    """``[fuzz] elapsed/budget  cases  worst  failures`` on stderr: rewritten on a terminal, else every 10 s."""

    def __init__(self, stream: TextIO, budget: float, start: float, report: FuzzReport):
        self.stream, self.budget, self.start, self.report = stream, budget, start, report
        self.live = hasattr(stream, "isatty") and stream.isatty()
        self.last = 0.0

    def update(self, name: str, examples: int, worst: Measurement | None, force: bool = False) -> None:
        if worst is not None and (self.report.worst is None or worst.ratio > self.report.worst[1].ratio):
            self.report.worst = (name, worst)
        now = time.monotonic()
        if not force and now - self.last < (0.2 if self.live else 10.0):
            return
        self.last = now
        w = self.report.worst
        worst_text = f"worst {w[1].ratio:.2g} of bound ({w[0]})" if w is not None else "worst -"
        line = (f"[fuzz] {_format_seconds(now - self.start)}/{_format_seconds(self.budget)}  cases {self.report.cases}"
                f"  {worst_text}  failures {len(self.report.failures)}  now {name}")
        self.stream.write(("\r" + line.ljust(110)) if self.live else line + "\n")
        self.stream.flush()


def _campaign_properties(impl: Implementation, names: list[str], report: FuzzReport, out: TextIO) -> list[Property]:
    """The properties to cycle, sized for the hardware, each wrapped to count cases."""
    sizes, oracle = large.CPU_SIZES, None
    if impl.array != "numpy":
        try:
            oracle = large.oracle_from(implementations.resolve("cupy-oracle"))
            sizes = large.GPU_SIZES
        except ConfigurationError as exc:
            print(f"fuzz: no GPU float64 oracle ({exc}); using the NumPy oracle and CPU sizes", file=out)
    counting = _Counting(report)
    return [counting.wrap(large.large_property(PROPERTIES[n], sizes, oracle)) for n in names]


def run_fuzz(impl_name: str, budget: str, dtype: str | None = None, database: str | None = None,
             cases: str | None = None, properties: str | None = None, max_tokens: int = 2048, seed: int | None = None,
             array: str | None = None, out: TextIO = sys.stdout, progress: TextIO = sys.stderr,
             head_dims: tuple[int, ...] | None = None) -> FuzzReport:
    """Run a campaign; raises :class:`ConfigurationError` on misuse. See :func:`main` for the exit code."""
    seconds = parse_budget(budget)
    impl = implementations.resolve(impl_name, array)
    dtype = dtype or impl.default_dtype
    if dtype not in DTYPES:
        raise ConfigurationError(f"--dtype {dtype!r}: choose from {', '.join(DTYPES)}")
    names = [n.strip() for n in (properties or ",".join(PROPERTIES)).split(",") if n.strip()]
    unknown = [n for n in names if n not in PROPERTIES]
    if unknown or not names:
        raise ConfigurationError(f"--properties: unknown {', '.join(unknown) or '(none)'}; choose from "
                                 f"{', '.join(PROPERTIES)}")
    if max_tokens < 64:
        raise ConfigurationError("--max-tokens must be at least 64")
    db_root = Path(database) if database is not None else DATABASE_DIR
    cases_dir = Path(cases) if cases is not None else CASES_DIR
    print(f"gdn-verify fuzz: impl={impl.name}, dtype={dtype}, budget {_format_seconds(seconds)}, "
          f"database {db_root}, {len(names)} properties", file=out, flush=True)
    if seed is not None:
        # hypothesis.seed() switches the example database off, so a seeded campaign neither
        # replays earlier failures nor records new ones.
        print(f"fuzz: --seed {seed} makes the run reproducible but Hypothesis then ignores the example database",
              file=out, flush=True)

    report = FuzzReport()
    start = time.monotonic()
    line = _ProgressLine(progress, seconds, start, report)
    remaining = _campaign_properties(impl, names, report, out)
    per_example: dict[str, float] = {}
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", impl.name)
    while remaining and time.monotonic() - start < seconds:
        for prop in list(remaining):
            left = seconds - (time.monotonic() - start)
            if left <= 0:
                break
            share = left / len(remaining)
            n = FIRST_ROUND_EXAMPLES if prop.name not in per_example else int(share / per_example[prop.name])
            n = max(1, min(n, MAX_EXAMPLES_PER_CALL))
            # One database directory per implementation and property: Hypothesis keys saved examples
            # by the test function's source, which run_property shares across properties.
            round_seed = None if seed is None else seed + 7919 * report.rounds + names.index(prop.name)
            options = CheckOptions(dtype=dtype, max_examples=n, seed=round_seed,
                                   database=str(db_root / slug / prop.name), cases_dir=cases_dir,
                                   max_tokens=max_tokens, head_dims=head_dims)
            result = run_property(prop, impl, options, progress=line.update)
            per_example[prop.name] = result.seconds / max(result.examples, 1)
            if result.status == "failed":
                remaining.remove(prop)
                f = result.failure
                report.failures.append(FuzzFailure(prop.name, f.message, f.case_path, f.problem.describe()))
                print(f"FAILED {prop.name}: {f.message}\n  minimal example: {f.problem.describe()}", file=out)
                if f.case_path is not None:
                    print(f"  replay: python cli.py replay {f.case_path} --impl {impl.name}", file=out, flush=True)
            elif result.status == "unsupported":
                remaining.remove(prop)
                print(f"  {prop.name}: unsupported ({result.note})", file=out, flush=True)
        report.rounds += 1
    report.elapsed = time.monotonic() - start
    line.update("done", report.cases, None, force=True)
    if line.live:
        progress.write("\n")
    w = report.worst
    print(f"fuzz done: {report.cases} cases in {report.rounds} rounds, {_format_seconds(report.elapsed)}; "
          f"worst {'-' if w is None else f'{w[1].ratio:.3g} of bound ({w[0]})'}; "
          f"{len(report.failures)} failures", file=out, flush=True)
    return report


def main(impl_name: str, budget: str, **kw) -> int:
    """``cli.py fuzz``: exit 0 when no property failed, 1 otherwise."""
    return 1 if run_fuzz(impl_name, budget, **kw).failures else 0


__all__ = ["parse_budget", "run_fuzz", "main", "FuzzReport", "Problem"]
