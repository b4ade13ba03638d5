"""The chunk-organised adjoint of the gated delta rule with rounding hooks and mistake switches.

The engine behind every NumPy backward model (``implementations.numpy_grad``), every planted
gradient bug (``implementations.planted_grad``) and every probe of the gradient tolerance model
(``core.grad_tolerance``): :func:`adjoint` on a packed problem in any working dtype, organised in
chunks like FLA's ``chunk_gated_delta_rule_bwd``, with a ``hook`` on the intermediates a chunked
backward stores (:data:`STAGES`) and named switches (:data:`ENGINE_BUGS`) for the mistakes the
planted bugs make. The algebra and what each stage is are in ``implementations/numpy_grad.py``'s
docstring and ``docs/gradients.md``. The float64 oracle (``core.gradients``) is written
separately, token by token, so that these models are checked against an independent adjoint.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gdn_verify.core.conventions import L2NORM_EPS, Packed

# hook(stage, x, index) -> what the algorithm goes on with. Axis 0 of x is always the sequence
# axis N; ``index`` is the chunk (h, dh, dq, dk_state, dk_pred) or the token position (v_new, dv_new
# and the operands).
Hook = Callable[[str, np.ndarray, int], np.ndarray]
# The intermediates a hook sees (qk is applied by the caller): the stored ones in the order the
# engine meets them, then the reverse pass's product operands, per token ``[N, HV, K]``:
# ``q_operand`` scale q_t as the state-cotangent update dS += (scale q_t) do_t^T reads it (FLA's
# q scaled by scale exp(G) in ``chunk_gated_delta_rule_bwd_dhu``), ``k_operand`` k_t as du_t = dS^T k_t
# reads it (FLA's decayed k of dv2 = k dh and the k q^T of ``chunk_bwd_dv_local``), ``w_operand``
# k_t as the erase update dS += k_t dp_t^T reads it (FLA's recomputed W = T (beta exp(G) k)).
# Then the same three operands with the chunk-local decays a chunked backward folds into them before
# storing them in the input dtype, per token ``[N, HV, K]``: ``q_decayed`` scale q_t exp(G_t) and
# ``w_decayed`` k_t exp(G_t) (G_t: the gates from the chunk's start through t), whose products with
# do_t and dp_t form the state cotangent at the chunk's start (FLA's ``dh`` recurrence), and
# ``k_decayed`` k_t exp(G_last - G_t), whose product with the chunk's ``dh`` is du_t's part from the
# later chunks (FLA's ``dv2 = k dh``). The engine carries the exact sums and adds only what the
# hook changed (its rounding) to those two places: float16 flushes a decayed operand below 2^-25
# to zero, which an undecayed operand's rounding never shows (FlashQLA's float16 ``dh0`` at T = 1
# under gates of -40, H100 2026-11-27: 0 against 3e-18).
STAGES = (
    "qk",
    "h",
    "v_new",
    "dh",
    "dv_new",
    "dq",
    "dk_state",
    "dk_pred",
    "q_operand",
    "k_operand",
    "w_operand",
    "q_decayed",
    "k_decayed",
    "w_decayed",
)
SIXTEEN_STAGES = STAGES
# "both": the direct dg in ``dg`` and the cumsum one in ``dg_cumsum`` (the tolerance probes take both).
DG_FORMS = ("direct", "cumsum", "both")
# Switches of the engine and of the assembly that plant one gradient bug each (planted_grad.py).
ENGINE_BUGS = (
    "dv_missing_beta",
    "dbeta_uses_v",
    "dg_wrt_decay",
    "chunk_boundary_decay_missing",
    "dh0_undecayed",
    "dg_chunk_end_missing",
)
WRAPPER_BUGS = (
    "dht_ignored",
    "dh0_dropped",
    "l2norm_backward_skipped",
    "gva_first_head_only",
    "dk_doubled",
    "varlen_tail_unwritten",
    "nondeterministic_dk",
    "dg_cumsum16",
    "dh0_unwritten_without_dht",
)
KNOWN_BUGS = ENGINE_BUGS + WRAPPER_BUGS
# Per-token magnitudes the engine can report (``magnitudes=``), each [N, L, HV]: Frobenius norms of
# S_t, D_t, dS_t (the cotangent of S_t), dD_t (of D_t), dS_t^later (dS_t without token t's own
# output term), and the norms of u_t, du_t, r_t, pred_t = D_t^T k_t, o_t; with dg_form "cumsum" or
# "both" also w_t and e_t (the module docstring); "S_max", "dS_max", "u_max", "du_max": the largest
# element of S_t, dS_t, u_t, du_t (what a 16-bit store must represent).
MAGNITUDES = (
    "S",
    "D",
    "dS",
    "dD",
    "later",
    "u",
    "du",
    "r",
    "pred",
    "o",
    "w",
    "e",
    "S_max",
    "dS_max",
    "u_max",
    "du_max",
)


@dataclass(frozen=True)
class PackedGradients:
    """The engine's result on a packed problem: per value head, before the GVA sum."""

    dq: np.ndarray  # [N, L, HV, K]
    dk_state: np.ndarray  # [N, L, HV, K]: dS_t u_t
    dk_pred: np.ndarray  # [N, L, HV, K]: D_t dp_t
    dv: np.ndarray  # [N, L, HV, V]
    dg: np.ndarray  # [N, L, HV]
    dbeta: np.ndarray  # [N, L, HV]
    dh0: np.ndarray  # [N, HV, K, V]
    dg_cumsum: np.ndarray | None = None  # [N, L, HV], with dg_form="both"


