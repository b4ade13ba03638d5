"""The float64 oracle: gated delta rule in recurrent and chunked (WY/UT) form.

Both take FLA's ``chunk_gated_delta_rule`` arguments (see ``conventions``), accept any real
input dtype (bfloat16 through ``ml_dtypes`` included), compute in float64 and return
``(o [B, T, HV, V] float64, final_state or None)``.

Per sequence and value head, with state ``S`` of shape ``[K, V]``::

    S   = exp(g_t) * S
    u   = beta_t * (v_t - S^T k_t)
    S   = S + k_t u^T
    o_t = scale * S^T q_t

The implementation is vectorized over sequences and heads: the recurrent form loops over
token positions only, the chunked form over chunks only (plus a row loop of the triangular
solve), everything else is matrix products.  ``compute_dtype`` is float64 for the oracle;
``gdn_verify.implementations.numpy_impl`` runs the same algebra in float32 as the shipped CPU implementation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from gdn_verify.core.conventions import Packed, export_state, pack, unpack_output
from gdn_verify.core.gating import gates_from_raw

# The intermediates of the chunked form that a production kernel stores or feeds to a tensor-core
# product, by name: ``chunk_core`` (float64) and ``numpy_impl.chunk_fla_core`` (float32) pass each
# through their ``hook(name, x)``, which is how the tolerance model perturbs them and how the
# precision-contract models round them (``gdn_verify.core.tolerance``, ``docs/precision.md``).
#   kkt_operand  beta_i k_i, the left operand of the k k^T product
#   inverse      T = (I + A)^-1
#   wu_operands  beta exp(G) k and beta v, the right operands of W = T (.) and U = T (.)
#   wu           W and U
#   h            the state entering a chunk, as an operand of W h and q h
#   v_new        U - W h, as the operand of the intra-chunk output product
#   attn         (q k^T) * exp(G_i - G_j), the operand of the intra-chunk output product
#   v_new_decayed  v_new * exp(G_last - G_j), the operand of the state update k^T (.)
STAGES = ("kkt_operand", "inverse", "wu_operands", "wu", "h", "v_new", "attn", "v_new_decayed")
# Not an intermediate but the carried state itself, as loaded (the initial state) and as stored after
# each chunk's update (after every token at chunk size 1): a kernel that declares a narrower state
# dtype rounds it there (``tolerance.state_rounding_condition``). Not in STAGES: a float32-state
# kernel may not round it.
CARRIED = "state"


def _no_hook(name: str, x: np.ndarray) -> np.ndarray:
    return x


def run_packed(
    core: Callable[[Packed], tuple[np.ndarray, np.ndarray]], *, output_final_state: bool = False, **args
) -> tuple[np.ndarray, np.ndarray | None]:
    """FLA's arguments ``args`` packed (``conventions.pack``'s keywords, its ``dtype`` and
    ``pad_to_multiple`` included), ``core(p) -> (o, S)`` run on them and unpacked: ``(o [B, T, HV, V],
    final_state | None)`` in ``core``'s dtype and the caller's state layout. The plumbing of the
    forwards here and of ``numpy_impl``'s models; ``core`` is the algorithm."""
    p = pack(**args)
    o, S = core(p)
    final_state = export_state(p, S) if output_final_state else None
    return unpack_output(p, o), final_state


# Elements per state block from which the per-block BLAS update beats NumPy's (break-even at about 32 x 32).
BLAS_UPDATE_MIN = 1024
# State elements per tile of the token loop (1 MiB of float64): a tile's state stays in a core's L2
# cache for all its tokens, where a larger state (up to oracle.STACK_BUDGET elements) streams from
# memory four times a token. Measured on a 2-core EPYC (2 MiB L2): 3-4x faster for 1.5M-3M elements
# (stacked reruns of 12-16 heads of 128 x 128), slower below 4 tiles, where Python's per-tile
# overhead outweighs what the cache saves.
TILE_ELEMENTS = 1 << 17


