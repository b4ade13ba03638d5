"""Planted memory and contract bugs: NumPy plug-ins that the guarded-memory properties must catch.

Each wraps a correct NumPy implementation (the speculative-decoding reference of
``gdn_verify.implementations.speculative`` or the native ``numpy_impl``) and adds one mistake seen in
real kernels. ``BUGS`` maps a name to ``(description, callable, form, property meant to catch it)``;
:func:`implementation` builds the :class:`Implementation`. NumPy cannot write outside an array,
so a stray write goes through the buffer a view came from (``pool.base``); where there is no such
buffer (a pool that owns its memory) the write would land in whatever memory follows the
allocation, which NumPy cannot model, and the plug-in skips it: the guarded buffers of
``spec_guarded_pool`` are what make the bug visible.
"""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np

from gdn_verify.core.conventions import NATIVE_SPEC, l2norm, start_slots
from gdn_verify.core.implementation import SPEC_FORM, ConfigurationError, Implementation
from gdn_verify.implementations import numpy_impl
from gdn_verify.implementations.planted import truncated_keys
from gdn_verify.implementations.speculative import _spec_numpy, spec_reference


def _root(x: np.ndarray) -> np.ndarray:
    """The array that owns ``x``'s memory (``x`` itself when it owns it)."""
    while isinstance(x.base, np.ndarray):
        x = x.base
    return x


def _write_slot_through_base(pool: np.ndarray, slot: int, value: float) -> None:
    """Write ``value`` over slot ``slot`` of ``pool`` at ``pool``'s own slot stride, even past its
    end, through the buffer it is a view of (a raw-pointer store ``base + slot * stride``); what
    lies beyond that buffer is not written (NumPy has no memory there to corrupt)."""
    root = _root(pool)
    if not root.flags.c_contiguous:
        return
    item = pool.dtype.itemsize
    offset = (pool.__array_interface__["data"][0] - root.__array_interface__["data"][0]) // item
    flat = root.reshape(-1)
    first = offset + slot * pool.strides[0] // item
    end = min(first + pool[0].size, flat.size)  # a slot's elements are contiguous in every layout here
    if first < end:
        flat[first:end] = value


def spec_writes_past_last_slot(
    q,
    k,
    v,
    g,
    beta,
    state_pool,
    cu_seqlens,
    ssm_state_indices,
    num_accepted_tokens,
    scale=None,
    use_qk_l2norm_in_kernel=False,
):
    """Off-by-one in the slot index: padding requests (negative start slot) are parked on slot
    ``num_slots`` (the trailing pad slot of a pool allocated with ``num_slots + 1`` rows, which
    the caller's pool does not have) and that slot's state is reset to zero: the store lands just
    past the last slot, starting with the element one past the pool's last one."""
    o = spec_reference(
        q, k, v, g, beta, state_pool, cu_seqlens, ssm_state_indices, num_accepted_tokens, scale, use_qk_l2norm_in_kernel
    )
    if np.any(start_slots(np.asarray(ssm_state_indices), np.asarray(num_accepted_tokens)) < 0):
        _write_slot_through_base(state_pool, state_pool.shape[0], 0.0)
    return o


def spec_padding_as_last_slot(
    q,
    k,
    v,
    g,
    beta,
    state_pool,
    cu_seqlens,
    ssm_state_indices,
    num_accepted_tokens,
    scale=None,
    use_qk_l2norm_in_kernel=False,
):
    """Padding convention ignored on the state path: the output epilogue zeroes a padding request's
    rows, but its ``-1`` entries index the pool as they are, which wraps to the last slot: the
    padding request reads the last slot and stores its tokens' states there."""
    indices = np.asarray(ssm_state_indices, np.int64)
    slots = state_pool.shape[0]
    wrapped = np.where(indices < 0, indices % slots, indices)  # Python's (and a signed offset's) -1
    o = _spec_numpy(
        q, k, v, g, beta, state_pool, cu_seqlens, wrapped, num_accepted_tokens, scale, use_qk_l2norm_in_kernel
    )
    cu = np.asarray(cu_seqlens, np.int64)
    for n in np.flatnonzero(start_slots(indices, np.asarray(num_accepted_tokens)) < 0):
        o[:, cu[n] : cu[n + 1]] = 0  # the outputs follow the convention
    return o


