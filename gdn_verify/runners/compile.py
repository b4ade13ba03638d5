"""Compile-aware shape planning: learn what a new shape class costs, then compile a pool up front.

A JIT-compiled kernel (FLA's Triton kernels, FlashInfer's CuTe DSL ones) pays tens of seconds
the first time it meets a new :class:`~gdn_verify.core.shapes.ShapeClass`. :func:`plan_shapes`
times the first call of a new class against a repeat; when the difference exceeds
``EXPENSIVE_SECONDS`` (or the implementation declares itself JIT-compiled through
``Implementation.extra["compile_classes"]``), it compiles candidate classes in the order given,
as many as ``budget`` seconds allow, and returns them as the pool the strategies draw from.
Cheap implementations get no pool (``ShapePlan.classes is None``): full shape variety.

The classes past the probe compile in parallel worker processes (``runners.compile_workers``)
when the implementation can be re-created there by name: Triton's on-disk cache carries a class
compiled in a worker over to this process, which then warms each class (all its calls) cheaply,
so the budget bounds wall-clock time. A class of an implementation whose declared warm variants
compile apart (FlashQLA) is split into units of its warm calls (:func:`class_calls`,
:func:`unit_calls`), so a cold pool costs about the probe and its warm calls' seconds over the
workers; any other class is one unit, and a cold pool costs about the probe and its slowest
class. When the first such class is still expensive here (a library caching only in memory), the
rest compile in this process, as without workers.

A pool persists: :func:`save_plan` writes it, with each class's measured compile seconds (here
and in its worker), to one small JSON file per :class:`PlanKey` (implementation, version, device,
dtype, head sizes, gradients or not) under ``PLANS_DIR``; :func:`load_plan` reads it back (``None`` and a
note when there is none, or it is unreadable or for another key) and :func:`warm_plan` compiles
a stored pool again without probing or adding classes, which costs little in a warm cache.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gdn_verify.core import environment
from gdn_verify.core.gating import options_from_params
from gdn_verify.core.gradients import cotangents
from gdn_verify.core.implementation import BACKWARD_FORM, Implementation
from gdn_verify.core.problem import Problem
from gdn_verify.core.shapes import OPTION_CLASSES, ShapeClass, backward_variants, variants
from gdn_verify.runners.compile_workers import CompilePool, ImplSpec, Outcome, default_workers, error_text
from gdn_verify.runners.guard import KernelTimeout

# A new class costing more than this beyond a repeat call makes per-example shape variety
# unaffordable: 22 properties of 20-100 examples each would spend minutes compiling.
EXPENSIVE_SECONDS = 0.5
# A first call here costing more than this part of what compiling the class cost in a worker (or
# in the run that stored the plan) compiled it again: the cache did not carry over. Not the
# threshold alone: a class loaded from Triton's disk cache may still re-run its autotuning here.
CARRY_FRACTION = 0.5
# The probe times this many classes (a new class's cost: the second one's, free of one-off set-up).
PROBE_CLASSES = 2
# Fewer classes than this cannot cover GVA, K != V, an awkward size, varlen and batched, with and
# without an initial state and l2norm (see gdn_verify.properties.strategies.pool_candidates).
MIN_CLASSES = 4
# Stored pools, one JSON file per PlanKey, beside the case database (.gdn_verify/cases).
PLANS_DIR = Path(".gdn_verify") / "plans"
PLAN_SCHEMA = 1

CompileProgress = Callable[[int, int, float], None]  # (classes compiled, classes planned, seconds so far)


@dataclass
class ShapePlan:
    """What planning found: the pool (None: draw freely), what a new class cost, and the time it took."""

    classes: tuple[ShapeClass, ...] | None
    new_class_seconds: float | None  # first call of a new class minus a repeat (None: not measured)
    repeat_seconds: float | None
    declared: bool
    compile_seconds: float = 0.0  # probe and up-front compilation together
    class_seconds: dict[ShapeClass, float] = field(default_factory=dict)  # measured compile cost per class
    source: str = "planned"  # "stored": the pool came from ``path`` (no probe); "planned": measured now
    path: Path | None = None  # the stored plan read or written (None: not persisted)
    measured: str | None = None  # when the stored pool was measured (ISO date and time)
    note: str | None = None  # why the run planned afresh, why nothing was stored, why no workers
    workers: int = 1  # worker processes whose compiles this run used (1: none)
    parallel_seconds: dict[ShapeClass, float] = field(default_factory=dict)  # per class compiled in workers: the
    # sum over its units (what it would cost in one process)
    parallel_units: dict[ShapeClass, int] = field(default_factory=dict)  # per class split into several units
    parallel_wall: dict[ShapeClass, float] = field(default_factory=dict)  # and its first unit's start to its last's end
    worker_errors: list[str] = field(default_factory=list)  # a class's exception in its worker, or its death
    scales: tuple[float, ...] | None = None  # the explicit scales drawn, where narrowed (compiled per value)

    @property
    def expensive(self) -> bool:
        return self.classes is not None

    def origin(self) -> str:
        """Which plan the run used and why: reused from a file, or planned afresh (and the reason)."""
        if self.source == "stored":
            assert self.classes is not None
            stored = f"reused the plan stored in {self.path} ({len(self.classes)} classes, measured {self.measured})"
            return stored + (f"; {self.note}" if self.note else "")
        return "planned afresh" + (f": {self.note}" if self.note else "")

    def parallel(self) -> str | None:
        """How the workers compiled the pool, e.g. ``18 classes compiled in 71 s, 16 of them in 15
        worker processes (slowest class 64 s; serial sum 880 s)``; with classes split into units
        of their warm calls, e.g. ``... 8 of them in 15 worker processes as 80 units (slowest class
        1300 s of compiles in 170 s; serial sum 8000 s)``; None without workers."""
        if self.workers <= 1 or not self.parallel_seconds or self.classes is None:
            return None
        serial = sum(self.parallel_seconds.get(c, self.class_seconds.get(c, 0.0)) for c in self.classes)
        slowest = max(self.parallel_seconds, key=lambda c: self.parallel_seconds[c])
        units = ""
        how = _seconds(self.parallel_seconds[slowest])
        if self.parallel_units:
            units = f" as {sum(self.parallel_units.get(c, 1) for c in self.parallel_seconds)} units"
            if slowest in self.parallel_wall:
                how += f" of compiles in {_seconds(self.parallel_wall[slowest])}"
        return (
            f"{len(self.classes)} classes compiled in {_seconds(self.compile_seconds)}, "
            f"{len(self.parallel_seconds)} of them in {self.workers} worker processes{units} "
            f"(slowest class {how}; serial sum {_seconds(serial)})"
        )

    def describe(self) -> str:
        """One line: why the implementation is (not) treated as compiled per class, and the pool size."""
        cost = (
            f"a new shape class costs {self.new_class_seconds:.2f} s beyond a repeat call ({self.repeat_seconds:.3f} s)"
            if self.new_class_seconds is not None
            else "not compiled per shape class"
            if self.classes is None and not self.declared
            else "the compile cost was not measured"
        )
        if self.classes is None:
            return f"{cost}: every shape drawn freely"
        why = "declared JIT-compiled; " if self.declared else ""
        text = f"{why}{cost}: shapes drawn from {len(self.classes)} classes compiled up front; {self.origin()}"
        if self.scales is not None:
            text += f"; explicit scale {', '.join(f'{s:g}' for s in self.scales)} only (a compile per value)"
        parallel = self.parallel()
        return f"{text}; {parallel}" if parallel else text


def _seconds(x: float) -> str:
    return f"{x:.0f} s" if x >= 10 else f"{x:.1f} s"


def _key(impl: Implementation) -> Callable[[ShapeClass], object]:
    """The implementation's own class key (``extra["compile_classes"]`` as a callable), else the class."""
    declared = impl.extra.get("compile_classes")
    return declared if callable(declared) else (lambda c: c)


