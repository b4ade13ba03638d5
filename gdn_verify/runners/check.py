"""The check runner: drive properties with Hypothesis and collect a verdict per property.

:func:`run_property` returns a :class:`PropertyResult` whose ``status`` is one of
:data:`STATUSES`: ``passed``; ``failed`` (a violation, with the minimal, shrunk example saved as
a replayable ``.npz`` case); ``unsupported`` (the property does not apply, the implementation
lacks a keyword it needs, or it raised ``NotImplementedError`` on every example; examples dropped
so are counted per reason); ``timeout`` (a kernel call
overran the limit of ``gdn_verify.runners.guard``; the example that hung is saved, nothing is
shrunk); ``error`` (the kernel raised: shrunk like a failure, with the kernel's own traceback; a sticky
CUDA error, :func:`device_lost`, is not shrunk and ends the run);
``misuse`` (the kernel cannot take the arguments: :func:`run_check` stops there). An exception
raised by the implementation's library's own code is reported as its refusal ("fla refused: ...",
status ``error``). Every call's backend is recorded (``PropertyResult.backends``); with
``RunSettings.backend`` an example whose calls ran elsewhere fails ("ran on triton, not flash_qla
(fallback)"). Each example
has one of the same statuses (``PropertyResult.example_counts``). Warnings raised while a
property runs are counted, never shown one by one. Properties arrive as objects
(``gdn_verify.properties.catalogue``); progress is reported through a callback.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import Unsatisfiable

from gdn_verify.core import backends, processes, timing
from gdn_verify.core.implementation import BACKWARD_FORM, Implementation
from gdn_verify.core.problem import Problem
from gdn_verify.core.property import Measurement, Property, Violation
from gdn_verify.runners import causes, grad_causes
from gdn_verify.runners.guard import DEFAULT_TIMEOUT, Guard, KernelTimeout, abandoned_calls

CASES_DIR = Path(".gdn_verify") / "cases"
CAUSES = "causes"  # timing label: the experiments that name a failure's cause
SPLIT_LABELS = (timing.KERNEL, timing.ORACLE, CAUSES)

Progress = Callable[[str, int, "Measurement | None"], None]  # (property, examples so far, worst so far)

STATUSES = ("passed", "failed", "unsupported", "timeout", "error", "misuse")
NOT_PASSED = ("failed", "timeout", "error", "misuse")  # verdicts against the implementation (exit 1; misuse 2)


@dataclass
class Failure:
    """The example a property did not pass on: ``status`` failed, timeout, error or misuse."""

    message: str
    problem: Problem | None  # None where no problem can be kept (a scale case: its description says it)
    params: dict
    measurement: Measurement | None
    case_path: Path | None = None
    status: str = "failed"
    traceback: str | None = None  # the kernel's own traceback (status error)
    cause: str = ""  # likely cause named by gdn_verify.runners.causes ("" when none is identified)
    cause_model: str = ""  # the error model behind ``cause`` (its name in causes.MODELS)
    cause_alike: tuple[str, ...] = ()  # models as exact as cause_model on this example (``cause`` names them too)
    kind: str = ""  # "logic error" or "precision loss" (a numeric failure against the oracle)
    description: str = ""  # the example in words, where ``problem`` is None
    fallback: bool = False  # ran on another backend than RunSettings.backend (no numeric cause to name)

    def describe(self) -> str:
        return self.description if self.problem is None else self.problem.describe()

    @property
    def named_causes(self) -> tuple[str, ...]:
        """The error models the named cause stands for: ``cause_model`` and the models that reproduce
        the example as exactly (``cause_alike``); empty when none is named."""
        return (self.cause_model, *self.cause_alike) if self.cause_model else ()


class _Stop(BaseException):
    """Ends a property's Hypothesis run at once (misuse, or a lost GPU context: every further call
    would fail alike)."""


# CUDA's sticky errors: after one, every call in the process fails, whatever its inputs, so a
# property shrinking its example or a later property would only report the same dead context.
STICKY_DEVICE_ERRORS = (
    "illegal memory access",
    "illegal address",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction",
    "device-side assert",
    "hardware stack error",
    "invalid program counter",
    "cudaErrorIllegalAddress",
    "cudaErrorLaunchFailure",
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_FAILED",
)
CONTEXT_LOST = (
    "; the GPU context is lost (a sticky CUDA error: every later call of this process fails alike), "
    "so this is the first example that raised it, not shrunk, and the run stops here"
)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it was raised from or while handling, each once."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        stack += [e.__cause__, e.__context__]


def device_lost(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is one of CUDA's sticky errors."""
    texts = (f"{type(e).__name__}: {e}".lower() for e in _chain(exc))
    return any(s.lower() in text for text in texts for s in STICKY_DEVICE_ERRORS)


