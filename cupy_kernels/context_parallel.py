"""The algebra of the context-parallel chunked forward (``chunk.py``), pure and array-agnostic
(NumPy or torch arrays: indexing, reshapes and a batched product-and-add), so the CPU tests run
it against the float64 oracle with the same functions the launcher uses.

The state of a sequence after a run of tokens is affine in the state before it: every value
column evolves on its own, ``S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``
(S is K x V), so a segment maps ``S -> M S + B`` with ``M`` (K x K) the segment's state from the
identity with zero values and ``B`` (K x V) its state from zero with its values. Splitting each
sequence into J runs of whole chunks (:func:`segment_bounds`) makes the segments independent
"sequences" for the state kernel; :func:`scan_segment_states` chains them.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from cupy_kernels import tensors as ts


def segment_bounds(bounds: np.ndarray, chunk_size: int, segments: int) -> np.ndarray:
    """``[N * segments + 1]`` token offsets splitting each sequence of ``bounds [N + 1]`` into
    ``segments`` runs of ``ceil(chunks / segments)`` whole chunks (the last run takes the ragged
    last chunk; runs past the sequence's chunks are empty). Chunk boundaries are unchanged, so the
    chunk tables of the result list the same chunks as those of ``bounds``, and segment
    ``n * segments + j`` is the ``j``-th run of sequence ``n``."""
    bounds = np.asarray(bounds, np.int64)
    lengths = np.diff(bounds)
    chunks = -(-lengths // chunk_size)
    per = -(-chunks // segments) * chunk_size  # tokens per run: whole chunks
    cuts = bounds[:-1, None] + np.minimum(np.arange(segments)[None, :] * per[:, None], lengths[:, None])
    return np.append(cuts.reshape(-1), bounds[-1])


def scan_segment_states(M: Any, B: Any, initial: Any, segments: int) -> tuple[Any, Any]:
    """Chain the segments of each sequence: the start state of segment ``j + 1`` is ``M_j S_j + B_j``
    with ``S_0 = initial``. Returns ``(starts, final)``: each segment's start state and each
    sequence's state after its last segment.

    ``M [N * segments, HV, K, K]`` and ``B [N * segments, HV, K, V]`` in the state kernel's order
    (segment ``n * segments + j``) and dtype, ``initial [N, HV, K, V]`` in the dtype the scan runs
    in (the launcher: float64); ``starts [N * segments, HV, K, V]`` in the same order and B's dtype,
    ``final [N, HV, K, V]`` in initial's. The scan runs segment-major (``[segments, N * HV, ...]``,
    one copy in and one out), so each of its ``segments`` steps is one batched product-and-add over
    contiguous blocks: a single ``torch.baddbmm`` kernel on a GPU rather than a strided matmul, an
    add and a copy."""
    J = segments
    N = initial.shape[0]
    _, HV, K, V = B.shape
    Ms = _segment_major(M, J, initial.dtype)
    Bs = _segment_major(B, J, initial.dtype)
    chain = _empty_like(initial, (J + 1, N * HV, K, V))
    chain[0] = initial.reshape(N * HV, K, V)
    for j in range(J):
        _matmul_add(Bs[j], Ms[j], chain[j], chain[j + 1])
    starts = _empty_like(B, B.shape)
    starts.reshape(N, J, HV, K, V)[...] = _swap01(chain[:J].reshape(J, N, HV, K, V))
    return starts, chain[J].reshape(N, HV, K, V)


def _empty_like(x: Any, shape: tuple, dtype: Any = None) -> Any:
    dtype = x.dtype if dtype is None else dtype
    return x.new_empty(shape, dtype=dtype) if ts.is_torch(x) else np.empty(shape, dtype)


def _swap01(x: Any) -> Any:
    return x.transpose(0, 1) if ts.is_torch(x) else x.swapaxes(0, 1)


def _segment_major(x: Any, J: int, dtype: Any) -> Any:
    """``[N * J, HV, K, X]`` (segment ``n * J + j``) as a contiguous ``[J, N * HV, K, X]`` of ``dtype``."""
    NJ, HV, K, X = x.shape
    out = _empty_like(x, (J, NJ // J * HV, K, X), dtype)
    out.reshape(J, NJ // J, HV, K, X)[...] = _swap01(x.reshape(NJ // J, J, HV, K, X))
    return out


def _matmul_add(b: Any, m: Any, s: Any, out: Any) -> None:
    """``out = m @ s + b`` over a batch of matrices, one kernel with torch."""
    if ts.is_torch(m):
        sys.modules["torch"].baddbmm(b, m, s, out=out)
    else:
        np.matmul(m, s, out=out)
        out += b
