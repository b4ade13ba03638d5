"""NumPy kernels with the bugs the scale tier exists for, at limits small enough for a CPU.

``LIMITS`` shrinks the launch-grid dimension to 8 blocks and int32 offsets to 2^11 elements; each
plug-in below breaks exactly where a real kernel breaks at 65535 and 2^31.
"""

from __future__ import annotations

import os

import numpy as np

from gdn_verify.core.reference import recurrent_gated_delta_rule
from gdn_verify.runners.scale import ScaleLimits

LIMITS = ScaleLimits(grid=8, offset=2**11, chunk=4, head_dim=4)


def _sequences(q, cu_seqlens) -> int:
    return q.shape[0] if cu_seqlens is None else len(cu_seqlens) - 1


def correct(q, k, v, g, beta, **kw):
    return recurrent_gated_delta_rule(q, k, v, g, beta, **kw)


def skips_past_grid(q, k, v, g, beta, **kw):
    """Launches one block per (sequence, value head) on a grid dimension of ``LIMITS.grid``
    blocks: the blocks past it never run, their outputs and states stay zero."""
    o, state = recurrent_gated_delta_rule(q, k, v, g, beta, **kw)
    HV = v.shape[2]
    bounds = np.arange(q.shape[0] + 1) * q.shape[1] if kw.get("cu_seqlens") is None else kw["cu_seqlens"]
    flat = o.reshape(-1, HV, v.shape[3])
    for n in range(len(bounds) - 1):
        for h in range(HV):
            if n * HV + h >= LIMITS.grid:
                flat[bounds[n] : bounds[n + 1], h] = 0
                if state is not None:
                    state[n, h] = 0
    return o, state


def int32_offsets(q, k, v, g, beta, **kw):
    """Token offsets of q, k and v computed modulo ``LIMITS.offset`` elements: a later sample or
    sequence reads an earlier one's tokens (an int32 ``t * H * K`` that wrapped)."""

    def wrapped(x):
        per_token = int(np.prod(x.shape[2:]))
        flat = x.reshape(-1, *x.shape[2:])
        tokens = np.arange(flat.shape[0])
        return flat[(tokens * per_token) % LIMITS.offset // per_token].reshape(x.shape)

    return recurrent_gated_delta_rule(wrapped(q), wrapped(k), wrapped(v), g, beta, **kw)


def crashes_on_many_sequences(q, k, v, g, beta, **kw):
    """Dies (an illegal address kills a CUDA context and, often, the process) past the grid."""
    if _sequences(q, kw.get("cu_seqlens")) * v.shape[2] > LIMITS.grid:
        os.abort()
    return recurrent_gated_delta_rule(q, k, v, g, beta, **kw)


def launch_error(q, k, v, g, beta, **kw):
    """Refuses the launch past the grid with the driver's error, as torch surfaces it."""
    if _sequences(q, kw.get("cu_seqlens")) * v.shape[2] > LIMITS.grid:
        raise RuntimeError("CUDA error: invalid configuration argument")
    return recurrent_gated_delta_rule(q, k, v, g, beta, **kw)