class _OutOfTime(BaseException):
    """Ends a property's Hypothesis run at ``RunSettings.deadline``; a ``BaseException`` so that
    Hypothesis stops at once rather than treating it as a failure to shrink."""


@dataclass
class PropertyResult:
    name: str
    status: str  # one of STATUSES
    examples: int = 0
    unsupported: int = 0
    unsupported_reasons: dict[str, int] = field(default_factory=dict)  # examples dropped, per reason
    worst: Measurement | None = None
    failure: Failure | None = None
    seconds: float = 0.0
    note: str = ""
    above_uniform: int = 0  # examples within the algorithm-aware bound but above the uniform one
    explained: Measurement | None = None  # the one of those furthest above the uniform bound
    # per part of a measurement with parts (a backward's gradients): the (error, bound) of the
    # example where that part came closest to its bound, which need not be the worst example
    worst_parts: dict[str, tuple[float, float]] = field(default_factory=dict)
    example_counts: dict[str, int] = field(default_factory=dict)  # examples by status
    warnings: int = 0  # warnings raised while the property ran (the kernel's, mostly)
    warning: str = ""  # one line: the most frequent of them and where it was raised
    # Seconds by where they went (gdn_verify.core.timing): "kernel" (inside the implementation's
    # calls), "oracle" (our float64 oracle and tolerance model), "causes" (naming a failure's
    # cause) and "ours" (the rest: Hypothesis, strategies, comparisons); they add up to ``seconds``.
    split: dict[str, float] = field(default_factory=dict)
    context_lost: bool = False  # the kernel left the GPU context broken (run_check stops after it)
    # check --all-configs (gdn_verify.runners.configs): the autotuned kernel pinned to one config
    # while the property ran: {"kernel": name, "config": "BV=32, num_warps=4, num_stages=2", "index": i}
    config: dict[str, Any] | None = None
    backends: backends.Tally = field(default_factory=backends.Tally)  # the backend each call ran on

    @property
    def label(self) -> str:
        """The property's name, and under ``--all-configs`` the kernel and config it ran under:
        ``matches_reference chunk_fwd_kernel_o[BV=32, num_warps=4, num_stages=2]``."""
        if self.config is None:
            return self.name
        return f"{self.name} {self.config['kernel']}[{self.config['config']}]"

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = dict(
            name=self.name,
            status=self.status,
            examples=self.examples,
            examples_by_status=dict(self.example_counts),
            unsupported=self.unsupported,
            unsupported_reasons=dict(self.unsupported_reasons),
            seconds=round(self.seconds, 2),
            split={label: round(t, 2) for label, t in self.split.items()},
            note=self.note,
        )
        if self.config is not None:
            d["config"] = dict(self.config)
        if self.warnings:
            d["warnings"] = dict(count=self.warnings, summary=self.warning)
        if self.backends.calls:
            d["backend"] = self.backends.as_dict()
        if self.worst is not None:
            d["worst"] = dict(
                error=self.worst.error,
                bound=self.worst.bound,
                detail=self.worst.detail,
                uniform_bound=self.worst.uniform,
            )
        if self.worst_parts:
            d["worst_by_part"] = {
                n: dict(error=e, bound=b, ratio=Measurement.ratio_of(e, b)) for n, (e, b) in self.worst_parts.items()
            }
        if self.explained is not None:
            d["above_uniform"] = dict(examples=self.above_uniform, note=self.explained.note)
        if self.failure is not None:
            d["failure"] = dict(
                status=self.failure.status,
                message=self.failure.message,
                problem=self.failure.describe(),
                params=self.failure.params,
                case=str(self.failure.case_path.resolve()) if self.failure.case_path else None,
                traceback=self.failure.traceback,
                cause=self.failure.cause,
                cause_model=self.failure.cause_model,
                cause_alike=list(self.failure.cause_alike),
                kind=self.failure.kind,
            )
        return d


