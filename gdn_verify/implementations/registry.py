"""The registry: built-in implementations by name, planted bugs, plug-ins by ``MODULE:FUNCTION``.

Built-in: ``numpy`` (float32 NumPy, chunked and recurrent forms and the speculative-decoding
form), ``numpy-chunk``, ``numpy-chunk16``, ``numpy-recurrent``, models of the production chunked
algorithm (``numpy-chunk-fla`` and its C=32/16 variants with a float32 chunk-local gate cumsum,
``numpy-chunk-cumsum64``, ``numpy-chunk-fla16`` with FLA's 16-bit roundings, and ``numpy-chunk-tf32``
with TF32 products), ``oracle``, ``planted:BUG`` (``planted.py``), ``planted-grad:BUG`` (planted
gradient bugs, ``planted_grad.py``), ``numpy-grad`` and ``numpy-grad16`` (NumPy backwards,
``numpy_grad.py``); imported on demand: the CuPy kernels (``cupy.py``), FLA (``fla.py``),
FlashInfer (``flashinfer.py``), vLLM's kernel files (``vllm.py``) and Modular MAX (``max_kernels.py``).
Plug-ins are loaded by ``plugins.py``. :func:`choose_oracle` is the one place that picks the
float64 oracle for problems of a given array kind.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import numpy as np

from gdn_verify.core import arrays, reference
from gdn_verify.core.implementation import SPEC_FORM, ConfigurationError, Implementation
from gdn_verify.core.oracle import Oracle, from_implementation, numpy_oracle
from gdn_verify.implementations import interpreter, numpy_impl, precision, speculative
from gdn_verify.implementations.plugins import CONVENTIONS, load_plugin

# Names of planted-bug implementations: PREFIX + BUG, each prefix a module of this package.
PLANTED = {"planted:": "planted", "planted-grad:": "planted_grad"}


def _oracle_chunk(**kw):
    return reference.chunk_gated_delta_rule(**kw)


def _chunk16(**kw):
    return numpy_impl.chunk_gated_delta_rule(**kw, chunk_size=16)


def _numpy_grad(name: str) -> Callable[[], Implementation]:
    """A NumPy backward of ``numpy_grad.py`` (imported when asked for)."""

    def make() -> Implementation:
        try:
            module = importlib.import_module("gdn_verify.implementations.numpy_grad")
        except ImportError as exc:
            raise ConfigurationError("impl", f"{name}: unavailable here: {exc}") from None
        return module.numpy_grad_implementation(name)

    return make


def _fla_style(name: str, chunk_size: int, cumsum_dtype=np.float32, tf32: bool = False, what: str = ""):
    """A built-in NumPy model of the production chunked algorithm (``numpy_impl.chunk_fla_core``)."""

    def run(**kw):
        return numpy_impl.chunk_fla_gated_delta_rule(**kw, chunk_size=chunk_size, cumsum_dtype=cumsum_dtype, tf32=tf32)

    cumsum = np.dtype(cumsum_dtype).name
    return lambda: Implementation(
        name,
        {"chunk": run},
        description=f"float32 NumPy chunked as FLA writes it, C={chunk_size}, {cumsum} chunk-local gate cumsum{what}",
    )


BUILTIN: dict[str, Callable[[], Implementation]] = {
    "numpy": lambda: Implementation(
        "numpy",
        {
            "chunk": numpy_impl.chunk_gated_delta_rule,
            "recurrent": numpy_impl.recurrent_gated_delta_rule,
            SPEC_FORM: speculative.spec_reference,
        },
        description="float32 NumPy, chunked (C=64) with recurrent and speculative-decoding forms",
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
    # FLA's 16-bit choices (docs/precision.md): every allowed rounding in the input dtype, C=64.
    "numpy-chunk-fla16": lambda: Implementation(
        "numpy-chunk-fla16",
        {"chunk": precision.fla_rounded()},
        description="FLA's chunked algorithm with every allowed rounding of the precision contract in the input dtype",
    ),
    # A known precision loss: must fail float32 matches_reference.
    "numpy-chunk-tf32": _fla_style("numpy-chunk-tf32", 64, tf32=True, what=", TF32 matrix products"),
    # NumPy backwards (functional, float32 and 16-bit): what gradient checks run on CPU.
    "numpy-grad": _numpy_grad("numpy-grad"),
    "numpy-grad16": _numpy_grad("numpy-grad16"),
    "oracle": lambda: Implementation(
        "oracle",
        {"chunk": _oracle_chunk, "recurrent": reference.recurrent_gated_delta_rule},
        description="the float64 oracle itself (its outputs are float64 whatever the input dtype)",
        default_dtype="float64",
    ),
}

# Implementations provided by other modules, imported on demand: name -> "module:factory".
LAZY: dict[str, str] = {
    "cupy": "gdn_verify.implementations.cupy:cupy_auto",
    "cupy-recurrent": "gdn_verify.implementations.cupy:cupy_recurrent",
    "cupy-chunk": "gdn_verify.implementations.cupy:cupy_chunk",
    "cupy-oracle": "gdn_verify.implementations.cupy:cupy_oracle",
    "fla-chunk": "gdn_verify.implementations.fla:fla_chunk",
    "fla-recurrent": "gdn_verify.implementations.fla:fla_recurrent",
    "flash-qla": "gdn_verify.implementations.flashqla:flash_qla",
    "flashinfer-prefill": "gdn_verify.implementations.flashinfer:flashinfer_prefill",
    "flashinfer-prefill-cp": "gdn_verify.implementations.flashinfer:flashinfer_prefill_cp",
    "flashinfer-decode": "gdn_verify.implementations.flashinfer:flashinfer_decode",
    "flashinfer-decode-bf16": "gdn_verify.implementations.flashinfer:flashinfer_decode_bf16",
    "flashinfer-decode-kmajor": "gdn_verify.implementations.flashinfer:flashinfer_decode_kmajor",
    "flashinfer-mtp": "gdn_verify.implementations.flashinfer:flashinfer_mtp",
    "vllm-chunk": "gdn_verify.implementations.vllm:vllm_chunk",
    "vllm-recurrent": "gdn_verify.implementations.vllm:vllm_recurrent",
    "vllm-spec": "gdn_verify.implementations.vllm:vllm_spec",
    "vllm-sigmoid-spec": "gdn_verify.implementations.vllm:vllm_sigmoid_spec",
    "vllm-sigmoid-recurrent": "gdn_verify.implementations.vllm:vllm_sigmoid_recurrent",
    "vllm-packed-decode": "gdn_verify.implementations.vllm:vllm_packed_decode",
    "max-recurrence": "gdn_verify.implementations.max_kernels:max_recurrence",
    "max-recurrence-bf16": "gdn_verify.implementations.max_kernels:max_recurrence_bf16",
    "max-verify-ring": "gdn_verify.implementations.max_kernels:max_verify_ring",
    "max-verify-ring-bf16": "gdn_verify.implementations.max_kernels:max_verify_ring_bf16",
}


def names() -> list[str]:
    """Built-in names, besides ``MODULE:FUNCTION``, ``planted:BUG`` and ``planted-grad:BUG``."""
    return sorted(BUILTIN) + sorted(LAZY)


def planted_prefix(name: str) -> str | None:
    """``"planted:"`` or ``"planted-grad:"`` when ``name`` names a planted bug, else None."""
    return next((prefix for prefix in PLANTED if name.startswith(prefix)), None)


def is_plugin(name: str) -> bool:
    """Whether ``name`` is a ``MODULE:FUNCTION`` plug-in (not a built-in or a planted bug)."""
    return ":" in name and planted_prefix(name) is None


def resolve(name: str, array: str | None = None, convention: str = "native") -> Implementation:
    """The implementation named ``name``; raises :class:`ConfigurationError` on misuse.

    ``array`` and ``convention`` apply to ``MODULE:FUNCTION`` plug-ins (built-ins know theirs).
    They and ``name`` are kept in ``extra["resolved_as"]``, so that a child process can resolve
    the same implementation again (``gdn_verify.runners.compile_workers``).
    """
    if array is not None and array not in arrays.ARRAY_KINDS:
        raise ConfigurationError("array", f"{array!r}: choose from {', '.join(arrays.ARRAY_KINDS)}")
    if convention not in CONVENTIONS:
        raise ConfigurationError("convention", f"{convention!r}: choose from {', '.join(CONVENTIONS)}")
    plugin = is_plugin(name)
    prefix = planted_prefix(name)
    if name in BUILTIN:
        impl = BUILTIN[name]()
    elif prefix is not None:
        try:
            module = importlib.import_module(f"gdn_verify.implementations.{PLANTED[prefix]}")
        except ImportError as exc:
            raise ConfigurationError("impl", f"{name}: unavailable here: {exc}") from None
        impl = module.implementation(name.removeprefix(prefix))
    elif name in LAZY:
        module_name, _, factory = LAZY[name].partition(":")
        try:
            impl = getattr(importlib.import_module(module_name), factory)()
        except (ImportError, arrays.ArrayKindUnavailable) as exc:
            raise ConfigurationError("impl", f"{name}: unavailable here: {exc}") from None
    elif plugin:
        impl = load_plugin(name, array or "numpy", convention)
    else:
        raise ConfigurationError("impl", f"{name!r}: unknown; choose from {', '.join(names())} or MODULE:FUNCTION")
    if name in BUILTIN or prefix is not None:
        impl.extra.setdefault("compile_classes", False)  # NumPy: nothing compiles, no probe needed
    if not plugin and array is not None and array != impl.array:
        raise ConfigurationError("array", f"applies to MODULE:FUNCTION plug-ins; {name} takes {impl.array} arrays")
    if not plugin and convention != "native":
        raise ConfigurationError(
            "convention", f"applies to MODULE:FUNCTION plug-ins; {name}'s forms are {', '.join(impl.forms)}"
        )
    try:
        arrays.check_kind(impl.array)
    except arrays.ArrayKindUnavailable as exc:
        raise ConfigurationError("array", str(exc)) from None
    impl.extra["resolved_as"] = dict(name=name, array=array, convention=convention)
    return impl if plugin else interpreter.adapt(impl)  # a plug-in's was adapted in from_callable


def default_name() -> tuple[str, str]:
    """``("cupy", why)`` when a CUDA GPU with CuPy is usable, else ``("numpy", why)``."""
    try:
        arrays.check_kind("cupy")
        importlib.import_module("gdn_verify.implementations.cupy")
    except (arrays.ArrayKindUnavailable, ImportError) as exc:
        return "numpy", f"no usable CUDA GPU ({exc}); using the float32 NumPy implementation"
    return "cupy", "a CUDA GPU with CuPy is usable; using the CuPy kernels"


def choose_oracle(array: str) -> tuple[str, Oracle]:
    """The float64 oracle for problems of an implementation taking ``array`` arrays.

    GPU arrays: the float64 GPU recurrence (``cupy-oracle``) when it can run here, so that large
    problems are checked in seconds; otherwise (and for NumPy) the NumPy oracle.
    """
    if array != "numpy":
        try:
            return "cupy-oracle (float64 GPU recurrence)", from_implementation(resolve("cupy-oracle"))
        except ConfigurationError:
            pass
    return "gdn_verify.core.reference (float64 NumPy)", numpy_oracle
