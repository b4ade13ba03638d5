"""The native calling convention (FLA 0.6 ``chunk_gated_delta_rule``): validation and packing.

Shapes (B batch, T tokens, H query/key heads, HV value heads, K key dim, V value dim,
N sequences):

- ``q, k``: ``[B, T, H, K]``; ``v``: ``[B, T, HV, V]``; ``HV % H == 0``; value head ``h``
  reads query/key head ``h // (HV // H)``.
- ``g``: ``[B, T, HV]`` log-space decay; ``beta``: ``[B, T, HV]`` post-sigmoid.
- ``initial_state``: ``[N, HV, K, V]`` (``[N, HV, V, K]`` with ``state_v_first``).
- ``cu_seqlens``: ``[N + 1]`` cumulative lengths, only with ``B == 1``; else ``N == B``.

Everything here is NumPy and knows nothing of kernels: it checks the arguments, raising
``ValueError`` that names the offending one, and repacks the problem into a padded
per-sequence layout that the oracle vectorizes over.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

L2NORM_EPS = 1e-6


def value_head_to_qk_head(num_heads: int, num_value_heads: int) -> np.ndarray:
    """Index of the query/key head that each value head reads (GVA): ``h // (HV // H)``."""
    return np.arange(num_value_heads) // (num_value_heads // num_heads)


def l2norm(x: np.ndarray) -> np.ndarray:
    """``x / sqrt(sum(x^2) + 1e-6)`` over the last axis, in ``x``'s dtype."""
    sum_sq = np.einsum("...i,...i->...", x, x)[..., None]
    return x / np.sqrt(sum_sq + x.dtype.type(L2NORM_EPS))


def _as_float(name: str, x, dtype) -> np.ndarray:
    try:
        arr = np.asarray(x)
    except Exception as exc:  # noqa: BLE001 - anything unconvertible is the caller's input error
        raise ValueError(f"{name}: cannot be converted to a NumPy array ({exc})") from None
    if arr.dtype.kind not in "fiub" and arr.dtype.name != "bfloat16":
        raise ValueError(f"{name}: expected a real numeric array, got dtype {arr.dtype}")
    arr = np.asarray(arr, dtype=dtype)  # no copy when already in dtype
    if not np.isfinite(arr).all():
        raise ValueError(f"{name}: contains NaN or Inf")
    return arr


def _check_rank(name: str, arr: np.ndarray, rank: int, layout: str) -> None:
    if arr.ndim != rank:
        raise ValueError(f"{name}: expected rank {rank} {layout}, got shape {arr.shape}")


def sequence_bounds(cu_seqlens, batch: int, tokens: int) -> np.ndarray:
    """Validated ``[N + 1]`` int64 offsets into the flattened ``B * T`` token axis."""
    if cu_seqlens is None:
        return np.arange(batch + 1, dtype=np.int64) * tokens
    try:
        cu = np.asarray(cu_seqlens)
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"cu_seqlens: cannot be converted to a NumPy array ({exc})") from None
    if cu.ndim != 1 or cu.size < 2:
        raise ValueError(f"cu_seqlens: expected shape [N + 1] with N >= 1, got {cu.shape}")
    if cu.dtype.kind not in "iu":
        raise ValueError(f"cu_seqlens: expected an integer array, got dtype {cu.dtype}")
    cu = cu.astype(np.int64)
    if batch != 1:
        raise ValueError(f"cu_seqlens: requires batch size B == 1, got B = {batch}")
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens: must start at 0, starts at {cu[0]}")
    if np.any(np.diff(cu) < 0):
        raise ValueError("cu_seqlens: must be non-decreasing")
    if cu[-1] != tokens:
        raise ValueError(f"cu_seqlens: must end at T = {tokens}, ends at {cu[-1]}")
    return cu


