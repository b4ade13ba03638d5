"""The public Python API: ``check``, ``replay``, ``fuzz`` and ``selftest`` on any implementation.

``impl`` is a callable in FLA's convention, a ``"MODULE:FUNCTION"`` string, a built-in name
(``numpy``, ``cupy``, ``fla-chunk``, ... see ``gdn_verify.implementations.names()``) or an
:class:`~gdn_verify.core.implementation.Implementation`. ``grad=True`` (``check``, ``selftest``)
verifies the backward instead of the forward: the gradient properties
(``gdn_verify.properties.gradients``) against a functional backward, the implementation's own
(``convention="backward"``) or, for a torch forward, autograd's. Bad arguments raise
:class:`~gdn_verify.core.implementation.ConfigurationError` (a ``ValueError``) naming the argument.
``check``'s settings as one object, which the command line, the pytest plugin and the report
build: :class:`~gdn_verify.options.CheckOptions`; resolved against the implementation (every
setting checked, once) it is a :class:`~gdn_verify.options.ResolvedCheck`, which
:func:`check_resolved` runs.

Results as JSON: ``CheckResult.as_dict()``, :func:`fuzz_document` and :func:`selftest_document`
are documents of the versioned schema ``gdn_verify/schema/result.schema.json``
(:data:`SCHEMA_VERSION`); :func:`~gdn_verify.options.writable` checks an output path before a run and
:func:`write_json` replaces a document atomically, so that it can be rewritten as results arrive.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import tempfile
import time
import warnings
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gdn_verify import console, implementations
from gdn_verify import options as _options
from gdn_verify.core import environment
from gdn_verify.core.backends import Tally
from gdn_verify.core.implementation import BACKWARD_FORM, SPEC_FORM, ConfigurationError, Implementation
from gdn_verify.core.problem import DTYPES, Problem
from gdn_verify.core.property import Property
from gdn_verify.core.shapes import COMPILED_SCALES
from gdn_verify.implementations import planted
from gdn_verify.options import (
    SCALE_PREFIX,
    CheckOptions,
    FuzzOptions,
    ImplLike,
    ResolvedCheck,
    ResolvedFuzz,
    ResolvedSelftest,
    SelftestOptions,
    checks_gradients,
    grad_catalogue,
    implementation,
    scale_name,
    suite_catalogue,
    suite_limits,
    valid_choice,
    valid_compile_budget,
)
from gdn_verify.properties import LARGE_CPU, LARGE_GPU, Limits, catalogue
from gdn_verify.properties.strategies import pool_candidates
from gdn_verify.runners import configs as configs_runner
from gdn_verify.runners import fuzz as fuzz_runner
from gdn_verify.runners import scale as scale_runner
from gdn_verify.runners import workers as workers_runner
from gdn_verify.runners.check import (
    CASES_DIR,
    NOT_PASSED,
    SPLIT_LABELS,
    STATUSES,
    Failure,
    Progress,
    PropertyResult,
    Replay,
    RunSettings,
    run_check,
)
from gdn_verify.runners.check import replay as replay_case
from gdn_verify.runners.compile import (
    PLANS_DIR,
    CompileProgress,
    PlanKey,
    ShapePlan,
    load_plan,
    plan_shapes,
    save_plan,
    warm_plan,
)
from gdn_verify.runners.guard import DEFAULT_TIMEOUT, FIRST_CALL_FACTOR, Guard
from gdn_verify.runners.selftest import Planted, run_selftest

# Moved to gdn_verify.options with the rest of the validating; still here for their callers (the plugin).
scale_selection, select, writable = _options.scale_selection, _options.select, _options.writable

SCHEMA_VERSION = "1.0"
SCHEMA_PATH = Path(__file__).resolve().parent / "schema" / "result.schema.json"
RUN_STATUSES = ("running", "complete", "interrupted", "misuse", "stopped")  # a JSON document's own status


def grad_names() -> tuple[str, ...]:
    """The gradient properties' names (empty where the module cannot be imported)."""
    try:
        from gdn_verify.properties.gradients import GRAD_NAMES
    except ImportError:
        return ()
    return tuple(GRAD_NAMES)


def catalogue_for(impl: Implementation, options: CheckOptions | None = None) -> dict[str, Property]:
    """The properties for ``impl`` under ``check``'s ``options`` (``dtype``, ``dims``, ``max_tokens``;
    ``grad``: the gradient properties)."""
    options = options or CheckOptions()
    dtype = valid_choice("dtype", options.dtype or impl.default_dtype, DTYPES)
    limits = suite_limits(impl, dtype, options.dims, options.max_tokens)
    return suite_catalogue(limits, checks_gradients(impl, options.grad, options.convention))