def _tiles(N: int, HV: int, block: int) -> list[tuple[slice, slice]]:
    """``(sequences, heads)`` tiles of about ``TILE_ELEMENTS`` state elements (``block`` per head):
    one tile for a state of up to 4 tiles; else whole sequences when one holds fewer than a tile, else
    runs of heads of one sequence."""
    if N * HV * block <= 4 * TILE_ELEMENTS:
        return [(slice(0, N), slice(0, HV))]
    heads = max(1, min(HV, TILE_ELEMENTS // max(block, 1)))
    if heads < HV:
        return [(slice(n, n + 1), slice(h, min(h + heads, HV))) for n in range(N) for h in range(0, HV, heads)]
    rows = max(1, TILE_ELEMENTS // max(block * HV, 1))
    return [(slice(n, min(n + rows, N)), slice(0, HV)) for n in range(0, N, rows)]


def _blas_rank_one(S: np.ndarray, k: np.ndarray) -> Callable[[int, np.ndarray, slice, slice], None] | None:
    """``update(t, u, ns, hs)``: ``S[n, h] += k[n, t, h]^T u[n, h]`` in place for the tile ``ns, hs``
    (slices of the sequences and heads; ``u [len(ns), len(hs), V]``), one BLAS ``dgemm`` per block;
    None where NumPy's broadcast product is as fast (small blocks, not float64).

    ``S [N, HV, K, V]`` C-contiguous; ``k [N, L, HV, K]``. A product with an inner dimension of 1 and
    ``beta = 1`` rounds ``k_i u_j`` and then the sum, exactly NumPy's two steps (bitwise;
    ``tests/test_oracle_speed.py``), in one pass over ``S`` instead of three.
    """
    N, HV, K, V = S.shape
    if S.dtype != np.float64 or K * V < BLAS_UPDATE_MIN or not S.flags.c_contiguous:
        return None
    from scipy.linalg.blas import dgemm

    blocks = np.empty((N, HV), object)  # [V, K] Fortran views of S's blocks
    for index, b in zip(np.ndindex(N, HV), S.reshape(N * HV, K, V)):
        blocks[index] = b.T
    rows = np.ascontiguousarray(k.swapaxes(0, 1))[..., None, :]  # [L, N, HV, 1, K]

    def update(t: int, u: np.ndarray, ns: slice, hs: slice) -> None:
        for c, a, b in zip(blocks[ns, hs].ravel(), u.reshape(-1, V, 1), rows[t, ns, hs].reshape(-1, 1, K)):
            dgemm(1.0, a, b, 1.0, c, overwrite_c=True)

    return update


def recurrent_core(
    p: Packed,
    norms: np.ndarray | None = None,
    store: Callable[[np.ndarray], np.ndarray] | None = None,
    scale: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Token-by-token recurrence on a packed problem: ``(o [N, L, HV, V], S [N, HV, K, V])``.

    ``norms``: an ``[N', L, HV]`` array to fill with the state's Frobenius norm after each token, for
    the first ``N' <= N`` sequences. ``store``: applied to the carried state as loaded and after
    every token's update, returning a new array (a model of a state kept in a narrower dtype); each
    token's output reads the stored state. ``scale``: ``[N]`` per-sequence output scale in place of
    ``p.scale`` (problems of different scales stacked along N).

    Heads are independent, so without ``store`` the loop runs tile by tile (:func:`_tiles`), each
    tile through all its tokens while its state is in cache: the same operations on each element,
    so the same results bitwise (``tests/test_oracle_speed.py``).
    """
    N, L, HV, V = p.v.shape
    decay = np.exp(p.g)
    if store is not None:
        return _stored_state_loop(p, decay, store, norms, p.scale if scale is None else scale)
    S = p.initial_state.copy()
    o = np.empty((N, L, HV, V), S.dtype)
    update = _blas_rank_one(S, p.k)
    for ns, hs in _tiles(N, HV, S.shape[-2] * S.shape[-1]):
        tile = S[ns, hs]
        tile_scale = p.scale if scale is None else np.asarray(scale, S.dtype)[ns, None, None]
        kept = slice(ns.start, min(ns.stop, 0 if norms is None else norms.shape[0]))  # sequences with norms
        for t in range(L):
            tile *= decay[ns, t, hs, None, None]
            k_t = p.k[ns, t, hs, None, :]  # [n, h, 1, K]
            u = p.beta[ns, t, hs, None] * (p.v[ns, t, hs] - (k_t @ tile)[:, :, 0])
            if update is None:
                tile += k_t.swapaxes(-1, -2) * u[:, :, None, :]
            else:
                update(t, u, ns, hs)
            o[ns, t, hs] = tile_scale * (p.q[ns, t, hs, None, :] @ tile)[:, :, 0]
            if norms is not None and kept.stop > kept.start:
                part = tile[: kept.stop - kept.start]
                norms[kept, t, hs] = np.sqrt(np.einsum("nhkv,nhkv->nh", part, part))
    return o, S


def _stored_state_loop(
    p: Packed,
    decay: np.ndarray,
    store: Callable[[np.ndarray], np.ndarray],
    norms: np.ndarray | None,
    scale: float | np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`recurrent_core` with ``store``: the whole state a token at a time (``store`` may not be
    elementwise, so no tiles)."""
    S = store(p.initial_state)
    N, L, HV, V = p.v.shape
    o = np.empty((N, L, HV, V), S.dtype)
    out_scale = scale if np.ndim(scale) == 0 else np.asarray(scale, S.dtype)[:, None, None]
    for t in range(L):
        S *= decay[:, t, :, None, None]
        k_t = p.k[:, t, :, None, :]  # [N, HV, 1, K]
        u = p.beta[:, t, :, None] * (p.v[:, t] - (k_t @ S)[:, :, 0])
        S += k_t.swapaxes(-1, -2) * u[:, :, None, :]
        S = store(S)
        o[:, t] = out_scale * (p.q[:, t, :, None, :] @ S)[:, :, 0]
        if norms is not None:
            part = S[: norms.shape[0]]
            norms[:, t] = np.sqrt(np.einsum("nhkv,nhkv->nh", part, part))
    return o, S


def stack_packed(parts: list[Packed]) -> Packed:
    """Packed problems of one padded length as one, their sequences concatenated along N.

    ``token_index`` and ``out_shape`` stay per part (the first part's ``out_shape``): unpack each
    part's rows of the result with its own :class:`Packed`.
    """
    if len(parts) == 1:
        return parts[0]

    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(x, name) for x in parts])

    return dataclasses.replace(
        parts[0],
        q=cat("q"),
        k=cat("k"),
        v=cat("v"),
        g=cat("g"),
        beta=cat("beta"),
        initial_state=cat("initial_state"),
        token_index=cat("token_index"),
    )


def segment_sums(g: np.ndarray) -> np.ndarray:
    """``D[..., i, j] = g[j+1] + ... + g[i]`` for ``i >= j`` (0 above the diagonal).

    Summing each segment directly, rather than differencing a cumulative sum, keeps
    ``exp(D)`` accurate when a saturated gate makes the cumulative sum huge. Row ``i`` is row
    ``i - 1`` plus ``g[i]``: the additions of a cumulative sum down the columns, in its order (so
    bitwise the same), as one NumPy operation per row, several times faster than ``np.cumsum``
    along a non-contiguous axis.
    """
    C = g.shape[-1]
    D = np.zeros(g.shape + (C,), g.dtype)
    for i in range(1, C):
        np.add(D[..., i - 1, :i], g[..., i, None], out=D[..., i, :i])
    return D


def unit_lower_inverse(A: np.ndarray) -> np.ndarray:
    """``(I + A)^-1`` for strictly lower-triangular ``A [..., C, C]``, by forward substitution (only
    the strict lower triangle of ``A`` is read)."""
    C = A.shape[-1]
    T = np.broadcast_to(np.eye(C, dtype=A.dtype), A.shape).copy()
    for i in range(1, C):
        # Row i of (I + A) T = I: T[i] = e_i - A[i, :i] T[:i]; rows < i of T are final.
        T[..., i, :i] = -(A[..., i : i + 1, :i] @ T[..., :i, :i])[..., 0, :]
    return T


def chunk_state_norms(h: np.ndarray, g: np.ndarray, k: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``||S_t||_F [..., C]`` after each token of chunks, ``S_t = exp(g_t) S_{t-1} + k_t u_t^T`` from ``S_{-1} = h``.

    ``h [..., K, V]`` the state entering each chunk, ``g [..., C]`` the gates, ``k [..., C, K]``,
    ``u [..., C, V]`` (``v_new``). The states are materialised token by token, all chunks at once: the
    token loop's update with ``v_new`` for its ``u``, so its norms to rounding even where the delta
    rule erases the state, where a Gram-matrix identity for ``||S_t||^2`` would cancel (these norms are
    denominators of the metrics; ``tests/test_oracle_speed.py``).
    """
    batch, (C, K), V = g.shape[:-1], k.shape[-2:], u.shape[-1]
    S = h.reshape(-1, K, V).copy()
    decay = np.exp(g.reshape(-1, C).T)  # [C, B]
    k, u = (np.moveaxis(x.reshape((-1,) + x.shape[-2:]), 1, 0) for x in (k, u))  # [C, B, K], [C, B, V]
    write = np.empty_like(S)
    out = np.empty((C, S.shape[0]))
    for t in range(C):
        S *= decay[t, :, None, None]
        S += np.multiply(k[t, :, :, None], u[t, :, None, :], out=write)
        out[t] = np.einsum("bkv,bkv->b", S, S)
    return np.sqrt(out.T).reshape(batch + (C,))


def chunk_core(
    p: Packed, chunk_size: int, chunks_per_block: int = 8, hook=_no_hook, norms: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """WY/UT chunked form on a packed problem whose length is a multiple of ``chunk_size``.

    Work is batched over blocks of ``chunks_per_block`` chunks: the intra-chunk part (gates,
    ``(I + A)^-1``, W, U) and the output are batched matrix products over the block, and only
    the state passing loops over chunks. Bounded blocks keep temporaries in cache. ``hook(name,
    x)`` sees each intermediate of :data:`STAGES` (arrays ``[N, HV, ...]``) and the carried
    state (:data:`CARRIED`, ``[N, HV, K, V]``: once as loaded, then after each chunk) and returns
    what the algorithm goes on with. Every ``x`` is a temporary the hook may overwrite, except
    ``h`` (the live state). ``norms``: an ``[N, L, HV]`` array to fill with the state's Frobenius
    norm after each token (:func:`chunk_state_norms`), as ``recurrent_core`` fills it.
    """
    N, L, HV, V = p.v.shape
    C, n_chunks = chunk_size, L // chunk_size
    causal = np.tril(np.ones((C, C), bool))
    S = hook(CARRIED, p.initial_state.copy())
    o = np.empty_like(p.v)

    def block_of(x: np.ndarray, first: int, count: int) -> np.ndarray:
        # [N, L, HV, ...] -> view [N, HV, count, C, ...]; the last axis stays unit-stride for BLAS
        x = x[:, first * C : (first + count) * C]
        return np.moveaxis(x.reshape((N, count, C) + x.shape[2:]), 3, 1)

    for first in range(0, n_chunks, chunks_per_block):
        count = min(chunks_per_block, n_chunks - first)
        q, k, v, g, beta = (block_of(x, first, count) for x in (p.q, p.k, p.v, p.g, p.beta))
        G = np.cumsum(g, axis=-1)  # [N, HV, n, C]
        D = segment_sums(g)
        Gamma = np.exp(D)  # D is 0 above the diagonal: finite there, so the mask's product zeroes it exactly
        Gamma *= causal
        A = hook("kkt_operand", beta[..., :, None] * k) @ k.swapaxes(-1, -2)
        A *= Gamma  # its strictly lower triangle, all that unit_lower_inverse reads
        T = hook("inverse", unit_lower_inverse(A))
        W = hook("wu", T @ hook("wu_operands", (beta * np.exp(G))[..., None] * k))  # [N, HV, n, C, K]
        U = hook("wu", T @ hook("wu_operands", beta[..., None] * v))  # [N, HV, n, C, V]
        attn = q @ k.swapaxes(-1, -2)
        attn *= Gamma
        attn = hook("attn", attn)
        to_end = np.exp(D[..., -1, :, None])  # exp(G_last - G_j), [..., C, 1]
        decay_chunk = np.exp(G[..., -1])
        chunk_states = np.empty(W.shape[:3] + S.shape[-2:], S.dtype)  # state entering each chunk (as used)
        v_new = np.empty_like(U)
        for c in range(count):
            h = hook("h", S)
            chunk_states[:, :, c] = h
            v_new[:, :, c] = U[:, :, c] - W[:, :, c] @ h
            update = hook("v_new_decayed", v_new[:, :, c] * to_end[:, :, c])
            S = hook(CARRIED, decay_chunk[:, :, c, None, None] * S + k[:, :, c].swapaxes(-1, -2) @ update)
        o_block = q @ chunk_states  # then in place: scale * (exp(G) * (q h) + attn v_new), in that order
        o_block *= np.exp(G)[..., None]
        o_block += attn @ hook("v_new", v_new)
        o_block *= p.scale
        block_of(o, first, count)[...] = o_block
        if norms is not None:
            block_of(norms, first, count)[...] = chunk_state_norms(chunk_states, g, k, v_new)
    return o, S


def recurrent_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    scale: float | None = None,
    initial_state=None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    state_v_first: bool = False,
    cu_seqlens=None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Float64 token-by-token oracle. Returns ``(o [B, T, HV, V], final_state | None)``."""
    return run_packed(recurrent_core, **locals())  # each parameter is pack's keyword of the same name


def chunk_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    scale: float | None = None,
    initial_state=None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    state_v_first: bool = False,
    cu_seqlens=None,
    chunk_size: int = 64,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Float64 chunked (WY/UT) oracle; ragged last chunks are zero-padded per sequence."""
    if not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ValueError(f"chunk_size: must be a positive integer, got {chunk_size!r}")
    args = dict(locals())  # each parameter but chunk_size is pack's keyword of the same name
    C = int(args.pop("chunk_size"))
    return run_packed(lambda p: chunk_core(p, C), **args, pad_to_multiple=C)


def decode_gated_delta_rule(
    q,
    k,
    v,
    state,
    A_log,
    a,
    dt_bias,
    b,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """FlashInfer / FlashInfer-Bench decode: raw gates, k-last state.

    ``q, k`` ``[B, 1, H, K]``; ``v`` ``[B, 1, HV, V]``; ``state`` ``[B, HV, V, K]``;
    ``A_log, dt_bias`` ``[HV]``; ``a, b`` ``[B, 1, HV]``. ``scale`` None or 0 means ``K**-0.5``.
    Returns ``(o [B, 1, HV, V], new_state [B, HV, V, K])`` in float64.
    """
    for name, x in (("q", q), ("a", a), ("b", b)):
        if np.ndim(x) < 2 or np.shape(x)[1] != 1:
            raise ValueError(f"{name}: decode expects a single token, shape [B, 1, ...], got {np.shape(x)}")
    if np.shape(a) != np.shape(b):
        raise ValueError(f"b: expected shape {np.shape(a)} like a, got {np.shape(b)}")
    g, beta = gates_from_raw(A_log, a, dt_bias, b)
    if scale == 0.0:
        scale = None
    o, new_state = recurrent_gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        scale=scale,
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=use_qk_l2norm,
        state_v_first=True,
    )
    assert new_state is not None  # output_final_state=True
    return o, new_state
