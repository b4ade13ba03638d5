"""The check runner: drive each property with Hypothesis and collect a verdict per property.

``run_check`` returns one :class:`PropertyResult` per property: ``passed``, ``failed`` (with
the minimal, shrunk example saved as a replayable ``.npz`` case) or ``unsupported`` (the
implementation raised ``NotImplementedError`` on every example).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import hypothesis
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import Unsatisfiable

from gdn_verify.implementations import ConfigurationError, Implementation
from gdn_verify.problem import Problem
from properties.checks import PROPERTIES, Measurement, Property, Violation
from properties.strategies import only_head_dims

CASES_DIR = Path(".gdn_verify") / "cases"


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


    def as_dict(self) -> dict:
        d = dict(name=self.name, status=self.status, examples=self.examples, unsupported=self.unsupported,
                 seconds=round(self.seconds, 2), note=self.note)
        if self.worst is not None:
            d["worst"] = dict(error=self.worst.error, bound=self.worst.bound, detail=self.worst.detail,
                              uniform_bound=self.worst.uniform)
        if self.explained is not None:
            d["above_uniform"] = dict(examples=self.above_uniform, note=self.explained.note)
        if self.failure is not None:
            d["failure"] = dict(message=self.failure.message, problem=self.failure.problem.describe(),
                                params=self.failure.params,
                                case=str(self.failure.case_path) if self.failure.case_path else None)
        return d


@dataclass
class CheckOptions:
    dtype: str
    max_examples: int | None = None  # None: each property's default
    seed: int | None = None
    database: str | None = None  # directory of Hypothesis's example database (None: no database)
    cases_dir: Path = field(default_factory=lambda: CASES_DIR)
    max_tokens: int = 2048  # longest T for error_growth
    head_dims: tuple[int, ...] | None = None  # K and V drawn only from these (None: every size)


def parse_head_dims(text: str | None) -> tuple[int, ...] | None:
    """``--dims 64,128`` as ``(64, 128)``; :class:`ConfigurationError` otherwise."""
    if text is None:
        return None
    try:
        dims = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise ConfigurationError(f"--dims {text!r}: expected comma-separated head sizes such as 64,128") from None
    if not dims or min(dims) < 1:
        raise ConfigurationError(f"--dims {text!r}: expected positive head sizes such as 64,128")
    return dims


def strategy_for(prop: Property, impl: Implementation, options: CheckOptions):
    if prop.name == "error_growth":
        from properties.checks import strategy_growth

        return strategy_growth(impl, options.dtype, options.max_tokens)
    return prop.strategy(impl, options.dtype)


def save_case(failure: Failure, prop: str, impl: Implementation, options: CheckOptions) -> Path:
    digest = hashlib.sha1(repr((prop, impl.name, failure.problem.describe(), failure.params)).encode()).hexdigest()
    path = options.cases_dir / f"{prop}-{digest[:10]}.npz"
    return failure.problem.save(path, property=prop, impl=impl.name, params=failure.params, message=failure.message,
                                dtype=options.dtype)


def run_property(prop: Property, impl: Implementation, options: CheckOptions,
                 progress: Callable[[str, int, Measurement | None], None] | None = None) -> PropertyResult:
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

    n = options.max_examples if options.max_examples is not None else prop.max_examples
    config = settings(
        max_examples=n, deadline=None, database=None if options.database is None else
        hypothesis.database.DirectoryBasedExampleDatabase(options.database),
        suppress_health_check=list(HealthCheck), verbosity=hypothesis.Verbosity.quiet, print_blob=False,
        report_multiple_bugs=False, phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    )
    wrapped = config(hypothesis.given(strategy_for(prop, impl, options))(test))
    if options.seed is not None and options.database is None:
        # Hypothesis ignores its database under a fixed seed, so a database wins over a seed.
        wrapped = hypothesis.seed(options.seed)(wrapped)
    # Hypothesis keys saved examples on the test's source; every property shares `test`, so
    # give each (property, implementation) its own key.
    wrapped.hypothesis.inner_test._hypothesis_internal_add_digest = f"{prop.name}/{impl.name}".encode()
    try:
        with only_head_dims(options.head_dims):
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
        result.failure.case_path = save_case(result.failure, prop.name, impl, options)
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


def run_check(impl: Implementation, properties: list[str], options: CheckOptions,
              progress: Callable[[str, int, Measurement | None], None] | None = None,
              on_result: Callable[[PropertyResult], None] | None = None) -> list[PropertyResult]:
    results = []
    for name in properties:
        result = run_property(PROPERTIES[name], impl, options, progress)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def replay(path: str | Path, impl: Implementation, prop_name: str | None = None) -> tuple[str, Measurement | None]:
    """Rerun a saved case: ``("passed" | "failed: message" | "unsupported", measurement)``."""
    problem, meta = Problem.load(path)
    name = prop_name or meta.get("property", "matches_reference")
    if name not in PROPERTIES:
        raise ValueError(f"unknown property {name!r} in case {path}")
    try:
        m = PROPERTIES[name].check(impl, problem, meta.get("params", {}))
    except NotImplementedError as exc:
        return f"unsupported ({exc})", None
    except Violation as exc:
        return f"failed: {exc}", exc.measurement
    return "passed", m
