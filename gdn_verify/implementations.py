"""Implementations that ``check`` can verify: built-in ones by name, plug-ins as ``MODULE:FUNCTION``.

Every implementation is called in the native convention
``fn(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
use_qk_l2norm_in_kernel=False, cu_seqlens=None) -> (o, final_state)`` (``state_v_first=True``
is passed only when a problem asks for it). An implementation that raises
``NotImplementedError`` for a feature has that feature reported as unsupported.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gdn_verify import arrays, numpy_impl, reference
from gdn_verify.problem import Problem


class ConfigurationError(ValueError):
    """Misuse: unknown implementation, unimportable module, missing function, bad option."""


@dataclass(frozen=True)
class Result:
    """An implementation's outputs as NumPy arrays (dtypes kept) and the dtypes it returned."""

    o: Any
    final_state: Any
    o_dtype: str | None
    state_dtype: str | None


def _dtype_name(x: Any) -> str | None:
    if x is None:
        return None
    name = str(getattr(x, "dtype", type(x).__name__))
    return name.removeprefix("torch.")


@dataclass
class Implementation:
    """A named GDN implementation with one or more algorithmic forms.

    ``forms`` maps a form name (``"chunk"``, ``"recurrent"``) to a callable in the native
    convention; the first form is the default. ``array`` is the array type the callables take.
    """

    name: str
    forms: dict[str, Callable]
    array: str = "numpy"
    description: str = ""
    default_dtype: str = "float32"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def default_form(self) -> str:
        return next(iter(self.forms))

    def run(self, problem: Problem, form: str | None = None, options: dict[str, Any] | None = None) -> Result:
        """Call the implementation on ``problem`` and bring the outputs back to NumPy.

        ``options``: extra keyword arguments (FLA's in-kernel gate options); NumPy arrays among
        them are converted like the inputs. An option the callable does not accept (a
        ``TypeError`` naming it) raises ``NotImplementedError``: the feature is unsupported.
        """
        fn = self.forms[form or self.default_form]
        kw = problem.kwargs()
        for name in ("q", "k", "v", "g", "beta", "initial_state"):
            kw[name] = arrays.to_kind(kw[name], self.array)
        if kw["cu_seqlens"] is not None:
            kw["cu_seqlens"] = arrays.to_kind(np.asarray(kw["cu_seqlens"], np.int64), self.array)
        for name, value in (options or {}).items():
            kw[name] = arrays.to_kind(value, self.array) if isinstance(value, np.ndarray) else value
        try:
            out = fn(**kw)
        except TypeError as exc:
            rejected = [name for name in ("state_v_first", *(options or {})) if f"'{name}'" in str(exc)]
            if rejected:
                raise NotImplementedError(f"{rejected[0]} is not accepted") from exc
            raise
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise ContractError(f"expected a pair (o, final_state), got {type(out).__name__}")
        o, final_state = out
        return Result(arrays.to_numpy(o), arrays.to_numpy(final_state), _dtype_name(o), _dtype_name(final_state))


class ContractError(AssertionError):
    """The implementation returned something other than the documented outputs."""


def _oracle_chunk(**kw):
    return reference.chunk_gated_delta_rule(**kw)


def _chunk16(**kw):
    return numpy_impl.chunk_gated_delta_rule(**kw, chunk_size=16)


def _fla_style(name: str, chunk_size: int, cumsum_dtype=np.float32, tf32: bool = False, what: str = ""):
    """A built-in NumPy model of the production chunked algorithm (``numpy_impl.chunk_fla_core``)."""

    def run(**kw):
        return numpy_impl.chunk_fla_gated_delta_rule(**kw, chunk_size=chunk_size, cumsum_dtype=cumsum_dtype,
                                                     tf32=tf32)

    cumsum = np.dtype(cumsum_dtype).name
    return lambda: Implementation(
        name, {"chunk": run},
        description=f"float32 NumPy chunked as FLA writes it, C={chunk_size}, {cumsum} chunk-local gate cumsum{what}",
    )