def option_variants(problem: Problem) -> list[dict[str, Any]]:
    """The option keywords that ``in_kernel_gate`` and ``in_kernel_beta_sigmoid`` call the first
    ``OPTION_CLASSES`` classes of a pool with, in the properties' own form
    (``gating.options_from_params``): the in-kernel gate with and without ``dt_bias``, the beta
    sigmoid with and without ``allow_neg_eigval``; each a constexpr of FLA's kernels. On an H100
    (2026-11-26) those compiles cost fla-chunk's cold check about 45 s inside the two properties."""
    HV = problem.v.shape[2]
    A_log = [0.0] * HV
    params: list[dict[str, Any]] = [
        dict(A_log=A_log, dt_bias=[0.5] * HV),
        dict(A_log=A_log, dt_bias=None),
        dict(beta_logits=True, allow_neg_eigval=False),
        dict(beta_logits=True, allow_neg_eigval=True),
    ]
    return [options_from_params(p) for p in params]


# A warm-up call: the problem, and whether a backward form gets a final-state cotangent ``dht``
# (the forward then stores its final state); a forward form ignores the flag.
WarmCall = tuple[Problem, bool]
# ``Implementation.extra["warm_variants"]``: ``fn(example, backward) -> [WarmCall, ...]``, the calls
# beside the class's own ``(example, True)`` that compile apart in the implementation (see warm_calls).
WarmVariants = Callable[[Problem, bool], Sequence[WarmCall]]