def jsonable(x: Any) -> Any:
    """``x`` with NumPy scalars and arrays as Python values and non-finite floats as "inf", "-inf", "nan"
    (JSON has no infinity)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):
        return jsonable(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, Path):
        return str(x)
    return x


def _header(kind: str, status: str, command: Sequence[str] | None, array: str) -> dict[str, Any]:
    if status not in RUN_STATUSES:
        raise ValueError(f"status {status!r}: expected one of {RUN_STATUSES}")
    return dict(
        schema_version=SCHEMA_VERSION,
        kind=kind,
        status=status,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command=None if command is None else " ".join(command),
        environment=environment.describe(array),
    )


def _rows(results: Sequence[PropertyResult], impl: Implementation, convention: str) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        row = r.as_dict()
        if row.get("failure"):
            case = r.failure.case_path if r.failure is not None else None
            row["failure"]["replay"] = None if case is None else console.replay_command(case, impl, convention)
        rows.append(row)
    return rows


def totals(results: Sequence[PropertyResult]) -> dict[str, int]:
    """How many properties ended in each status (every status present, zeros included)."""
    return {s: sum(r.status == s for r in results) for s in STATUSES}


def write_json(path: str | Path, document: dict[str, Any]) -> None:
    """Write ``document`` to ``path`` atomically (a reader never sees half a file)."""
    path = Path(path)
    text = json.dumps(jsonable(document), indent=2, allow_nan=False)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass
class CheckResult:
    """Every property's verdict for one implementation and dtype."""

    impl: Implementation
    dtype: str
    seed: int
    results: list[PropertyResult] = field(default_factory=list)
    convention: str = "native"
    timeout: float | None = DEFAULT_TIMEOUT
    shapes: ShapePlan | None = None  # compile-aware shape planning (None: not planned)
    seconds: float = 0.0  # the whole check, compilation included
    startup_seconds: float | None = None  # from the process's start to the check's (imports, the CLI)
    grad: bool = False  # the gradient properties, against the backward
    # Properties not run: a property left the GPU context broken (PropertyResult.context_lost) and
    # every later call of this process would fail alike; run them in a fresh process.
    not_run: list[str] = field(default_factory=list)
    # check --all-configs: the autotuned kernels and configs the properties ran under (None: not asked)
    configs: configs_runner.Plan | None = None
    backend: str | None = None  # the backend every call had to run on (check's ``backend``), or None

    @classmethod
    def started(cls, run: ResolvedCheck) -> CheckResult:
        """``run``'s result before its first property: its implementation, dtype, seed and settings,
        no results yet (what the command line saves as its run goes)."""
        return cls(
            run.impl,
            run.dtype,
            run.seed,
            convention=run.options.convention,
            timeout=run.options.timeout,
            grad=run.grad,
            configs=run.configs,
            backend=run.options.backend,
        )

    def backends(self) -> Tally:
        """The backend each call of the whole check ran on, over every property."""
        tally = Tally()
        for r in self.results:
            tally.merge(r.backends)
        return tally

    @property
    def passed(self) -> bool:
        """No property failed, timed out, raised or misused (unsupported ones do not count against it)."""
        return not self.failures

    @property
    def failures(self) -> list[PropertyResult]:
        """Properties with a verdict against the implementation: failed, timeout, error, misuse."""
        return [r for r in self.results if r.status in NOT_PASSED]

    @property
    def misuse(self) -> PropertyResult | None:
        """The property on which the kernel could not take the arguments (the run stopped there)."""
        return next((r for r in self.results if r.status == "misuse"), None)

    def __getitem__(self, name: str) -> PropertyResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(name)

    def counts(self) -> dict[str, int]:
        """Properties per status: passed, failed, unsupported, timeout, error, misuse."""
        return totals(self.results)

    def time_split(self) -> dict[str, float]:
        """Seconds of the whole check by where they went: ``compile`` (the shape pool, up front),
        then the properties' ``kernel``, ``oracle``, ``causes`` and ``ours`` (see ``PropertyResult.split``)."""
        split: dict[str, float] = {}
        if self.shapes is not None and self.shapes.compile_seconds:
            split["compile"] = self.shapes.compile_seconds
        for label in (*SPLIT_LABELS, "ours"):
            seconds = sum(r.split.get(label, 0.0) for r in self.results)
            if seconds or label == "ours":
                split[label] = seconds
        return split

    def replay_command(self, result: PropertyResult) -> str | None:
        """The shell command that reruns a failed property's minimal example."""
        if result.failure is None or result.failure.case_path is None:
            return None
        return console.replay_command(result.failure.case_path, self.impl, self.convention)

    def report(self) -> str:
        """Every failure with its minimal example and replay command, then the counts."""
        lines = [console.format_failure(r, self.replay_command(r)) for r in self.failures]
        what = f"{self.impl.name}, {self.dtype}" + (", gradients" if self.grad else "")
        lines.append(f"{what}: {console.format_counts(self.counts())}")
        return "\n".join(lines)

    def assert_passed(self) -> None:
        """Raise ``AssertionError`` carrying each failure's minimal example (for a user's own test)."""
        if not self.passed:
            raise AssertionError(self.report())

    def as_dict(self, status: str | None = None, command: Sequence[str] | None = None) -> dict[str, Any]:
        """The JSON document (schema ``kind: check``); ``status`` defaults to complete (misuse when
        the kernel could not take the arguments); ``command``: the command line, recorded."""
        status = status or ("misuse" if self.misuse is not None else "stopped" if self.not_run else "complete")
        return dict(
            _header("check", status, command, self.impl.array),
            impl=self.impl.name,
            array=self.impl.array,
            dtype=self.dtype,
            seed=self.seed,
            convention=self.convention,
            **({"grad": True} if self.grad else {}),
            timeout=self.timeout,
            totals=self.counts(),
            results=_rows(self.results, self.impl, self.convention),
            **_plan_dict(self.shapes, self.seconds),
            time_split={label: round(t, 2) for label, t in self.time_split().items()},
            **({} if self.startup_seconds is None else {"startup_seconds": round(self.startup_seconds, 1)}),
            **({"not_run": self.not_run} if self.not_run else {}),
            **({"all_configs": self.configs.as_dict()} if self.configs is not None else {}),
            backend=dict(self.backends().as_dict(), required=self.backend),
        )


