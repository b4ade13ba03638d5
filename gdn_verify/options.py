"""A command's settings as one object, validated in one place, then resolved against the implementation.

The path of a check's settings, from the command line or the Python API alike: :class:`CheckOptions`
holds what ``gdn_verify.check`` takes as keywords and refuses a bad value when it is made (what
needs no implementation: choices, ranges, head sizes, max tokens, timeout, compile budget);
:meth:`CheckOptions.resolve` loads the implementation and checks what needs it (its backward,
its signature, its default dtype, the scale tier, the property names), once, into a
:class:`ResolvedCheck`, which ``api.check_resolved`` runs to the end without asking again.
:class:`CheckCommand` is the ``check`` command line as one object: its flags, ``--json`` checked
for writability, the check resolved. ``fuzz`` and ``selftest`` have the same three steps
(:class:`FuzzOptions`, :class:`SelftestOptions`). Misuse anywhere here raises
:class:`ConfigurationError` naming the argument (the command line maps it to its flag: one
line, exit 2, before its header).

The command line (``check``'s flags), the pytest plugin (``--gdn-*``) and the report build a
:class:`CheckOptions`; a setting added later is a field here and a keyword of ``check``;
``tests/test_options.py`` fails until the command line and the plugin have its flag too (or list
it as an exception, with the reason), and keeps ``fuzz`` and ``selftest`` in step with theirs.

The ``valid_*`` functions are the checks of single values; each raises :class:`ConfigurationError`
naming the argument.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import os
import pickle
import random
import tempfile
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from gdn_verify import implementations
from gdn_verify.core import arrays, backends
from gdn_verify.core.implementation import BACKWARD_FORM, SPEC_FORM, ConfigurationError, Implementation
from gdn_verify.core.problem import DTYPES
from gdn_verify.core.property import Property
from gdn_verify.implementations import CONVENTIONS
from gdn_verify.properties import Limits, catalogue
from gdn_verify.properties.strategies import declared_head_dims, supported
from gdn_verify.runners import configs as configs_runner
from gdn_verify.runners import fuzz as fuzz_runner
from gdn_verify.runners import scale as scale_runner
from gdn_verify.runners import workers as workers_runner
from gdn_verify.runners.check import CASES_DIR
from gdn_verify.runners.compile import PLANS_DIR
from gdn_verify.runners.fuzz import parse_budget
from gdn_verify.runners.guard import DEFAULT_TIMEOUT
from gdn_verify.runners.scale import ScaleLimits

ImplLike = Implementation | Callable | str
MIN_TOKENS = 64  # error_growth needs a few chunks of 64 tokens
# Flags named otherwise than their field (--cases, --gdn-cases: cases_dir); every other is --FIELD.
FLAG_NAMES = {"cases_dir": "cases", "plans_dir": "plans"}


class _Settings:
    """What the settings objects share (frozen dataclasses): their keywords, a validated copy, the
    object made from a command line's flags, and the checks of the fields they have in common."""

    def keywords(self) -> dict[str, Any]:
        """The settings as the API function's keyword arguments."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    def replace(self: _S, **changes: Any) -> _S:
        """A copy with ``changes``, validated like a new one."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    @classmethod
    def from_flags(cls: type[_S], values: Mapping[str, Any], prefix: str = "") -> _S:
        """The options a command line gave: ``values`` by flag destination (``prefix`` + ``max_examples``,
        ``cases``, ...; see :func:`flag_name`), None or absent where unset (the field's default
        applies), comma-separated ``properties`` and ``dims`` split; other entries are ignored."""
        given: dict[str, Any] = {}
        for field in dataclasses.fields(cls):  # type: ignore[arg-type]
            value = values.get(prefix + flag_name(field.name))
            if field.name == "properties" and isinstance(value, str):
                value = comma_list(value)
            elif field.name == "dims" and isinstance(value, str):
                value = comma_dims(value)
            if value is not None:
                given[field.name] = value
        return cls(**given)