def _tokens(x: np.ndarray, t0: int, t1: int) -> np.ndarray:
    """Tokens ``t0 .. t1-1`` of a packed ``[N, L, HV, ...]`` array as a ``[n, N, HV, ...]`` view."""
    return np.moveaxis(x[:, t0:t1], 1, 0)


def _batched_hook(hook: Hook | None, stage: str, x: np.ndarray, index: int) -> np.ndarray:
    """``hook`` on a tokens-first ``[n, N, ...]`` array, seen sequence-first."""
    if hook is None:
        return x
    return np.moveaxis(hook(stage, np.moveaxis(x, 0, 1), index), 1, 0)


def _chunk_forward(
    p: Packed, decay: np.ndarray, c: int, C: int, A: np.ndarray, hook: Hook | None, keep: bool, n: int | None = None
):
    """Run chunk ``c`` from the carried state ``A``; returns ``(carried state after it, kept)``.

    The chunk reads ``h = hook("h", A)``; ``A - h`` is carried on beside it, decayed. ``kept``
    (with ``keep``): ``(h, D, S, r, u)``, the chunk's decayed states, states after each token,
    residuals and writes, tokens first. ``n``: run only the chunk's first ``n`` tokens (the rest
    are padding, which leaves the state unchanged).
    """
    n = C if n is None else n
    N, _, HV, V = p.v.shape
    K = p.k.shape[-1]
    h = A if hook is None else hook("h", A, c)
    delta = None if h is A else A - h
    kept = None
    if keep:
        D_all = np.empty((n, N, HV, K, V), A.dtype)
        S_all = np.empty_like(D_all)
        r_all = np.empty((n, N, HV, V), A.dtype)
        u_all = np.empty_like(r_all)
    S = h if keep else np.array(h, copy=True)
    for j in range(n):
        t = c * C + j
        a = decay[:, t, :, None, None]
        if keep:  # written straight into the kept buffers: D_t = a S_{t-1}, S_t = D_t + k u^T
            D = np.multiply(S, a, out=D_all[j])
        else:
            S *= a
            D = S
        if delta is not None:
            delta *= a
        k_t = p.k[:, t, :, None, :]  # [N, HV, 1, K]
        r = p.v[:, t] - (k_t @ D)[:, :, 0]
        u = p.beta[:, t, :, None] * r
        if hook is not None:
            u = hook("v_new", u, t)
        write = k_t.swapaxes(-1, -2) * u[:, :, None, :]
        if keep:
            S = np.add(D, write, out=S_all[j])
            r_all[j], u_all[j] = r, u
        else:
            S += write
    if keep:
        kept = (h, D_all, S_all, r_all, u_all)
    return (S if delta is None else S + delta), kept


