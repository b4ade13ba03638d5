"""Adapters from the native convention to third-party kernels (translation only).

``fla-chunk`` and ``fla-recurrent``: flash-linear-attention 0.6 (``fla-core``), torch CUDA
tensors. FLA's own convention is the native one, so the adapter only renames nothing and
passes ``cu_seqlens`` as a LongTensor,
and every tensor by keyword.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from gdn_verify.core import arrays
from gdn_verify.core.implementation import ConfigurationError, Implementation
from gdn_verify.implementations import interpreter


def jit_compiled(**extra: Any) -> dict[str, Any]:
    """``Implementation.extra`` for a kernel compiled per shape class (``gdn_verify.core.shapes``).

    Triton (FLA) and CuTe DSL (FlashInfer) kernels compile one variant per head counts, head
    sizes, dtype, varlen, initial state and l2norm: 25-45 s each for FLA's chunked kernel on an
    H100 with a cold cache. Declared, ``check`` and ``fuzz`` draw shapes from a pool compiled up
    front without first deciding from a timing probe whether a new class is expensive.
    """
    return {"compile_classes": True, **extra}


def cache_triton_autotuning() -> None:
    """Keep Triton's autotuning winners in its cache directory, unless the user has said otherwise.

    FLA (and vLLM's fork of it) autotune every kernel variant in every process, benchmarking each
    config again even when the compiled kernels come from a warm Triton cache; FLA 0.6 passes
    ``cache_results=False``, which Triton ORs with ``TRITON_CACHE_AUTOTUNING``. With it set, a
    later process (a warm ``check``, each ``fuzz --workers`` process) reuses the winners. Must run
    before the library is imported: Triton's autotuner reads it when a kernel is decorated.
    """
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")


def cuda_library(what: str, install: str, load: Callable[[], Any]) -> Any:
    """``load()`` (which imports a torch-based kernel library), or a one-line ConfigurationError.

    Under Triton's interpreter (``TRITON_INTERPRET=1``) a Triton library runs on CPU tensors, so
    no GPU is asked for (``gdn_verify.implementations.interpreter``).
    """
    cache_triton_autotuning()
    try:
        import torch

        loaded = load()
    except ImportError as exc:
        raise ConfigurationError("impl", f"{what} is not installed ({install}): {exc}") from None
    if not torch.cuda.is_available() and not interpreter.requested():
        cpu = f"set {interpreter.ENV}=1 to run Triton kernels on the CPU"
        raise ConfigurationError("impl", f"{what}'s kernels need a CUDA GPU; none is visible ({cpu})")
    return loaded


def _fla():
    def load():
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

        return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    return cuda_library("FLA", "pip install fla-core==0.6.0", load)


def wrap(fn):
    def call(q, k, v, g, beta, cu_seqlens=None, **kw):
        if cu_seqlens is not None:
            cu_seqlens = cu_seqlens.long()
        # by keyword: fused_recurrent_gated_delta_rule's positional order is (q, k, v, g, gk, gv, beta)
        return fn(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens, **kw)

    return call


class FlaStaged:
    """FLA 0.6's stage functions on a CUDA GPU (torch); imports FLA on construction."""

    chunk_size = 64
    working_unit_roundoff = 2.0**-24

    def __init__(self):
        cache_triton_autotuning()
        try:
            import torch
            from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h
            from fla.ops.common.chunk_o import chunk_fwd_o
            from fla.ops.common.chunk_scaled_dot_kkt import chunk_scaled_dot_kkt_fwd
            from fla.ops.gated_delta_rule.wy_fast import recompute_w_u_fwd
            from fla.ops.utils import chunk_local_cumsum, solve_tril
        except ImportError as exc:
            raise ConfigurationError("impl", f"FLA is not installed (pip install fla-core==0.6.0): {exc}") from None
        self.torch = torch
        self.f = dict(
            cumsum=chunk_local_cumsum,
            kkt=chunk_scaled_dot_kkt_fwd,
            solve=solve_tril,
            wu=recompute_w_u_fwd,
            h=chunk_gated_delta_rule_fwd_h,
            o=chunk_fwd_o,
        )

    def _t(self, x):
        return self.torch.from_numpy(np.ascontiguousarray(x, np.float32)).cuda()

    def _n(self, x):
        return x.float().cpu().numpy()

    def cumsum(self, g):
        return self._n(self.f["cumsum"](self._t(g), chunk_size=64))

    def kkt(self, k, beta, G):
        return self._n(self.f["kkt"](k=self._t(k), g=self._t(G), beta=self._t(beta), output_dtype=self.torch.float32))

    def solve_tril(self, A):
        return self._n(self.f["solve"](A=self._t(A), output_dtype=self.torch.float32))

    def w_u(self, k, v, beta, Ai, G):
        w, u = self.f["wu"](k=self._t(k), v=self._t(v), beta=self._t(beta), A=self._t(Ai), g=self._t(G))
        return self._n(w), self._n(u)

    def fwd_h(self, k, W, U, G, initial_state):
        h, v_new, final = self.f["h"](
            k=self._t(k),
            w=self._t(W),
            u=self._t(U),
            g=self._t(G),
            initial_state=self._t(initial_state),
            output_final_state=True,
        )
        return self._n(h), self._n(v_new), self._n(final)

    def fwd_o(self, q, k, v_new, h, G, scale):
        return self._n(
            self.f["o"](q=self._t(q), k=self._t(k), v=self._t(v_new), h=self._t(h), g=self._t(G), scale=scale)
        )


def fla_chunk() -> Implementation:
    chunk, _ = _fla()
    arrays.check_kind("torch")
    return Implementation(
        "fla-chunk",
        {"chunk": wrap(chunk)},
        "torch",
        "FLA 0.6 chunk_gated_delta_rule",
        "bfloat16",
        extra=jit_compiled(stages=FlaStaged()),
    )


def fla_recurrent() -> Implementation:
    _, recurrent = _fla()
    return Implementation(
        "fla-recurrent",
        {"recurrent": wrap(recurrent)},
        "torch",
        "FLA 0.6 fused_recurrent_gated_delta_rule",
        "bfloat16",
        extra=jit_compiled(),
    )