@dataclass
class RunSettings:
    """How Hypothesis runs a property (what it draws is the property's own configuration)."""

    max_examples: int | None = None  # None: each property's default
    seed: int | None = None
    database: str | None = None  # example database: a directory or redis://host:port/db (None: none)
    cases_dir: Path = field(default_factory=lambda: CASES_DIR)
    timeout: float | None = DEFAULT_TIMEOUT  # seconds per kernel call (see runners.guard); None: none
    # time.monotonic() after which no further example starts (a fuzz budget); the property's verdict
    # is then that of the examples run so far. A failure being shrunk is finished regardless.
    deadline: float | None = None
    backend: str | None = None  # every call must run on this backend (gdn_verify.core.backends.BACKENDS)


def example_database(location: str) -> hypothesis.database.ExampleDatabase:
    """Hypothesis's example database at ``location``: a directory, or ``redis://host:port/db`` (shared
    by several hosts; Hypothesis's ``RedisExampleDatabase``, which needs the ``redis`` package)."""
    if not location.startswith("redis://"):
        return hypothesis.database.DirectoryBasedExampleDatabase(location)
    import redis  # only for this: not a dependency of the toolkit
    from hypothesis.extra.redis import RedisExampleDatabase

    return RedisExampleDatabase(redis.Redis.from_url(location))


def save_case(failure: Failure, prop: str, impl: Implementation, cases_dir: Path) -> Path:
    problem = failure.problem
    assert problem is not None  # a property's failures keep their problem
    digest = hashlib.sha1(repr((prop, impl.name, problem.describe(), failure.params)).encode()).hexdigest()
    path = cases_dir / f"{prop}-{digest[:10]}.npz"
    return problem.save(
        path,
        property=prop,
        impl=impl.name,
        array=impl.array,
        params=failure.params,
        message=failure.message,
        dtype=problem.dtype.name,
    )