def _check_suite(settings: CheckOptions | FuzzOptions) -> None:
    """The fields that ``check`` and ``fuzz`` share, checked; ``properties`` and ``dims`` kept as
    tuples (``dims`` sorted, without repeats) and a ``timeout`` of 0 as None. Frozen: normalised
    through object.__setattr__, so that equal settings compare equal and the object holds no list
    of the caller's."""
    if settings.array is not None:
        valid_choice("array", settings.array, arrays.ARRAY_KINDS)
    valid_choice("convention", settings.convention, CONVENTIONS)
    if settings.dtype is not None:
        valid_choice("dtype", settings.dtype, DTYPES)
    valid_max_tokens(settings.max_tokens)
    valid_compile_budget(settings.compile_budget)
    if settings.properties is not None:
        object.__setattr__(settings, "properties", tuple(settings.properties))
    object.__setattr__(settings, "dims", valid_dims(settings.dims))
    object.__setattr__(settings, "timeout", valid_timeout(settings.timeout))


_S = TypeVar("_S", bound=_Settings)


@dataclasses.dataclass(frozen=True)
class CheckOptions(_Settings):
    """Everything ``gdn_verify.check`` takes but the implementation and the callbacks (its keywords,
    same names and defaults). Bad values raise :class:`ConfigurationError` naming the field when
    the object is made; ``properties`` and ``dims`` are kept as tuples (``dims`` sorted, without
    repeats) and a ``timeout`` of 0 as None (no limit)."""

    array: str | None = None
    dtype: str | None = None
    properties: Sequence[str] | None = None
    seed: int | None = None
    max_examples: int | None = None
    dims: Sequence[int] | None = None
    max_tokens: int | None = None
    database: str | Path | None = None
    cases_dir: str | Path = CASES_DIR
    plans_dir: str | Path | None = PLANS_DIR
    convention: str = "native"
    timeout: float | None = DEFAULT_TIMEOUT
    compile_budget: str | float | None = None
    scale: bool = False
    scale_limits: ScaleLimits | None = None
    grad: bool = False
    all_configs: bool = False
    # With all_configs: sweep only these autotuned kernels (names as the plan lists them); the
    # others keep their autotuner's choice. None: every kernel.
    config_kernels: Sequence[str] | None = None
    # Every call must run on this backend (gdn_verify.core.backends.BACKENDS); a call that ran
    # elsewhere fails its property. None: any backend, recorded.
    backend: str | None = None

    def __post_init__(self) -> None:
        _check_suite(self)
        valid_max_examples(self.max_examples)
        if self.all_configs and self.scale:
            raise ConfigurationError(ALL_CONFIGS, SCALE_REFUSED)
        if self.config_kernels is not None:
            given = self.config_kernels
            names = comma_list(given) or [] if isinstance(given, str) else given  # "a,b": a flag, or from Python
            object.__setattr__(self, "config_kernels", tuple(names))
            if not self.config_kernels:
                raise ConfigurationError("config_kernels", "no kernel named")
            if not self.all_configs:
                raise ConfigurationError("config_kernels", "picks the kernels all_configs sweeps; give all_configs too")
        if self.backend is not None:
            valid_choice("backend", self.backend, backends.BACKENDS)

    def resolve(self, impl: ImplLike) -> ResolvedCheck:
        """These settings against ``impl``, loaded (:func:`implementation`): every check that needs
        the implementation, here and nowhere else, before anything runs or compiles. Gradients
        (:func:`checks_gradients`) give ``impl`` its backward form and refuse the scale tier; the
        signatures must take the arguments; the dtype (the implementation's default where none was
        given) and the property names must be known; the scale tier needs a GPU implementation
        given by name (:func:`scale_selection`). A seed is drawn where none was given, so that it
        can be shown before the run and recorded after it."""
        loaded = implementation(impl, self.array, self.convention)
        grad = checks_gradients(loaded, self.grad, self.convention)
        if grad:
            if self.scale:
                raise ConfigurationError("scale", "the scale tier checks the forward pass; not with grad (yet)")
            loaded = implementations.with_backward(loaded)
        loaded.check_signatures()
        dtype = valid_choice("dtype", self.dtype or loaded.default_dtype, DTYPES)
        cases: list[str] = []
        names: Sequence[str] | None = self.properties
        if not grad:  # with grad, a scale_ name is an unknown gradient property: the scale tier is forward problems
            cases, names = scale_selection(loaded, self.scale, self.scale_limits, self.properties)
        limits = suite_limits(loaded, dtype, self.dims, self.max_tokens)
        if self.all_configs and names is None:
            names = configs_runner.default_properties(suite_catalogue(limits, grad), grad)
        scale_only = bool(cases) and names == []
        chosen = () if scale_only else tuple(p.name for p in select(suite_catalogue(limits, grad), names, loaded))
        seed = self.seed if self.seed is not None else random.randrange(2**31)
        plan = all_configs_plan(loaded, self, grad, dtype, limits, chosen) if self.all_configs else None
        return ResolvedCheck(loaded, self, grad, dtype, seed, limits, chosen, tuple(cases), plan)