def check(
    impl: ImplLike,
    *,
    array: str | None = None,
    dtype: str | None = None,
    properties: Sequence[str] | None = None,
    seed: int | None = None,
    max_examples: int | None = None,
    dims: Sequence[int] | None = None,
    max_tokens: int | None = None,
    database: str | Path | None = None,
    cases_dir: str | Path = CASES_DIR,
    plans_dir: str | Path | None = PLANS_DIR,
    convention: str = "native",
    timeout: float | None = DEFAULT_TIMEOUT,
    progress: Progress | None = None,
    on_result: Callable[[PropertyResult], None] | None = None,
    compile_budget: str | float | None = None,
    on_compile: CompileProgress | None = None,
    scale: bool = False,
    scale_limits: scale_runner.ScaleLimits | None = None,
    grad: bool = False,
    all_configs: bool = False,
    config_kernels: Sequence[str] | None = None,
    backend: str | None = None,
) -> CheckResult:
    """Run the property suite against ``impl``; ``CheckResult.passed`` is the verdict.

    ``array``: the array type a callable or ``MODULE:FUNCTION`` takes (numpy, torch, cupy);
    ``dtype``: input dtype (float32 for NumPy, bfloat16 for GPU arrays by default);
    ``properties``: names (default: all that apply); ``seed``: Hypothesis seed (default random,
    recorded in the result); ``max_examples``: per property (default: each property's own);
    ``dims``: draw head sizes K and V only from these (kernels compiled per size);
    ``max_tokens``: longest T of ``error_growth``; ``database``: Hypothesis example database
    directory (it takes precedence over ``seed``); ``cases_dir``: where minimal cases are saved;
    ``convention="spec"``: a callable in the speculative-decoding convention; ``timeout``: seconds
    a compiled kernel call may take (the first call of a new shape gets ten times that for
    compilation; None or 0: no limit; see ``gdn_verify.runners.guard``).
    A callable whose signature cannot take the arguments raises :class:`ConfigurationError`
    before anything runs.
    ``compile_budget``: seconds (or ``"3m"``, the default) for compiling shape classes up front when a new
    class is expensive (JIT-compiled kernels), ``on_compile(done, planned, seconds)`` its progress.
    ``plans_dir``: where the chosen pool is stored and read back (None: neither); a run with the
    same implementation, version, device, dtype, head sizes and gradient mode reuses the stored
    pool (no probe, no new classes) unless ``compile_budget`` is given, which plans afresh and
    replaces it (``CheckResult.shapes.describe()`` says which).
    ``scale``: after the properties, the scale tier (``gdn_verify.runners.scale``: problems past the
    launch-grid and 2^31-element limits, each in a child process; GPU implementations only, unless
    ``scale_limits`` shrinks the limits). Its cases are results named ``scale_<case>``; naming only
    such cases in ``properties`` runs the tier alone.
    ``grad``: the gradient properties instead (``gdn_verify.properties.gradients``; ``properties``
    then names among them) against the implementation's backward form: its own, or for a torch
    forward autograd's (``implementations.with_backward``). Implied by ``convention="backward"``
    (``impl`` a functional backward ``fn(q, k, v, g, beta, scale=None, initial_state=None,
    use_qk_l2norm_in_kernel=False, cu_seqlens=None, *, do, dht=None) -> (dq, dk, dv, dg, dbeta,
    dh0)``) and by an implementation with only a backward form. Not with ``scale`` (yet).
    ``all_configs``: for each autotuned Triton kernel the implementation launches, the properties
    (by default ``runners.configs.DEFAULT_PROPERTIES``) under each config of its autotuner, one at a
    time, each result labelled with the kernel and config (``PropertyResult.config``), then one
    ``same_across_configs`` result per kernel (``gdn_verify.runners.configs`` says what is promised);
    torch implementations with Triton kernels only, not with ``scale``. The cost, known before the
    run: ``CheckOptions(all_configs=True).resolve(impl).configs.describe()``. ``config_kernels``
    (with ``all_configs``): sweep only these kernels, by the names that plan lists; the others
    keep their autotuner's choice (a kernel author iterating on one kernel; a backward whose
    forward kernels were swept already).
    ``backend``: every call must run on this backend (``gdn_verify.core.backends.BACKENDS``: ``triton``,
    ``flash_qla``, ``cupy-fused``, ...); a call that ran elsewhere fails its property ("ran on triton,
    not flash_qla (fallback)"). Without it the backends are recorded (``CheckResult.backends()``).

    The same settings as one object: ``check(impl, **options.keywords())`` with a
    :class:`~gdn_verify.options.CheckOptions`, which validates them (as this call does first), then
    :meth:`~gdn_verify.options.CheckOptions.resolve` checks them against ``impl`` before anything
    runs; :func:`check_resolved` runs what that gives.
    """
    options = CheckOptions(
        array=array,
        dtype=dtype,
        properties=properties,
        seed=seed,
        max_examples=max_examples,
        dims=dims,
        max_tokens=max_tokens,
        database=database,
        cases_dir=cases_dir,
        plans_dir=plans_dir,
        convention=convention,
        timeout=timeout,
        compile_budget=compile_budget,
        scale=scale,
        scale_limits=scale_limits,
        grad=grad,
        all_configs=all_configs,
        config_kernels=config_kernels,
        backend=backend,
    )
    return check_resolved(options.resolve(impl), progress=progress, on_result=on_result, on_compile=on_compile)


