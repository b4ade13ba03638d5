"""The CuPy kernels (``cupy_kernels``) under test: ``cupy``, ``cupy-recurrent``, ``cupy-chunk``, ``cupy-oracle``.

Importing this module needs CuPy and a CUDA device (``implementations.resolve`` turns the
failure into a one-line "unavailable here"). Problems travel as torch tensors when PyTorch
is installed, since CuPy has no bfloat16, else as CuPy arrays.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from gdn_verify.core import arrays, backends
from gdn_verify.core.implementation import SPEC_FORM, Implementation

arrays.check_kind("cupy")

from cupy_kernels import check_errors, chunk, decode, recurrent  # noqa: E402 - only once a GPU is known to be usable

# Longest sequence for which ``cupy`` takes the recurrent kernel: decode and speculative
# decoding (a few tokens per request) read the state once; the chunked form pays off beyond.
RECURRENT_MAX_TOKENS = 16


def _array_kind() -> str:
    try:
        arrays.check_kind("torch")
    except arrays.ArrayKindUnavailable:
        return "cupy"
    return "torch"


def _reporting(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, then the deferred ``ValueError`` its kernel reported for bad device metadata, then
    the backend it ran noted (:func:`_ran`).

    Unchecked launchers report a bad ``num_accepted_tokens`` or ``cu_seqlens`` on the device at
    the *next* call (the package's tensor policy). The verifier must see the rejection on the call
    that made it, yet verify the unchecked path users run, so it flushes after each call instead
    of passing ``checked=True``.
    """

    @functools.wraps(fn)
    def call(*args: Any, **kw: Any) -> Any:
        out = fn(*args, **kw)
        check_errors()
        backends.note(*_ran(fn))
        return out

    return call


def _ran(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The backend names of the call of ``fn`` that just returned: the chunked kernel's path as it
    decided it (``chunk.last_kernels``), else the kernel family (:func:`auto` notes its own)."""
    if fn is auto:
        return ()
    if fn is chunk.chunk_gated_delta_rule:
        return backends.cupy_chunk_names(chunk.last_kernels)
    return ("cupy-spec",) if fn is decode.spec_decode else ("cupy-recurrent",)


def _longest_sequence(q, cu_seqlens) -> int:
    if cu_seqlens is None:
        return q.shape[1]
    lengths = arrays.to_numpy(cu_seqlens)
    return int((lengths[1:] - lengths[:-1]).max(initial=0))


def auto(q, k, v, g, beta, cu_seqlens=None, **kw):
    """Recurrent kernel for decode-sized sequences, chunked kernel for prefill (the one taken noted)."""
    if _longest_sequence(q, cu_seqlens) <= RECURRENT_MAX_TOKENS:
        out = recurrent.recurrent_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu_seqlens, **kw)
        backends.note("cupy-recurrent")
        return out
    out = chunk.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu_seqlens, **kw)
    backends.note(*backends.cupy_chunk_names(chunk.last_kernels))
    return out


def gpu_oracle(q, k, v, g, beta, **kw):
    return recurrent.recurrent_gated_delta_rule(q, k, v, g, beta, precision="float64", **kw)


def cupy_recurrent() -> Implementation:
    return Implementation(
        "cupy-recurrent",
        {"recurrent": _reporting(recurrent.recurrent_gated_delta_rule)},
        _array_kind(),
        "CuPy recurrent kernel, float32 state",
        "bfloat16",
    )


def cupy_chunk() -> Implementation:
    return Implementation(
        "cupy-chunk",
        {"chunk": _reporting(chunk.chunk_gated_delta_rule)},
        _array_kind(),
        "CuPy chunked (WY/UT) kernel, C=64",
        "bfloat16",
    )


def cupy_auto() -> Implementation:
    forms = {
        "auto": auto,
        "chunk": chunk.chunk_gated_delta_rule,
        "recurrent": recurrent.recurrent_gated_delta_rule,
        SPEC_FORM: decode.spec_decode,
    }
    forms = {name: _reporting(fn) for name, fn in forms.items()}
    return Implementation(
        "cupy",
        forms,
        _array_kind(),
        f"CuPy kernels: recurrent up to {RECURRENT_MAX_TOKENS} tokens, else chunked",
        "bfloat16",
    )


def cupy_oracle() -> Implementation:
    return Implementation(
        "cupy-oracle",
        {"recurrent": _reporting(gpu_oracle)},
        _array_kind(),
        "the recurrent kernel in float64: a GPU oracle (float64 outputs)",
        "float64",
    )
