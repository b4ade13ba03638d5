"""Every autotuner config of a Triton implementation, one at a time (``check --all-configs``).

An autotuned Triton kernel runs under whichever config its autotuner picks on the machine at hand;
a bug that lives in one config only (a tile width that skips part of V, a ``num_warps`` choice with
a race: FLA #945, #988) passes every check run under the others. Here:

1. :func:`discover`: a few small calls of the implementation (:func:`probe_problems`: dense and
   varlen, with an initial and a final state; the backward for a gradient check) with
   ``triton.runtime.autotuner.Autotuner.run`` wrapped, which records every autotuner the calls
   reach, whatever wraps it (``@triton.heuristics`` over ``@triton.autotune`` over
   ``@triton.jit``, FLA's nesting): its kernel's name and its whole list of configs.
2. :func:`pinned`: one autotuner runs exactly one config (its list replaced by that config alone,
   which ``Autotuner.run`` launches without pruning, timing or its cache; the config's own
   ``pre_hook`` still runs), the others keep their normal choice; restored afterwards.
3. :func:`run_all_configs`: for each (kernel, config), the chosen properties, each result labelled
   with the kernel and the config (``PropertyResult.config``); and for each kernel one result
   ``same_across_configs``: the outputs of one fixed problem (the first of
   :func:`probe_problems`) compared across its configs.

What is promised across configs: nothing bitwise on a GPU, where tiles change the order of
floating-point sums (the largest difference is reported as information); each config must still
pass the properties on its own (``determinism`` judges each config alone). Under Triton's
interpreter ``num_warps``, ``num_stages``, ``num_ctas`` and ``maxnreg`` never reach the kernel
(configs differ only in tiling there), so configs with the same kwargs must give bitwise identical
outputs: a difference is a failure (host code attached to one config, such as its ``pre_hook``).
A config that ``prune_configs_by`` would drop for a shape still runs there when pinned.

Progress goes through callbacks; nothing here prints.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gdn_verify.core.gradients import cotangents
from gdn_verify.core.implementation import ConfigurationError, Implementation
from gdn_verify.core.problem import Problem
from gdn_verify.core.property import Property
from gdn_verify.core.shapes import ShapeClass
from gdn_verify.runners.check import Failure, Progress, PropertyResult, RunSettings, run_property
from gdn_verify.runners.guard import Guard

AGREEMENT = "same_across_configs"  # the result name of the cross-config comparison of one kernel
# What a config's launch options are (the interpreter ignores them all); everything else is its kwargs.
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
# Properties that ``--all-configs`` runs by default: the oracle comparison, the packed varlen path
# (other tiles meet sequence bounds elsewhere) and bitwise repeatability (a race under one config).
DEFAULT_PROPERTIES = ("matches_reference", "varlen_equals_separate", "determinism")
DEFAULT_GRAD_PROPERTIES = ("grad_matches_reference", "grad_varlen_equals_separate", "grad_determinism")
INTERPRETER_NOTE = (
    "under the Triton interpreter configs differ only in tiling (their kwargs): num_warps, num_stages, "
    "num_ctas and maxnreg never reach the kernel, so configs with the same kwargs must agree bitwise"
)


@dataclass(frozen=True)
class Tuned:
    """One autotuned kernel an implementation launches: its name, its autotuner (a
    ``triton.runtime.autotuner.Autotuner``) and the autotuner's whole list of configs."""

    kernel: str
    autotuner: Any = field(compare=False, repr=False)
    configs: tuple[Any, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return dict(kernel=self.kernel, configs=[config_text(c) for c in self.configs])


def config_text(config: Any) -> str:
    """``BV=32, num_warps=4, num_stages=2``: a ``triton.Config``'s kwargs, then its launch options
    (``num_ctas`` and ``maxnreg`` only where not their defaults, 1 and None)."""
    words = [f"{k}={v}" for k, v in config.kwargs.items()]
    words += [f"num_warps={config.num_warps}", f"num_stages={config.num_stages}"]
    if getattr(config, "num_ctas", 1) not in (1, None):
        words.append(f"num_ctas={config.num_ctas}")
    if getattr(config, "maxnreg", None) is not None:
        words.append(f"maxnreg={config.maxnreg}")
    return ", ".join(words)


def label(kernel: str, config: Any) -> str:
    """``chunk_fwd_kernel_o[BV=32, num_warps=4, num_stages=2]``: a kernel under one config."""
    return f"{kernel}[{config_text(config)}]"


def _autotuner_class() -> Any:
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError as exc:
        raise ConfigurationError("all_configs", f"needs Triton (pip install triton): {exc}") from None
    return Autotuner


def _kernel_name(tuner: Any) -> str:
    base = getattr(tuner, "base_fn", None) or getattr(tuner, "fn", None)
    return str(getattr(base, "__name__", type(tuner).__name__))


@contextlib.contextmanager
def recording() -> Iterator[list[Any]]:
    """While open, every ``Autotuner.run`` call records its autotuner (each once, in order of first
    launch) in the list yielded; the class's own ``run`` is restored on leaving."""
    Autotuner = _autotuner_class()
    original = Autotuner.run
    seen: list[Any] = []

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not any(self is s for s in seen):
            seen.append(self)
        return original(self, *args, **kwargs)

    Autotuner.run = run
    try:
        yield seen
    finally:
        Autotuner.run = original


def probe_problems(dtype: str, head_dims: Sequence[int]) -> list[Problem]:
    """The small problems discovery runs: dense and varlen, each with an initial and a final state,
    head sizes the smallest power of two of at least 16 among ``head_dims`` (16 if none: the
    smallest tile Triton's ``tl.dot`` takes), GVA (2 value heads per q/k head), 70 tokens (past a
    64-token chunk). The first is the fixed problem compared across configs."""
    d = min([n for n in head_dims if n >= 16 and not n & (n - 1)] or [16])
    return [
        ShapeClass(1, 2, d, d, dtype, varlen=varlen, initial_state=True).example(seed=0) for varlen in (False, True)
    ]


def outputs(impl: Implementation, problem: Problem, grad: bool) -> dict[str, np.ndarray]:
    """Every output of one call of ``impl`` on ``problem``, as NumPy arrays by name: ``o`` and
    ``final_state`` of each native form (``chunk.o``, ...), or with ``grad`` the gradients."""
    if grad:
        g = impl.run_backward(problem, *cotangents(problem, seed=0, with_dht=True))
        return {n: np.asarray(x) for n, x in g.grads.items() if x is not None}
    found: dict[str, np.ndarray] = {}
    for form in impl.native_forms:
        r = impl.run(problem, form)
        for name, x in (("o", r.o), ("final_state", r.final_state)):
            if x is not None:
                found[f"{form}.{name}"] = np.asarray(x)
    return found


def discover(impl: Implementation, problems: Sequence[Problem], grad: bool = False) -> list[Tuned]:
    """The autotuned Triton kernels that ``impl`` launches on ``problems`` (see :func:`recording`),
    each named by its kernel function (``name@module`` where two share a name). A failing call is
    raised: the properties would meet it under every config."""
    with recording() as seen:
        for problem in problems:
            outputs(impl, problem, grad)
    names = [_kernel_name(t) for t in seen]
    found = []
    for tuner, name in zip(seen, names):
        if names.count(name) > 1:
            name = f"{name}@{getattr(getattr(tuner, 'base_fn', None), '__module__', '?')}"
        found.append(Tuned(name, tuner, tuple(tuner.configs)))
    return found


def only(tuned: Sequence[Tuned], names: Sequence[str]) -> tuple[list[Tuned], tuple[str, ...]]:
    """(the kernels of ``tuned`` named in ``names``, in launch order; the names of the others), or
    :class:`ConfigurationError` naming ``config_kernels`` for a name no kernel has."""
    found = [t.kernel for t in tuned]
    unknown = [n for n in names if n not in found]
    if unknown:
        raise ConfigurationError(
            "config_kernels", f"no autotuned kernel {', '.join(unknown)} was launched; these were: {', '.join(found)}"
        )
    return [t for t in tuned if t.kernel in names], tuple(n for n in found if n not in names)


def default_properties(available: dict[str, Property], grad: bool = False) -> list[str]:
    """The properties run under each config unless named: :data:`DEFAULT_PROPERTIES` (or
    :data:`DEFAULT_GRAD_PROPERTIES`) among ``available``."""
    return [n for n in (DEFAULT_GRAD_PROPERTIES if grad else DEFAULT_PROPERTIES) if n in available]


def no_kernel_message(impl: Implementation) -> str:
    return f"{impl.name} launches no autotuned Triton kernel (no triton.autotune was reached): nothing to pin"


def _skipped_by_autotuner() -> tuple[type[BaseException], ...]:
    """The errors for which Triton's autotuner drops a config when it times them (the config does not
    fit this GPU: shared memory, registers, a compile-time assertion), as ``Autotuner._bench`` does."""
    try:
        from triton.compiler.errors import CompileTimeAssertionFailure
        from triton.runtime.errors import OutOfResources, PTXASError
    except ImportError:
        return ()
    return (OutOfResources, CompileTimeAssertionFailure, PTXASError)


@contextlib.contextmanager
def pinned(tuned: Tuned, config: Any) -> Iterator[None]:
    """While open, ``tuned``'s autotuner runs ``config`` and nothing else: its list is ``[config]``,
    which ``Autotuner.run`` launches directly (no pruning, no timing, no cache, the interpreter's
    patches not reached). Other autotuners are untouched. Restored on leaving.

    A config the autotuner itself would drop on this GPU (:func:`_skipped_by_autotuner`) raises
    ``NotImplementedError`` saying so: the example is unsupported there, not a failure of the kernel."""
    tuner = tuned.autotuner
    saved, run, skipped = tuner.configs, tuner.run, _skipped_by_autotuner()

    def pinned_run(*args: Any, **kwargs: Any) -> Any:
        try:
            return run(*args, **kwargs)
        except skipped as exc:
            raise NotImplementedError(
                f"{label(tuned.kernel, config)} cannot launch here, so the autotuner never picks it: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            ) from exc

    tuner.configs = [config]
    tuner.run = pinned_run  # an instance attribute: what @heuristics and kernel[grid] call
    try:
        yield
    finally:
        tuner.configs = saved
        del tuner.run


def differences(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> tuple[bool, float]:
    """(bitwise identical, largest absolute difference) between two calls' outputs; NaN in the same
    places counts as equal, a shape or name mismatch as infinitely different."""
    if a.keys() != b.keys():
        return False, float("inf")
    same, worst = True, 0.0
    for name in a:
        x, y = a[name], b[name]
        if x.shape != y.shape or x.dtype != y.dtype:
            return False, float("inf")
        same = same and x.tobytes() == y.tobytes()
        with np.errstate(all="ignore"):  # garbage an unwritten output holds may overflow float64
            fx, fy = x.astype(np.float64), y.astype(np.float64)
            diff = np.where(np.isnan(fx) & np.isnan(fy), 0.0, np.abs(fx - fy))  # NaN where only one is NaN
        worst = max(worst, float("inf") if np.isnan(diff).any() else float(diff.max(initial=0.0)))
    return same, worst


@dataclass
class Plan:
    """What an all-configs run costs before it starts: the kernels, configs and properties."""

    kernels: list[Tuned]
    properties: list[str]
    interpreted: bool = False
    problem: Problem | None = None  # the fixed problem compared across configs
    left: tuple[str, ...] = ()  # autotuned kernels launched but not swept (config_kernels): their own choice

    @property
    def pairs(self) -> int:
        """(kernel, config) pairs, each run with every property."""
        return sum(len(t.configs) for t in self.kernels)

    @property
    def runs(self) -> int:
        """Property runs: pairs x properties."""
        return self.pairs * len(self.properties)

    def describe(self) -> str:
        text = (
            f"{len(self.kernels)} autotuned kernel{'s' * (len(self.kernels) != 1)}, {self.pairs} (kernel, config) "
            f"pairs x {len(self.properties)} properties = {self.runs} property runs"
        )
        if self.left:
            text += f"; not swept, under their autotuner's choice: {', '.join(self.left)}"
        return text + (f"; {INTERPRETER_NOTE}" if self.interpreted else "")

    def as_dict(self) -> dict[str, Any]:
        return dict(
            kernels=[t.as_dict() for t in self.kernels],
            **({"not_swept": list(self.left)} if self.left else {}),
            pairs=self.pairs,
            properties=list(self.properties),
            property_runs=self.runs,
            interpreter=self.interpreted,
            promise=INTERPRETER_NOTE if self.interpreted else "none bitwise across configs (differences reported)",
        )


def agreement(
    tuned: Tuned, per_config: list[dict[str, np.ndarray] | str], interpreted: bool, problem: Problem
) -> PropertyResult:
    """The :data:`AGREEMENT` result of one kernel: its configs' outputs on one fixed problem
    (``per_config[i]``: outputs, or the error text of a call that raised) against the first
    config's, and under the interpreter within each group of configs with the same kwargs."""
    r = PropertyResult(AGREEMENT, "passed", examples=1)
    r.config = dict(kernel=tuned.kernel, config=f"all {len(tuned.configs)} configs")
    raised = [i for i, out in enumerate(per_config) if isinstance(out, str)]
    ran = [i for i in range(len(per_config)) if i not in raised]
    notes = [f"{label(tuned.kernel, tuned.configs[i])} raised ({per_config[i]})" for i in raised]
    broken: list[str] = []
    if interpreted:  # same kwargs: the same program under the interpreter, so the same bits
        groups: dict[str, list[int]] = {}
        for i in ran:
            groups.setdefault(repr(sorted(tuned.configs[i].kwargs.items())), []).append(i)
        for members in groups.values():
            first = per_config[members[0]]
            for i in members[1:]:
                same, worst = differences(first, per_config[i])  # type: ignore[arg-type]
                if not same:
                    broken.append(
                        f"{label(tuned.kernel, tuned.configs[i])} differs from "
                        f"{label(tuned.kernel, tuned.configs[members[0]])} by up to {worst:.3g}"
                    )
    if len(ran) > 1:
        base = per_config[ran[0]]
        diffs = [differences(base, per_config[i]) for i in ran[1:]]  # type: ignore[arg-type]
        identical = 1 + sum(same for same, _ in diffs)
        worst = max(w for _, w in diffs)
        notes.insert(
            0,
            f"{identical} of {len(ran)} configs bitwise identical to the first on {problem.describe()}; "
            f"largest difference {worst:.3g}" + ("" if interpreted else " (information: not promised on a GPU)"),
        )
    r.note = "; ".join(notes)
    if broken:
        r.status = "failed"
        message = (
            "configs that differ only in launch options gave different bits under the interpreter "
            "(which ignores them): " + "; ".join(broken)
        )
        r.failure = Failure(message, None, {}, None, description=problem.describe())
    return r


def run_all_configs(
    impl: Implementation,
    plan: Plan,
    properties: Sequence[Property],
    run: RunSettings,
    grad: bool = False,
    progress: Progress | None = None,
    on_result: Callable[[PropertyResult], None] | None = None,
) -> list[PropertyResult]:
    """Each property under each (kernel, config) of ``plan``, that kernel pinned, then each kernel's
    :data:`AGREEMENT` on ``plan.problem``; ``on_result`` sees each result as soon as it is known. A
    misuse or a lost GPU context ends the run, as in ``runners.check.run_check``."""
    results: list[PropertyResult] = []
    guard = Guard(run.timeout)
    problem = plan.problem
    assert problem is not None  # made with the plan (options.all_configs_plan)

    def emit(r: PropertyResult) -> None:
        results.append(r)
        if on_result is not None:
            on_result(r)

    try:
        for tuned in plan.kernels:
            per_config: list[dict[str, np.ndarray] | str] = []
            seconds = 0.0  # the fixed problem's calls: the agreement's time
            for index, config in enumerate(tuned.configs):
                where = dict(kernel=tuned.kernel, config=config_text(config), index=index)
                with pinned(tuned, config):
                    start = time.perf_counter()
                    try:
                        per_config.append(outputs(guard.guarded(impl), problem, grad))
                    except Exception as exc:  # noqa: BLE001 - the properties report it under this config
                        per_config.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                    seconds += time.perf_counter() - start
                    for prop in properties:
                        r = run_property(prop, impl, run, progress, guard)
                        r.config = where
                        if r.failure is not None and r.failure.case_path is not None:
                            r.failure.message += (
                                f"\nonly under {label(tuned.kernel, config)}: a replay runs the kernel's own "
                                "choice of config (rerun check --all-configs to reproduce)"
                            )
                        emit(r)
                        if r.status == "misuse" or r.context_lost:
                            return results
            r = agreement(tuned, per_config, plan.interpreted, problem)
            r.seconds, r.split = seconds, {"kernel": seconds, "ours": 0.0}
            emit(r)
    finally:
        guard.close()
    return results