@dataclasses.dataclass(frozen=True)
class ResolvedCheck:
    """:class:`CheckOptions` resolved against one implementation (:meth:`CheckOptions.resolve`):
    what ``api.check_resolved`` runs, every setting checked. ``impl`` has its backward form where
    ``grad``; ``dtype`` and ``seed`` are the ones run (the implementation's default dtype and a
    drawn seed where ``options`` gave none); ``properties``: the names of the properties run, in
    order (the scale cases apart, in ``scale_cases``); ``limits``: what they draw within, before
    shape planning narrows it."""

    impl: Implementation
    options: CheckOptions
    grad: bool
    dtype: str
    seed: int
    limits: Limits
    properties: tuple[str, ...]
    scale_cases: tuple[str, ...] = ()
    configs: configs_runner.Plan | None = None  # all_configs: the autotuned kernels and their configs

    @property
    def scale_only(self) -> bool:
        """Only scale cases were named: nothing compiles up front (each child compiles its own case)."""
        return bool(self.scale_cases) and not self.properties


@dataclasses.dataclass(frozen=True)
class CheckCommand:
    """The ``check`` command line as one object, made by :meth:`from_flags` from its flags: the
    check resolved (every setting validated, the implementation loaded and checked against them),
    the ``--json`` path (checked for writability, absolute), ``--sanitize``, and why the default
    implementation was taken when no ``--impl`` was given."""

    check: ResolvedCheck
    json: Path | None = None
    sanitize: bool = False
    default_impl: str | None = None

    @classmethod
    def from_flags(cls, values: Mapping[str, Any]) -> CheckCommand:
        """``check``'s flags by destination (``impl``, ``json``, ``sanitize`` and those of
        :meth:`CheckOptions.from_flags`), or :class:`ConfigurationError` naming the first bad one."""
        options = CheckOptions.from_flags(values)
        out = writable(values["json"], "json") if values.get("json") else None
        name, why = values.get("impl"), None
        if name is None:
            name, why = implementations.default_name()
        return cls(options.resolve(name), out, bool(values.get("sanitize")), why)


@dataclasses.dataclass(frozen=True)
class FuzzOptions(_Settings):
    """Everything ``gdn_verify.fuzz`` takes but the implementation and the callbacks (its
    arguments, same names and defaults), checked when the object is made, as :class:`CheckOptions`
    is; ``workers`` kept as a number or ``"auto"``."""

    budget: str | float = "30m"
    array: str | None = None
    dtype: str | None = None
    properties: Sequence[str] | None = None
    seed: int | None = None
    dims: Sequence[int] | None = None
    max_tokens: int = 2048
    database: str | Path = fuzz_runner.DATABASE_DIR
    cases_dir: str | Path = CASES_DIR
    plans_dir: str | Path | None = PLANS_DIR
    convention: str = "native"
    timeout: float | None = DEFAULT_TIMEOUT
    compile_budget: str | float | None = None
    workers: int | str = 1

    def __post_init__(self) -> None:
        parse_budget(self.budget)
        _check_suite(self)
        object.__setattr__(self, "workers", valid_workers(self.workers))

    def resolve(self, impl: ImplLike) -> ResolvedFuzz:
        """These settings against ``impl``, loaded: every check that needs the implementation, before
        anything compiles (its forward signatures, the dtype, the property names; a backward is
        refused: fuzz runs the forward properties), and the number of worker processes (``"auto"``:
        one per GPU, or per CPU core for NumPy), which need ``impl`` in a form they can rebuild."""
        loaded = implementation(impl, self.array, self.convention)
        if checks_gradients(loaded, False, self.convention):
            raise ConfigurationError(
                "convention",
                "backward: fuzz runs the forward properties; check a backward with check --grad (grad=True)",
            )
        loaded.check_signatures()
        dtype = valid_choice("dtype", self.dtype or loaded.default_dtype, DTYPES)
        limits = suite_limits(loaded, dtype, self.dims, self.max_tokens)
        names = tuple(p.name for p in select(catalogue(limits), self.properties, loaded))
        gpu = loaded.array != "numpy"
        workers = workers_runner.default_workers(gpu=gpu) if self.workers == "auto" else int(self.workers)
        portable = _portable(impl) if workers > 1 else None
        return ResolvedFuzz(loaded, self, dtype, limits, names, workers, portable)