def check_resolved(
    run: ResolvedCheck,
    *,
    progress: Progress | None = None,
    on_result: Callable[[PropertyResult], None] | None = None,
    on_compile: CompileProgress | None = None,
) -> CheckResult:
    """Run a check that :meth:`CheckOptions.resolve` made (every setting checked there): the shape
    pool planned, the properties, then the scale cases; the callbacks as for :func:`check`. Asks
    nothing of its caller and validates nothing again: it runs to the end and returns the result."""
    start, startup = time.perf_counter(), environment.process_seconds()
    options, impl = run.options, run.impl
    limits, shapes = run.limits, None
    if not run.scale_only:  # the scale tier alone compiles nothing up front (each child compiles its own case)
        limits, shapes = plan_limits(
            impl, limits, options.compile_budget, on_compile, options.timeout, options.plans_dir
        )
    available = suite_catalogue(limits, run.grad)
    props = [available[name] for name in run.properties]
    settings = RunSettings(
        max_examples=options.max_examples,
        seed=run.seed,
        database=None if options.database is None else str(options.database),
        cases_dir=Path(options.cases_dir),
        timeout=options.timeout,
        backend=options.backend,
    )
    result = CheckResult.started(run)
    result.shapes, result.startup_seconds = shapes, startup
    if run.configs is not None:  # --all-configs: every property under each (kernel, config)
        result.results = configs_runner.run_all_configs(
            impl, run.configs, props, settings, run.grad, progress, on_result
        )
    else:
        result.results = run_check(impl, props, settings, progress, on_result)
    if result.results and result.results[-1].context_lost and run.configs is None:
        result.not_run = [p.name for p in props[len(result.results) :]]
    if run.scale_cases:
        result.results += _run_scale(
            impl, run.dtype, list(run.scale_cases), options.scale_limits, run.seed, options.timeout, progress, on_result
        )
    result.seconds = time.perf_counter() - start
    return result


def _run_scale(
    impl: Implementation,
    dtype: str,
    cases: list[str],
    limits: scale_runner.ScaleLimits | None,
    seed: int,
    timeout: float | None,
    progress: Progress | None,
    on_result: Callable[[PropertyResult], None] | None,
) -> list[PropertyResult]:
    """The scale cases, each child given what a first call may take (it compiles afresh)."""
    results = []

    def started(case: scale_runner.ScaleCase) -> None:
        if progress is not None:
            progress(SCALE_PREFIX + case.name, 0, None)

    def finished(outcome: scale_runner.ScaleOutcome) -> None:
        results.append(scale_result(outcome))
        if on_result is not None:
            on_result(results[-1])

    if not impl.native_forms:  # the cases call the native form: nothing to run, and the reason
        why = f"the scale tier calls the native (FLA-convention) form; {impl.name} has only: {', '.join(impl.forms)}"
        for case in scale_runner.plan(limits or scale_runner.ScaleLimits()):
            if case.name in cases:
                started(case)
                finished(scale_runner.ScaleOutcome(case.name, "unsupported", why, case.describe(), 0.0))
        return results
    name = scale_name(impl)
    assert name is not None  # checked by options.scale_selection
    scale_runner.run_scale(
        name,
        dtype,
        array=impl.array if implementations.is_plugin(name) else None,
        convention="native",
        limits=limits or scale_runner.ScaleLimits(),
        cases=cases,
        seed=seed,
        on_case=finished,
        on_start=started,
        timeout=FIRST_CALL_FACTOR * timeout if timeout else None,
    )
    return results


