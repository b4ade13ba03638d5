"""Compile-aware shape planning: learn what a new shape class costs, then compile a pool up front.

A JIT-compiled kernel (FLA's Triton kernels, FlashInfer's CuTe DSL ones) pays tens of seconds
the first time it meets a new :class:`~gdn_verify.core.shapes.ShapeClass`. :func:`plan_shapes`
times the first call of a new class against a repeat; when the difference exceeds
``EXPENSIVE_SECONDS`` (or the implementation declares itself JIT-compiled through
``Implementation.extra["compile_classes"]``), it compiles candidate classes in the order given,
as many as ``budget`` seconds allow, and returns them as the pool the strategies draw from.
Cheap implementations get no pool (``ShapePlan.classes is None``): full shape variety.

A pool persists: :func:`save_plan` writes it, with each class's measured compile
seconds, to one small JSON file per :class:`PlanKey` (implementation, version, device, dtype,
head sizes, gradients or not) under ``PLANS_DIR``; :func:`load_plan` reads it back (``None`` and a
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
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from gdn_verify.core import environment
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
    note: str | None = None  # why the run planned afresh, or why nothing was stored

    @property
    def expensive(self) -> bool:
        return self.classes is not None

    def origin(self) -> str:
        """Which plan the run used and why: reused from a file, or planned afresh (and the reason)."""
        if self.source == "stored":
            assert self.classes is not None
            return f"reused the plan stored in {self.path} ({len(self.classes)} classes, measured {self.measured})"
        return "planned afresh" + (f": {self.note}" if self.note else "")

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
        return f"{why}{cost}: shapes drawn from {len(self.classes)} classes compiled up front; {self.origin()}"


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
    seconds: dict[ShapeClass, float] = {}  # each class's first call (compiling it), for the stored plan
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
        seconds[c] = first
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
            seconds[c] = 0.0
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
            seconds[c] = costs[-1]
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
    plan.class_seconds = seconds
    plan.compile_seconds = time.perf_counter() - start
    if progress is not None:
        progress(len(pool), len(pool), plan.compile_seconds)
    return plan


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


def _class_dict(c: ShapeClass) -> dict[str, Any]:
    return {f.name: getattr(c, f.name) for f in fields(ShapeClass)}


def save_plan(path: Path, key: PlanKey, plan: ShapePlan) -> None:
    """Write ``plan``'s pool to ``path`` atomically (a temporary file in the same folder, renamed)."""
    assert plan.classes is not None
    document = dict(
        schema=PLAN_SCHEMA,
        key=key.as_dict(),
        measured=datetime.datetime.now().isoformat(timespec="seconds"),
        new_class_seconds=plan.new_class_seconds,
        repeat_seconds=plan.repeat_seconds,
        declared=plan.declared,
        compile_seconds=round(plan.compile_seconds, 3),
        classes=[
            dict(_class_dict(c), seconds=None if c not in plan.class_seconds else round(plan.class_seconds[c], 3))
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
        names = {f.name for f in fields(ShapeClass)}
        classes, seconds = [], {}
        for row in document["classes"]:
            c = ShapeClass(**{k: v for k, v in row.items() if k in names})
            if not isinstance(c.H, int) or not isinstance(c.dtype, str):
                raise TypeError(f"not a shape class: {row!r}")
            classes.append(c)
            if row.get("seconds") is not None:
                seconds[c] = float(row["seconds"])
        if not classes:
            raise ValueError("no classes")
        stored = StoredPlan(
            tuple(classes),
            seconds,
            None if document.get("new_class_seconds") is None else float(document["new_class_seconds"]),
            None if document.get("repeat_seconds") is None else float(document["repeat_seconds"]),
            bool(document.get("declared")),
            str(document.get("measured", "at an unknown time")),
        )
    except Exception as exc:  # noqa: BLE001 - a corrupt plan costs a fresh plan, never the run
        what = " ".join(f"{type(exc).__name__}: {exc}".split())[:120]
        return None, f"the stored plan {path} is unreadable ({what}): ignored"
    return stored, ""


def warm_plan(impl: Implementation, stored: StoredPlan, progress: CompileProgress | None = None) -> ShapePlan:
    """Compile a stored pool again (cheap in a warm cache), in order; no probe and no new classes.

    Classes that now raise ``NotImplementedError`` are left out; one that times out stays in (the
    properties report it) and the rest are not warmed (they would only wait again).
    """
    start = time.perf_counter()
    pool: list[ShapeClass] = []
    timed_out = False
    for i, c in enumerate(stored.classes):
        if timed_out:
            pool.append(c)
            continue
        if progress is not None:
            progress(i, len(stored.classes), time.perf_counter() - start)
        try:
            warm_class(impl, c)
        except KernelTimeout:
            timed_out = True
        except NotImplementedError:
            continue
        except Exception:  # noqa: BLE001 - kept in the pool: the properties report it
            pass
        pool.append(c)
    plan = ShapePlan(tuple(pool), stored.new_class_seconds, stored.repeat_seconds, stored.declared)
    plan.class_seconds = dict(stored.class_seconds)
    plan.source, plan.measured = "stored", stored.measured
    plan.compile_seconds = time.perf_counter() - start
    if progress is not None:
        progress(len(pool), len(pool), plan.compile_seconds)
    return plan
