"""What an implementation under test is: named callables (forms) and how one is called.

Every native form is called in FLA's convention
``fn(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
use_qk_l2norm_in_kernel=False, cu_seqlens=None) -> (o, final_state)`` (``state_v_first=True``
is passed only when a problem asks for it). The form named ``"spec"``, when present, is the
speculative-decoding convention of ``gdn_verify.core.conventions`` (``SPEC_SIGNATURE``). The form
named ``"backward"``, when present, is a functional backward (:data:`BACKWARD_KEYWORDS`):
``fn(q, k, v, g, beta, scale=None, initial_state=None, use_qk_l2norm_in_kernel=False,
cu_seqlens=None, *, do, dht=None) -> (dq, dk, dv, dg, dbeta, dh0)``, the cotangents of the
inputs for ``sum(do * o) + sum(dht * final_state)`` (``dh0`` None without an initial state). An
implementation that raises ``NotImplementedError`` for a feature has that feature reported as
unsupported.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gdn_verify.core import arrays, gating
from gdn_verify.core.problem import Problem

SPEC_FORM = "spec"
BACKWARD_FORM = "backward"
# How each form is called: positional argument count and keyword names (``Implementation.run``
# passes the native arguments by keyword; the spec form takes nine arrays by position).
NATIVE_KEYWORDS = (
    "q",
    "k",
    "v",
    "g",
    "beta",
    "scale",
    "initial_state",
    "output_final_state",
    "use_qk_l2norm_in_kernel",
    "cu_seqlens",
)
SPEC_CALL = (9, ("scale", "use_qk_l2norm_in_kernel"))
# The backward takes the native inputs (no output_final_state: dht says whether there is a final
# state) and the cotangents.
BACKWARD_KEYWORDS = tuple(k for k in NATIVE_KEYWORDS if k != "output_final_state") + ("do", "dht")
# The functional backward's outputs, in order.
GRADIENTS = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
# Forms that are not the native forward (the default form is the first native one).
OTHER_FORMS = (SPEC_FORM, BACKWARD_FORM)


class ConfigurationError(ValueError):
    """Misuse (unknown implementation, unimportable module, bad option), naming the offending field.

    ``field`` is the argument's name in the Python API (``impl``, ``dims``, ``dtype``); the command
    line maps it to its flag. ``str(exc)`` is ``"field: message"``.
    """

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class ContractError(AssertionError):
    """The implementation returned something other than the documented outputs."""


@dataclass(frozen=True)
class Result:
    """An implementation's outputs as NumPy arrays (dtypes kept) and the dtypes it returned."""

    o: Any
    final_state: Any
    o_dtype: str | None
    state_dtype: str | None
    returned: tuple[str | None, str | None] = (None, None)  # o's and final_state's array kind (array_kind)


def _convention(form: str) -> str:
    names = {SPEC_FORM: "speculative-decoding (--convention spec)", BACKWARD_FORM: "backward (--convention backward)"}
    return names.get(form, "native (FLA)")


def _call_shape(form: str) -> tuple[int, tuple[str, ...]]:
    if form == SPEC_FORM:
        return SPEC_CALL
    return 0, BACKWARD_KEYWORDS if form == BACKWARD_FORM else NATIVE_KEYWORDS


def signature_problem(fn: Callable, positional: int, keywords: tuple[str, ...]) -> str | None:
    """Why ``fn(*[None] * positional, **{k: None for k in keywords})`` cannot bind, or None.

    Tolerant of ``*args``/``**kwargs`` and of callables whose signature cannot be read.
    """
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        sig.bind(*([None] * positional), **dict.fromkeys(keywords))
    except TypeError as exc:
        return f"{exc} (its signature is {getattr(fn, '__name__', 'fn')}{sig})"
    return None


def _dtype_name(x: Any) -> str | None:
    if x is None:
        return None
    name = str(getattr(x, "dtype", type(x).__name__))
    return name.removeprefix("torch.")


def array_kind(x: Any) -> str | None:
    """What ``x`` is, as ``arrays.ARRAY_KINDS`` names them (``"numpy"``, ``"torch"``, ``"cupy"``), else its
    type's name (None for None): an output must come back in the array kind of the inputs."""
    if x is None:
        return None
    if isinstance(x, np.ndarray):
        return "numpy"
    module = type(x).__module__.split(".")[0]
    return module if module in arrays.ARRAY_KINDS else type(x).__name__


def returned_pair(out: Any) -> tuple[Any, Any]:
    """A native form's return as ``(o, final_state)``; :class:`ContractError` naming what came back
    (its type, and its length for a tuple or list) when it is not a pair."""
    if isinstance(out, (tuple, list)) and len(out) == 2:
        return out[0], out[1]
    what = f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list)) else type(out).__name__
    raise ContractError(f"expected a pair (o, final_state), got {what}")