def _reverse_cumsum(x: np.ndarray, dtype: np.dtype | None) -> np.ndarray:
    """Sum from each token to the chunk's end along axis 0 (tokens first), sequentially; in
    ``dtype`` (every term and every partial sum rounded to it) when given, else in x's dtype."""
    if dtype is None or np.dtype(dtype) == x.dtype:
        return np.cumsum(x[::-1], axis=0)[::-1]
    out = np.empty_like(x)
    acc = np.zeros(x.shape[1:], dtype)
    for j in range(x.shape[0] - 1, -1, -1):
        acc = (acc.astype(x.dtype) + x[j].astype(dtype).astype(x.dtype)).astype(dtype)
        out[j] = acc
    return out


def adjoint(
    p: Packed,
    do: np.ndarray,
    dht: np.ndarray,
    chunk_size: int = 64,
    hook: Hook | None = None,
    dg_form: str = "direct",
    cumsum_dtype=None,
    bug: str | None = None,
    magnitudes: dict[str, np.ndarray] | None = None,
    length: int | None = None,
    magnitude_rows: int | None = None,
) -> PackedGradients:
    """The engine: gradients of a packed problem whose arrays are all in one working dtype.

    ``p``: packed (``conventions.pack``, padded to a multiple of ``chunk_size``, l2norm applied);
    ``do`` ``[N, L, HV, V]`` (zero on padding); ``dht`` ``[N, HV, K, V]``, k-first. ``hook``: sees
    each stage of :data:`STAGES` but ``qk``; ``dg_form``: ``"direct"`` (the oracle's formula) or
    ``"cumsum"`` (FLA's, reverse chunk-local cumsum in ``cumsum_dtype``, None: the working dtype)
    or ``"both"`` (direct in ``dg``, FLA's in ``dg_cumsum``);
    ``bug``: one of :data:`ENGINE_BUGS` or None; ``magnitudes``: a dict to fill with the
    per-token norms of :data:`MAGNITUDES` (of the first ``magnitude_rows`` sequences, None: all).

    ``length``: every sequence is padding from token ``length`` on (``max(p.lengths)``; None: not
    known). The last chunk then runs only up to its first padding token and gives each later
    padding token that token's values: padding leaves the state and its cotangent unchanged, so the
    results are those of the full run, bitwise (on padding tokens too, unless a hook perturbs their
    zeros by an absolute amount: that gave each its own ``u`` and ``du``, so its own ``dk_state``
    and magnitudes there).
    """
    N, L, HV, V = p.v.shape
    K = p.k.shape[-1]
    C = int(chunk_size)
    if L % C:
        raise ValueError(f"chunk_size: the packed length {L} is not a multiple of {C}")
    dt = p.v.dtype
    decay = np.exp(p.g)
    n_chunks = L // C
    checkpoints = []
    A = p.initial_state.astype(dt)
    last = None  # the last chunk's states, kept from this pass instead of recomputed
    # tokens of the last chunk run: up to and including its first padding token (``length`` above)
    n_last = C if length is None else min(C, max(1, int(length) - (n_chunks - 1) * C + 1))
    for c in range(n_chunks):
        checkpoints.append(A)
        final = c == n_chunks - 1
        A, last = _chunk_forward(p, decay, c, C, A, hook, keep=final, n=n_last if final else C)

    out = PackedGradients(
        dq=np.zeros((N, L, HV, K), dt),
        dk_state=np.zeros((N, L, HV, K), dt),
        dk_pred=np.zeros((N, L, HV, K), dt),
        dv=np.zeros((N, L, HV, V), dt),
        dg=np.zeros((N, L, HV), dt),
        dbeta=np.zeros((N, L, HV), dt),
        dh0=np.zeros((N, HV, K, V), dt),
    )
    R = N if magnitude_rows is None else min(N, int(magnitude_rows))
    if magnitudes is not None:
        for name in MAGNITUDES:
            magnitudes[name] = np.zeros((R, L, HV))
    cumsum = dg_form in ("cumsum", "both")
    dg_cumsum = np.zeros((N, L, HV), dt) if dg_form == "both" else None
    dS_carried = np.array(dht, dt, copy=True)
    dS_buf = np.empty((C, N, HV, K, V), dt)
    du_buf = np.empty((C, N, HV, V), dt)
    w_buf = np.empty((C, N, HV, V), dt)  # dS~^T k: the decay-only cotangent (cumsum form)
    e_buf = np.empty((C, N, HV, V), dt)  # du - w: what the erase terms add
    for c in range(n_chunks - 1, -1, -1):
        n = n_last if c == n_chunks - 1 else C  # tokens run; the chunk's others repeat the last one's values
        t0, t1 = c * C, c * C + n
        kept = last if c == n_chunks - 1 else _chunk_forward(p, decay, c, C, checkpoints[c], hook, keep=True)[1]
        assert kept is not None
        h, D, S, r, u = kept
        dS_at, du_at, w_at, e_at = dS_buf[:n], du_buf[:n], w_buf[:n], e_buf[:n]
        dh = dS_carried if hook is None else hook("dh", dS_carried, c)
        ddelta = None if dh is dS_carried else dS_carried - dh
        dS = dh
        dS_decay = np.array(dh, copy=True) if cumsum else None
        if hook is not None:  # the decayed operands' rounding (STAGES): its effect, added below
            from_start = np.cumprod(decay[:, t0:t1], axis=1)  # exp(G_t), the chunk's start through t
            to_end = np.ones_like(from_start[:, 0])  # exp(G_last - G_t), updated as j goes down
            start_error = np.zeros_like(dh)
        for j in range(n - 1, -1, -1):
            t = t0 + j
            q_op = p.scale * p.q[:, t]
            k_t = p.k[:, t, :, None, :]
            k_du = k_w = k_t
            if hook is not None:
                q_op = hook("q_operand", q_op, t)
                k_du = hook("k_operand", p.k[:, t], t)[:, :, None, :]
                k_w = hook("w_operand", p.k[:, t], t)[:, :, None, :]
                decayed = from_start[:, j, :, None]
                e_q = _rounding(hook, "q_decayed", q_op * decayed, t)
                e_k = _rounding(hook, "k_decayed", k_du[:, :, 0] * to_end[..., None], t)
                e_w = _rounding(hook, "w_decayed", k_w[:, :, 0] * decayed, t)
                to_end = to_end * decay[:, t]
                if e_q is not None:
                    start_error += e_q[..., None] * do[:, t, :, None, :]
            out_term = q_op[..., None] * do[:, t, :, None, :]
            cur = np.add(dS, out_term, out=dS_at[j])  # the cotangent of S_t
            du = (k_du @ cur)[:, :, 0]  # dS^T k
            if hook is not None and e_k is not None:
                du = du + (e_k[:, :, None, :] @ dh)[:, :, 0]
            if dS_decay is not None:
                dS_decay += out_term
                w_at[j] = (k_t @ dS_decay)[:, :, 0]
                e_at[j] = du - w_at[j]
                dS_decay *= decay[:, t, :, None, None]
            if hook is not None:
                du = hook("dv_new", du, t)
            du_at[j] = du
            # dp = -beta du is the cotangent of D^T k; D feeds S_t directly and through D^T k.
            dp = -p.beta[:, t, :, None] * du
            dS = k_w.swapaxes(-1, -2) * dp[:, :, None, :]
            dS += cur
            if hook is not None and e_w is not None:
                start_error += e_w[..., None] * dp[:, :, None, :]
            skip = (bug == "chunk_boundary_decay_missing" and j == 0 and c > 0) or (bug == "dh0_undecayed" and t == 0)
            if not skip:
                a = decay[:, t, :, None, None]
                dS *= a
                if ddelta is not None:
                    ddelta *= a
        dS_carried = dS if ddelta is None else dS + ddelta
        if hook is not None:
            dS_carried = dS_carried + start_error

        # The batched part, over the chunk's tokens (tokens first).
        q, k, v, beta, do_c = (_tokens(x, t0, t1) for x in (p.q, p.k, p.v, p.beta, do))
        dp = -beta[..., None] * du_at
        dq = p.scale * (S @ do_c[..., None])[..., 0]
        dk_state = (dS_at @ u[..., None])[..., 0]
        dk_pred = (D @ dp[..., None])[..., 0]
        # the hooks see the whole chunk, as in a full run (their draws are shaped like it)
        _tokens(out.dq, c * C, (c + 1) * C)[...] = _batched_hook(hook, "dq", _repeat_last(dq, C), c)
        _tokens(out.dk_state, c * C, (c + 1) * C)[...] = _batched_hook(hook, "dk_state", _repeat_last(dk_state, C), c)
        _tokens(out.dk_pred, c * C, (c + 1) * C)[...] = _batched_hook(hook, "dk_pred", _repeat_last(dk_pred, C), c)
        dv = beta[..., None] * du_at
        _tokens(out.dv, t0, t1)[...] = du_at if bug == "dv_missing_beta" else dv
        _tokens(out.dbeta, t0, t1)[...] = np.einsum("jnhv,jnhv->jnh", du_at, v if bug == "dbeta_uses_v" else r)
        pred = (k[..., None, :] @ D)[..., 0, :]  # D^T k, as the forward formed it
        if cumsum:
            o = p.scale * (q[..., None, :] @ S)[..., 0, :]
            w, e = w_at, e_at
            dG = np.einsum("jnhv,jnhv->jnh", do_c, o) - np.einsum("jnhv,jnhv->jnh", u, w)
            dG -= beta * (np.einsum("jnhv,jnhv->jnh", pred, w) + np.einsum("jnhv,jnhv->jnh", v, e))
            if bug != "dg_chunk_end_missing":
                dG[-1] += np.einsum("nhkv,nhkv->nh", dh, S[-1])
            summed = _reverse_cumsum(dG, cumsum_dtype)
            if dg_cumsum is not None:
                _tokens(dg_cumsum, t0, t1)[...] = summed
        if dg_form == "cumsum":
            dg = summed
        elif bug == "dg_wrt_decay":  # d/d(exp g): dD paired with the undecayed state S_{t-1}
            prev = np.concatenate([np.asarray(h, dt)[None], S[:-1]])
            dg = np.einsum("jnhkv,jnhkv->jnh", dS_at, prev) + np.einsum(
                "jnhv,jnhv->jnh", (k[..., None, :] @ prev)[..., 0, :], dp
            )
        else:
            # dg = <dD, D> (D = exp(g) S_prev, so dD/dg = D), dD = dS_t + k dp^T, <k dp^T, D> = pred . dp
            dg = np.einsum("jnhkv,jnhkv->jnh", dS_at, D) + np.einsum("jnhv,jnhv->jnh", pred, dp)
        _tokens(out.dg, t0, t1)[...] = dg
        if magnitudes is not None:
            rows = (q, k, do_c, S, D, dS_at, du_at, dp, u, r, pred)
            _fill_magnitudes(magnitudes, t0, t1, p.scale, *(x[:, :R] for x in rows))
            if cumsum:
                _tokens(magnitudes["w"], t0, t1)[...] = _norm(w_at[:, :R], 1)
                _tokens(magnitudes["e"], t0, t1)[...] = _norm(e_at[:, :R], 1)
        if n < C:  # the chunk's later tokens are padding like its last one run
            arrays = [out.dv, out.dg, out.dbeta] + ([] if dg_cumsum is None else [dg_cumsum])
            for x in arrays + ([] if magnitudes is None else list(magnitudes.values())):
                x[:, t1 : (c + 1) * C] = x[:, t1 - 1 : t1]
    out.dh0[...] = dS_carried
    return out if dg_cumsum is None else dataclasses.replace(out, dg_cumsum=dg_cumsum)