def warm_calls(impl: Implementation, problem: Problem, backward: bool) -> list[WarmCall]:
    """The calls :func:`warm_class` makes beside the class's own ``(problem, True)`` (``problem`` its
    example; ``backward``: through the backward form).

    An implementation whose kernels take more compile-time arguments than a :class:`ShapeClass`
    holds declares them as ``extra["warm_variants"]`` (a :data:`WarmVariants`; FlashQLA's TileLang
    kernels compile per scale value and per ``dht`` given or not, ``implementations.flashqla``);
    those are its calls. Otherwise, for an implementation declared JIT-compiled
    (``extra["compile_classes"]``): for a forward form its :func:`variants`, for a backward form
    its :func:`backward_variants` (no ``dht``; the other batch sizes), all run in the class's one
    unit; nothing for an undeclared implementation."""
    declared = impl.extra.get("warm_variants")
    if callable(declared):
        return list(declared(problem, backward))
    if not impl.extra.get("compile_classes"):
        return []
    if backward:
        return backward_variants(problem)
    return [(v, True) for v in variants(problem)]


# One call of a class's warm-up: the problem, a final-state cotangent or not (``WarmCall``'s flag),
# and the option keywords of a forward form (None: none).
ClassCall = tuple[Problem, bool, dict[str, Any] | None]


def class_calls(impl: Implementation, c: ShapeClass, options: bool = False) -> list[ClassCall]:
    """Every call :func:`warm_class` makes for ``c``, in order: ``[0]`` the class's own (its example
    with a final-state cotangent), then the :func:`warm_calls` of the implementation and, for a
    forward form with ``options`` (the pool's first ``OPTION_CLASSES`` classes of an implementation
    declared JIT-compiled), its :func:`option_variants`. The one list both the compile workers
    (which split it into units, ``compile_workers.split_units``) and this process index into."""
    problem = c.example()
    backward = BACKWARD_FORM in impl.forms
    calls: list[ClassCall] = [(problem, True, None)]
    calls += [(call, with_dht, None) for call, with_dht in warm_calls(impl, problem, backward)]
    if options and not backward and impl.extra.get("compile_classes"):
        calls += [(problem, True, o) for o in option_variants(problem)]
    return calls


