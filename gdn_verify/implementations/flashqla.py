"""Adapter to FlashQLA (``flash-qla`` on PyPI): fused TileLang GDN prefill and backward, Hopper.

FlashQLA takes FLA's convention (``q, k [B, T, H, K]``, log-space ``g``, ``cu_seqlens``), so the
adapter translates nothing: ``fla.wrap`` passes every tensor by keyword and ``cu_seqlens`` as
a LongTensor. FlashQLA supports bfloat16 and float16 inputs only (it asserts so), and FLA 0.6
dispatches its own ``chunk_gated_delta_rule`` to it when it can be imported (head sizes 128,
16-bit inputs, Hopper; ``FLA_FLASH_QLA=0`` turns that off). Training stacks call it through
autograd: ``check --grad --impl flash-qla`` verifies that backward.
"""

from __future__ import annotations

from gdn_verify.core import arrays
from gdn_verify.core.implementation import Implementation
from gdn_verify.implementations.fla import cuda_library, jit_compiled, wrap


def flash_qla() -> Implementation:
    def load():
        from flash_qla import chunk_gated_delta_rule

        return chunk_gated_delta_rule

    chunk = cuda_library("FlashQLA", "pip install flash-qla (needs tilelang)", load)
    arrays.check_kind("torch")
    return Implementation(
        "flash-qla",
        {"chunk": wrap(chunk)},
        "torch",
        "FlashQLA chunk_gated_delta_rule (TileLang, auto intra-card context parallelism)",
        "bfloat16",
        extra=jit_compiled(),
    )