def _rounding(hook: Hook, stage: str, x: np.ndarray, index: int) -> np.ndarray | None:
    """What ``hook`` changed of ``x`` at ``stage`` (None: nothing)."""
    y = hook(stage, x, index)
    return None if y is x else y - x


def _repeat_last(x: np.ndarray, C: int) -> np.ndarray:
    """A tokens-first chunk ``[n, ...]`` as ``[C, ...]``, its last token repeated (the padding)."""
    if x.shape[0] == C:
        return x
    return np.concatenate([x, np.broadcast_to(x[-1:], (C - x.shape[0],) + x.shape[1:])])


def _norm(x: np.ndarray, axes) -> np.ndarray:
    return np.sqrt(np.einsum("...ij,...ij->..." if axes == 2 else "...i,...i->...", x, x))


def _fill_magnitudes(m, t0, t1, scale, q, k, do, S, D, dS, du, dp, u, r, pred) -> None:
    def put(name, x):
        _tokens(m[name], t0, t1)[...] = x

    nS, nD, ndS = _norm(S, 2), _norm(D, 2), _norm(dS, 2)
    put("S", nS)
    put("D", nD)
    put("dS", ndS)
    # |dD|^2 = |dS + k dp^T|^2 = |dS|^2 + 2 du . dp + |k|^2 |dp|^2 (k^T dS = du^T)
    k2 = np.einsum("...i,...i->...", k, k)
    dD2 = ndS**2 + 2 * np.einsum("...v,...v->...", du, dp) + k2 * np.einsum("...v,...v->...", dp, dp)
    put("dD", np.sqrt(np.maximum(dD2, 0.0)))
    # dS^later = dS - scale q do^T: |.|^2 = |dS|^2 - 2 scale (q^T dS) . do + scale^2 |q|^2 |do|^2
    qdS = (q[..., None, :] @ dS)[..., 0, :]
    q2, do2 = np.einsum("...i,...i->...", q, q), np.einsum("...v,...v->...", do, do)
    later2 = ndS**2 - 2 * scale * np.einsum("...v,...v->...", qdS, do) + scale**2 * q2 * do2
    put("later", np.sqrt(np.maximum(later2, 0.0)))
    put("u", _norm(u, 1))
    put("du", _norm(du, 1))
    put("r", _norm(r, 1))
    put("pred", _norm(pred, 1))
    put("o", np.abs(scale) * _norm((q[..., None, :] @ S)[..., 0, :], 1))
    put("S_max", np.abs(S).max(axis=(-2, -1), initial=0.0))
    put("dS_max", np.abs(dS).max(axis=(-2, -1), initial=0.0))
    put("u_max", np.abs(u).max(axis=-1, initial=0.0))
    put("du_max", np.abs(du).max(axis=-1, initial=0.0))