def warm_class(impl: Implementation, c: ShapeClass, options: bool = False, calls: Sequence[int] | None = None) -> float:
    """Seconds to make the :func:`class_calls` of ``c`` numbered ``calls`` (None: all of them): every
    native form of ``impl`` once on each (compiling it), or its backward form (``check --grad``,
    which runs and compiles its forward as well) with a final-state cotangent or not. Only the
    class's own call (``0``) may fail: a variant's failure or refusal is ignored (the properties
    meet and report it), so a selection without ``0`` never fails; a timeout is raised. A number
    outside the list raises ``IndexError`` (a worker that builds another list than its parent)."""
    everything = class_calls(impl, c, options)
    chosen = range(len(everything)) if calls is None else list(calls)
    if any(not 0 <= i < len(everything) for i in chosen):
        raise IndexError(f"warm calls {list(chosen)} of a class with {len(everything)}")
    backward = BACKWARD_FORM in impl.forms
    start = time.perf_counter()
    for i in chosen:
        call, with_dht, opts = everything[i]
        try:
            if backward:
                impl.run_backward(call, *cotangents(call, seed=0, with_dht=with_dht))
            else:
                for form in impl.native_forms:
                    impl.run(call, form, options=opts)
        except KernelTimeout:
            raise
        except Exception:  # noqa: BLE001 - a warm-up: the properties meet and report it
            if i == 0:  # the class itself: its failure is the outcome
                raise
    return time.perf_counter() - start


def try_warm(
    impl: Implementation, c: ShapeClass, options: bool = False, calls: Sequence[int] | None = None
) -> tuple[str, float | None, str]:
    """:func:`warm_class` as an outcome: ``("compiled", seconds, "")``, or ``("timeout" |
    "unsupported" | "error", None, the exception in one line)`` (a crash is the properties' to
    report, not the planner's). Here and in a compile worker alike (there on a unit's ``calls``)."""
    try:
        return "compiled", warm_class(impl, c, options, calls), ""
    except KernelTimeout as exc:
        return "timeout", None, error_text(exc)
    except NotImplementedError as exc:
        return "unsupported", None, error_text(exc)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        return "error", None, error_text(exc)


def _compiled_here(
    impl: Implementation, c: ShapeClass, first: float, repeat: float | None, there: float | None
) -> bool:
    """Whether ``c``'s first call here (``first`` seconds) compiled it rather than loading it from the
    disk cache: more than ``EXPENSIVE_SECONDS`` beyond a repeat call (``repeat``; None: called now)
    and more than ``CARRY_FRACTION`` of what compiling it cost elsewhere (``there``; None: unknown)."""
    if repeat is None:
        repeat = try_warm(impl, c)[1] or 0.0
    cost = first - repeat
    return cost > EXPENSIVE_SECONDS and (there is None or cost > CARRY_FRACTION * there)


def _start_workers(
    impl: Implementation,
    classes: Sequence[ShapeClass],
    workers: int | None,
    timeout: float | None,
    options: Sequence[ShapeClass] = (),
) -> tuple[CompilePool | None, str | None]:
    """Worker processes compiling ``classes`` (those in ``options`` with their :func:`option_variants`
    too), or None and why not (None: one worker, nothing to say)."""
    calls = unit_calls(impl, classes, options)
    units = sum(calls.get(c, 1) for c in classes)  # at most one worker per call
    n = default_workers(units) if workers is None else min(workers, units)
    if n <= 1:
        return None, None
    spec = ImplSpec.of(impl)
    if spec is None:
        return None, (
            "compiled in this process: the implementation was handed in as a Python object, "
            "not by a name (built-in or MODULE:FUNCTION) a worker process can resolve"
        )
    return CompilePool(spec, classes, n, timeout, options, calls), None


def unit_calls(
    impl: Implementation, classes: Sequence[ShapeClass], options: Sequence[ShapeClass] = ()
) -> dict[ShapeClass, int]:
    """How many :func:`class_calls` each class has, for an implementation whose declared
    ``extra["warm_variants"]`` compile apart (FlashQLA: a fused forward and backward per call),
    so that the workers may split a class into units of its calls; empty for any other (FLA: a
    variant call runs the class's whole kernel pipeline, which a unit of its own would compile
    again), whose classes stay one unit each."""
    if not callable(impl.extra.get("warm_variants")):
        return {}
    chosen = set(options)
    return {c: len(class_calls(impl, c, c in chosen)) for c in classes}