@dataclasses.dataclass(frozen=True)
class ResolvedFuzz:
    """:class:`FuzzOptions` resolved against one implementation (:meth:`FuzzOptions.resolve`): what
    ``api.fuzz_resolved`` runs. ``properties``: the names run; ``limits``: what they draw within
    before shape planning; ``workers``: processes (``portable``: the implementation as they rebuild
    it, when more than one)."""

    impl: Implementation
    options: FuzzOptions
    dtype: str
    limits: Limits
    properties: tuple[str, ...]
    workers: int = 1
    portable: ImplLike | None = None

    @property
    def seconds(self) -> float:
        """The budget in seconds."""
        return parse_budget(self.options.budget)


@dataclasses.dataclass(frozen=True)
class FuzzCommand:
    """The ``fuzz`` command line as one object (:meth:`from_flags`): the campaign resolved, the
    ``--json`` and ``--campaigns`` paths checked for writability, and why the default
    implementation was taken when no ``--impl`` was given."""

    fuzz: ResolvedFuzz
    json: Path | None = None
    campaigns: Path | None = None
    default_impl: str | None = None

    @classmethod
    def from_flags(cls, values: Mapping[str, Any]) -> FuzzCommand:
        """``fuzz``'s flags by destination, or :class:`ConfigurationError` naming the first bad one."""
        options = FuzzOptions.from_flags(values)
        out = writable(values["json"], "json") if values.get("json") else None
        campaigns = writable(values["campaigns"], "campaigns") if values.get("campaigns") else None
        name, why = values.get("impl"), None
        if name is None:
            name, why = implementations.default_name()
        return cls(options.resolve(name), out, campaigns, why)


@dataclasses.dataclass(frozen=True)
class SelftestOptions(_Settings):
    """Everything ``gdn_verify.selftest`` takes but the callback (its keywords, same names and
    defaults), checked when the object is made; a ``timeout`` of 0 kept as None."""

    dtype: str = "float32"
    seed: int | None = None
    max_examples: int | None = None
    timeout: float | None = DEFAULT_TIMEOUT
    grad: bool = False

    def __post_init__(self) -> None:
        valid_choice("dtype", self.dtype, DTYPES)
        valid_max_examples(self.max_examples)
        object.__setattr__(self, "timeout", valid_timeout(self.timeout))

    def resolve(self) -> ResolvedSelftest:
        """What the run needs beyond the settings: a seed (drawn where none was given, so that it can
        be shown before the run) and, with ``grad``, the planted gradient bugs (their module, which
        needs the gradient machinery: :class:`ConfigurationError` naming ``grad`` where it is missing)."""
        bugs = None
        if self.grad:
            try:
                bugs = importlib.import_module("gdn_verify.implementations.planted_grad")
            except ImportError as exc:
                raise ConfigurationError("grad", f"the planted gradient bugs are unavailable here: {exc}") from None
        seed = self.seed if self.seed is not None else random.randrange(2**31)
        return ResolvedSelftest(self, seed, bugs)


@dataclasses.dataclass(frozen=True)
class ResolvedSelftest:
    """:class:`SelftestOptions` ready to run (:meth:`SelftestOptions.resolve`): the seed run and, with
    ``grad``, the module of the planted gradient bugs."""

    options: SelftestOptions
    seed: int
    bugs: Any = None