def scale_result(outcome: scale_runner.ScaleOutcome) -> PropertyResult:
    """A scale case's outcome as a property's result (skipped for memory: unsupported, with the reason)."""
    status = outcome.status if outcome.status in ("passed", "failed", "timeout") else "unsupported"
    r = PropertyResult(SCALE_PREFIX + outcome.case, status, examples=1, seconds=outcome.seconds, worst=outcome.worst)
    if status == "unsupported":
        r.unsupported, r.unsupported_reasons, r.examples = 1, {outcome.message: 1}, 0
        r.note = outcome.message
    elif status in ("failed", "timeout"):
        r.failure = Failure(
            outcome.message,
            None,
            {},
            outcome.worst,
            status=status,
            traceback=outcome.detail.get("traceback"),
            description=outcome.describe,
        )
    else:
        stages = ", ".join(f"{name} {t:.1f} s" for name, t in outcome.detail.get("seconds", {}).items())
        r.note = outcome.describe.split("; crosses ", 1)[-1] + (f" ({stages})" if stages else "")
    return r


@dataclass
class ReplayResult(Replay):
    """A replayed case: the outcome, and the implementation, property and problem it ran."""

    impl: Implementation | None = None
    property: str = ""
    problem: Problem | None = None
    form: str = "native"  # the property's form: native, spec or backward (a gradient property)


def _replay_property(name: str, limits: Limits, case: str | Path) -> Property:
    """The property named ``name``, forward or gradient (a saved case records only the name)."""
    available = catalogue(limits)
    if name in available:
        return available[name]
    try:
        gradients = grad_catalogue(limits)
    except ImportError:
        gradients = {}
    if name in gradients:
        return gradients[name]
    choices = ", ".join([*available, *gradients])
    raise ConfigurationError("property", f"{name!r} (from {case}): choose from {choices}")


def replay(
    case: str | Path,
    impl: ImplLike | None = None,
    *,
    array: str | None = None,
    property: str | None = None,
    convention: str | None = None,
) -> ReplayResult:
    """Rerun a saved case, by default against the implementation and array type recorded in it.

    ``convention`` applies to a ``MODULE:FUNCTION`` or callable ``impl``; by default the property's
    form says it: spec for the speculative-decoding properties; for a gradient property
    ``backward`` (a functional backward), except for torch arrays, whose native function's backward
    autograd gives (pass ``convention="backward"`` for a torch functional backward).
    """
    path = Path(case)
    if not path.is_file():
        raise ConfigurationError("case", f"{str(case)!r}: no such case file")
    try:
        problem, meta = Problem.load(path)
    except (ValueError, KeyError, OSError, zipfile.BadZipFile) as exc:
        # NumPy's own message for a file that is not an .npz archive talks of pickles: say what it is not
        raise ConfigurationError(
            "case", f"{case}: not a case file that check saved (an .npz of a minimal example): {type(exc).__name__}"
        ) from None
    name = property or meta.get("property", "matches_reference")
    prop = _replay_property(name, Limits(dtype=problem.dtype.name), case)
    if impl is None:
        if "impl" not in meta:
            raise ConfigurationError("impl", f"{case} records no implementation; name one")
        impl, array = meta["impl"], array or meta.get("array")
    if convention is None:
        convention = "spec" if prop.form == SPEC_FORM else "native"
        if prop.form == BACKWARD_FORM and (array or "numpy") != "torch":
            convention = BACKWARD_FORM
    if isinstance(impl, str) and not implementations.is_plugin(impl):
        convention, array = "native", None  # built-ins know their own array type and forms
    impl = implementation(impl, array, convention)
    if prop.form == BACKWARD_FORM:
        impl = implementations.with_backward(impl)
    outcome = replay_case(problem, meta.get("params", {}), impl, prop)
    replayed = (outcome.status, outcome.message, outcome.measurement, outcome.cause, outcome.kind)
    return ReplayResult(*replayed, impl=impl, property=name, problem=problem, form=prop.form)


