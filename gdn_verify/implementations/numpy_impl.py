"""The float32 NumPy implementation shipped with the toolkit (``--impl numpy``).

It runs the oracle's algebra (``reference.recurrent_core`` / ``chunk_core``) in float32, the
precision a GPU kernel's state has in this convention, and returns ``o`` in the input dtype and
the final state in float32, like FLA. It is the CPU stand-in for a correct kernel: the
tolerance model is calibrated so that it passes. It also takes FLA's in-kernel gate options
(``use_gate_in_kernel`` with ``A_log``/``dt_bias``, ``use_beta_sigmoid_in_kernel``,
``allow_neg_eigval``), applied in float64 and rounded to float32 before the recurrence.

:func:`chunk_fla_gated_delta_rule` models the chunked algorithm as FLA, FlashInfer and vLLM
write it, for checking that the tolerance model accepts the rounding those algorithms incur:
a chunk-local gate cumsum ``G`` (float32 in production, ``cumsum_dtype``), every gate factor
as ``exp`` of a difference of that cumsum (``exp(G_i - G_j)``, ``exp(G_i)``, ``exp(G_C - G_j)``),
``(I + A)^-1`` by forward substitution, ragged chunks zero-padded. ``tf32=True`` cuts the
operands of every matrix product to TF32 (10 explicit mantissa bits) toward zero, as a tensor core
does with float32 registers it is handed unconverted (Triton's default ``tl.dot`` on float32;
``tf32="rna"`` rounds them to nearest like ``cvt.rna``), and accumulates in float32: a known
precision loss the checks must report. Cutting reproduces FLA 0.6's float32 error on the
committed one-token case to three digits (0.0024 output, 9.57e-4 state; rounding gives 3.2e-4).

:func:`recurrent_stored_state_gated_delta_rule` is the float32 token loop of a kernel whose state
pool has a narrower dtype (FlashInfer's bfloat16-state decode): the carried state is stored
through ``store`` as it is loaded and after every token, the arithmetic is float32.
"""

from __future__ import annotations

import numpy as np

from gdn_verify.core.gating import OPTION_NAMES, float32_gates
from gdn_verify.core.reference import chunk_core, recurrent_core, run_packed

TF32_MANTISSA_BITS = 10


def round_to_tf32(x: np.ndarray) -> np.ndarray:
    """Float32 values rounded to TF32 (10 explicit mantissa bits), nearest with ties away from
    zero like ``cvt.rna.tf32.f32``; returned as float32. Inf and NaN pass through."""
    x = np.ascontiguousarray(x, np.float32)
    dropped = 23 - TF32_MANTISSA_BITS
    bits = x.view(np.uint32)
    half = np.uint32(1 << (dropped - 1))
    mask = np.uint32(~((1 << dropped) - 1) & 0xFFFFFFFF)
    rounded = ((bits + half) & mask).view(np.float32)
    return np.where(np.isfinite(x), rounded, x)


def truncate_to_tf32(x: np.ndarray) -> np.ndarray:
    """Float32 values cut to TF32 toward zero: what a tensor core reads from a float32 register it
    is given unconverted (its low 13 mantissa bits ignored), as Triton's default ``tl.dot`` on
    float32 does on Hopper. Returned as float32; Inf and NaN pass through."""
    x = np.ascontiguousarray(x, np.float32)
    cut = (x.view(np.uint32) & np.uint32(~((1 << (23 - TF32_MANTISSA_BITS)) - 1) & 0xFFFFFFFF)).view(np.float32)
    return np.where(np.isfinite(x), cut, x)


def _tf32_matmul(a: np.ndarray, b: np.ndarray, convert=truncate_to_tf32) -> np.ndarray:
    # Products of two TF32 numbers are exact in float32 (11 + 11 significant bits <= 24), so a
    # float32 matmul of cut operands is a TF32 tensor-core product with float32 accumulation.
    return np.matmul(convert(a), convert(b))