@dataclasses.dataclass(frozen=True)
class SelftestCommand:
    """The ``selftest`` command line as one object (:meth:`from_flags`): the run resolved and the
    ``--json`` path checked for writability."""

    selftest: ResolvedSelftest
    json: Path | None = None

    @classmethod
    def from_flags(cls, values: Mapping[str, Any]) -> SelftestCommand:
        """``selftest``'s flags by destination, or :class:`ConfigurationError` naming the first bad one."""
        options = SelftestOptions.from_flags(values)
        out = writable(values["json"], "json") if values.get("json") else None
        return cls(options.resolve(), out)


ALL_CONFIGS = "all_configs"
SCALE_REFUSED = "pins autotuner configs for the properties; not with the scale tier"


def all_configs_plan(
    impl: Implementation, options: CheckOptions, grad: bool, dtype: str, limits: Limits, properties: Sequence[str]
) -> configs_runner.Plan:
    """``check --all-configs``: the autotuned Triton kernels ``impl`` launches (a few small calls,
    ``runners.configs.discover``) and their configs, or :class:`ConfigurationError` naming
    ``all_configs`` where it cannot apply: with the scale tier, an implementation that takes
    NumPy or CuPy arrays (no Triton), or one that launches no autotuned kernel."""
    if any(n.startswith(SCALE_PREFIX) for n in options.properties or ()):
        raise ConfigurationError(ALL_CONFIGS, SCALE_REFUSED)
    if impl.array != "torch":
        raise ConfigurationError(
            ALL_CONFIGS, f"pins Triton autotuner configs; {impl.name} takes {impl.array} arrays (no Triton kernels)"
        )
    from gdn_verify.implementations import interpreter

    problems = configs_runner.probe_problems(dtype, limits.head_dims)
    try:
        tuned = configs_runner.discover(impl, problems, grad)
    except ConfigurationError:
        raise
    except Exception as exc:  # noqa: BLE001 - one line: the call discovery needs could not run
        raise ConfigurationError(
            ALL_CONFIGS, f"{impl.name} raised on the small call that finds its kernels: {type(exc).__name__}: {exc}"
        ) from None
    if not tuned:
        raise ConfigurationError(ALL_CONFIGS, configs_runner.no_kernel_message(impl))
    left: tuple[str, ...] = ()
    if options.config_kernels is not None:
        tuned, left = configs_runner.only(tuned, options.config_kernels)
    return configs_runner.Plan(tuned, list(properties), interpreter.requested(), problems[0], left)


# The implementation and the property suite it is checked with -------------------------------
SCALE_PREFIX = "scale_"  # the scale tier's cases, among the properties: scale_<case>


def implementation(impl: ImplLike, array: str | None = None, convention: str = "native") -> Implementation:
    """``impl`` as an :class:`Implementation`: itself, a built-in name or ``"MODULE:FUNCTION"``
    (``implementations.resolve``), or a callable (in ``convention``, taking ``array`` arrays)."""
    if isinstance(impl, Implementation):
        return impl
    if isinstance(impl, str):
        return implementations.resolve(impl, array, convention)
    if callable(impl):
        return implementations.from_callable(impl, array or "numpy", convention)
    raise ConfigurationError(
        "impl", f"expected a callable, 'MODULE:FUNCTION' or a built-in name, got {type(impl).__name__}"
    )


def checks_gradients(impl: Implementation, grad: bool = False, convention: str = "native") -> bool:
    """Whether ``check`` verifies ``impl``'s backward: asked for (``grad``), or a backward is all it has."""
    return grad or convention == BACKWARD_FORM or implementations.backward_only(impl)


