"""Modular MAX's ``gated_delta`` calling convention, both ways: our problem to MAX's arguments,
MAX's arguments to the float64 oracle, and a MAX-convention callable as a native form.

MAX 26.7.0's ``max.nn.state_space.gated_delta_recurrence_fwd`` (``ops.inplace_custom``
``"gated_delta_recurrence_fwd"``) takes, in this order (N tokens, B batch items):

- ``qkv_conv_output`` ``[N, conv_dim]`` float32: q, k and v side by side per token, q in channels
  ``[0, key_dim)``, k in ``[key_dim, 2 key_dim)``, v in ``[2 key_dim, 2 key_dim + value_dim)``,
  ``key_dim = nk * KD``, ``value_dim = nv * VD`` (head-major inside each block);
- ``decay_per_token`` ``[N, nv]`` float32: the decay already exponentiated, linear (``exp(-A
  softplus(a + dt_bias))`` in MAX's Qwen3.5 layer), not a log gate;
- ``beta_per_token`` ``[N, nv]`` float32, sigmoid already applied (ours is post-sigmoid too);
- ``recurrent_state`` ``[max_slots, nv, KD, VD]``, float32 or bfloat16 whatever the working
  dtype, mutated in place at row ``slot_idx[b]``, every other row untouched;
- ``slot_idx`` ``[B]`` uint32, ``input_row_offsets`` ``[B + 1]`` uint32 (sequence ``b`` is tokens
  ``[offsets[b], offsets[b + 1])``);

and returns ``[N, value_dim]`` float32 (``output[t, h * VD + j]``). L2 normalisation of q and k
and the query scale ``1 / sqrt(KD)`` are fused in the kernel: a MAX kernel always normalises and
always scales by ``KD ** -0.5``, so problems with l2norm off or another scale are unsupported
(``NotImplementedError`` naming why), as is a v-first state (MAX's pool is k-first).

What the seed (``001_*.txt``) and the wheel's kernel docstrings (``state_space.mojoc`` in
``max-mojo-libs`` 26.7.0) say, and what this module does with it:

- State layout: "Each thread owns the KD-element column state_col[0..KD-1] =
  recurrent_state[slot_idx[batch_item], value_head, 0..KD-1, vd_element]" (seed); the wheel:
  "``recurrent_state[slot, value_head, :, tid]``". So a slot is ``[nv, KD, VD]``, our k-first
  ``[HV, K, V]`` layout, no transpose.
- Decay before the update: step 1 of the seed's five, "Apply per-head scalar decay to the entire
  state column: state_col[k] <- decay[t,h] * state_col[k]", then ``kv_memory`` (step 2), the delta
  (3), the outer-product update (4) and the readout of the updated state (5): our recurrence.
- GQA: "key_head_idx = value_head_idx // heads_expansion_ratio", our ``h // (HV // H)``.
- The wheel adds what the seed does not say: the query scale is ``1/sqrt(KD)``; the kernels
  require ``KEY_HEAD_DIM == VALUE_HEAD_DIM`` (a compile-time assertion); one CTA per (batch item,
  value head) with ``VD`` threads (the seed describes a flat one-thread-per-element grid); the
  key update is ``k_raw * key_update_factor`` with ``key_update_factor = beta (v - kv_memory) /
  ||k||``, one token-step function shared with the speculative verify ring. The L2 norm's epsilon
  is compiled in and not visible: this module assumes ours (``x / sqrt(||x||^2 + 1e-6)``).

The conversion (:func:`to_max`, working dtype float32 as MAX's per-token tensors are):
q, k, v and beta are cast to float32, exactly for float16, bfloat16 and float32 inputs (float64
inputs are unsupported: MAX has no float64 path); the decay is :func:`decay_from_gate`,
``float32(exp(float64(g)))``: ``g`` (any dtype, exact in float64) exponentiated in float64 (error
about 1e-16 relative) and rounded once to float32, so ``|decay - exp(g)| <= 2^-24 exp(g)`` while
``exp(g) >= 2^-126``, and an absolute ``2^-150`` below (float32 subnormals; ``g < -103.98`` gives
exactly 0). The initial state is copied into the pool exactly (float32) or rounded to nearest
bfloat16 (relative ``2^-9``) for a bfloat16 pool. The output comes back float32 and is rounded
once to the input dtype. Back (:func:`from_max`), ``g = log(float64(decay))`` (``-1e4`` for a
zero decay, whose ``exp`` is 0 in float64 too), so the oracle sees exactly the decay MAX was given.

Sequences take pool rows ``slot_idx[n] = 2 n + 1`` of ``2 N + 1``: the rows between them are
spare and zero, so that reading or writing a neighbouring row shows (:func:`native_form` raises
:class:`ContractError` when a spare row changed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import ml_dtypes
import numpy as np

from gdn_verify.core import arrays
from gdn_verify.core.implementation import ContractError
from gdn_verify.core.oracle import numpy_oracle
from gdn_verify.core.problem import Problem

WORK_DTYPE = np.dtype(np.float32)  # MAX's per-token tensors and output
POOL_DTYPES = (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16))
# The log gate standing for a decay of exactly 0: exp(-1e4) is 0 in float64, and any positive
# float64 decay has log >= -745, so the clamp changes nothing else.
ZERO_DECAY_GATE = -1e4
# The speculative verify ring (``max.pipelines.architectures.qwen3_5.state_cache``): record
# capacities the ring kernels are compiled for, and the alignment of a record's stride (elements).
RING_LENS = (2, 4, 8)
RING_RECORD_ALIGN = 32


@dataclass(frozen=True)
class MaxArguments:
    """The arguments of one ``gated_delta_recurrence_fwd`` call, in MAX's order (NumPy).

    ``qkv_conv_output`` ``[N, conv_dim]``, ``decay_per_token`` and ``beta_per_token`` ``[N, nv]``
    (float32), ``recurrent_state`` ``[max_slots, nv, KD, VD]`` (float32 or bfloat16, the pool the
    call mutates), ``slot_idx`` ``[B]`` and ``input_row_offsets`` ``[B + 1]`` (uint32).
    """

    qkv_conv_output: np.ndarray
    decay_per_token: np.ndarray
    beta_per_token: np.ndarray
    recurrent_state: np.ndarray
    slot_idx: np.ndarray
    input_row_offsets: np.ndarray

    def astuple(self) -> tuple[np.ndarray, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))

    @property
    def heads(self) -> tuple[int, int, int, int]:
        """``(nk, nv, KD, VD)``, the key-head count derived from ``conv_dim``."""
        _, nv, KD, VD = self.recurrent_state.shape
        return key_heads(self.qkv_conv_output.shape[1], nv, KD, VD), nv, KD, VD


def key_heads(conv_dim: int, nv: int, KD: int, VD: int) -> int:
    """``nk`` from ``conv_dim = 2 nk KD + nv VD``; ``ValueError`` when no whole GQA group fits."""
    key_dim, rest = divmod(conv_dim - nv * VD, 2)
    nk, extra = divmod(key_dim, KD) if KD else (0, 1)
    if rest or extra or nk < 1 or nv % nk:
        raise ValueError(f"conv_dim {conv_dim} is not 2 nk KD + nv VD with nk dividing nv (nv={nv}, KD={KD}, VD={VD})")
    return nk


def decay_from_gate(g: Any, dtype: Any = WORK_DTYPE) -> np.ndarray:
    """MAX's linear decay of our log gate: ``exp(g)`` in float64, rounded once to ``dtype``."""
    return np.exp(np.asarray(g, np.float64)).astype(dtype)