@dataclass(frozen=True)
class Packed:
    """A validated problem in padded per-sequence layout, value heads expanded.

    ``q, k``: ``[N, L, HV, K]``; ``v``: ``[N, L, HV, V]``; ``g, beta``: ``[N, L, HV]``;
    ``initial_state``: ``[N, HV, K, V]`` (always k-first here); ``token_index``: ``[N, L]``
    flat index into ``B * T`` (-1 on padding). Padding tokens are zeros with ``g = 0`` and
    ``beta = 0``, which leave the state exactly unchanged, so padding needs no masking.
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    g: np.ndarray
    beta: np.ndarray
    initial_state: np.ndarray
    token_index: np.ndarray
    scale: float
    out_shape: tuple[int, int, int, int]
    state_v_first: bool

    @property
    def lengths(self) -> np.ndarray:
        return (self.token_index >= 0).sum(axis=1)


def pack(
    q,
    k,
    v,
    g,
    beta,
    scale: float | None = None,
    initial_state=None,
    use_qk_l2norm_in_kernel: bool = False,
    state_v_first: bool = False,
    cu_seqlens=None,
    dtype=np.float64,
    pad_to_multiple: int = 1,
) -> Packed:
    """Validate the native-convention arguments and pack them per sequence in ``dtype``.

    ``pad_to_multiple`` rounds the padded length up (the chunked form uses the chunk size).
    """
    q = _as_float("q", q, dtype)
    k = _as_float("k", k, dtype)
    v = _as_float("v", v, dtype)
    g = _as_float("g", g, dtype)
    beta = _as_float("beta", beta, dtype)
    _check_rank("q", q, 4, "[B, T, H, K]")
    _check_rank("k", k, 4, "[B, T, H, K]")
    _check_rank("v", v, 4, "[B, T, HV, V]")
    _check_rank("g", g, 3, "[B, T, HV]")
    _check_rank("beta", beta, 3, "[B, T, HV]")
    B, T, H, K = q.shape
    if k.shape != q.shape:
        raise ValueError(f"k: expected shape {q.shape} like q, got {k.shape}")
    if v.shape[:2] != (B, T):
        raise ValueError(f"v: expected leading dims [B, T] = {(B, T)}, got {v.shape[:2]}")
    HV, V = v.shape[2], v.shape[3]
    if H == 0 or HV == 0 or K == 0 or V == 0:
        raise ValueError(f"v: head counts and head dims must be positive (H={H}, HV={HV}, K={K}, V={V})")
    if HV % H != 0:
        raise ValueError(f"v: value heads HV = {HV} must be a multiple of query/key heads H = {H}")
    if g.shape != (B, T, HV):
        raise ValueError(f"g: expected shape [B, T, HV] = {(B, T, HV)}, got {g.shape}")
    if beta.shape != (B, T, HV):
        raise ValueError(f"beta: expected shape [B, T, HV] = {(B, T, HV)}, got {beta.shape}")
    if scale is None:
        scale = K**-0.5
    elif not np.isfinite(scale):
        raise ValueError(f"scale: must be finite, got {scale}")
    bounds = sequence_bounds(cu_seqlens, B, T)
    N = bounds.size - 1
    if initial_state is None:
        state = np.zeros((N, HV, K, V), dtype)
    else:
        state = _as_float("initial_state", initial_state, dtype)
        want = (N, HV, V, K) if state_v_first else (N, HV, K, V)
        if state.shape != want:
            layout = "[N, HV, V, K]" if state_v_first else "[N, HV, K, V]"
            raise ValueError(f"initial_state: expected {layout} = {want}, got {state.shape}")
        if state_v_first:
            state = state.swapaxes(-1, -2)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)

    lengths = np.diff(bounds)
    L = int(lengths.max(initial=0))
    L = -(-max(L, 1) // pad_to_multiple) * pad_to_multiple
    position = np.arange(L)
    token_index = np.where(position < lengths[:, None], bounds[:-1, None] + position, -1)
    heads = value_head_to_qk_head(H, HV)

    def gather(x: np.ndarray) -> np.ndarray:
        if cu_seqlens is None and L == T:
            return x  # already [N, L, ...]: no copy
        flat = x.reshape((B * T,) + x.shape[2:])
        out = np.zeros((N, L) + x.shape[2:], dtype)
        for n in range(N):  # one slice copy per sequence
            out[n, : lengths[n]] = flat[bounds[n] : bounds[n + 1]]
        return out

    def gather_heads(x: np.ndarray) -> np.ndarray:
        return gather(x) if H == HV else gather(x)[:, :, heads]

    return Packed(
        q=gather_heads(q),
        k=gather_heads(k),
        v=gather(v),
        g=gather(g),
        beta=gather(beta),
        initial_state=np.ascontiguousarray(state),
        token_index=token_index,
        scale=float(scale),
        out_shape=(B, T, HV, V),
        state_v_first=state_v_first,
    )


def unpack_output(packed: Packed, o: np.ndarray) -> np.ndarray:
    """Scatter a padded ``[N, L, HV, V]`` output back to ``[B, T, HV, V]``."""
    B, T, HV, V = packed.out_shape
    out = np.zeros((B * T, HV, V), o.dtype)
    valid = packed.token_index >= 0
    out[packed.token_index[valid]] = o[valid]
    return out.reshape(B, T, HV, V)


def export_state(packed: Packed, state: np.ndarray) -> np.ndarray:
    """A k-first ``[N, HV, K, V]`` state in the caller's layout."""
    return np.ascontiguousarray(state.swapaxes(-1, -2)) if packed.state_v_first else state


