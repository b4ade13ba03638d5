"""Adapters from the native convention to third-party kernels (translation only).

``fla-chunk`` and ``fla-recurrent``: flash-linear-attention 0.6 (``fla-core``), torch CUDA
tensors. FLA's own convention is the native one, so the adapter only renames nothing and
passes ``cu_seqlens`` as a LongTensor,
and every tensor by keyword.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gdn_verify.core import arrays
from gdn_verify.implementations import ConfigurationError, Implementation


def cuda_library(what: str, install: str, load: Callable[[], Any]) -> Any:
    """``load()`` (which imports a torch-based kernel library), or a one-line ConfigurationError."""
    try:
        import torch

        loaded = load()
    except ImportError as exc:
        raise ConfigurationError(f"{what} is not installed ({install}): {exc}") from None
    if not torch.cuda.is_available():
        raise ConfigurationError(f"{what}'s kernels need a CUDA GPU; none is visible")
    return loaded


def _fla():
    def load():
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

        return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    return cuda_library("FLA", "pip install fla-core==0.6.0", load)


def _wrap(fn):
    def call(q, k, v, g, beta, cu_seqlens=None, **kw):
        if cu_seqlens is not None:
            cu_seqlens = cu_seqlens.long()
        # by keyword: fused_recurrent_gated_delta_rule's positional order is (q, k, v, g, gk, gv, beta)
        return fn(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, **kw)

    return call


def fla_chunk() -> Implementation:
    from gdn_verify.runners.diagnose import FlaStaged

    chunk, _ = _fla()
    arrays.check_kind("torch")
    return Implementation("fla-chunk", {"chunk": _wrap(chunk)}, "torch", "FLA 0.6 chunk_gated_delta_rule", "bfloat16",
                          extra={"stages": FlaStaged()})


def fla_recurrent() -> Implementation:
    _, recurrent = _fla()
    return Implementation("fla-recurrent", {"recurrent": _wrap(recurrent)}, "torch",
                          "FLA 0.6 fused_recurrent_gated_delta_rule", "bfloat16")