class _WarningCounter:
    """Counts warnings by (category, message, place) instead of printing them (a kernel's NumPy
    RuntimeWarnings printed 610 lines in a 15 s fuzz)."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str, str]] = Counter()

    def __call__(self, message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
        self.counts[
            (category.__name__, str(message).splitlines()[0][:100], f"{os.path.basename(filename)}:{lineno}")
        ] += 1

    def summary(self) -> str:
        if not self.counts:
            return ""
        (category, message, place), n = self.counts.most_common(1)[0]
        total, others = sum(self.counts.values()), len(self.counts) - 1
        text = f"{total} warning{'s' * (total > 1)}: {n}x {category}: {message} ({place})"
        return text + (f", {others} other kind{'s' * (others > 1)}" if others else "")


def _interrupted(exc: BaseException) -> bool:
    """Whether a Ctrl-C lies behind ``exc``.

    A KeyboardInterrupt that lands inside Hypothesis's engine (or a kernel library's handler) can
    come out as another exception raised while handling it, e.g. Hypothesis's internal
    ``AssertionError``; it is still the user's interruption, not a property failure.
    """
    return any(isinstance(e, KeyboardInterrupt) for e in _chain(exc))


def run_property(
    prop: Property,
    impl: Implementation,
    run: RunSettings,
    progress: Progress | None = None,
    guard: Guard | None = None,
) -> PropertyResult:
    """Run one property; ``progress(name, examples_so_far, worst)`` is called after each example.

    ``guard``: the run's :class:`~gdn_verify.runners.guard.Guard` (one that remembers which shapes
    have compiled); by default a fresh one with ``run.timeout``.
    """
    result = PropertyResult(prop.name, "passed")
    reason = prop.unsupported_by(impl)
    if reason is not None:
        result.status, result.note = "unsupported", reason
        return result
    own_guard = guard is None
    guard = guard if guard is not None else Guard(run.timeout)
    called = guard.guarded(impl)
    failures: list[Failure] = []
    counts: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    start, clock = time.perf_counter(), timing.snapshot()
    first_call = len(guard.calls)

    def test(case):
        if run.deadline is not None and result.examples and not failures and time.monotonic() >= run.deadline:
            raise _OutOfTime
        problem, params = case
        problem = impl.as_called(problem, params)  # the gates a raw-gate kernel computes (the oracle's too)
        result.examples += 1
        calls_before = len(guard.calls)
        try:
            m = prop.check(called, problem, params)
        except NotImplementedError as exc:
            counts["unsupported"] += 1
            result.unsupported += 1
            reasons[str(exc) or "raised NotImplementedError"] += 1
            hypothesis.reject()
        except KernelTimeout as exc:
            counts["timeout"] += 1
            note = str(exc)
            if abandoned_calls():
                note += "; the call still runs in an abandoned thread (the process may need to exit to free the device)"
            failures.append(Failure(note, problem, params, None, status="timeout"))
            raise
        except Violation as exc:
            counts["failed"] += 1
            failures.append(Failure(str(exc), problem, params, exc.measurement))
            raise
        except Exception as exc:
            if _interrupted(exc):
                raise KeyboardInterrupt from exc
            origin = guard.origin(exc)
            refused = None if origin is None else guard.refusal(origin, impl)
            message = refused or f"raised {type(exc).__name__}: {exc}"
            if origin is not None and guard.is_misuse(origin):
                counts["misuse"] += 1
                failures.append(
                    Failure(f"the kernel cannot take the arguments: {exc}", problem, params, None, status="misuse")
                )
                raise _Stop from None
            status = "failed" if origin is None else "error"  # raised by the kernel, not by a check
            counts[status] += 1
            lost = device_lost(exc)
            failures.append(
                Failure(
                    message + (CONTEXT_LOST if lost else ""),
                    problem,
                    params,
                    None,
                    status=status,
                    traceback=guard.kernel_traceback(exc),
                )
            )
            if lost:
                result.context_lost = True
                raise _Stop from None
            raise
        if run.backend is not None:  # every call of the example must have run there
            elsewhere = [r for r in guard.calls[calls_before:] if not r.ran_on(run.backend)]
            if elsewhere:
                counts["failed"] += 1
                failures.append(Failure(elsewhere[0].mismatch(run.backend), problem, params, None, fallback=True))
                raise Violation(failures[-1].message)
        counts["passed"] += 1
        if result.worst is None or m.ratio > result.worst.ratio:
            result.worst = m
        for part, (e, b) in m.parts.items():
            kept = result.worst_parts.get(part)
            if kept is None or Measurement.ratio_of(e, b) > Measurement.ratio_of(*kept):
                result.worst_parts[part] = (e, b)
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
    counter = _WarningCounter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")  # count every occurrence, not the first per place
            warnings.showwarning = counter
            with contextlib.suppress(_OutOfTime):  # a verdict on the examples run so far
                wrapped()
    except Unsatisfiable:
        result.status = "unsupported"
        result.note = f"unsupported on every example: {_reasons(reasons)}"
    except (KernelTimeout, _Stop):  # stopped at once: the example that hung, misused or lost the context
        result.failure = failures[-1]
        result.status = result.failure.status
        if result.status == "timeout" or result.context_lost:
            result.failure.case_path = save_case(result.failure, prop.name, impl, run.cases_dir)
    except Exception as exc:  # noqa: BLE001 - the failure itself was recorded by the test
        if _interrupted(exc):
            raise KeyboardInterrupt from exc
        if not failures:
            raise
        # Hypothesis replays the minimal example last, so the last failure is the shrunk one.
        result.failure = failures[-1]
        result.status = result.failure.status
        # The worst error is the failure's (none for a non-numeric one), not the passing examples'.
        result.worst = result.failure.measurement
        f = result.failure  # named cause: short experiments on the minimal example, confirmed on others
        if f.status == "failed" and f.problem is not None and not f.fallback:
            with timing.timed(CAUSES):
                cause = name_cause(
                    impl, prop, f.problem, f.params, f.message, f.measurement, _before_shrinking(failures)
                )
            f.cause, f.cause_model, f.cause_alike, f.kind = cause.text, cause.model, cause.alike, cause.kind
        result.failure.case_path = save_case(result.failure, prop.name, impl, run.cases_dir)
    else:
        if result.examples and result.unsupported == result.examples:
            result.status = "unsupported"
            result.note = f"unsupported on every example: {_reasons(reasons)}"
        elif result.unsupported:
            result.note = f"{result.unsupported} of {result.examples} examples unsupported ({_reasons(reasons)})"
            if any(reason.startswith("needs ") for reason in reasons):  # a keyword the signature lacks
                result.note += OPTIONAL_KEYWORD
        if result.status == "passed" and result.explained is not None:
            note = f"{result.above_uniform} of {result.examples} examples {result.explained.note}"
            result.note = f"{result.note}; {note}" if result.note else note
    finally:
        if own_guard:
            guard.close()
        result.backends.add(guard.calls[first_call:])
        del guard.calls[first_call:]  # tallied: a long run keeps no per-call record
    result.example_counts = {s: counts[s] for s in STATUSES if counts[s]}
    result.unsupported_reasons = dict(reasons.most_common())
    result.warnings, result.warning = sum(counter.counts.values()), counter.summary()
    result.seconds = time.perf_counter() - start
    result.split = time_split(result.seconds, timing.since(clock))
    return result


def name_cause(
    impl: Implementation,
    prop: Property,
    problem: Problem,
    params: dict,
    message: str,
    measurement: Measurement | None,
    others: list[tuple[Problem, dict]] | None = None,
) -> causes.Cause:
    """The likely cause of ``prop``'s failure on ``problem``: the gradient models
    (``grad_causes``) for a backward property, the forward's (``causes``) otherwise."""
    if prop.form == BACKWARD_FORM:
        return grad_causes.explain(impl, problem, params, measurement)
    return causes.explain(impl, problem, params, prop.name, message, measurement, prop.form, others or ())


