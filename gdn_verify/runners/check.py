"""The check runner: drive properties with Hypothesis and collect a verdict per property.

:func:`run_property` returns a :class:`PropertyResult`: ``passed``, ``failed`` (with the
minimal, shrunk example saved as a replayable ``.npz`` case) or ``unsupported`` (the property
does not apply, or the implementation raised ``NotImplementedError`` on every example).
Properties arrive as objects (``gdn_verify.properties.catalogue``); progress is reported through
a callback.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import Unsatisfiable

from gdn_verify.core.implementation import Implementation
from gdn_verify.core.problem import Problem
from gdn_verify.core.verdict import Measurement, Property, Violation

CASES_DIR = Path(".gdn_verify") / "cases"

Progress = Callable[[str, int, "Measurement | None"], None]  # (property, examples so far, worst so far)


@dataclass
class Failure:
    message: str
    problem: Problem
    params: dict
    measurement: Measurement | None
    case_path: Path | None = None


@dataclass
class PropertyResult:
    name: str
    status: str  # passed | failed | unsupported
    examples: int = 0
    unsupported: int = 0
    worst: Measurement | None = None
    failure: Failure | None = None
    seconds: float = 0.0
    note: str = ""
    above_uniform: int = 0  # examples within the algorithm-aware bound but above the uniform one
    explained: Measurement | None = None  # the one of those furthest above the uniform bound

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = dict(
            name=self.name,
            status=self.status,
            examples=self.examples,
            unsupported=self.unsupported,
            seconds=round(self.seconds, 2),
            note=self.note,
        )
        if self.worst is not None:
            d["worst"] = dict(
                error=self.worst.error,
                bound=self.worst.bound,
                detail=self.worst.detail,
                uniform_bound=self.worst.uniform,
            )
        if self.explained is not None:
            d["above_uniform"] = dict(examples=self.above_uniform, note=self.explained.note)
        if self.failure is not None:
            d["failure"] = dict(
                message=self.failure.message,
                problem=self.failure.problem.describe(),
                params=self.failure.params,
                case=str(self.failure.case_path.resolve()) if self.failure.case_path else None,
            )
        return d


@dataclass
class RunSettings:
    """How Hypothesis runs a property (what it draws is the property's own configuration)."""

    max_examples: int | None = None  # None: each property's default
    seed: int | None = None
    database: str | None = None  # example database: a directory or redis://host:port/db (None: none)
    cases_dir: Path = field(default_factory=lambda: CASES_DIR)


def example_database(location: str) -> hypothesis.database.ExampleDatabase:
    """Hypothesis's example database at ``location``: a directory, or ``redis://host:port/db`` (shared
    by several hosts; Hypothesis's ``RedisExampleDatabase``, which needs the ``redis`` package)."""
    if not location.startswith("redis://"):
        return hypothesis.database.DirectoryBasedExampleDatabase(location)
    import redis  # only for this: not a dependency of the toolkit
    from hypothesis.extra.redis import RedisExampleDatabase

    return RedisExampleDatabase(redis.Redis.from_url(location))


def save_case(failure: Failure, prop: str, impl: Implementation, cases_dir: Path) -> Path:
    digest = hashlib.sha1(repr((prop, impl.name, failure.problem.describe(), failure.params)).encode()).hexdigest()
    path = cases_dir / f"{prop}-{digest[:10]}.npz"
    return failure.problem.save(
        path,
        property=prop,
        impl=impl.name,
        array=impl.array,
        params=failure.params,
        message=failure.message,
        dtype=failure.problem.dtype.name,
    )


def run_property(
    prop: Property, impl: Implementation, run: RunSettings, progress: Progress | None = None
) -> PropertyResult:
    """Run one property; ``progress(name, examples_so_far, worst)`` is called after each example."""
    result = PropertyResult(prop.name, "passed")
    reason = prop.unsupported_by(impl)
    if reason is not None:
        result.status, result.note = "unsupported", reason
        return result
    failures: list[Failure] = []
    start = time.perf_counter()

    def test(case):
        problem, params = case
        result.examples += 1
        try:
            m = prop.check(impl, problem, params)
        except NotImplementedError:
            result.unsupported += 1
            hypothesis.reject()
        except Violation as exc:
            failures.append(Failure(str(exc), problem, params, exc.measurement))
            raise
        except Exception as exc:
            failures.append(Failure(f"raised {type(exc).__name__}: {exc}", problem, params, None))
            raise
        if result.worst is None or m.ratio > result.worst.ratio:
            result.worst = m
        if m.note:
            result.above_uniform += 1
            if result.explained is None or m.uniform_ratio > result.explained.uniform_ratio:
                result.explained = m
        if progress is not None:
            progress(prop.name, result.examples, result.worst)

    n = run.max_examples if run.max_examples is not None else prop.max_examples
    config = settings(
        max_examples=n,
        deadline=None,
        database=None if run.database is None else example_database(run.database),
        suppress_health_check=list(HealthCheck),
        verbosity=hypothesis.Verbosity.quiet,
        print_blob=False,
        report_multiple_bugs=False,
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    )
    wrapped = config(hypothesis.given(prop.strategy(impl))(test))
    if run.seed is not None and run.database is None:
        # Hypothesis ignores its database under a fixed seed, so a database wins over a seed.
        wrapped = hypothesis.seed(run.seed)(wrapped)
    # Hypothesis keys saved examples on the test's source; every property shares `test`, so
    # give each (property, implementation) its own key.
    wrapped.hypothesis.inner_test._hypothesis_internal_add_digest = f"{prop.name}/{impl.name}".encode()
    try:
        wrapped()
    except Unsatisfiable:
        result.status = "unsupported"
        result.note = "the implementation raised NotImplementedError on every example"
    except Exception:  # noqa: BLE001 - the failure itself was recorded by the test
        if not failures:
            raise
        result.status = "failed"
        # Hypothesis replays the minimal example last, so the last failure is the shrunk one.
        result.failure = failures[-1]
        if result.failure.measurement is not None:  # the worst error is the failure's, not the passing examples'
            result.worst = result.failure.measurement
        result.failure.case_path = save_case(result.failure, prop.name, impl, run.cases_dir)
    else:
        if result.examples and result.unsupported == result.examples:
            result.status = "unsupported"
            result.note = "the implementation raised NotImplementedError on every example"
        elif result.unsupported:
            result.note = f"{result.unsupported} of {result.examples} examples unsupported"
        if result.status == "passed" and result.explained is not None:
            note = f"{result.above_uniform} of {result.examples} examples {result.explained.note}"
            result.note = f"{result.note}; {note}" if result.note else note
    result.seconds = time.perf_counter() - start
    return result


def run_check(
    impl: Implementation,
    properties: list[Property],
    run: RunSettings,
    progress: Progress | None = None,
    on_result: Callable[[PropertyResult], None] | None = None,
) -> list[PropertyResult]:
    """Run each property in turn; ``on_result`` sees each verdict as soon as it is known."""
    results = []
    for prop in properties:
        result = run_property(prop, impl, run, progress)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


@dataclass
class Replay:
    """What rerunning a saved case gave: ``passed``, ``failed`` (with the message) or ``unsupported``."""

    status: str
    message: str
    measurement: Measurement | None


def replay(problem: Problem, params: dict, impl: Implementation, prop: Property) -> Replay:
    """Rerun ``prop`` on one saved case."""
    try:
        m = prop.check(impl, problem, params)
    except NotImplementedError as exc:
        return Replay("unsupported", str(exc), None)
    except Violation as exc:
        return Replay("failed", str(exc), exc.measurement)
    return Replay("passed", "", m)
