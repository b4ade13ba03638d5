"""The float64 gradient oracle: the adjoint of the gated delta rule, written out.

:func:`recurrent_gated_delta_rule_backward` returns the cotangents of every input of
``reference.recurrent_gated_delta_rule`` (and of FLA 0.6's in-kernel gate and beta options) for
the loss ``sum(do * o) + sum(dht * final_state)``: what an autograd engine would hand to a
kernel's backward as ``(do, dht)`` and expect back. The derivation is in ``docs/gradients.md``.

Per sequence and value head, forward (``a_t = exp(g_t)``, ``D_t`` the decayed state)::

    D_t = a_t S_{t-1};  r_t = v_t - D_t^T k_t;  u_t = beta_t r_t;  S_t = D_t + k_t u_t^T;  o_t = scale S_t^T q_t

and in reverse, with ``dS`` the cotangent of ``S_t`` coming from later tokens (``dht`` at the end)::

    dS  += scale q_t do_t^T             dq_t    = scale S_t do_t
    du   = dS^T k_t                     dv_t    = beta_t du
    dp   = -beta_t du                   dbeta_t = du . r_t
    dS  <- a_t (dS + k_t dp^T)          dk_t    = dS u_t + D_t dp
                                        dg_t    = sum(dS * D_t) + (D_t^T k_t) . dp

where ``dS`` on the right is the cotangent of ``S_t`` (before the last line on the left, which
makes it that of ``S_{t-1}``). Only the left column is sequential; the right one is batched over
a segment of tokens.
States are not all stored: the forward pass keeps one state per segment of ``checkpoint_every``
tokens and the reverse pass recomputes each segment's states from its checkpoint, so memory is
``O((T / C + C) * N * HV * K * V)`` instead of ``O(T * N * HV * K * V)``.

The sequential loops and the batched products run on any NumPy-like array module
(``array_module``: NumPy, or CuPy for a GPU's float64 units); packing, the head groups and the
l2norm and gate options stay in NumPy.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from gdn_verify.core.adjoint import cotangent, gather, l2norm_backward, scatter
from gdn_verify.core.conventions import Packed, pack
from gdn_verify.core.gating import SOFTPLUS_THRESHOLD, in_kernel_gates, sigmoid
from gdn_verify.core.problem import Problem

# Upper bound on one segment buffer (states of the segment being recomputed), in float64 elements:
# 32 Mi elements = 256 MiB; the automatic segment length is cut to respect it.
_SEGMENT_ELEMENTS = 1 << 25


def _head_parameter(name: str, x, num_value_heads: int) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.shape != (num_value_heads,):
        raise ValueError(f"{name}: expected shape [HV] = ({num_value_heads},), got {arr.shape}")
    return arr


def _segment_length(L: int, state_elements: int, checkpoint_every: int | None) -> int:
    if checkpoint_every is not None:
        if not isinstance(checkpoint_every, (int, np.integer)) or checkpoint_every < 1:
            raise ValueError(f"checkpoint_every: must be a positive integer, got {checkpoint_every!r}")
        return int(checkpoint_every)
    # sqrt(L) balances the checkpoints (L / C states) against one segment (C states); at least 16
    # so short problems run in one segment and per-segment overhead stays small.
    C = max(16, math.isqrt(max(L - 1, 0)) + 1)
    return max(1, min(C, _SEGMENT_ELEMENTS // max(state_elements, 1)))


def _advance(
    p: Packed,
    decay: np.ndarray,
    S: np.ndarray,
    t0: int,
    t1: int,
    states: np.ndarray | None,
    resid: np.ndarray | None,
) -> np.ndarray:
    """Run tokens ``t0 .. t1-1`` from state ``S``; returns the state after them.

    With buffers: ``states[j]`` gets the state entering token ``t0 + j`` (``states[t1 - t0]`` the
    one leaving the segment) and ``resid[j]`` the residual ``v - D^T k`` of that token. The
    algebra and its order are the oracle's (``reference.recurrent_core``).
    """
    S = S.copy()
    for j, t in enumerate(range(t0, t1)):
        if states is not None:
            states[j] = S
        S *= decay[:, t, :, None, None]
        k_t = p.k[:, t, :, None, :]  # [N, HV, 1, K]
        r = p.v[:, t] - (k_t @ S)[:, :, 0]
        if resid is not None:
            resid[j] = r
        S += k_t.swapaxes(-1, -2) * (p.beta[:, t, :, None] * r)[:, :, None, :]
    if states is not None:
        states[t1 - t0] = S
    return S


def _tokens_first(x: np.ndarray, t0: int, t1: int) -> np.ndarray:
    """Tokens ``t0 .. t1-1`` of a packed ``[N, L, HV, ...]`` array as a ``[n, N, HV, ...]`` view."""
    return x[:, t0:t1].swapaxes(0, 1)


def _packed_backward(
    p: Packed, do: np.ndarray, dS: np.ndarray, segment: int, xp: Any = np
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Adjoint on a packed problem: ``(dq, dk [N, L, HV, K], dv [N, L, HV, V], dg, dbeta [N, L, HV],
    dS0 [N, HV, K, V])`` for packed ``do`` ``[N, L, HV, V]`` and final-state cotangent ``dS``,
    computed with the array module ``xp`` and returned as NumPy arrays."""
    if xp is not np:  # the arrays the adjoint reads, in the array module
        moved = {name: xp.asarray(getattr(p, name)) for name in ("q", "k", "v", "g", "beta", "initial_state")}
        p, do, dS = dataclasses.replace(p, **moved), xp.asarray(do), xp.asarray(dS)
    N, L, HV, V = p.v.shape
    K = p.k.shape[-1]
    decay = xp.exp(p.g)
    starts = list(range(0, L, segment))

    # Forward: keep only the state entering each segment.
    checkpoints = []
    S = p.initial_state
    for t0 in starts:
        checkpoints.append(S)
        S = _advance(p, decay, S, t0, min(t0 + segment, L), None, None)

    dq, dk = xp.zeros((N, L, HV, K)), xp.zeros((N, L, HV, K))
    dv, dg, dbeta = xp.zeros((N, L, HV, V)), xp.zeros((N, L, HV)), xp.zeros((N, L, HV))
    dS = dS.copy()
    states = xp.empty((segment + 1, N, HV, K, V))
    resid = xp.empty((segment, N, HV, V))
    dS_at = xp.empty((segment, N, HV, K, V))  # cotangent of S_t (after token t, output included)
    du_at = xp.empty((segment, N, HV, V))
    for t0, S0 in zip(reversed(starts), reversed(checkpoints)):
        t1 = min(t0 + segment, L)
        n = t1 - t0
        _advance(p, decay, S0, t0, t1, states, resid)
        q, k, beta, a, do_s = (_tokens_first(x, t0, t1) for x in (p.q, p.k, p.beta, decay, do))
        # The sequential part: only what the cotangent of the state needs.
        for j in range(n - 1, -1, -1):
            dS += p.scale * q[j, :, :, :, None] * do_s[j, :, :, None, :]
            dS_at[j] = dS
            du = (k[j, :, :, None, :] @ dS)[:, :, 0]  # dS^T k, [N, HV, V]
            du_at[j] = du
            # dp = -beta du is the cotangent of D^T k; D feeds S_t directly and through D^T k.
            dS += k[j, :, :, :, None] * (-beta[j, :, :, None] * du)[:, :, None, :]
            dS *= a[j, :, :, None, None]

        # The batched part, over the segment's tokens.
        dS_s, du_s, r = dS_at[:n], du_at[:n], resid[:n]
        D = a[..., None, None] * states[:n]  # decayed state each token's update starts from
        u = beta[..., None] * r
        dp = -beta[..., None] * du_s
        pred = (k[..., None, :] @ D)[..., 0, :]  # D^T k, as the forward formed it
        _tokens_first(dq, t0, t1)[...] = p.scale * (states[1 : n + 1] @ do_s[..., None])[..., 0]
        _tokens_first(dk, t0, t1)[...] = (dS_s @ u[..., None])[..., 0] + (D @ dp[..., None])[..., 0]
        _tokens_first(dv, t0, t1)[...] = beta[..., None] * du_s
        _tokens_first(dbeta, t0, t1)[...] = xp.einsum("jnhv,jnhv->jnh", du_s, r)
        # dg = <dD, D> (D = exp(g) S_prev, so dD/dg = D), dD = dS_t + k dp^T, <k dp^T, D> = (D^T k).dp
        _tokens_first(dg, t0, t1)[...] = xp.einsum("jnhkv,jnhkv->jnh", dS_s, D) + xp.einsum("jnhv,jnhv->jnh", pred, dp)
    if xp is np:
        return dq, dk, dv, dg, dbeta, dS
    return tuple(x.get() for x in (dq, dk, dv, dg, dbeta, dS))  # type: ignore[return-value,union-attr]