def suite_limits(impl: Implementation, dtype: str, dims: Sequence[int] | None, max_tokens: int | None) -> Limits:
    """What the properties draw within: ``dtype``, head sizes ``dims`` (None: all), ``max_tokens``
    (None or 0: 2048 for NumPy, 65536 for GPU arrays)."""
    default_tokens = 2048 if impl.array == "numpy" else 65536
    limits = Limits(dtype=dtype, max_tokens=valid_max_tokens(max_tokens) or default_tokens)
    head_dims = valid_dims(dims)
    declared = declared_head_dims(impl)
    if head_dims is not None and declared is not None and not set(head_dims) & set(declared):
        raise ConfigurationError(
            "dims",
            f"{impl.name} has kernels for head sizes {','.join(map(str, declared))} only; "
            f"got {','.join(map(str, head_dims))}",
        )
    limits = limits if head_dims is None else limits.replace(head_dims=head_dims)
    # what the implementation declares (no GVA, its head sizes), once for every property, shape pool
    # and configs probe: no example drawn only to be refused
    return supported(limits, impl)


def grad_catalogue(limits: Limits) -> dict[str, Property]:
    """Every gradient property (``gdn_verify.properties.gradients``), by name, drawing within ``limits``."""
    from gdn_verify.properties.gradients import grad_properties

    return {p.name: p for p in grad_properties(limits)}


def suite_catalogue(limits: Limits, grad: bool = False) -> dict[str, Property]:
    """The forward properties, or with ``grad`` the gradient ones, by name, drawing within ``limits``."""
    return grad_catalogue(limits) if grad else catalogue(limits)


def _form_kind(form: str) -> str:
    """The ``Property.form`` that calls an implementation's form ``form``."""
    return form if form in (SPEC_FORM, BACKWARD_FORM) else "native"


def select(available: dict[str, Property], names: Sequence[str] | None, impl: Implementation) -> list[Property]:
    """The properties named (all by default, those of a form the implementation lacks left out)."""
    if names is None:
        forms = {_form_kind(name) for name in impl.forms}
        return [p for p in available.values() if p.form in forms]
    unknown = [n for n in names if n not in available]
    if unknown or not names:
        raise ConfigurationError(
            "properties", f"unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(available)}"
        )
    return [available[n] for n in names]


def scale_selection(
    impl: Implementation, scale: bool, limits: ScaleLimits | None, properties: Sequence[str] | None
) -> tuple[list[str], list[str] | None]:
    """(scale cases to run, properties to run: None for all, [] for none) from ``check``'s arguments."""
    cases = [c.name for c in scale_runner.plan(limits or ScaleLimits())]
    named = [n.removeprefix(SCALE_PREFIX) for n in properties or () if n.startswith(SCALE_PREFIX)]
    unknown = [SCALE_PREFIX + n for n in named if n not in cases]
    if unknown:
        choices = ", ".join(SCALE_PREFIX + c for c in cases)
        raise ConfigurationError("properties", f"unknown {', '.join(unknown)}; the scale cases are {choices}")
    rest = None if properties is None else [n for n in properties if not n.startswith(SCALE_PREFIX)]
    if not (scale or named):
        return [], rest
    if limits is None and impl.array == "numpy":
        raise ConfigurationError(
            "scale", f"the scale tier needs a GPU implementation ({impl.name} takes NumPy arrays; problems of GiBs)"
        )
    if scale_name(impl) is None:
        raise ConfigurationError(
            "scale",
            "the scale tier runs each case in a child process: give the implementation by name "
            "(built-in or MODULE:FUNCTION)",
        )
    if named:
        return [c for c in cases if c in named], (rest or [])
    return cases, rest


def builtin(impl: Implementation) -> bool:
    """Whether ``impl`` is a resolved built-in or planted bug, which another process resolves by name."""
    return impl.name in implementations.names() or implementations.planted_prefix(impl.name) is not None


def scale_name(impl: Implementation) -> str | None:
    """The name a child process resolves ``impl`` by (built-in, planted or ``MODULE:FUNCTION``)."""
    if builtin(impl):
        return impl.name
    module, _, function = impl.name.partition(":")
    plugin = impl.description.startswith("plug-in") and module and function.isidentifier()
    return impl.name if plugin else None


def _portable(impl: ImplLike) -> ImplLike:
    """``impl`` in a form a worker process can rebuild (a name, or a picklable callable)."""
    if isinstance(impl, str):
        return impl
    if isinstance(impl, Implementation) and builtin(impl):
        return impl.name  # a resolved built-in: the worker resolves it again
    try:
        pickle.dumps(impl)
    except Exception:  # noqa: BLE001 - any pickling failure means the same thing
        raise ConfigurationError(
            "workers", "worker processes need the implementation by name (built-in or MODULE:FUNCTION)"
        ) from None
    return impl


