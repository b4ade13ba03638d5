"""The algebra of the context-parallel chunked forward (``chunk.py``), pure and array-agnostic
(NumPy or torch arrays: only indexing, ``@`` and ``+``), so the CPU tests run it against the
float64 oracle with the same functions the launcher uses.

The state of a sequence after a run of tokens is affine in the state before it: every value
column evolves on its own, ``S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``
(S is K x V), so a segment maps ``S -> M S + B`` with ``M`` (K x K) the segment's state from the
identity with zero values and ``B`` (K x V) its state from zero with its values. Splitting each
sequence into J runs of whole chunks (:func:`segment_bounds`) makes the segments independent
"sequences" for the state kernel; :func:`scan_segment_states` chains them.
"""

from __future__ import annotations

from typing import Any

import numpy as np


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


def scan_segment_states(M: Any, B: Any, initial: Any, starts: Any) -> Any:
    """Chain the segments of each sequence: ``starts[:, 0] = initial`` and ``starts[:, j + 1] =
    M[:, j] @ starts[:, j] + B[:, j]``; returns the state after the last segment.

    ``M [N, J, HV, K, K]``, ``B [N, J, HV, K, V]``, ``initial [N, HV, K, V]`` and ``starts [N, J,
    HV, K, V]`` (written) of one dtype (the launcher scans in float64). J steps, each one batched
    product over sequences and heads."""
    state = initial
    for j in range(M.shape[1]):
        starts[:, j] = state
        state = M[:, j] @ state + B[:, j]
    return state