def gate_from_decay(decay: Any) -> np.ndarray:
    """Our log gate of MAX's linear decay, float64 (:data:`ZERO_DECAY_GATE` where it is 0)."""
    d = np.asarray(decay, np.float64)
    if np.any(d < 0) or not np.all(np.isfinite(d)):
        raise ValueError("decay_per_token: a linear decay must be finite and >= 0")
    with np.errstate(divide="ignore"):
        return np.maximum(np.log(d), ZERO_DECAY_GATE)


def unsupported(
    dtype: Any, scale: float | None, head_dim: int, l2norm: bool, state_v_first: bool = False, work: Any = WORK_DTYPE
) -> str | None:
    """Why a problem of input ``dtype`` cannot be put in MAX's convention (``work``: its per-token dtype), or None."""
    if not l2norm:
        return "MAX's gated_delta kernels always L2-normalise q and k (no use_qk_l2norm_in_kernel=False)"
    if scale is not None and scale != head_dim**-0.5:
        return "MAX's gated_delta kernels fix the query scale at 1/sqrt(KD) (no other scale)"
    if state_v_first:
        return "MAX's state pool is k-first [max_slots, nv, KD, VD]; there is no v-first layout"
    if np.dtype(dtype).itemsize > np.dtype(work).itemsize:
        return f"MAX's per-token tensors are {np.dtype(work).name}; {np.dtype(dtype).name} inputs are not expressible"
    return None


