"""A user's own Triton GDN kernel, as a plug-in in the native convention (for the interpreter tests).

One program per (sequence, value head) runs the recurrence token by token with a float32 state
in registers. It is written the way FLA's and vLLM's kernels are, so that it needs each of the
interpreter workarounds of ``gdn_verify.implementations.interpreter``: an autotuner with two
configs, a ``range`` loop variable widened with ``.to(tl.int64)``, and ``exp`` bound as a module
global (vLLM's ``op.py`` does ``exp = tl.exp``). ``IGNORE_GATE = True`` plants a bug: the decay
is never applied.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

exp = tl.exp  # a builtin bound as a module global
IGNORE_GATE = False


@triton.autotune(configs=[triton.Config({}, num_warps=w) for w in (1, 2)], key=["BK", "BV"])
@triton.jit
def _recurrent_kernel(
    q, k, v, g, beta, o, h0, ht, cu_seqlens, scale, T,
    H: tl.constexpr, HV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    VARLEN: tl.constexpr, INITIAL: tl.constexpr, FINAL: tl.constexpr, L2NORM: tl.constexpr, GATE: tl.constexpr,
):  # fmt: skip
    n, hv = tl.program_id(0), tl.program_id(1)
    h = hv // (HV // H)
    if VARLEN:
        bos, eos = tl.load(cu_seqlens + n).to(tl.int64), tl.load(cu_seqlens + n + 1).to(tl.int64)
        row = 0
    else:
        bos, eos = 0, T
        row = n
    ok, ov = tl.arange(0, BK), tl.arange(0, BV)
    S = tl.zeros([BK, BV], dtype=tl.float32)
    if INITIAL:
        S += tl.load(h0 + ((n * HV + hv) * BK + ok[:, None]) * BV + ov[None, :])
    for t in range(bos, eos):
        i_t = (row * T + t).to(tl.int64)  # compiled Triton's loop variable is an int32 tensor
        b_q = tl.load(q + (i_t * H + h) * BK + ok).to(tl.float32)
        b_k = tl.load(k + (i_t * H + h) * BK + ok).to(tl.float32)
        if L2NORM:
            b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
            b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
        b_v = tl.load(v + (i_t * HV + hv) * BV + ov).to(tl.float32)
        if GATE:
            S *= exp(tl.load(g + i_t * HV + hv).to(tl.float32))
        b_beta = tl.load(beta + i_t * HV + hv).to(tl.float32)
        u = b_beta * (b_v - tl.sum(S * b_k[:, None], 0))
        S += b_k[:, None] * u[None, :]
        b_o = scale * tl.sum(S * b_q[:, None], 0)
        tl.store(o + (i_t * HV + hv) * BV + ov, b_o.to(o.dtype.element_ty))
    if FINAL:
        tl.store(ht + ((n * HV + hv) * BK + ok[:, None]) * BV + ov[None, :], S)


def recurrent(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
    cu_seqlens=None,
):  # fmt: skip
    """``q, k [B, T, H, K]``, ``v [B, T, HV, V]``, ``g, beta [B, T, HV]`` -> ``o``, state ``[N, HV, K, V]`` float32."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if K & (K - 1) or V & (V - 1):
        raise NotImplementedError(f"head sizes must be powers of two (K={K}, V={V})")
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
    o = torch.empty_like(v)
    ht = torch.empty(N, HV, K, V, dtype=torch.float32, device=q.device) if output_final_state else None
    h0 = None if initial_state is None else initial_state.float().contiguous()
    _recurrent_kernel[(N, HV)](
        q, k, v, g, beta, o, h0, ht, cu_seqlens, K**-0.5 if scale is None else scale, T,
        H=H, HV=HV, BK=K, BV=V, VARLEN=cu_seqlens is not None, INITIAL=h0 is not None, FINAL=ht is not None,
        L2NORM=use_qk_l2norm_in_kernel, GATE=not IGNORE_GATE,
    )  # fmt: skip
    return o, ht


def gate_ignored(**kw):
    """The planted bug: the same kernel with the decay never applied."""
    global IGNORE_GATE
    IGNORE_GATE = True
    try:
        return recurrent(**kw)
    finally:
        IGNORE_GATE = False