def l2norm_backward(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """Cotangent of ``x`` through ``y = x / sqrt(|x|^2 + eps)`` over the last axis, in x's dtype:
    ``dx = (dy - y (y . dy)) / n`` (``docs/gradients.md``)."""
    n = np.sqrt(np.einsum("...i,...i->...", x, x) + x.dtype.type(L2NORM_EPS))[..., None]
    y = x / n
    return (dy - y * np.einsum("...i,...i->...", y, dy)[..., None]) / n


def gather(p: Packed, x: np.ndarray, dtype) -> np.ndarray:
    """``[B, T, ...]`` -> ``p``'s packed ``[N, L, ...]`` layout in ``dtype`` (zeros on padding)."""
    B, T = p.out_shape[:2]
    flat = np.asarray(x).reshape((B * T,) + np.shape(x)[2:])
    valid = p.token_index >= 0
    out = np.zeros(p.token_index.shape + np.shape(x)[2:], dtype)
    out[valid] = flat[p.token_index[valid]]
    return out


def scatter(p: Packed, x: np.ndarray) -> np.ndarray:
    """Packed ``[N, L, ...]`` -> ``[B, T, ...]`` (x's dtype); padding positions are dropped (0)."""
    B, T = p.out_shape[:2]
    out = np.zeros((B * T,) + x.shape[2:], x.dtype)
    valid = p.token_index >= 0
    out[p.token_index[valid]] = x[valid]
    return out.reshape((B, T) + x.shape[2:])


def _group_sum(x: np.ndarray, H: int, bug: str | None) -> np.ndarray:
    """``[B, T, HV, K]`` -> ``[B, T, H, K]``: value heads ``h = j G + i`` summed per q/k head ``j``."""
    B, T, HV, K = x.shape
    grouped = x.reshape(B, T, H, HV // H, K)
    return grouped[:, :, :, 0] if bug == "gva_first_head_only" else grouped.sum(axis=3)


def _shuffled_sum(terms: np.ndarray) -> np.ndarray:
    """Sum over axis 0 sequentially in a random order per row (atomics): float32 rounding makes
    the result depend on the order, so two calls differ in the last bits."""
    keys = np.random.default_rng().random(terms.shape[:-1] + (1,))
    order = np.argsort(keys, axis=0)
    ordered = np.take_along_axis(terms, np.broadcast_to(order, terms.shape), axis=0)
    acc = ordered[0].copy()
    for x in ordered[1:]:
        acc = acc + x
    return acc


def assemble(
    p: Packed, grads: PackedGradients, q: np.ndarray, k: np.ndarray, H: int, l2norm: bool, bug: str | None = None
) -> dict[str, np.ndarray]:
    """The engine's packed, per-value-head result as the convention's ``[B, T, ...]`` gradients in
    the working dtype: GVA sums (``dk = dk_state + dk_pred``), the l2norm backward through the raw
    ``q``, ``k`` (``[B, T, H, K]``, working dtype), ``dh0`` in the state's layout (and
    ``dg_cumsum`` when the engine ran with ``dg_form="both"``)."""
    dq_h, dks, dkp = (scatter(p, x) for x in (grads.dq, grads.dk_state, grads.dk_pred))
    dq = _group_sum(dq_h, H, bug)
    if bug == "nondeterministic_dk":
        B, T, HV, K = dks.shape
        parts = np.concatenate([dks.reshape(B, T, H, HV // H, K), dkp.reshape(B, T, H, HV // H, K)], axis=3)
        dk = _shuffled_sum(np.moveaxis(parts, 3, 0))
    else:
        dk = _group_sum(dks + (2 * dkp if bug == "dk_doubled" else dkp), H, bug)
    if l2norm and bug != "l2norm_backward_skipped":
        dq, dk = l2norm_backward(q, dq), l2norm_backward(k, dk)
    dh0 = grads.dh0.swapaxes(-1, -2) if p.state_v_first else grads.dh0
    out = dict(
        dq=dq,
        dk=dk,
        dv=scatter(p, grads.dv),
        dg=scatter(p, grads.dg),
        dbeta=scatter(p, grads.dbeta),
        dh0=np.ascontiguousarray(dh0),
    )
    if grads.dg_cumsum is not None:
        out["dg_cumsum"] = scatter(p, grads.dg_cumsum)
    return out


def cotangent(name: str, x, shape: tuple[int, ...], dtype) -> np.ndarray:
    try:
        arr = np.asarray(x)
    except Exception as exc:  # noqa: BLE001 - anything unconvertible is the caller's input error
        raise ValueError(f"{name}: cannot be converted to a NumPy array ({exc})") from None
    if arr.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {arr.shape}")
    arr = arr.astype(dtype)
    if not np.isfinite(arr).all():
        raise ValueError(f"{name}: contains NaN or Inf")
    return arr


def rounder(dtype) -> Hook:
    """A hook that rounds every stage it sees to ``dtype`` (and back to the working dtype)."""
    narrow = np.dtype(dtype)

    def hook(stage: str, x: np.ndarray, index: int) -> np.ndarray:
        return x.astype(narrow).astype(x.dtype)

    return hook