def to_max(
    q,
    k,
    v,
    g,
    beta,
    scale: float | None = None,
    initial_state=None,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens=None,
    state_v_first: bool = False,
    pool_dtype: Any = WORK_DTYPE,
    dtype: Any = WORK_DTYPE,
) -> MaxArguments:
    """Our native arguments (NumPy) as MAX's (module doc: the rounding, the slot layout).

    ``dtype``: the per-token tensors' dtype, MAX's float32 (float64 makes a lossless twin for tests).
    Raises ``NotImplementedError`` for what MAX cannot express (:func:`unsupported`).
    """
    q, k, v = (np.asarray(x) for x in (q, k, v))
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    why = unsupported(v.dtype, scale, K, use_qk_l2norm_in_kernel, state_v_first, dtype)
    if why:
        raise NotImplementedError(why)
    bounds = np.arange(B + 1, dtype=np.int64) * T if cu_seqlens is None else np.asarray(cu_seqlens, np.int64)
    N = len(bounds) - 1
    qkv = np.concatenate([q.reshape(B * T, H * K), k.reshape(B * T, H * K), v.reshape(B * T, HV * V)], axis=1)
    pool = np.zeros((2 * N + 1, HV, K, V), pool_dtype)
    slots = 2 * np.arange(N) + 1
    if initial_state is not None:
        pool[slots] = np.asarray(initial_state).astype(pool_dtype)
    return MaxArguments(
        np.ascontiguousarray(qkv, dtype),
        decay_from_gate(np.asarray(g).reshape(B * T, HV), dtype),
        np.asarray(beta).reshape(B * T, HV).astype(dtype),
        pool,
        slots.astype(np.uint32),
        bounds.astype(np.uint32),
    )


def from_max(qkv_conv_output, decay_per_token, beta_per_token, recurrent_state, slot_idx, input_row_offsets) -> Problem:
    """MAX's arguments (NumPy) as our problem, in float64: a varlen pack (``B == 1``) of the
    ``B`` items starting from their slots, l2norm on, the default scale, the final state asked for."""
    qkv = np.asarray(qkv_conv_output, np.float64)
    pool = np.asarray(recurrent_state)
    _, nv, KD, VD = pool.shape
    nk = key_heads(qkv.shape[1], nv, KD, VD)
    N = qkv.shape[0]
    key_dim = nk * KD
    offsets = np.asarray(input_row_offsets).astype(np.int64)
    slots = np.asarray(slot_idx).astype(np.int64)
    if offsets.ndim != 1 or len(offsets) != len(slots) + 1 or offsets[0] != 0 or offsets[-1] != N:
        raise ValueError(f"input_row_offsets: expected [B + 1] from 0 to {N}, got {offsets.tolist()}")
    if np.any(np.diff(offsets) < 0) or np.any(slots >= len(pool)):
        raise ValueError("input_row_offsets must not decrease and slot_idx must index recurrent_state")
    return Problem(
        q=qkv[None, :, :key_dim].reshape(1, N, nk, KD),
        k=qkv[None, :, key_dim : 2 * key_dim].reshape(1, N, nk, KD),
        v=qkv[None, :, 2 * key_dim :].reshape(1, N, nv, VD),
        g=gate_from_decay(decay_per_token)[None],
        beta=np.asarray(beta_per_token, np.float64)[None],
        initial_state=pool[slots].astype(np.float64),
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=offsets,
    )


def max_oracle(qkv_conv_output, decay_per_token, beta_per_token, recurrent_state, slot_idx, input_row_offsets):
    """``gated_delta_recurrence_fwd`` computed by the float64 oracle: returns ``[N, value_dim]``
    float64 and stores each item's final state in ``recurrent_state[slot_idx[b]]`` (in the pool's
    dtype; an item listed twice stores the later one's)."""
    problem = from_max(qkv_conv_output, decay_per_token, beta_per_token, recurrent_state, slot_idx, input_row_offsets)
    o, state = numpy_oracle(problem)
    for b, slot in enumerate(np.asarray(slot_idx).astype(np.int64)):
        recurrent_state[slot] = state[b].astype(recurrent_state.dtype)
    return o.reshape(o.shape[1], -1)