def fuzz(
    impl: ImplLike,
    budget: str | float = "30m",
    *,
    array: str | None = None,
    dtype: str | None = None,
    properties: Sequence[str] | None = None,
    seed: int | None = None,
    dims: Sequence[int] | None = None,
    max_tokens: int = 2048,
    database: str | Path = fuzz_runner.DATABASE_DIR,
    cases_dir: str | Path = CASES_DIR,
    plans_dir: str | Path | None = PLANS_DIR,
    convention: str = "native",
    timeout: float | None = DEFAULT_TIMEOUT,
    progress: Callable[[fuzz_runner.FuzzReport, str], None] | None = None,
    on_result: Callable[[PropertyResult], None] | None = None,
    on_round: Callable[[fuzz_runner.FuzzReport], None] | None = None,
    compile_budget: str | float | None = None,
    on_compile: CompileProgress | None = None,
    workers: int | str = 1,
) -> fuzz_runner.FuzzReport:
    """A time-budgeted campaign (``budget``: seconds or ``"90s"``, ``"30m"``, ``"1h"``).

    On GPU arrays ``matches_reference`` and ``gate_extremes`` draw large problems checked against
    the float64 GPU oracle when it can run here. ``timeout`` as in :func:`check`; ``on_round``
    sees the report after each property run (to save partial results). ``compile_budget`` as for
    :func:`check` (its time counts against ``budget``; without one, at most half of ``budget`` goes to
    compilation), and ``plans_dir`` as for :func:`check`. ``workers``: processes over disjoint shards
    of the properties, one GPU each (round robin over the visible ones) or one per CPU core for
    NumPy implementations (``"auto"``: as many as GPUs, or cores), sharing ``database``; their
    reports are merged.
    """
    options = FuzzOptions(
        budget=budget,
        array=array,
        dtype=dtype,
        properties=properties,
        seed=seed,
        dims=dims,
        max_tokens=max_tokens,
        database=database,
        cases_dir=cases_dir,
        plans_dir=plans_dir,
        convention=convention,
        timeout=timeout,
        compile_budget=compile_budget,
        workers=workers,
    )
    return fuzz_resolved(
        options.resolve(impl), progress=progress, on_result=on_result, on_round=on_round, on_compile=on_compile
    )


def fuzz_resolved(
    run: ResolvedFuzz,
    *,
    progress: Callable[[fuzz_runner.FuzzReport, str], None] | None = None,
    on_result: Callable[[PropertyResult], None] | None = None,
    on_round: Callable[[fuzz_runner.FuzzReport], None] | None = None,
    on_compile: CompileProgress | None = None,
) -> fuzz_runner.FuzzReport:
    """Run a campaign that :meth:`FuzzOptions.resolve` made (every setting checked there), the
    callbacks as for :func:`fuzz`: in this process, or sharded over ``run.workers`` processes, each
    a :func:`fuzz` of its own share of the properties."""
    options, impl, seconds = run.options, run.impl, run.seconds
    if run.workers > 1:
        common = dict(
            options.keywords(),
            impl=run.portable,
            budget=seconds,
            database=str(options.database),
            cases_dir=str(options.cases_dir),
            plans_dir=None if options.plans_dir is None else str(options.plans_dir),
            workers=1,
        )
        shards = [
            dict(common, properties=part, seed=None if options.seed is None else options.seed + 1_000_003 * i)
            for i, part in enumerate(workers_runner.shard(list(run.properties), run.workers))
        ]
        envs = workers_runner.worker_environments(run.workers, gpu=impl.array != "numpy")
        return workers_runner.run_sharded(fuzz, shards, envs, progress, on_result, on_round)
    # A short campaign must not spend all of its time compiling; an explicit budget re-plans.
    default_budget = min(DEFAULT_COMPILE_BUDGET, seconds / 2)
    limits, shapes = plan_limits(
        impl, run.limits, options.compile_budget, on_compile, options.timeout, options.plans_dir, default_budget
    )
    oracle_name, oracle = implementations.choose_oracle(impl.array)
    large = LARGE_GPU if impl.array != "numpy" and oracle_name.startswith("cupy") else LARGE_CPU
    large = large.replace(dtype=run.dtype, head_dims=limits.head_dims if options.dims is not None else large.head_dims)
    large = large.replace(shape_classes=limits.shape_classes)
    available = catalogue(limits, large, oracle)
    props = [available[name] for name in run.properties]
    report = fuzz_runner.run_fuzz(
        impl,
        props,
        max(seconds - shapes.compile_seconds, 0.1 * seconds),  # compilation is part of the budget
        seed=options.seed,
        database=options.database if str(options.database).startswith("redis://") else Path(options.database),
        cases_dir=Path(options.cases_dir),
        progress=progress,
        on_result=on_result,
        on_round=on_round,
        timeout=options.timeout,
    )
    report.compile_seconds = shapes.compile_seconds
    report.shape_classes = None if shapes.classes is None else len(shapes.classes)
    return report


