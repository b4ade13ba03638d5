"""Compile-aware shape planning: learn what a new shape class costs, then compile a pool up front.

A JIT-compiled kernel (FLA's Triton kernels, FlashInfer's CuTe DSL ones) pays tens of seconds
the first time it meets a new :class:`~gdn_verify.core.shapes.ShapeClass`. :func:`plan_shapes`
times the first call of a new class against a repeat; when the difference exceeds
``EXPENSIVE_SECONDS`` (or the implementation declares itself JIT-compiled through
``Implementation.extra["compile_classes"]``), it compiles candidate classes in the order given,
as many as ``budget`` seconds allow, and returns them as the pool the strategies draw from.
Cheap implementations get no pool (``ShapePlan.classes is None``): full shape variety.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gdn_verify.core.gradients import cotangents
from gdn_verify.core.implementation import BACKWARD_FORM, Implementation
from gdn_verify.core.shapes import ShapeClass
from gdn_verify.runners.guard import KernelTimeout

# A new class costing more than this beyond a repeat call makes per-example shape variety
# unaffordable: 22 properties of 20-100 examples each would spend minutes compiling.
EXPENSIVE_SECONDS = 0.5
# Fewer classes than this cannot cover GVA, K != V, an awkward size, varlen and batched, with and
# without an initial state and l2norm (see gdn_verify.properties.strategies.pool_candidates).
MIN_CLASSES = 4

CompileProgress = Callable[[int, int, float], None]  # (classes compiled, classes planned, seconds so far)


@dataclass
class ShapePlan:
    """What planning found: the pool (None: draw freely), what a new class cost, and the time it took."""

    classes: tuple[ShapeClass, ...] | None
    new_class_seconds: float | None  # first call of a new class minus a repeat (None: not measured)
    repeat_seconds: float | None
    declared: bool
    compile_seconds: float = 0.0  # probe and up-front compilation together

    @property
    def expensive(self) -> bool:
        return self.classes is not None

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
        return f"{why}{cost}: shapes drawn from {len(self.classes)} classes compiled up front"


def _key(impl: Implementation) -> Callable[[ShapeClass], object]:
    """The implementation's own class key (``extra["compile_classes"]`` as a callable), else the class."""
    declared = impl.extra.get("compile_classes")
    return declared if callable(declared) else (lambda c: c)


def warm_class(impl: Implementation, c: ShapeClass) -> float:
    """Seconds to run every native form of ``impl`` once on a tiny problem of class ``c`` (compiling
    it); an implementation with a backward form (``check --grad``) runs that instead, which runs
    (and compiles) its forward as well."""
    problem = c.example()
    start = time.perf_counter()
    if BACKWARD_FORM in impl.forms:
        impl.run_backward(problem, *cotangents(problem, seed=0))
    else:
        for form in impl.native_forms:
            impl.run(problem, form)
    return time.perf_counter() - start


def plan_shapes(
    impl: Implementation,
    candidates: Sequence[ShapeClass],
    budget: float,
    progress: CompileProgress | None = None,
) -> ShapePlan:
    """Probe ``impl`` on the first candidates; if a new class is expensive, compile a pool within ``budget``.

    Candidates are taken in order, so the pool is always a prefix of them (less the ones that
    raise ``NotImplementedError``: the properties then report that feature unsupported); ones
    that raise anything else stay in, for the properties to report. At least ``MIN_CLASSES``.
    """
    start = time.perf_counter()
    declared = bool(impl.extra.get("compile_classes"))
    if impl.extra.get("compile_classes") is False:  # declared not compiled per class: nothing to learn
        return ShapePlan(None, None, None, False)
    key = _key(impl)
    pool: list[ShapeClass] = []
    costs: list[float] = []  # first call minus repeat, per class compiled
    repeat = None
    # The probe: two classes, each called twice. The second class's first call against its repeat
    # is the cost of a new class (the very first call also pays one-off set-up: imports, a context).
    tried = 0
    for c in candidates:
        if len(costs) == 2 or tried == 2 * 2:
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
    new_class = costs[-1] if costs else None
    plan = ShapePlan(None, new_class, repeat, declared)
    if not (declared or (new_class is not None and new_class > EXPENSIVE_SECONDS)):
        plan.compile_seconds = time.perf_counter() - start
        return plan
    seen = {key(c) for c in pool}
    costs = costs[1:] or costs  # the first class's cost includes the one-off set-up
    for c in candidates:
        if c in pool:
            continue
        if key(c) in seen:  # compiled already under the implementation's own key: free
            pool.append(c)
            continue
        elapsed = time.perf_counter() - start
        estimate = sum(costs) / len(costs) if costs else 0.0
        if len(pool) >= MIN_CLASSES and elapsed + estimate > budget:
            break
        if progress is not None:
            more = int((budget - elapsed) // estimate) if estimate > 0 else len(candidates)
            progress(len(pool), min(len(candidates), len(pool) + max(more, MIN_CLASSES - len(pool), 1)), elapsed)
        try:
            costs.append(warm_class(impl, c))
        except KernelTimeout:
            seen.add(key(c))
            pool.append(c)
            break
        except NotImplementedError:
            continue
        except Exception:  # noqa: BLE001 - kept in the pool: the properties report it
            pass
        seen.add(key(c))
        pool.append(c)
    plan.classes = tuple(pool)
    plan.compile_seconds = time.perf_counter() - start
    if progress is not None:
        progress(len(pool), len(pool), plan.compile_seconds)
    return plan