def _from_worker(children: CompilePool, c: ShapeClass, until: float | None, plan: ShapePlan) -> Outcome | None:
    """``c``'s outcome in its worker; None when this process compiles it (its worker did not finish by
    ``until`` or was never started, died, or could not re-create the implementation: then ``plan.note``)."""
    outcome = children.wait(c, until)
    if outcome is None or outcome.status == "died":
        if outcome is not None:
            plan.worker_errors.append(f"{c.describe()}: {outcome.error}")
        return None
    if outcome.status == "unresolvable":
        children.close()
        plan.note = (
            f"compiled in this process: a worker process could not re-create the implementation ({outcome.error})"
        )
        return None
    if outcome.status == "error" or (outcome.status == "compiled" and outcome.error):  # (a later unit died)
        plan.worker_errors.append(f"{c.describe()}: {outcome.error}")
    return outcome


def _record(plan: ShapePlan, c: ShapeClass, outcome: Outcome) -> None:
    """``c`` compiled in the workers: its seconds there (the sum over its units) and, when it was
    split, its units and their wall time."""
    plan.parallel_seconds[c] = outcome.seconds
    if outcome.units > 1 and outcome.wall is not None:
        plan.parallel_units[c], plan.parallel_wall[c] = outcome.units, outcome.wall


def _carried_over(
    impl: Implementation, c: ShapeClass, seconds: float, outcome: Outcome, children: CompilePool, plan: ShapePlan
) -> bool:
    """Whether ``c``, compiled in its worker (``outcome``) and then warmed here in ``seconds``, came
    from the disk cache; if not, the workers stop (the rest compile here) and ``plan.note`` says why."""
    if not _compiled_here(impl, c, seconds, plan.repeat_seconds, outcome.seconds):
        plan.workers = children.workers
        return True
    children.close()
    plan.note = (
        f"the compiles of worker processes did not carry over to this process ({c.describe()}: "
        f"{seconds:.1f} s here after {outcome.seconds:.1f} s in its worker): the rest compiled in this process"
    )
    return False


def _keep(plan: ShapePlan, pool: Sequence[ShapeClass]) -> None:
    """The workers' times of the classes in ``pool`` only."""
    plan.parallel_seconds = {c: s for c, s in plan.parallel_seconds.items() if c in pool}
    plan.parallel_units = {c: n for c, n in plan.parallel_units.items() if c in pool}
    plan.parallel_wall = {c: s for c, s in plan.parallel_wall.items() if c in pool}


def _needed(
    candidates: Sequence[ShapeClass], pool: Sequence[ShapeClass], seen: set[object], key: Callable[[ShapeClass], object]
) -> list[ShapeClass]:
    """The classes that still compile for the pool to reach ``MIN_CLASSES`` (none unsupported): their
    units start past the budget's ``start_by``, as this process waits for them without a deadline."""
    count, keys, out = len(pool), set(seen), []
    for c in candidates:
        if count >= MIN_CLASSES:
            break
        if c in pool:
            continue
        if key(c) not in keys:
            keys.add(key(c))
            out.append(c)
        count += 1
    return out


def _unique(classes: Sequence[ShapeClass], done: set[object], key: Callable[[ShapeClass], object]) -> list[ShapeClass]:
    """The first class of each key not in ``done``, in order: what is left to compile."""
    keys, out = set(done), []
    for c in classes:
        if key(c) not in keys:
            keys.add(key(c))
            out.append(c)
    return out