def time_split(seconds: float, labelled: dict[str, float]) -> dict[str, float]:
    """``labelled`` (kernel, oracle, causes) in their order, and ``ours``: what is left of ``seconds``."""
    split = {label: labelled[label] for label in SPLIT_LABELS if labelled.get(label)}
    split["ours"] = max(seconds - sum(labelled.values()), 0.0)
    return split


# Said after the count of examples dropped for a keyword the kernel's signature lacks
# (state_v_first, FLA's in-kernel gate options): not a failure, and how to have them checked.
OPTIONAL_KEYWORD = ": optional FLA keywords, the other examples ran; take them in the signature to have them checked"


def _reasons(reasons: Counter[str]) -> str:
    """``needs state_v_first=: 12, raised NotImplementedError: 1``: why examples were unsupported."""
    return ", ".join(f"{reason}: {n}" for reason, n in reasons.most_common()) or "no reason given"


def _before_shrinking(failures: list[Failure], count: int = 2) -> list[tuple[Problem, dict]]:
    """Up to ``count`` failing examples met before the minimal one, each with its own params: the
    first (as drawn) and one halfway through the shrinking, for a cause to be confirmed on."""
    earlier = [(f.problem, f.params) for f in failures[:-1] if f.status == "failed" and f.problem is not None]
    picks = sorted({0, len(earlier) // 2}) if earlier else []
    return [earlier[i] for i in picks][:count]


def run_check(
    impl: Implementation,
    properties: list[Property],
    run: RunSettings,
    progress: Progress | None = None,
    on_result: Callable[[PropertyResult], None] | None = None,
) -> list[PropertyResult]:
    """Run each property in turn; ``on_result`` sees each verdict as soon as it is known.

    One guard serves the whole run (shapes compiled once are not given the compile allowance
    again); a ``misuse`` verdict or a lost GPU context (``PropertyResult.context_lost``) ends the
    run, since every further property would fail alike: the properties not run are the ones after
    the last result.
    """
    results = []
    guard = Guard(run.timeout)
    try:
        for prop in properties:
            result = run_property(prop, impl, run, progress, guard)
            results.append(result)
            if on_result is not None:
                on_result(result)
            if result.status == "misuse" or result.context_lost:
                break
    finally:
        guard.close()
        processes.shutdown()  # the oracles' worker processes, started on first use (core.processes)
    return results


@dataclass
class Replay:
    """What rerunning a saved case gave: ``passed``, ``failed`` (with the message and, as ``check``
    names it, the likely cause) or ``unsupported``."""

    status: str
    message: str
    measurement: Measurement | None
    cause: str = ""
    kind: str = ""


def replay(problem: Problem, params: dict, impl: Implementation, prop: Property) -> Replay:
    """Rerun ``prop`` on one saved case; an exception the kernel raised is a failure saying so, as in
    :func:`run_property` (a Ctrl-C still stops)."""
    problem = impl.as_called(problem, params)
    try:
        m = prop.check(impl, problem, params)
    except NotImplementedError as exc:
        return Replay("unsupported", str(exc), None)
    except Violation as exc:
        cause = name_cause(impl, prop, problem, params, str(exc), exc.measurement)
        return Replay("failed", str(exc), exc.measurement, cause.text, cause.kind)
    except Exception as exc:
        if _interrupted(exc):
            raise KeyboardInterrupt from exc
        return Replay("failed", f"raised {type(exc).__name__}: {exc}", None)
    return Replay("passed", "", m)
