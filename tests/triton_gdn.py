"""A user's own Triton GDN kernel, as a plug-in in the native convention (for the interpreter tests).

One program per (sequence, value head, tile of ``BV`` value columns) runs the recurrence token by
token with a float32 state in registers. It is written the way FLA's and vLLM's kernels are, so
that it needs each of the interpreter workarounds of ``gdn_verify.implementations.interpreter``:
``@triton.heuristics`` over ``@triton.autotune`` (:data:`CONFIGS`, over the tile width ``BV``
and ``num_warps``) over ``@triton.jit``, a ``range`` loop variable widened with
``.to(tl.int64)``, and ``exp`` bound as a module global (vLLM's ``op.py`` does ``exp = tl.exp``).

Planted bugs, each a module flag (tests set it in the child process):

- ``IGNORE_GATE``: the decay is never applied (every config).
- ``FLOOR_GRID``: the launch grid has ``V // BV`` value tiles instead of ``cdiv(V, BV)``: a config
  whose tile is wider than V (``BV=32`` with V=16) launches no program at all and leaves ``o`` and
  the final state unwritten. The default config (the first, ``BV=16``) is right on every V that is
  a multiple of 16: a config-only bug, the kind ``check --all-configs`` is for.
- ``WARPS_HOOK``: the second config (the first's tiling, ``num_warps=2``) carries a host-side
  ``pre_hook`` that rescales the (copied) initial state by ``1 + 2**-20``: two configs that differ
  only in ``num_warps`` give different bits. Under the interpreter ``num_warps`` never reaches the
  kernel, so host code attached to a config is the only way such configs can differ there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

exp = tl.exp  # a builtin bound as a module global
IGNORE_GATE = False
FLOOR_GRID = False
WARPS_HOOK = False


def _warps_hook(nargs):
    """The second config's pre_hook: a no-op unless ``WARPS_HOOK`` plants its bug."""
    if WARPS_HOOK and nargs["h0"] is not None:
        nargs["h0"].mul_(1 + 2**-20)


CONFIGS = [
    triton.Config({"BV": 16}, num_warps=1),
    triton.Config({"BV": 16}, num_warps=2, pre_hook=_warps_hook),
    triton.Config({"BV": 32}, num_warps=1),
]


@triton.heuristics({"VARLEN": lambda args: args["cu_seqlens"] is not None})
@triton.autotune(configs=CONFIGS, key=["BK", "V"])
@triton.jit
def _recurrent_kernel(
    q, k, v, g, beta, o, h0, ht, cu_seqlens, scale, T,
    H: tl.constexpr, HV: tl.constexpr, BK: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    VARLEN: tl.constexpr, INITIAL: tl.constexpr, FINAL: tl.constexpr, L2NORM: tl.constexpr, GATE: tl.constexpr,
):  # fmt: skip
    n, hv, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    h = hv // (HV // H)
    if VARLEN:
        bos, eos = tl.load(cu_seqlens + n).to(tl.int64), tl.load(cu_seqlens + n + 1).to(tl.int64)
        row = 0
    else:
        bos, eos = 0, T
        row = n
    ok, ov = tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    mv = ov < V  # a tile may reach past V (BV > V)
    S = tl.zeros([BK, BV], dtype=tl.float32)
    if INITIAL:
        S += tl.load(h0 + ((n * HV + hv) * BK + ok[:, None]) * V + ov[None, :], mask=mv[None, :], other=0.0)
    for t in range(bos, eos):
        i_t = (row * T + t).to(tl.int64)  # compiled Triton's loop variable is an int32 tensor
        b_q = tl.load(q + (i_t * H + h) * BK + ok).to(tl.float32)
        b_k = tl.load(k + (i_t * H + h) * BK + ok).to(tl.float32)
        if L2NORM:
            b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
            b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
        b_v = tl.load(v + (i_t * HV + hv) * V + ov, mask=mv, other=0.0).to(tl.float32)
        if GATE:
            S *= exp(tl.load(g + i_t * HV + hv).to(tl.float32))
        b_beta = tl.load(beta + i_t * HV + hv).to(tl.float32)
        u = b_beta * (b_v - tl.sum(S * b_k[:, None], 0))
        S += b_k[:, None] * u[None, :]
        b_o = scale * tl.sum(S * b_q[:, None], 0)
        tl.store(o + (i_t * HV + hv) * V + ov, b_o.to(o.dtype.element_ty), mask=mv)
    if FINAL:
        tl.store(ht + ((n * HV + hv) * BK + ok[:, None]) * V + ov[None, :], S, mask=mv[None, :])


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
    # a copy: the kernel reads its own float32 state, never the caller's tensor
    h0 = None if initial_state is None else initial_state.to(torch.float32, copy=True).contiguous()

    def grid(meta):
        tiles = V // meta["BV"] if FLOOR_GRID else triton.cdiv(V, meta["BV"])
        return (N, HV, tiles)

    _recurrent_kernel[grid](
        q, k, v, g, beta, o, h0, ht, cu_seqlens, K**-0.5 if scale is None else scale, T,
        H=H, HV=HV, BK=K, V=V, INITIAL=h0 is not None, FINAL=ht is not None,
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


def floor_grid(**kw):
    """The planted config-only bug ``FLOOR_GRID``: right under the default config, wrong under ``BV=32``."""
    global FLOOR_GRID
    FLOOR_GRID = True
    try:
        return recurrent(**kw)
    finally:
        FLOOR_GRID = False


def warps_hook(**kw):
    """The planted bug ``WARPS_HOOK``: the ``num_warps=2`` config's results differ from the first's."""
    global WARPS_HOOK
    WARPS_HOOK = True
    try:
        return recurrent(**kw)
    finally:
        WARPS_HOOK = False