def _rna_tf32_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _tf32_matmul(a, b, round_to_tf32)


TF32_MODES = {"truncate": _tf32_matmul, "rna": _rna_tf32_matmul}


def _forward_substitution(A: np.ndarray, matmul) -> np.ndarray:
    """``(I + A)^-1`` for strictly lower-triangular ``A [..., C, C]``, row by row."""
    C = A.shape[-1]
    T = np.broadcast_to(np.eye(C, dtype=A.dtype), A.shape).copy()
    for i in range(1, C):
        T[..., i, :i] = -matmul(A[..., i : i + 1, :i], T[..., :i, :i])[..., 0, :]
    return T


def _no_hook(name: str, x: np.ndarray) -> np.ndarray:
    return x


def chunk_fla_core(
    p, chunk_size: int, cumsum_dtype=np.float32, tf32: bool | str = False, hook=_no_hook, carried_dtype=None
):
    """The chunked (WY/UT) form with FLA's gate handling on a packed float32 problem.

    Per chunk: ``G = cumsum(g)`` in ``cumsum_dtype`` restarting at the chunk start, gate factors
    ``exp(G_i - G_j)`` (masked to ``i >= j`` before the ``exp``), ``exp(G_i)`` and
    ``exp(G_last - G_j)``, all evaluated in float32. ``hook(name, x)`` sees each intermediate of
    ``reference.STAGES`` (the precision models round them there); ``carried_dtype``: the carried
    state is rounded to it at every chunk boundary (a forbidden rounding; None keeps float32).
    Returns ``(o [N, L, HV, V], S [N, HV, K, V])``.
    """
    matmul = TF32_MODES["truncate" if tf32 is True else tf32] if tf32 else np.matmul
    f32 = np.float32
    N, L, HV, V = p.v.shape
    C, n = chunk_size, L // chunk_size

    def chunks(x):  # [N, L, HV, ...] -> [N, HV, n, C, ...]
        return np.moveaxis(x.reshape((N, n, C) + x.shape[2:]), 3, 1)

    q, k, v, g, beta = (chunks(x) for x in (p.q, p.k, p.v, p.g, p.beta))
    G = np.cumsum(g.astype(cumsum_dtype), axis=-1)  # chunk-local cumsum, [N, HV, n, C]
    causal = np.tril(np.ones((C, C), bool))
    diff = np.where(causal, G[..., :, None] - G[..., None, :], 0.0).astype(f32)
    gamma = np.where(causal, np.exp(diff), f32(0))  # exp(G_i - G_j), i >= j
    decay = np.exp(G.astype(f32))  # exp(G_i): from the chunk start to token i
    to_end = np.exp((G[..., -1:] - G).astype(f32))  # exp(G_last - G_j)
    # As FLA: beta scales k k^T after the product, and (I + A)^-1 is a float32 substitution (scalar
    # arithmetic in its diagonal blocks, not a tensor-core product: TF32 does not touch it).
    A = np.tril(beta[..., :, None] * matmul(hook("kkt_operand", k), k.swapaxes(-1, -2)) * gamma, -1)
    T = hook("inverse", _forward_substitution(A, np.matmul))
    W = hook("wu", matmul(T, hook("wu_operands", (beta * decay)[..., None] * k)))  # [N, HV, n, C, K]
    U = hook("wu", matmul(T, hook("wu_operands", beta[..., None] * v)))  # [N, HV, n, C, V]
    attn = hook("attn", matmul(q, k.swapaxes(-1, -2)) * gamma)
    S = p.initial_state.astype(f32)
    o = np.empty((N, HV, n, C, V), f32)
    for c in range(n):
        h = hook("h", S)
        v_new = U[:, :, c] - matmul(W[:, :, c], h)
        o[:, :, c] = p.scale * (
            decay[:, :, c, :, None] * matmul(q[:, :, c], h) + matmul(attn[:, :, c], hook("v_new", v_new))
        )
        update = hook("v_new_decayed", v_new * to_end[:, :, c, :, None])
        S = decay[:, :, c, -1, None, None] * S + matmul(k[:, :, c].swapaxes(-1, -2), update)
        if carried_dtype is not None:
            S = S.astype(carried_dtype).astype(f32)
    return np.moveaxis(o, 1, 3).reshape(N, L, HV, V), S