def host_array(x: Any, name: str) -> np.ndarray | None:
    """``arrays.to_numpy(x)``; a return that is no array (a ragged list, an object) is a
    :class:`ContractError` naming ``name``. Arrays convert unguarded: a CUDA error surfacing at the
    copy is the kernel's, and must keep its own type."""
    if x is None or isinstance(x, np.ndarray) or type(x).__module__.startswith(("torch", "cupy")):
        host = arrays.to_numpy(x)
        # A NumPy array, or a torch tensor in host memory, converts without a copy: keep one, so that
        # a later call writing the same buffer cannot change a result already taken (output_isolation
        # is the property that says whether an implementation does that).
        return host.copy() if host is not None and _in_host_memory(x) else host
    try:
        return np.asarray(x)
    except Exception as exc:  # noqa: BLE001 - whatever NumPy makes of it, it is not an array
        raise ContractError(f"{name} is a {type(x).__name__} that is not an array ({exc})") from None


def _in_host_memory(x: Any) -> bool:
    """Whether ``arrays.to_numpy(x)`` may share ``x``'s memory: a NumPy array, a CPU torch tensor."""
    return isinstance(x, np.ndarray) or (type(x).__module__.startswith("torch") and x.device.type == "cpu")


def result_of(o: Any, final_state: Any) -> Result:
    """A call's ``(o, final_state)`` (the implementation's own arrays) as a :class:`Result` of host copies."""
    return Result(
        host_array(o, "o"),
        host_array(final_state, "final_state"),
        _dtype_name(o),
        _dtype_name(final_state),
        (array_kind(o), array_kind(final_state)),
    )


@dataclass(frozen=True)
class Gradients:
    """A functional backward's outputs as NumPy arrays (dtypes kept), by name (:data:`GRADIENTS`),
    and the dtype each came back in (None for a gradient returned as None)."""

    grads: dict[str, Any]
    dtypes: dict[str, str | None]


