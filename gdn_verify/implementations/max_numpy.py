"""NumPy references in Modular MAX's ``gated_delta`` convention (``gdn_verify.core.max_convention``).

Written from the kernel's description (the seed ``001_*.txt`` and the wheel's docstrings), not by
calling our oracle: float32 throughout, one sequence at a time, each token the five steps of the
seed (decay the state column, ``kv_memory`` from the L2-normalised key, the delta, the
outer-product update, the readout with the scaled, L2-normalised query), factored as MAX's
``_gated_delta_token_step`` is (the raw key times ``beta (v - kv_memory) / ||k||``), so that
:func:`verify_ring` plus :func:`state_fold` equal :func:`gated_delta_recurrence` bit for bit, as
MAX documents for float32 rings.

- :func:`gated_delta_recurrence`: ``gated_delta_recurrence_fwd``, a plug-in for
  ``check --impl gdn_verify.implementations.max_numpy:gated_delta_recurrence --convention max``.
- :func:`verify_ring`, :func:`state_fold`: ``gated_delta_recurrence_verify_ring_fwd`` and
  ``gated_delta_state_fold`` (the speculative verify writes per-token records to a ring
  ``[ring_rows, nk, RING_LEN, record_stride]``; the fold advances the pool over the first
  ``num_accepted[b]`` of them), stand-ins for MAX's kernels in the adapters' CPU tests.
- :func:`with_bug`: the recurrence with one planted MAX-convention bug (``planted.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from gdn_verify.core.conventions import L2NORM_EPS
from gdn_verify.core.max_convention import key_heads, ring_record_elements

F32 = np.float32
# Planted MAX-convention bugs (``with_bug``): the linear decay read as a log-space rate (the state
# multiplied by exp(-decay), as a kernel written for Mamba's dA = exp(-A dt) would), and the state
# read from the pool row after the item's own (written back to its own).
BUGS = ("decay_as_log_rate", "slot_read_off_by_one")


class _Heads:
    """The geometry of one call, from the pool's shape and ``conv_dim``."""

    def __init__(self, conv_dim: int, pool_shape: tuple[int, ...]):
        _, self.nv, self.KD, self.VD = pool_shape
        self.nk = key_heads(conv_dim, self.nv, self.KD, self.VD)
        self.group = self.nv // self.nk
        self.key_dim = self.nk * self.KD
        self.key_head = np.arange(self.nv) // self.group  # GQA: value head h reads key head h // group


def _inverse_norm(x: np.ndarray) -> np.ndarray:
    """``1 / sqrt(||x||^2 + eps)`` over the last axis (the fused L2 norm's scalar)."""
    return F32(1.0) / np.sqrt(np.einsum("...i,...i->...", x, x) + F32(L2NORM_EPS))


def _token_step(S, q_raw, k_raw, v, decay, beta, geo: _Heads, log_rate: bool = False):
    """Advance ``S`` ``[nv, KD, VD]`` over one token; ``(readout [nv, VD], key_update_factor [nv, VD])``.

    ``q_raw, k_raw`` ``[nk, KD]``, ``v`` ``[nv, VD]``, ``decay, beta`` ``[nv]``, all float32.
    """
    q, k = q_raw[geo.key_head], k_raw[geo.key_head]  # [nv, KD]
    factor = np.exp(-decay) if log_rate else decay.astype(F32)
    S *= factor[:, None, None]  # 1. decay the whole state column first
    inv_k = _inverse_norm(k)
    kv_memory = np.einsum("hk,hkv->hv", k, S) * inv_k[:, None]  # 2. against the normalised key
    update = beta[:, None] * (v - kv_memory) * inv_k[:, None]  # 3. the delta, over ||k||
    S += k[:, :, None] * update[:, None, :]  # 4. raw key times the update factor
    query = _inverse_norm(q) * F32(geo.KD**-0.5)
    return np.einsum("hk,hkv->hv", q, S) * query[:, None], update  # 5. the scaled, normalised readout


def _rows(qkv: np.ndarray, t: int, geo: _Heads) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ``t``'s raw q, k ``[nk, KD]`` and v ``[nv, VD]`` from the packed conv output."""
    row = qkv[t]
    q = row[: geo.key_dim].reshape(geo.nk, geo.KD)
    k = row[geo.key_dim : 2 * geo.key_dim].reshape(geo.nk, geo.KD)
    return q, k, row[2 * geo.key_dim :].reshape(geo.nv, geo.VD)


def _recurrence(
    qkv_conv_output,
    decay_per_token,
    beta_per_token,
    recurrent_state,
    slot_idx,
    input_row_offsets,
    bug: str | None = None,
) -> np.ndarray:
    qkv = np.asarray(qkv_conv_output, F32)
    decay, beta = np.asarray(decay_per_token, F32), np.asarray(beta_per_token, F32)
    geo = _Heads(qkv.shape[1], recurrent_state.shape)
    offsets = np.asarray(input_row_offsets).astype(np.int64)
    out = np.zeros((qkv.shape[0], geo.nv * geo.VD), F32)
    for b, slot in enumerate(np.asarray(slot_idx).astype(np.int64)):
        read = slot + 1 if bug == "slot_read_off_by_one" else slot
        S = recurrent_state[read].astype(F32)  # the column lives in float32 registers
        for t in range(offsets[b], offsets[b + 1]):
            o, _ = _token_step(S, *_rows(qkv, t, geo), decay[t], beta[t], geo, log_rate=bug == "decay_as_log_rate")
            out[t] = o.reshape(-1)
        recurrent_state[slot] = S.astype(recurrent_state.dtype)  # stored back in the pool's dtype
    return out