def plan_shapes(
    impl: Implementation,
    candidates: Sequence[ShapeClass],
    budget: float,
    progress: CompileProgress | None = None,
    workers: int | None = None,
    timeout: float | None = None,
) -> ShapePlan:
    """Probe ``impl`` on the first candidates; if a new class is expensive, compile a pool within ``budget``.

    Candidates are taken in order, so the pool is always a prefix of them (less the ones that
    raise ``NotImplementedError``: the properties then report that feature unsupported); ones
    that raise anything else stay in, for the properties to report. At least ``MIN_CLASSES``.
    ``workers``: processes compiling the classes past the probe (default ``default_workers``; 1:
    all in this process); a worker's calls are guarded by ``timeout`` like the probe's, and one
    still compiling when the budget is spent is killed (the pool stops before its class). A
    declared JIT-compiled implementation's workers start with the probe.
    """
    start = time.perf_counter()
    deadline = time.monotonic() + budget
    declared = bool(impl.extra.get("compile_classes"))
    if impl.extra.get("compile_classes") is False:  # declared not compiled per class: nothing to learn
        return ShapePlan(None, None, None, False)
    key = _key(impl)
    plan = ShapePlan(None, None, None, declared)
    children: CompilePool | None = None
    try:
        if declared:  # compiled per class whatever the probe finds: no need to wait for it
            later = _unique(candidates[PROBE_CLASSES:], {key(c) for c in candidates[:PROBE_CLASSES]}, key)
            # the option properties' classes (a prefix of the pool, probed here) get their option
            # variants compiled in workers of their own, first, beside the probe
            optional = list(candidates[:OPTION_CLASSES])
            children, plan.note = _start_workers(impl, optional + later, workers, timeout, optional)
        pool, costs = _probe(impl, candidates, plan)
        if not (declared or (plan.new_class_seconds is not None and plan.new_class_seconds > EXPENSIVE_SECONDS)):
            plan.class_seconds = {}
            plan.compile_seconds = time.perf_counter() - start
            return plan
        seen = {key(c) for c in pool}
        costs = costs[1:] or costs  # the first class's cost includes the one-off set-up
        if not declared:
            later = _unique([c for c in candidates if c not in pool], seen, key)
            children, plan.note = _start_workers(impl, later, workers, timeout)
        if children is not None:  # a child that cannot finish by the deadline is not worth starting
            children.start_by = deadline - (sum(costs) / len(costs) if costs else 0.0)
            children.require(_needed(candidates, pool, seen, key))  # compiled whatever the budget
        checked = False  # whether the first class a worker compiled carried over to this process
        for c in candidates:
            if c in pool:
                continue
            if key(c) in seen:  # compiled already under the implementation's own key: free
                pool.append(c)
                plan.class_seconds[c] = 0.0
                continue
            must = len(pool) < MIN_CLASSES
            outcome = None
            if children is not None and not children.closed:  # (closed: the rest compile here)
                if progress is not None:
                    left = children.given[children.given.index(c) :] if c in children.given else [c]
                    progress(len(pool), len(pool) + len(left), time.perf_counter() - start)
                if must:  # (one more when a class before it was unsupported)
                    children.require([c])
                outcome = _from_worker(children, c, None if must else deadline, plan)
            if outcome is None:  # this process compiles it, as without workers
                elapsed = time.perf_counter() - start
                estimate = sum(costs) / len(costs) if costs else 0.0
                if not must and elapsed + estimate > budget:
                    break
                if progress is not None:
                    more = int((budget - elapsed) // estimate) if estimate > 0 else len(candidates)
                    planned = len(pool) + max(more, MIN_CLASSES - len(pool), 1)
                    progress(len(pool), min(len(candidates), planned), elapsed)
                status, seconds, _ = try_warm(impl, c)
                if seconds is not None:
                    costs.append(seconds)
                    plan.class_seconds[c] = seconds
            else:
                assert children is not None
                status = outcome.status
                if status == "compiled":  # compiled in its worker: cheap here when the disk cache carried it over
                    _record(plan, c, outcome)
                    status, seconds, _ = try_warm(impl, c)
                    if seconds is not None:
                        plan.class_seconds[c] = seconds
                        if not checked and not _carried_over(impl, c, seconds, outcome, children, plan):
                            costs.append(seconds)  # what a class costs here: the budget's estimate from now on
                        checked = True
            if status == "unsupported":
                continue
            seen.add(key(c))
            pool.append(c)
            if status == "timeout":  # a hung kernel: the properties report it, compiling on would only wait again
                break
    finally:
        if children is not None:
            children.close()
    plan.classes = tuple(pool)
    _keep(plan, pool)
    plan.compile_seconds = time.perf_counter() - start
    if progress is not None:
        progress(len(pool), len(pool), plan.compile_seconds)
    return plan


def _probe(
    impl: Implementation, candidates: Sequence[ShapeClass], plan: ShapePlan
) -> tuple[list[ShapeClass], list[float]]:
    """Two classes, each called twice: the second class's first call against its repeat is the cost
    of a new class (the very first call also pays one-off set-up: imports, a context). The pool so
    far and each compiled class's first call minus its repeat; ``plan`` gets the measurements."""
    pool: list[ShapeClass] = []
    costs: list[float] = []  # first call minus repeat, per class compiled
    tried = 0
    for c in candidates:
        if len(costs) == PROBE_CLASSES or tried == 2 * PROBE_CLASSES:
            break
        tried += 1
        try:
            first, repeat = warm_class(impl, c), warm_class(impl, c)
        except KernelTimeout:  # a hung kernel: the properties report it, probing on would only wait again
            pool.append(c)
            break
        except NotImplementedError:
            continue
        except Exception:  # noqa: BLE001 - a crash is the properties' to report, not the planner's
            pool.append(c)
            continue
        pool.append(c)
        costs.append(max(first - repeat, 0.0))
        plan.class_seconds[c] = first
        plan.repeat_seconds = repeat
    plan.new_class_seconds = costs[-1] if costs else None
    return pool, costs


# The stored plan ---------------------------------------------------------------------------------
def device_name(impl: Implementation) -> str:
    """The GPU ``impl``'s arrays live on (its library imported only for torch/cupy arrays), else "cpu"."""
    if impl.array not in ("torch", "cupy"):
        return "cpu"
    try:
        importlib.import_module(impl.array)
        return environment.device_name(impl.array) or "cpu"
    except Exception:  # noqa: BLE001 - no usable device is an answer, not an error
        return "cpu"


@dataclass(frozen=True)
class PlanKey:
    """What a stored pool is valid for: a different kernel build, device, dtype, head sizes or
    gradient mode compiles different variants, so it plans afresh."""

    impl: str
    version: str
    device: str
    dtype: str
    head_dims: tuple[int, ...]
    grad: bool

    @classmethod
    def of(cls, impl: Implementation, dtype: str | None, head_dims: Sequence[int]) -> PlanKey:
        version = impl.extra.get("version") or impl.description or ""
        return cls(
            impl.name,
            str(version),
            device_name(impl),
            str(dtype),
            tuple(sorted({int(d) for d in head_dims})),
            BACKWARD_FORM in impl.forms,
        )

    def as_dict(self) -> dict[str, Any]:
        return dict(asdict(self), head_dims=list(self.head_dims))

    def filename(self) -> str:
        """``<impl>-<dtype>-<hash of the whole key>.json`` (readable, and one file per key)."""
        digest = hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:12]
        name = re.sub(r"[^A-Za-z0-9_.+-]+", "_", self.impl).strip("._") or "impl"
        return f"{name[:60]}-{self.dtype}{'-grad' if self.grad else ''}-{digest}.json"