def untouched_rows(before: np.ndarray, after: np.ndarray, slots: np.ndarray) -> None:
    """Raise :class:`ContractError` naming the first pool row outside ``slots`` that changed (bitwise)."""
    written = set(np.asarray(slots).astype(np.int64).tolist())
    for row in range(len(before)):
        if row not in written and before[row].tobytes() != after[row].tobytes():
            raise ContractError(
                f"recurrent_state row {row} changed although no item's slot_idx names it (items at rows "
                f"{sorted(written)}; MAX documents every other slot as untouched)"
            )


def through_max(launch: Callable[[MaxArguments, tuple[int, int]], tuple[Any, np.ndarray]], pool_dtype: Any) -> Callable:
    """A native-convention callable that puts its arguments (of any array kind) in MAX's convention
    (:func:`to_max`, the pool in ``pool_dtype``) and hands them to ``launch(args, want)``, ``want``
    the ``recurrence_output`` shape ``(B * T, HV * V)`` to expect; ``launch`` runs and checks the
    kernels and returns ``(recurrence_output, pool)``. ``o`` comes back ``[B, T, HV, V]`` in the
    input dtype, the final state from the slots of ``pool``.
    """
    pool_dtype = np.dtype(pool_dtype)

    def call(
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
    ):
        qn, kn, vn, gn, bn, state, cu = (arrays.to_numpy(x) for x in (q, k, v, g, beta, initial_state, cu_seqlens))
        args = to_max(qn, kn, vn, gn, bn, scale, state, use_qk_l2norm_in_kernel, cu, state_v_first, pool_dtype)
        B, T, HV, V = np.asarray(vn).shape
        out, pool = launch(args, (B * T, HV * V))
        o = np.asarray(out).reshape(B, T, HV, V).astype(np.asarray(vn).dtype)
        return o, (np.ascontiguousarray(pool[args.slot_idx.astype(np.int64)]) if output_final_state else None)

    return call


def native_form(kernel: Callable, array: str = "numpy", pool_dtype: Any = WORK_DTYPE) -> Callable:
    """A native-convention callable running ``kernel``, a callable in MAX's convention::

        kernel(qkv_conv_output, decay_per_token, beta_per_token, recurrent_state, slot_idx,
               input_row_offsets) -> recurrence_output   # recurrent_state updated in place

    on arrays of kind ``array`` (the native inputs may be of any kind). ``o`` comes back
    ``[B, T, HV, V]`` in the input dtype, the final state from the slots in ``pool_dtype``.
    """
    pool_dtype = np.dtype(pool_dtype)

    def launch(args: MaxArguments, want: tuple[int, int]) -> tuple[Any, np.ndarray]:
        before = args.recurrent_state.copy()
        given = [arrays.to_kind(x, array) for x in args.astuple()]
        out = arrays.to_numpy(kernel(*given))
        pool = np.asarray(arrays.to_numpy(given[3]))
        if out is None or tuple(np.shape(out)) != want:
            raise ContractError(f"expected recurrence_output {want}, got {None if out is None else np.shape(out)}")
        if pool.shape != before.shape or pool.dtype != pool_dtype:
            raise ContractError(f"recurrent_state came back {pool.dtype} {pool.shape}, not {pool_dtype} {before.shape}")
        untouched_rows(before, pool, args.slot_idx)
        return out, pool

    return through_max(launch, pool_dtype)


def ring_record_elements(KD: int, VD: int, group: int) -> int:
    """Elements of one ring record (``gated_delta_ring_record_elements``): the token's raw key
    ``[KD]``, one ``[VD]`` row of delta factors per value head of the key head's group, then one
    decay per value head of the group."""
    return KD + group * (VD + 1)


def ring_record_stride(KD: int, VD: int, group: int) -> int:
    """The smallest stride a ring record may have: its elements rounded up to 32 (one 128-byte line)."""
    return -(-ring_record_elements(KD, VD, group) // RING_RECORD_ALIGN) * RING_RECORD_ALIGN


def ring_len_for(window: int) -> int:
    """The shortest compiled ring length holding ``window`` records, else the longest."""
    return next((n for n in RING_LENS if window <= n), RING_LENS[-1])


def verify_geometry(window: int) -> tuple[int, int]:
    """``(K, RING_LEN)``: the verify width (drafts) and ring length for a call whose longest
    sequence has ``window`` tokens. MAX's verify refuses a ring of fewer than ``K + 1`` records
    (H100, 2026-11-27), and its longest ring holds 8: a longer sequence is verified at ``K = 7``
    and commits itself (MAX's documented path for rows past ``RING_LEN``)."""
    width = max(min(window, RING_LENS[-1]) - 1, 0)
    return width, ring_len_for(width + 1)