def recurrent_gated_delta_rule_backward(
    q,
    k,
    v,
    g,
    beta,
    scale: float | None = None,
    initial_state=None,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens=None,
    *,
    do,
    dht=None,
    state_v_first: bool = False,
    use_gate_in_kernel: bool = False,
    A_log=None,
    dt_bias=None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    checkpoint_every: int | None = None,
    array_module: Any = None,
) -> dict[str, np.ndarray | None]:
    """Float64 gradients of ``sum(do * o) + sum(dht * final_state)`` for the native convention.

    Inputs are those of ``reference.recurrent_gated_delta_rule`` (any real dtype, computed in
    float64): ``q, k`` ``[B, T, H, K]``, ``v`` ``[B, T, HV, V]``, ``g, beta`` ``[B, T, HV]``,
    ``initial_state`` ``[N, HV, K, V]`` (``[N, HV, V, K]`` with ``state_v_first``) or None,
    ``cu_seqlens`` ``[N + 1]`` with ``B == 1`` or None; plus FLA 0.6's in-kernel options as
    ``gating.in_kernel_gates`` spells them: ``use_gate_in_kernel`` (``g`` is the raw gate ``a``,
    decay ``-exp(A_log) * softplus(a + dt_bias)``, ``A_log`` and ``dt_bias`` ``[HV]``),
    ``use_beta_sigmoid_in_kernel`` (``beta`` holds logits) and ``allow_neg_eigval``.

    ``do``: ``[B, T, HV, V]``, the cotangent of the output; ``dht``: the cotangent of the final
    state in ``initial_state``'s layout, or None for 0. ``checkpoint_every``: tokens per
    recomputed segment (None: about ``sqrt(T)``, at least 16, capped by memory); it changes the
    cost, not the result. ``array_module``: where the adjoint's loops and products run (None:
    NumPy; ``cupy``: the GPU, in float64, results copied back); it changes the cost, and the
    result only by the order of float64 sums.

    Returns float64 arrays, the cotangents of the arguments as passed (so ``dg`` and ``dbeta``
    are with respect to the raw gate and the beta logits when the in-kernel options are on):
    ``dq, dk`` ``[B, T, H, K]`` (summed over the value heads sharing a query/key head), ``dv``
    ``[B, T, HV, V]``, ``dg, dbeta`` ``[B, T, HV]``, ``dh0`` like ``initial_state`` (None
    without one), and with ``use_gate_in_kernel`` ``dA_log`` ``[HV]`` and ``ddt_bias`` ``[HV]``
    (None when ``dt_bias`` is None). Bad arguments raise ``ValueError`` naming the argument.
    """
    if use_gate_in_kernel and np.ndim(g) == 3:
        # Checked before use so that a wrong size is named, not a NumPy broadcasting error.
        for name, x in (("A_log", A_log), ("dt_bias", dt_bias)):
            if x is not None:
                _head_parameter(name, x, np.shape(g)[2])
    g_native, beta_native = in_kernel_gates(
        g, beta, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel, allow_neg_eigval
    )
    p = pack(
        q,
        k,
        v,
        g_native,
        beta_native,
        scale,
        initial_state,
        use_qk_l2norm_in_kernel,
        state_v_first,
        cu_seqlens,
    )
    B, T, HV, V = p.out_shape
    H, K = np.shape(q)[2], np.shape(q)[3]
    N = p.initial_state.shape[0]
    do_arr = cotangent("do", do, (B, T, HV, V), np.float64)
    if dht is None:
        dS = np.zeros((N, HV, K, V))
    else:
        dS = cotangent("dht", dht, (N, HV, V, K) if state_v_first else (N, HV, K, V), np.float64)
        if state_v_first:
            dS = dS.swapaxes(-1, -2)

    L = p.v.shape[1]
    segment = _segment_length(L, N * HV * K * V, checkpoint_every)
    xp = np if array_module is None else array_module
    dq_p, dk_p, dv_p, dg_p, dbeta_p, dS0 = _packed_backward(p, gather(p, do_arr, np.float64), dS, segment, xp)

    # Value heads h = j * G + i read query/key head j (G = HV // H): sum each group of G.
    def to_qk_heads(x: np.ndarray) -> np.ndarray:
        return scatter(p, x).reshape(B, T, H, HV // H, K).sum(axis=3)

    dq_out, dk_out = to_qk_heads(dq_p), to_qk_heads(dk_p)
    if use_qk_l2norm_in_kernel:
        dq_out = l2norm_backward(np.asarray(q, np.float64), dq_out)
        dk_out = l2norm_backward(np.asarray(k, np.float64), dk_out)
    dg_out, dbeta_out = scatter(p, dg_p), scatter(p, dbeta_p)

    result: dict[str, np.ndarray | None] = {}
    if use_gate_in_kernel:
        # g = -exp(A_log) softplus(x), x = a + dt_bias: dg/dA_log = g, dg/da = dg/ddt_bias =
        # -exp(A_log) softplus'(x), where softplus' is sigmoid, or 1 above the threshold where
        # softplus returns x itself (the function differentiated is the one the oracle computes).
        A = _head_parameter("A_log", A_log, HV)
        bias = np.zeros(HV) if dt_bias is None else _head_parameter("dt_bias", dt_bias, HV)
        x = np.asarray(g, np.float64) + bias
        slope = np.where(x > SOFTPLUS_THRESHOLD, 1.0, sigmoid(x))
        result["dA_log"] = np.einsum("bth,bth->h", dg_out, g_native)
        dg_out = dg_out * (-np.exp(A) * slope)
        result["ddt_bias"] = None if dt_bias is None else dg_out.sum(axis=(0, 1))
    if use_beta_sigmoid_in_kernel:
        # beta = c sigmoid(b): dbeta/db = c sigmoid(b) sigmoid(-b), without cancellation for |b| large.
        b = np.asarray(beta, np.float64)
        dbeta_out = dbeta_out * (2.0 if allow_neg_eigval else 1.0) * sigmoid(b) * sigmoid(-b)

    dh0 = None
    if initial_state is not None:
        dh0 = np.ascontiguousarray(dS0.swapaxes(-1, -2)) if state_v_first else dS0
    return dict(
        dq=dq_out,
        dk=dk_out,
        dv=scatter(p, dv_p),
        dg=dg_out,
        dbeta=dbeta_out,
        dh0=dh0,
        **result,
    )


def cotangents(problem: Problem, seed: int, with_dht: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """The cotangents a gradient property feeds a backward, drawn from ``seed`` (so that a saved
    case needs only the seed): ``do`` ``[B, T, HV, V]`` in the problem's input dtype (what
    autograd hands a kernel's backward), ``dht`` float32 in the final state's layout, or None.

    Standard normal over ``sqrt(V)`` (``do``) and ``sqrt(K V)`` (``dht``): each token's and each
    state's cotangent has about unit norm, so neither term of the loss dwarfs the other.
    Tokens past ``cu_seqlens[-1]`` (padding) get zero ``do``, as a loss that ignores them would.
    """
    s = problem.shape
    rng = np.random.default_rng(seed)
    do = rng.standard_normal((s["B"], s["T"], s["HV"], s["V"])) / math.sqrt(s["V"])
    if problem.cu_seqlens is not None:
        do[:, int(problem.bounds[-1]) :] = 0.0
    dht = None
    if with_dht:
        dht = (rng.standard_normal(problem.state_shape()) / math.sqrt(s["K"] * s["V"])).astype(np.float32)
    return do.astype(problem.dtype), dht


def problem_gradients(
    problem: Problem, do: np.ndarray, dht: np.ndarray | None, options: dict | None = None
) -> dict[str, np.ndarray | None]:
    """The float64 gradients of ``problem`` (its inputs as given, rounded or not) for ``do`` and
    ``dht``: :func:`recurrent_gated_delta_rule_backward` on the problem's arguments. ``options``:
    FLA 0.6's in-kernel gate and beta keywords, as the forward takes them."""
    kw = {**problem.backward_kwargs(), "state_v_first": problem.state_v_first}
    return recurrent_gated_delta_rule_backward(**kw, **(options or {}), do=do, dht=dht)