@dataclass
class StoredPlan:
    """A pool read back from its file."""

    classes: tuple[ShapeClass, ...]
    class_seconds: dict[ShapeClass, float]
    new_class_seconds: float | None
    repeat_seconds: float | None
    declared: bool
    measured: str
    workers: int = 1  # worker processes the plan was compiled with (1: none)
    parallel_seconds: dict[ShapeClass, float] = field(default_factory=dict)  # per class compiled in a worker


def save_plan(path: Path, key: PlanKey, plan: ShapePlan) -> None:
    """Write ``plan``'s pool to ``path`` atomically (a temporary file in the same folder, renamed)."""
    assert plan.classes is not None
    document: dict[str, Any] = dict(
        schema=PLAN_SCHEMA,
        key=key.as_dict(),
        measured=datetime.datetime.now().isoformat(timespec="seconds"),
        new_class_seconds=plan.new_class_seconds,
        repeat_seconds=plan.repeat_seconds,
        declared=plan.declared,
        compile_seconds=round(plan.compile_seconds, 3),
        workers=plan.workers,
        classes=[
            dict(
                c.as_dict(),
                seconds=_rounded(plan.class_seconds.get(c)),  # its first call in the planning process
                # compiling it in its worker (absent: compiled in the planning process)
                **({"child_seconds": _rounded(plan.parallel_seconds[c])} if c in plan.parallel_seconds else {}),
            )
            for c in plan.classes
        ],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(document, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    plan.measured = document["measured"]


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def load_plan(path: Path, key: PlanKey) -> tuple[StoredPlan | None, str]:
    """The pool stored at ``path`` for ``key``, or None and why not (a one-line note; never raises
    on a missing, unreadable, corrupt or foreign file)."""
    if not path.exists():
        return None, "no stored plan for this key"
    try:
        document = json.loads(path.read_text())
        if document.get("schema") != PLAN_SCHEMA:
            return None, f"the stored plan {path} has another schema ({document.get('schema')!r}): ignored"
        if document.get("key") != key.as_dict():
            return None, f"the stored plan {path} is for another key: ignored"
        classes, seconds, parallel = [], {}, {}
        for row in document["classes"]:
            c = ShapeClass.from_dict(row)
            if not isinstance(c.H, int) or not isinstance(c.dtype, str):
                raise TypeError(f"not a shape class: {row!r}")
            classes.append(c)
            if row.get("seconds") is not None:
                seconds[c] = float(row["seconds"])
            if row.get("child_seconds") is not None:  # absent from plans stored before workers
                parallel[c] = float(row["child_seconds"])
        if not classes:
            raise ValueError("no classes")
        stored = StoredPlan(
            tuple(classes),
            seconds,
            None if document.get("new_class_seconds") is None else float(document["new_class_seconds"]),
            None if document.get("repeat_seconds") is None else float(document["repeat_seconds"]),
            bool(document.get("declared")),
            str(document.get("measured", "at an unknown time")),
            int(document.get("workers", 1)),
            parallel,
        )
    except Exception as exc:  # noqa: BLE001 - a corrupt plan costs a fresh plan, never the run
        return None, f"the stored plan {path} is unreadable ({error_text(exc, 120)}): ignored"
    return stored, ""


def warm_plan(
    impl: Implementation,
    stored: StoredPlan,
    progress: CompileProgress | None = None,
    workers: int | None = None,
    timeout: float | None = None,
) -> ShapePlan:
    """Compile a stored pool again (cheap in a warm cache), in order; no probe and no new classes.

    Classes that now raise ``NotImplementedError`` are left out; one that times out stays in (the
    properties report it) and the rest are not warmed (they would only wait again). ``workers`` as
    for :func:`plan_shapes`: they start on the second class while this process warms the first,
    and are stopped when the first proves cheap here (compiled already, here or on disk).
    """
    start = time.perf_counter()
    plan = ShapePlan(None, stored.new_class_seconds, stored.repeat_seconds, stored.declared)
    plan.source, plan.measured = "stored", stored.measured
    pool: list[ShapeClass] = []
    timed_out, checked = False, False
    children: CompilePool | None = None
    try:
        children, why = _start_workers(impl, stored.classes[1:], workers, timeout)
        for i, c in enumerate(stored.classes):
            if timed_out:
                pool.append(c)
                continue
            if progress is not None:
                progress(i, len(stored.classes), time.perf_counter() - start)
            outcome = None
            if i > 0 and children is not None and not children.closed:
                outcome = _from_worker(children, c, None, plan)  # a stored pool compiles whole: no deadline
            if outcome is not None and outcome.status != "compiled":
                status = outcome.status
            else:
                status, seconds, _ = try_warm(impl, c)
                if outcome is not None:
                    _record(plan, c, outcome)
                if seconds is not None and i == 0:  # against its first call when stored: cold here or not
                    cold = _compiled_here(impl, c, seconds, stored.repeat_seconds or 0.0, stored.class_seconds.get(c))
                    if not cold and children is not None:
                        children.close()  # compiled already, here or on disk: nothing for workers to do
                    elif cold:
                        plan.note = why  # and why no workers help (None: they do)
                elif seconds is not None and outcome is not None and not checked:
                    assert children is not None
                    checked = True
                    _carried_over(impl, c, seconds, outcome, children, plan)
            if status == "timeout":
                timed_out = True
            elif status == "unsupported":
                continue
            pool.append(c)
    finally:
        if children is not None:
            children.close()
    plan.classes = tuple(pool)
    plan.class_seconds = dict(stored.class_seconds)
    _keep(plan, pool)
    plan.compile_seconds = time.perf_counter() - start
    if progress is not None:
        progress(len(pool), len(pool), plan.compile_seconds)
    return plan