BUILTIN: dict[str, Callable[[], Implementation]] = {
    "numpy": lambda: Implementation(
        "numpy",
        {"chunk": numpy_impl.chunk_gated_delta_rule, "recurrent": numpy_impl.recurrent_gated_delta_rule},
        description="float32 NumPy, chunked (C=64) with a recurrent form",
    ),
    "numpy-chunk": lambda: Implementation(
        "numpy-chunk", {"chunk": numpy_impl.chunk_gated_delta_rule}, description="float32 NumPy chunked, C=64"
    ),
    "numpy-chunk16": lambda: Implementation("numpy-chunk16", {"chunk": _chunk16}, description="float32 NumPy, C=16"),
    "numpy-recurrent": lambda: Implementation(
        "numpy-recurrent", {"recurrent": numpy_impl.recurrent_gated_delta_rule}, description="float32 NumPy loop"
    ),
    # Correct production-style algorithms: they must pass in every dtype.
    "numpy-chunk-fla": _fla_style("numpy-chunk-fla", 64),
    "numpy-chunk32-fla": _fla_style("numpy-chunk32-fla", 32),
    "numpy-chunk16-fla": _fla_style("numpy-chunk16-fla", 16),
    "numpy-chunk-cumsum64": _fla_style("numpy-chunk-cumsum64", 64, np.float64),
    # A known precision loss: must fail float32 matches_reference.
    "numpy-chunk-tf32": _fla_style("numpy-chunk-tf32", 64, tf32=True, what=", TF32 matrix products"),
    "oracle": lambda: Implementation(
        "oracle",
        {"chunk": _oracle_chunk, "recurrent": reference.recurrent_gated_delta_rule},
        description="the float64 oracle itself (its outputs are float64 whatever the input dtype)",
        default_dtype="float64",
    ),
}

# Implementations provided by other modules, imported on demand: name -> "module:factory".
LAZY: dict[str, str] = {
    "cupy": "cupy_kernels.registry:cupy_auto",
    "cupy-recurrent": "cupy_kernels.registry:cupy_recurrent",
    "cupy-chunk": "cupy_kernels.registry:cupy_chunk",
    "cupy-oracle": "cupy_kernels.registry:cupy_oracle",
    "fla-chunk": "gdn_verify.adapters:fla_chunk",
    "fla-recurrent": "gdn_verify.adapters:fla_recurrent",
    "flashinfer-prefill": "gdn_verify.flashinfer_adapters:flashinfer_prefill",
    "flashinfer-decode": "gdn_verify.flashinfer_adapters:flashinfer_decode",
}


def names() -> list[str]:
    """Names accepted by ``--impl`` besides ``MODULE:FUNCTION`` and ``planted:BUG``."""
    return sorted(BUILTIN) + sorted(LAZY)


def load_plugin(spec: str, array: str = "numpy") -> Implementation:
    """``MODULE:FUNCTION`` importable from ``PYTHONPATH`` or the current directory."""
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        raise ConfigurationError(f"--impl {spec!r}: expected MODULE:FUNCTION")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's configuration
        raise ConfigurationError(f"--impl {spec!r}: cannot import module {module_name!r}: {exc}") from None
    fn = getattr(module, function_name, None)
    if fn is None or not callable(fn):
        raise ConfigurationError(f"--impl {spec!r}: module {module_name!r} has no function {function_name!r}")
    # A chunked plug-in may expose its stages for ``replay --diagnose`` as ``FUNCTION.stages``
    # (a ``gdn_verify.diagnose.StagedImplementation``).
    stages = getattr(fn, "stages", None)
    return Implementation(spec, {"default": fn}, array=array, description=f"plug-in {spec}",
                          default_dtype="float32" if array == "numpy" else "bfloat16",
                          extra={} if stages is None else {"stages": stages})


def resolve(name: str, array: str | None = None) -> Implementation:
    """The implementation named ``name``; raises :class:`ConfigurationError` on misuse."""
    if array is not None and array not in arrays.ARRAY_KINDS:
        raise ConfigurationError(f"--array {array!r}: choose from {', '.join(arrays.ARRAY_KINDS)}")
    if name in BUILTIN:
        impl = BUILTIN[name]()
    elif name.startswith("planted:"):
        from gdn_verify import planted

        impl = planted.implementation(name.removeprefix("planted:"))
    elif name in LAZY:
        module_name, _, factory = LAZY[name].partition(":")
        try:
            impl = getattr(importlib.import_module(module_name), factory)()
        except (ImportError, arrays.ArrayKindUnavailable) as exc:
            raise ConfigurationError(f"--impl {name}: unavailable here: {exc}") from None
    elif ":" in name:
        impl = load_plugin(name, array or "numpy")
    else:
        raise ConfigurationError(f"--impl {name!r}: unknown; choose from {', '.join(names())} or MODULE:FUNCTION")
    if array is not None and array != impl.array and ":" not in name:
        raise ConfigurationError(f"--array applies to MODULE:FUNCTION plug-ins; {name} takes {impl.array} arrays")
    try:
        arrays.check_kind(impl.array)
    except arrays.ArrayKindUnavailable as exc:
        raise ConfigurationError(str(exc)) from None
    return impl


def default_name() -> tuple[str, str]:
    """``("cupy", why)`` when a CUDA GPU with CuPy is usable, else ``("numpy", why)``."""
    try:
        arrays.check_kind("cupy")
        importlib.import_module("cupy_kernels.registry")
    except (arrays.ArrayKindUnavailable, ImportError) as exc:
        return "numpy", f"no usable CUDA GPU ({exc}); using the float32 NumPy implementation"
    return "cupy", "a CUDA GPU with CuPy is usable; using the CuPy kernels"