def _run(*, g, beta, chunk_size: int | None, core=None, **args):
    """The public functions' shared body; they pass their arguments as ``locals()``, which keeps
    each one's own signature (what ``Implementation`` reads to know the options it takes).
    ``args``: FLA's in-kernel gate options (``gating.OPTION_NAMES``) and its other arguments
    (``reference.run_packed``'s); ``core(p)``: the algorithm (None: the oracle's token loop, or
    its chunked form with ``chunk_size``)."""
    g, beta = float32_gates(g, beta, **{name: args.pop(name) for name in OPTION_NAMES if name in args})
    if core is None:
        core = recurrent_core if chunk_size is None else lambda p: chunk_core(p, chunk_size)
    o, final_state = run_packed(core, g=g, beta=beta, **args, dtype=np.float32, pad_to_multiple=chunk_size or 1)
    return o.astype(np.asarray(args["v"]).dtype), None if final_state is None else final_state.astype(np.float32)


def recurrent_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    cu_seqlens=None,
    state_v_first=False,
    use_gate_in_kernel=False,
    A_log=None,
    dt_bias=None,
    use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False,
):
    """Float32 token loop. Returns ``(o [B, T, HV, V] in v's dtype, final_state float32 | None)``."""
    return _run(**locals(), chunk_size=None)


def chunk_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    cu_seqlens=None,
    state_v_first=False,
    chunk_size=64,
    use_gate_in_kernel=False,
    A_log=None,
    dt_bias=None,
    use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False,
):
    """Float32 chunked (WY/UT) form with chunk size 16, 32 or 64."""
    return _run(**locals())


def chunk_fla_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    cu_seqlens=None,
    state_v_first=False,
    chunk_size=64,
    cumsum_dtype=np.float32,
    tf32=False,
    hook=None,
    carried_dtype=None,
    use_gate_in_kernel=False,
    A_log=None,
    dt_bias=None,
    use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False,
):
    """Float32 chunked form as production kernels write it (see :func:`chunk_fla_core`).

    ``cumsum_dtype``: float32 as in FLA/FlashInfer/vLLM, float64 to take the cumsum's rounding
    out; ``tf32``: operands of every matrix product cut to TF32 (``"rna"``: rounded); ``hook``, ``carried_dtype``:
    the roundings of the precision contract's models (``gdn_verify.implementations.precision``).
    """
    args = dict(locals())
    for name in ("cumsum_dtype", "tf32", "hook", "carried_dtype"):
        del args[name]  # the core below carries them
    if chunk_size not in (16, 32, 64):
        raise ValueError(f"chunk_size: 16, 32 or 64, got {chunk_size!r}")

    def core(p):
        return chunk_fla_core(p, chunk_size, np.dtype(cumsum_dtype), tf32, hook or _no_hook, carried_dtype)

    return _run(**args, core=core)


def recurrent_stored_state_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    cu_seqlens=None,
    state_v_first=False,
    use_gate_in_kernel=False,
    A_log=None,
    dt_bias=None,
    use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False,
    store=None,
):
    """Float32 token loop whose carried state is stored through ``store`` (float32 to float32, e.g.
    rounded to bfloat16) as loaded and after every token (``reference.recurrent_core``'s ``store``;
    None: kept in float32). The final state is returned in float32."""
    args = dict(locals())
    del args["store"]

    def core(p):
        return recurrent_core(p, store=store)

    return _run(**args, chunk_size=None, core=core)