def fuzz_document(
    report: fuzz_runner.FuzzReport,
    impl: Implementation,
    dtype: str,
    *,
    seed: int | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
    convention: str = "native",
    status: str | None = None,
    command: Sequence[str] | None = None,
) -> dict[str, Any]:
    """A campaign as a JSON document (schema ``kind: fuzz``)."""
    results = list(report.properties.values())
    status = status or ("misuse" if any(r.status == "misuse" for r in results) else "complete")
    w = report.worst
    worst = None if w is None else dict(property=w[0], error=w[1].error, bound=w[1].bound, ratio=w[1].ratio)
    return dict(
        _header("fuzz", status, command, impl.array),
        impl=impl.name,
        array=impl.array,
        dtype=dtype,
        seed=seed,
        convention=convention,
        timeout=timeout,
        totals=totals(results),
        results=_rows(results, impl, convention),
        campaign=dict(
            budget=report.budget,
            elapsed=round(report.elapsed, 2),
            cases=report.cases,
            rounds=report.rounds,
            first_failure_case=report.first_failure_case,
            worst=worst,
            compile_seconds=round(report.compile_seconds, 2),
            shape_classes=report.shape_classes,
            workers=report.workers,
            worker_errors=report.worker_errors,
        ),
    )


def selftest_document(
    rows: Sequence[Planted],
    dtype: str,
    *,
    seed: int | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
    status: str = "complete",
    command: Sequence[str] | None = None,
    grad: bool = False,
) -> dict[str, Any]:
    """A selftest as a JSON document (schema ``kind: selftest``): one row per planted bug
    (``grad``: the planted gradient bugs, ``impl`` ``planted-grad``)."""
    bugs = []
    for row in rows:
        caught = None
        if row.caught_by is not None:
            impl = row.impl or implementations.resolve(f"planted:{row.bug}")
            (caught,) = _rows([row.caught_by], impl, "native")
        bugs.append(
            dict(
                bug=row.bug,
                description=row.description,
                caught=row.caught_by is not None,
                caught_by=caught,
                margin=row.margin,
                cause=row.cause_verdict,
                seconds=round(row.seconds, 2),
                **({"not_applicable": row.not_applicable} if row.not_applicable else {}),
            )
        )
    caught_count = sum(row.caught_by is not None for row in rows)
    skipped = sum(bool(row.not_applicable) for row in rows)
    causes = {f"cause_{v}": sum(row.cause_verdict == v for row in rows) for v in ("right", "wrong", "none")}
    array = next((row.impl.array for row in rows if row.impl is not None), "numpy")
    return dict(
        _header("selftest", status, command, array),
        impl="planted-grad" if grad else "planted",
        array=array,
        dtype=dtype,
        seed=seed,
        **({"grad": True} if grad else {}),
        timeout=timeout,
        totals=dict(
            bugs=len(bugs),
            caught=caught_count,
            missed=len(bugs) - caught_count - skipped,
            not_applicable=skipped,
            **causes,
        ),
        bugs=bugs,
    )


def selftest(
    *,
    dtype: str = "float32",
    seed: int | None = None,
    max_examples: int | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
    on_bug: Callable[[Planted], None] | None = None,
    grad: bool = False,
) -> list[Planted]:
    """Run the suite against every planted bug; each row says which property caught it (None:
    missed, or not run where the bug is no bug on ``dtype`` inputs: ``Planted.not_applicable``).

    ``grad``: the planted gradient bugs (``gdn_verify.implementations.planted_grad``) against the
    gradient properties, the named causes judged against its ``RIGHT_CAUSES``.
    """
    options = SelftestOptions(dtype=dtype, seed=seed, max_examples=max_examples, timeout=timeout, grad=grad)
    return selftest_resolved(options.resolve(), on_bug=on_bug)


def selftest_resolved(run: ResolvedSelftest, *, on_bug: Callable[[Planted], None] | None = None) -> list[Planted]:
    """Run a selftest that :meth:`SelftestOptions.resolve` made; ``on_bug`` as for :func:`selftest`."""
    options = run.options
    limits = Limits(dtype=options.dtype)
    settings = RunSettings(max_examples=options.max_examples, seed=run.seed, timeout=options.timeout)
    if not options.grad:
        properties = list(catalogue(limits).values())
        return run_selftest(properties, settings, on_bug, not_applicable=planted.not_applicable(options.dtype))
    return run_selftest(list(grad_catalogue(limits).values()), settings, on_bug, bugs=run.bugs)


