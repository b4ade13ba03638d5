"""Adapter to FlashQLA (``flash-qla`` on PyPI): fused TileLang GDN prefill and backward, Hopper.

FlashQLA takes FLA's convention (``q, k [B, T, H, K]``, log-space ``g``, ``cu_seqlens``), so the
adapter translates nothing: ``fla.wrap`` passes every tensor by keyword and ``cu_seqlens`` as
a LongTensor. FlashQLA supports bfloat16 and float16 inputs only (it asserts so), and FLA 0.6
dispatches its own ``chunk_gated_delta_rule`` to it when it can be imported (head sizes 128,
16-bit inputs, Hopper; ``FLA_FLASH_QLA=0`` turns that off). Training stacks call it through
autograd: ``check --grad --impl flash-qla`` verifies that backward.
"""

from __future__ import annotations

from collections.abc import Callable

from gdn_verify.core import arrays
from gdn_verify.core.implementation import Implementation
from gdn_verify.implementations.fla import cuda_library, jit_compiled, wrap


def training_contract(fn: Callable) -> Callable:
    """``fn`` under FlashQLA 0.1.3's contract, as read from its source and seen on an H100
    (2026-11-26):

    - a call with an empty sequence is reported unsupported: FlashQLA raises ``ValueError: invalid
      sequence lengths: [0, 1]`` for any zero length (its context-parallel planner), an explicit
      refusal;
    - ``g`` is passed in float32, as models compute it: FlashQLA keeps the chunk-local cumsum of
      ``g`` in ``g``'s dtype and its backward asserts ``dg should be fp32``. The values are those of
      the drawn 16-bit ``g``, so the oracle's inputs do not change.
    """

    def call(q, k, v, g, *args, cu_seqlens=None, **kw):
        lengths = [q.shape[1]] if cu_seqlens is None else (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        if min(lengths, default=0) == 0:
            raise NotImplementedError("FlashQLA refuses a call with an empty sequence")
        return fn(q, k, v, g.float(), *args, cu_seqlens=cu_seqlens, **kw)

    return call


def flash_qla() -> Implementation:
    def load():
        from flash_qla import chunk_gated_delta_rule

        return chunk_gated_delta_rule

    chunk = cuda_library("FlashQLA", "pip install flash-qla (needs tilelang)", load)
    arrays.check_kind("torch")
    return Implementation(
        "flash-qla",
        {"chunk": training_contract(wrap(chunk))},
        "torch",
        "FlashQLA chunk_gated_delta_rule (TileLang, auto intra-card context parallelism)",
        "bfloat16",
        extra=jit_compiled(),
    )