def spec_updates_a_copy(
    q,
    k,
    v,
    g,
    beta,
    state_pool,
    cu_seqlens,
    ssm_state_indices,
    num_accepted_tokens,
    scale=None,
    use_qk_l2norm_in_kernel=False,
):
    """A non-contiguous pool is made contiguous for the kernel (``np.ascontiguousarray``, as a
    launcher's ``.contiguous()``) and the update goes into that copy, never back into the
    caller's pool. A contiguous pool is updated in place, correctly."""
    work = np.ascontiguousarray(state_pool)  # the same array when already contiguous
    return spec_reference(
        q, k, v, g, beta, work, cu_seqlens, ssm_state_indices, num_accepted_tokens, scale, use_qk_l2norm_in_kernel
    )


def spec_state_cache_bf16(
    q,
    k,
    v,
    g,
    beta,
    state_pool,
    cu_seqlens,
    ssm_state_indices,
    num_accepted_tokens,
    scale=None,
    use_qk_l2norm_in_kernel=False,
):
    """A bfloat16 state cache behind a float32 step: each step computes its outputs from the float32
    state, but every stored state is rounded to bfloat16 (a 16-bit ``mamba_ssm_cache_dtype``):
    single steps look right, the carried state drifts."""
    o = spec_reference(
        q, k, v, g, beta, state_pool, cu_seqlens, ssm_state_indices, num_accepted_tokens, scale, use_qk_l2norm_in_kernel
    )
    indices = np.asarray(ssm_state_indices, np.int64)
    cu = np.asarray(cu_seqlens, np.int64)
    starts = start_slots(indices, np.asarray(num_accepted_tokens))
    for n in range(len(cu) - 1):
        if starts[n] < 0:
            continue
        for t in range(int(cu[n + 1] - cu[n])):
            slot = int(indices[n, t])
            if NATIVE_SPEC.stores(slot):
                state_pool[slot] = state_pool[slot].astype(ml_dtypes.bfloat16).astype(np.float32)
    return o


def normalizes_k_in_place(
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
):
    """With ``use_qk_l2norm_in_kernel``, k is l2-normalised into the caller's buffer (``k[...] =``,
    an in-place pre-pass) and the kernel then runs on the normalised q and k: the outputs are
    right, the caller's k is not."""
    if use_qk_l2norm_in_kernel:
        k[...] = l2norm(np.asarray(k, np.float32)).astype(k.dtype)
        q = l2norm(np.asarray(q, np.float32)).astype(q.dtype)
    return numpy_impl.chunk_gated_delta_rule(
        q, k, v, g, beta, scale, initial_state, output_final_state, False, cu_seqlens
    )


_OUTPUT_BUFFERS: dict[tuple, np.ndarray] = {}


def shared_output_buffer(**kw):
    """The output written into one buffer per shape and dtype, cached and handed out by every call:
    a caller keeping one call's result sees it overwritten by the next call of those shapes."""
    o, S = numpy_impl.chunk_gated_delta_rule(**kw)
    buffer = _OUTPUT_BUFFERS.setdefault((o.shape, o.dtype.str), np.empty_like(o))
    buffer[...] = o
    return buffer, S