# Flags and the checks of single values --------------------------------------------------------
def flag_name(field: str) -> str:
    """The flag of a :class:`CheckOptions` field, as a destination: ``max_examples``, ``cases``
    (``--max-examples``, ``--gdn-cases``)."""
    return FLAG_NAMES.get(field, field)


def comma_list(text: str | None) -> list[str] | None:
    """``"a, b"`` as ``["a", "b"]`` (a flag's comma-separated list)."""
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]


def comma_dims(text: str | None) -> tuple[int, ...] | None:
    """``"64,128"`` as ``(64, 128)``."""
    if text is None:
        return None
    try:
        return tuple(int(part) for part in comma_list(text) or [])
    except ValueError:
        raise ConfigurationError("dims", f"{text!r}: expected comma-separated head sizes such as 64,128") from None


def valid_choice(field: str, value: str, choices: Collection[str]) -> str:
    if value not in choices:
        raise ConfigurationError(field, f"{value!r}: choose from {', '.join(choices)}")
    return value


def valid_max_examples(n: int | None) -> int | None:
    if n is not None and n < 1:
        raise ConfigurationError("max_examples", f"{n}: must be at least 1")
    return n


def valid_max_tokens(max_tokens: int | None) -> int | None:
    """``max_tokens`` (None or 0: the default of the implementation's array kind)."""
    if max_tokens and max_tokens < MIN_TOKENS:
        raise ConfigurationError("max_tokens", f"{max_tokens}: must be at least {MIN_TOKENS}")
    return max_tokens


def valid_dims(dims: Sequence[int] | None) -> tuple[int, ...] | None:
    """The head sizes, sorted, without repeats."""
    if dims is None:
        return None
    try:
        head_dims = tuple(sorted({int(d) for d in dims}))
    except (TypeError, ValueError):
        raise ConfigurationError("dims", f"{dims!r}: expected head sizes such as (64, 128)") from None
    if not head_dims or min(head_dims) < 1:
        raise ConfigurationError("dims", f"{dims!r}: expected positive head sizes such as (64, 128)")
    return head_dims


def valid_timeout(seconds: float | None) -> float | None:
    """Seconds a kernel call may take, or None (given as None or 0) for no limit."""
    if seconds is None or seconds == 0:
        return None
    if not seconds > 0 or math.isinf(seconds):
        raise ConfigurationError("timeout", f"{seconds}: must be a positive number of seconds (0: no limit)")
    return float(seconds)


def valid_compile_budget(value: str | float | None) -> float | None:
    """Seconds of ``"90s"``, ``"3m"`` or a number (None: none given)."""
    if value is None:
        return None
    try:
        return parse_budget(value)
    except ConfigurationError as exc:
        raise ConfigurationError("compile_budget", exc.message) from None


def writable(path: str | Path, field: str, directory: bool = False) -> Path:
    """``path`` made absolute, after checking that a file (or, with ``directory``, files inside
    it) can be written there; raises :class:`ConfigurationError` naming ``field`` otherwise.
    Called before a run, so that hours of results are not lost to a read-only folder."""
    target = Path(path).expanduser().resolve()
    folder = target if directory else target.parent
    try:
        if not directory and target.is_dir():
            raise OSError(f"{target} is a directory")
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".gdn-verify-write-test-"):
            pass
        if not directory and target.exists() and not os.access(target, os.W_OK):
            raise PermissionError(f"{target} is read-only")
    except OSError as exc:
        raise ConfigurationError(field, f"{path}: cannot write there ({exc.strerror or exc})") from None
    return target


def valid_workers(workers: int | str) -> int | str:
    """A number of worker processes (at least 1), or ``"auto"``."""
    if workers == "auto":
        return workers
    try:
        n = int(workers)
    except (TypeError, ValueError):
        raise ConfigurationError("workers", f"{workers!r}: expected a number of processes or 'auto'") from None
    if n < 1:
        raise ConfigurationError("workers", f"{workers!r}: must be at least 1")
    return n