# Compile-aware shape planning (issue 14) ----------------------------------------------------
# FLA's chunked kernel costs 25-55 s per new shape class on an H100 with a cold Triton cache, and
# the properties then compile more variants of the pool's classes as they meet them (options,
# state layouts). Measured (H100, 2026-11-23, cold `check --impl fla-chunk`): with 5 minutes the
# pool was 7 classes (4 min 34 s) and the check ran past 9.5 minutes; with 3 minutes it was 4
# classes (2 min 39 s) and the check took 8 min 4 s, inside the 10 minutes a cold check may take.
DEFAULT_COMPILE_BUDGET = 180.0


def plan_limits(
    impl: Implementation,
    limits: Limits,
    compile_budget: str | float | None = None,
    on_compile: CompileProgress | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
    plans_dir: str | Path | None = None,
    default_budget: float = DEFAULT_COMPILE_BUDGET,
) -> tuple[Limits, ShapePlan]:
    """``limits`` with a shape pool when a new shape class of ``impl`` is expensive (see ``runners.compile``).

    The probe's calls are guarded by ``timeout`` like the properties' (a hung kernel must not hang
    the planning); a call that times out keeps its class in the pool, for the properties to report.
    An implementation declaring ``extra["compile_scales"]`` (a kernel compiled per scale value)
    gets ``shapes.COMPILED_SCALES`` as the explicit scales drawn, which its warm variants cover.
    ``plans_dir`` (None: nothing stored or read): the pool is stored there per implementation,
    version, device, dtype, head sizes and gradient mode, and the next run with the same key
    reuses it (no probe, no new classes: a warm cache compiles nothing); an explicit
    ``compile_budget`` plans afresh and replaces the stored plan, and without one
    ``default_budget`` applies. The classes compile in parallel worker processes when ``impl`` was
    resolved by name (``runners.compile_workers``; ``GDN_VERIFY_COMPILE_WORKERS=1``: none), their
    calls guarded by ``timeout`` too.
    """
    given = valid_compile_budget(compile_budget)
    budget = default_budget if given is None else given
    path, stored, key = None, None, None
    note = "no plans directory: not stored"
    if plans_dir is not None:
        key = PlanKey.of(impl, limits.dtype, limits.head_dims)
        path = Path(plans_dir) / key.filename()
        if compile_budget is None:
            stored, note = load_plan(path, key)
        else:
            note = "a compile budget was given: the pool is re-planned" + (
                " and replaces the stored plan" if path.exists() else ""
            )
    guard = Guard(timeout)
    try:
        with warnings.catch_warnings():  # the kernel's warnings are counted by the properties, not streamed here
            warnings.simplefilter("ignore")
            if stored is not None:
                plan = warm_plan(guard.guarded(impl), stored, on_compile, timeout=timeout)
            else:
                plan = plan_shapes(guard.guarded(impl), pool_candidates(limits), budget, on_compile, timeout=timeout)
    finally:
        guard.close()
    plan.path = path
    if impl.extra.get("compile_scales"):  # every scale drawn is a compile of every class and variant
        limits, plan.scales = limits.replace(scales=COMPILED_SCALES), COMPILED_SCALES
    if plan.source == "planned":
        plan.note = "; ".join(n for n in (note, plan.note) if n)  # the planner's own: why no worker processes
        # No pool (a cheap implementation): nothing to store.
        if path is not None and key is not None and plan.classes is not None:
            try:
                save_plan(path, key, plan)
            except OSError as exc:  # an unwritable directory costs the next run a fresh plan, not this one
                plan.path, plan.note = None, f"{note}; not stored ({exc})"
        else:
            plan.path = None
    return (limits if plan.classes is None else limits.replace(shape_classes=plan.classes)), plan


def _plan_dict(plan: ShapePlan | None, seconds: float) -> dict[str, Any]:
    if plan is None:
        return {}
    return dict(
        seconds=round(seconds, 1),
        compile=dict(
            seconds=round(plan.compile_seconds, 1),
            new_class_seconds=plan.new_class_seconds,
            shape_classes=None if plan.classes is None else [c.describe() for c in plan.classes],
            plan_source=plan.source,
            plan_path=None if plan.path is None else str(plan.path),
            **({"plan_measured": plan.measured} if plan.measured else {}),
            **({"plan_note": plan.note} if plan.note else {}),
            **({"scales": list(plan.scales)} if plan.scales is not None else {}),
            **(
                {
                    "workers": plan.workers,
                    "worker_seconds": {c.describe(): round(t, 1) for c, t in plan.parallel_seconds.items()},
                }
                if plan.workers > 1
                else {}
            ),
            **(  # classes split into units of their warm calls: how many, and their wall time
                {
                    "worker_units": {c.describe(): n for c, n in plan.parallel_units.items()},
                    "worker_wall_seconds": {c.describe(): round(t, 1) for c, t in plan.parallel_wall.items()},
                }
                if plan.workers > 1 and plan.parallel_units
                else {}
            ),
            **({"worker_errors": plan.worker_errors} if plan.worker_errors else {}),
        ),
    )