def start_slots(ssm_state_indices: np.ndarray, num_accepted_tokens: np.ndarray) -> np.ndarray:
    """Speculative decoding: ``[N]`` slot each request reads, ``ssm_state_indices[n, num_accepted_tokens[n] - 1]``."""
    rows = np.arange(len(num_accepted_tokens))
    return np.asarray(ssm_state_indices)[rows, np.asarray(num_accepted_tokens) - 1]


@dataclass(frozen=True)
class SpecRules:
    """The padding and slot rules of one speculative-decoding convention (what a kernel documents).

    ``padding``: how a padding request is marked: ``"negative"`` (start slot ``< 0``) or
    ``"null"`` (start slot ``<= null_slot``, vLLM's ``NULL_BLOCK_ID = 0``).
    ``null_slot``: a sacrificial slot that holds no live state (vLLM: 0), or None when every slot
    may be live. A column entry ``<= null_slot`` (or negative) in a live request means "do not
    store this token's state" when ``skip_entries``; otherwise live entries are all real slots.
    ``padding_output``: what a padding request's output rows hold: ``"zeros"`` (written as zero),
    ``"kept"`` (left as the caller's buffer had them; zeros when the kernel allocates it) or
    ``"any"`` (undefined: not written, e.g. vLLM's ``new_empty``).
    ``padding_entries``: what the generated column entries of a padding request are
    (``"negative"``, ``"null"``, or ``"spare"``: real unused slots, for kernels that would write
    through a negative entry).
    ``pool_v_first``: the pool is ``[slots, HV, V, K]`` (k-last) instead of ``[slots, HV, K, V]``.
    ``uniform_lengths``: every request has the same token count (a ``[B, T]`` kernel);
    ``min_tokens``: fewest tokens per request the kernel takes.
    """

    name: str = "native"
    padding: str = "negative"
    null_slot: int | None = None
    skip_entries: bool = False
    padding_output: str = "zeros"
    padding_entries: str = "negative"
    pool_v_first: bool = False
    uniform_lengths: bool = False
    min_tokens: int = 1

    def is_padding_slot(self, slot: int) -> bool:
        """Whether ``slot`` as a start slot marks a padding request."""
        if self.padding == "null" and self.null_slot is not None:
            return slot <= self.null_slot
        return slot < 0

    def stores(self, slot: int) -> bool:
        """Whether a live request's column entry ``slot`` is a slot its state is stored to."""
        if slot < 0:
            return False
        return not (self.null_slot is not None and slot <= self.null_slot)

    @property
    def first_live_slot(self) -> int:
        return 0 if self.null_slot is None else self.null_slot + 1


# The toolkit's own convention (``gdn_verify.implementations.speculative``, ``cupy_kernels.decode``).
NATIVE_SPEC = SpecRules()
# vLLM's ``fused_recurrent_gated_delta_rule`` with ``num_accepted_tokens``: slot 0 is the null
# block, an entry <= 0 is never read or written, a padding request writes no output row.
VLLM_SPEC = SpecRules(
    "vllm",
    padding="null",
    null_slot=0,
    skip_entries=True,
    padding_output="any",
    padding_entries="null",
    pool_v_first=True,
)
# FlashInfer's ``gated_delta_rule_mtp``: a negative read index is padding (output rows left as
# allocated); per-token scatter indices are not checked, so padding rows get spare real slots;
# ``T >= 2`` (its documented domain; T = 1 failed in CuTe DSL layout deduction on an H100, 2026-11-23).
FLASHINFER_SPEC = SpecRules(
    "flashinfer",
    padding="negative",
    padding_output="kept",
    padding_entries="spare",
    pool_v_first=True,
    uniform_lengths=True,
    min_tokens=2,
)


def spec_rules_of(extra: dict) -> SpecRules:
    """The rules an implementation declares in ``Implementation.extra["spec_rules"]`` (native by default)."""
    rules = extra.get("spec_rules", NATIVE_SPEC)
    return rules if isinstance(rules, SpecRules) else NATIVE_SPEC