def read_as(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``x``'s bytes read as ``dtype`` elements, ``x.size`` of them, ``x``'s shape (a kernel compiled
    for a pointer of ``dtype`` handed ``x``); bytes past ``x``'s end read as zeros (NumPy has no
    memory there to read)."""
    raw = np.ascontiguousarray(x).tobytes()
    need = x.size * np.dtype(dtype).itemsize
    raw = raw[:need] + bytes(max(0, need - len(raw)))
    return np.frombuffer(raw, dtype=dtype).reshape(x.shape).copy()


class InitialStateCacheWithoutDtype:
    """A kernel compiled on first use and cached by the shapes and the input dtype, not by the dtypes
    of its optional arrays (``initial_state``, and ``A_log``/``dt_bias`` where passed: FlashInfer PR
    #4219): a later call with one of them in another dtype runs the first call's kernel, which reads
    its bytes as the first dtype. One cache per instance (``implementation`` makes a fresh one: a
    fresh process)."""

    def __init__(self) -> None:
        self.compiled: dict[tuple, np.dtype] = {}

    def __call__(self, **kw):
        shapes = (np.shape(kw["q"]), np.shape(kw["v"]), np.asarray(kw["q"]).dtype.str)
        for name in ("initial_state", "A_log", "dt_bias"):
            if kw.get(name) is not None:
                x = np.asarray(kw[name])
                compiled = self.compiled.setdefault((*shapes, name, x.shape), x.dtype)
                kw = {**kw, name: read_as(x, compiled)}
        return numpy_impl.chunk_gated_delta_rule(**kw)


class KeyTileFromPreviousCall:
    """A launch heuristic kept in one per-process slot keyed without the head size: the key-dim tile
    ``BK`` a call launches with is the one computed for the previous call (the slot is refreshed
    after the launch; the first call computes its own). A call whose ``K`` exceeds the previous
    call's covers only its first ``BK`` key dims (the rest dropped, as
    ``planted.key_dim_tail_truncated`` drops them). One slot per instance."""

    def __init__(self) -> None:
        self.tile: int | None = None

    def __call__(self, **kw):
        K = np.shape(kw["q"])[-1]
        tile = K if self.tile is None else self.tile
        self.tile = K
        return truncated_keys(kw, min(K, tile))


# name: (description, callable, form, the property meant to catch it)
BUGS: dict[str, tuple[str, Callable, str, str]] = {
    "spec_writes_past_last_slot": (
        "padding requests reset slot num_slots, one past the last slot",
        spec_writes_past_last_slot,
        SPEC_FORM,
        "spec_guarded_pool",
    ),
    "spec_padding_as_last_slot": (
        "a padding request's -1 entries read and write the last slot",
        spec_padding_as_last_slot,
        SPEC_FORM,
        "spec_guarded_pool",
    ),
    "spec_updates_a_copy": (
        "a non-contiguous pool is copied and the copy updated",
        spec_updates_a_copy,
        SPEC_FORM,
        "spec_guarded_pool",
    ),
    "spec_state_cache_bf16": (
        "stored states rounded to bfloat16 every step, outputs from the float32 state",
        spec_state_cache_bf16,
        SPEC_FORM,
        "spec_decode_stream",
    ),
    "normalizes_k_in_place": (
        "k is l2-normalised in the caller's buffer",
        normalizes_k_in_place,
        "default",
        "guarded_inputs",
    ),
    "shared_output_buffer": (
        "every call returns the same output buffer, overwritten",
        shared_output_buffer,
        "default",
        "output_isolation",
    ),
    "initial_state_cache_without_dtype": (
        "a kernel cache keyed without the initial state's dtype reads it as the first call's dtype",
        InitialStateCacheWithoutDtype(),
        "default",
        "optional_dtypes",
    ),
    "key_tile_from_previous_call": (
        "each call launched with the previous call's key-dim tile: a larger K is truncated",
        KeyTileFromPreviousCall(),
        "default",
        "shape_class_return",
    ),
}

# Bugs whose callable keeps state across calls (a cache): ``implementation`` gives each a fresh one.
STATEFUL = (InitialStateCacheWithoutDtype, KeyTileFromPreviousCall)


def implementation(bug: str) -> Implementation:
    """The NumPy :class:`Implementation` of one planted memory bug (its one form)."""
    if bug not in BUGS:
        raise ConfigurationError("impl", f"{bug}: unknown planted memory bug; choose from {', '.join(BUGS)}")
    description, fn, form, _ = BUGS[bug]
    if isinstance(fn, STATEFUL):
        fn = type(fn)()
    return Implementation(f"planted-memory:{bug}", {form: fn}, description=description)