@dataclass
class Implementation:
    """A named GDN implementation with one or more algorithmic forms.

    ``forms`` maps a form name (``"chunk"``, ``"recurrent"``, ``"spec"``) to a callable; the first
    native (non-spec) form is the default. ``array`` is the array type the callables take.
    ``extra["optional_dtypes"]`` (``{name: (dtype, dtype)}``, names among ``initial_state``,
    ``A_log``, ``dt_bias``; ``"half"`` the input dtype where it has 16 bits, else bfloat16): the
    optional arguments the implementation takes in either dtype, for the process property
    ``optional_dtypes`` (undeclared: ``initial_state`` in float32 and ``"half"``).
    """

    name: str
    forms: dict[str, Callable]
    array: str = "numpy"
    description: str = ""
    default_dtype: str = "float32"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def native_forms(self) -> list[str]:
        return [name for name in self.forms if name not in OTHER_FORMS]

    @property
    def default_form(self) -> str:
        native = self.native_forms
        if not native:
            raise NotImplementedError(f"{self.name} has no forward (FLA-convention) form, only {', '.join(self.forms)}")
        return native[0]

    def as_called(self, problem: Problem, params: dict | None = None) -> Problem:
        """``problem`` with the gates this implementation's kernel computes from it.

        An implementation whose adapter hands ``(g, beta)`` over as raw gates ``a, b`` in the input
        dtype declares it (``extra["raw_gates"]``); the kernel then computes its gates from the
        rounded ``a, b``, so the oracle must see those (float32, :func:`gating.through_raw_gates`),
        not the drawn ones, or the rounding would count against the kernel. Under FLA's in-kernel
        gate options of the case (``params``) ``g`` is already ``a`` (``use_gate_in_kernel``) or
        ``beta`` already ``b`` (``use_beta_sigmoid_in_kernel``): only rounded to the input dtype.
        Otherwise ``problem``.
        """
        if not self.extra.get("raw_gates"):
            return problem
        options = gating.options_from_params(params or {})
        g, beta = gating.through_raw_gates(
            problem.g,
            problem.beta,
            problem.dtype,
            g_is_raw=bool(options.get("use_gate_in_kernel")),
            beta_is_raw=bool(options.get("use_beta_sigmoid_in_kernel")),
        )
        return problem.replace(g=g, beta=beta)

    def check_signatures(self) -> None:
        """Raise :class:`ConfigurationError` (``impl``) when a form cannot take the arguments it is
        called with; checked once, before any property runs. Callables without an inspectable
        signature (C extensions, some builtins) pass: their misuse shows on the first call."""
        for form, fn in self.forms.items():
            positional, keywords = _call_shape(form)
            problem = signature_problem(fn, positional, keywords)
            if problem is not None:
                raise ConfigurationError(
                    "impl", f"{self.name} cannot take the {_convention(form)} arguments: {problem}"
                )

    def missing_keywords(self, keywords: tuple[str, ...]) -> list[str]:
        """Which of ``keywords`` the default native form's signature cannot take (none when it
        takes ``**kwargs`` or its signature cannot be read: those show at the call)."""
        try:
            params = inspect.signature(self.forms[self.default_form]).parameters.values()
        except (TypeError, ValueError, NotImplementedError):
            return []
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return []
        names = {p.name for p in params}
        return [k for k in keywords if k not in names]

    def run(
        self,
        problem: Problem,
        form: str | None = None,
        options: dict[str, Any] | None = None,
        arguments: dict[str, Any] | None = None,
    ) -> Result:
        """Call the implementation on ``problem`` and bring the outputs back to NumPy (copies).

        The arguments as for :meth:`call`.
        """
        return result_of(*self.call(problem, form, options, arguments))

    def call(
        self,
        problem: Problem,
        form: str | None = None,
        options: dict[str, Any] | None = None,
        arguments: dict[str, Any] | None = None,
    ) -> tuple[Any, Any]:
        """Call the implementation on ``problem``: its ``(o, final_state)`` as it returned them.

        ``options``: extra keyword arguments (FLA's in-kernel gate options); NumPy arrays among
        them are converted like the inputs. An option the callable does not accept (a
        ``TypeError`` naming it) raises ``NotImplementedError``: the feature is unsupported.
        ``arguments``: inputs already in this implementation's array kind (views a property
        built into guarded buffers), passed as they are instead of the problem's.
        """
        fn = self.forms[form or self.default_form]
        kw = problem.kwargs()
        for name in ("q", "k", "v", "g", "beta", "initial_state"):
            kw[name] = arrays.to_kind(kw[name], self.array)
        kw.update(arguments or {})
        if kw["cu_seqlens"] is not None:
            kw["cu_seqlens"] = arrays.to_kind(np.asarray(kw["cu_seqlens"], np.int64), self.array)
        for name, value in (options or {}).items():
            kw[name] = arrays.to_kind(value, self.array) if isinstance(value, np.ndarray) else value
        try:
            out = fn(**kw)
        except TypeError as exc:
            rejected = [name for name in ("state_v_first", *(options or {})) if f"'{name}'" in str(exc)]
            if rejected:
                raise NotImplementedError(f"needs {rejected[0]}=") from exc
            raise
        return returned_pair(out)

    def run_backward(
        self,
        problem: Problem,
        do: np.ndarray,
        dht: np.ndarray | None,
        options: dict[str, Any] | None = None,
    ) -> Gradients:
        """Call the backward form on ``problem`` with cotangents ``do`` ``[B, T, HV, V]`` and
        ``dht`` (like the final state, or None) and bring the gradients back to NumPy.

        ``options`` as in :meth:`run`. Raises :class:`ContractError` unless the form returns six
        values in the order of :data:`GRADIENTS`.
        """
        fn = self.forms[BACKWARD_FORM]
        kw = problem.backward_kwargs()
        for name in ("q", "k", "v", "g", "beta", "initial_state"):
            kw[name] = arrays.to_kind(kw[name], self.array)
        if kw["cu_seqlens"] is not None:
            kw["cu_seqlens"] = arrays.to_kind(np.asarray(kw["cu_seqlens"], np.int64), self.array)
        for name, value in (options or {}).items():
            kw[name] = arrays.to_kind(value, self.array) if isinstance(value, np.ndarray) else value
        kw["do"] = arrays.to_kind(do, self.array)
        kw["dht"] = arrays.to_kind(dht, self.array)
        try:
            out = fn(**kw)
        except TypeError as exc:
            rejected = [name for name in (options or {}) if f"'{name}'" in str(exc)]
            if rejected:
                raise NotImplementedError(f"needs {rejected[0]}=") from exc
            raise
        if not isinstance(out, (tuple, list)) or len(out) != len(GRADIENTS):
            what = f"{len(out)} values" if isinstance(out, (tuple, list)) else type(out).__name__
            raise ContractError(f"expected {len(GRADIENTS)} gradients ({', '.join(GRADIENTS)}), got {what}")
        return Gradients(
            {n: host_array(x, n) for n, x in zip(GRADIENTS, out)}, {n: _dtype_name(x) for n, x in zip(GRADIENTS, out)}
        )