def gated_delta_recurrence(
    qkv_conv_output, decay_per_token, beta_per_token, recurrent_state, slot_idx, input_row_offsets
) -> np.ndarray:
    """``gated_delta_recurrence_fwd`` in float32: ``[N, nv * VD]``; ``recurrent_state``
    ``[max_slots, nv, KD, VD]`` (float32 or bfloat16) updated in place at ``slot_idx[b]``."""
    return _recurrence(qkv_conv_output, decay_per_token, beta_per_token, recurrent_state, slot_idx, input_row_offsets)


def with_bug(bug: str) -> Callable[..., np.ndarray]:
    """:func:`gated_delta_recurrence` with one of :data:`BUGS` planted."""
    if bug not in BUGS:
        raise ValueError(f"unknown MAX-convention bug {bug!r}; choose from {', '.join(BUGS)}")
    return partial(_recurrence, bug=bug)


def verify_ring(
    qkv_conv_output,
    decay_per_token,
    beta_per_token,
    recurrent_state,
    ring,
    slot_idx,
    ring_slot_idx,
    input_row_offsets,
    verify_width,
) -> np.ndarray:
    """``gated_delta_recurrence_verify_ring_fwd``: the recurrence's readout without writing the pool.

    Token ``p`` of item ``b`` records, for each key head ``kh``, at ``ring[ring_slot_idx[b], kh, p]``:
    the raw key ``[KD]``, the update factor row ``[VD]`` of each value head of the group, then
    their decays. A row longer than ``RING_LEN`` records nothing and commits its state; a verify
    width of zero (``len(verify_width) == 0``) is the plain recurrence.
    """
    if len(verify_width) == 0:
        return gated_delta_recurrence(
            qkv_conv_output, decay_per_token, beta_per_token, recurrent_state, slot_idx, input_row_offsets
        )
    qkv = np.asarray(qkv_conv_output, F32)
    decay, beta = np.asarray(decay_per_token, F32), np.asarray(beta_per_token, F32)
    geo = _Heads(qkv.shape[1], recurrent_state.shape)
    ring_len = ring.shape[2]
    drafts = len(verify_width)
    if ring_len < drafts + 1:  # MAX's kernel refuses it the same way
        raise ValueError(f"a verify of {drafts} drafts needs a ring of at least {drafts + 1} records, got {ring_len}")
    if ring.shape[3] < ring_record_elements(geo.KD, geo.VD, geo.group):
        raise ValueError(f"ring: record_stride {ring.shape[3]} holds less than one record")
    offsets = np.asarray(input_row_offsets).astype(np.int64)
    out = np.zeros((qkv.shape[0], geo.nv * geo.VD), F32)
    deltas = geo.KD + np.arange(geo.group)[:, None] * geo.VD + np.arange(geo.VD)  # [group, VD]
    decays = geo.KD + geo.group * geo.VD + np.arange(geo.group)
    for b, slot in enumerate(np.asarray(slot_idx).astype(np.int64)):
        S = recurrent_state[slot].astype(F32)
        length = offsets[b + 1] - offsets[b]
        row = ring[int(ring_slot_idx[b])]
        for p, t in enumerate(range(offsets[b], offsets[b + 1])):
            q, k, v = _rows(qkv, t, geo)
            o, update = _token_step(S, q, k, v, decay[t], beta[t], geo)
            out[t] = o.reshape(-1)
            if length <= ring_len:
                row[:, p, : geo.KD] = k
                row[:, p, deltas] = update.reshape(geo.nk, geo.group, geo.VD)
                row[:, p, decays] = decay[t].reshape(geo.nk, geo.group)
        if length > ring_len:
            recurrent_state[slot] = S.astype(recurrent_state.dtype)  # too long to record: committed
    return out


def state_fold(recurrent_state, ring, row_ids, ring_row_ids, num_accepted, verify_width) -> None:
    """``gated_delta_state_fold``: advance ``recurrent_state[row_ids[l, b]]`` over the first
    ``num_accepted[b]`` records of ``ring[ring_row_ids[l, b]]``; a count of 0 or past ``RING_LEN``
    leaves the row alone, and a verify width of zero folds nothing."""
    if len(verify_width) == 0:
        return
    _, nv, KD, VD = recurrent_state.shape
    nk, ring_len = ring.shape[1], ring.shape[2]
    group = nv // nk
    key_head = np.arange(nv) // group
    deltas = KD + (np.arange(nv) % group)[:, None] * VD + np.arange(VD)  # [nv, VD], in each key head's record
    decays = KD + group * VD + np.arange(nv) % group
    rows, ring_rows = np.asarray(row_ids).astype(np.int64), np.asarray(ring_row_ids).astype(np.int64)
    for layer in range(rows.shape[0]):
        for b, accepted in enumerate(np.asarray(num_accepted).astype(np.int64)):
            if accepted == 0 or accepted > ring_len:
                continue
            S = recurrent_state[rows[layer, b]].astype(F32)
            records = ring[ring_rows[layer, b]][key_head]  # [nv, RING_LEN, record_stride]
            for p in range(accepted):
                record = records[:, p]
                S *= record[np.arange(nv), decays][:, None, None]
                S += record[:, :KD, None] * np.take_along_axis(record, deltas, axis=1)[:, None, :]
            recurrent_state[rows[layer, b]] = S.astype(recurrent_state.dtype)
