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


# Kernels without GVA (grouped value heads, HV a multiple of H): the cases adapt to H = HV.
def no_gva_refuses(q, k, v, g, beta, **kw):
    """Refuses HV != H, as a kernel that declares the feature unsupported does."""
    if q.shape[2] != v.shape[2]:
        raise NotImplementedError("HV must equal H")
    return recurrent_gated_delta_rule(q, k, v, g, beta, **kw)


def no_gva_heads_of_q(q, k, v, g, beta, **kw):
    """Sizes everything by q's heads, as FLA releases before GVA did: with HV > H it returns
    ``[B, T, H, V]`` and ``[N, H, K, V]`` (the first H value heads' results) and no error."""
    H = q.shape[2]
    h0 = kw.get("initial_state")
    kw = dict(kw, initial_state=None if h0 is None else h0[:, :H])
    return recurrent_gated_delta_rule(q, k, v[:, :, :H], g[:, :, :H], beta[:, :, :H], **kw)


# Returns that break the output contract: each must be a clean failure naming what came back.
def returns_three(q, k, v, g, beta, **kw):
    o, state = recurrent_gated_delta_rule(q, k, v, g, beta, **kw)
    return o, state, None


def returns_none(q, k, v, g, beta, **kw):
    return None


def returns_integer_output(q, k, v, g, beta, **kw):
    o, state = recurrent_gated_delta_rule(q, k, v, g, beta, **kw)
    return o.astype(np.int32), state


def returns_transposed_state(q, k, v, g, beta, **kw):
    """The final state handed back v-first ``[N, HV, V, K]`` where k-first is asked for (K = V here:
    the shape cannot tell, the oracle can)."""
    o, state = recurrent_gated_delta_rule(q, k, v, g, beta, **kw)
    return o, np.ascontiguousarray(np.swapaxes(state, -1, -2))


def returns_one_state_short(q, k, v, g, beta, **kw):
    """Drops the last sequence's final state."""
    o, state = recurrent_gated_delta_rule(q, k, v, g, beta, **kw)
    return o, state[:-1]


def returns_numpy_for_torch(q, k, v, g, beta, **kw):
    """Takes torch tensors, hands back NumPy arrays."""
    host = {
        name: x.cpu().numpy() if hasattr(x, "cpu") else x for name, x in dict(kw, q=q, k=k, v=v, g=g, beta=beta).items()
    }
    return recurrent_gated_delta_rule(**host)
