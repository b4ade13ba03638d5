"""The float32 NumPy implementation shipped with the toolkit (``--impl numpy``).

It runs the oracle's algebra (``reference.recurrent_core`` / ``chunk_core``) in float32, the
precision a GPU kernel's state has in this convention, and returns ``o`` in the input dtype and
the final state in float32, like FLA. It is the CPU stand-in for a correct kernel: the
tolerance model is calibrated so that it passes. It also takes FLA's in-kernel gate options
(``use_gate_in_kernel`` with ``A_log``/``dt_bias``, ``use_beta_sigmoid_in_kernel``,
``allow_neg_eigval``), applied in float64 and rounded to float32 before the recurrence.
"""

from __future__ import annotations

import numpy as np

from gdn_verify.core.conventions import export_state, pack, unpack_output
from gdn_verify.core.gating import in_kernel_gates
from gdn_verify.core.reference import chunk_core, recurrent_core


def _run(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, state_v_first,
         cu_seqlens, chunk_size: int | None, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
         allow_neg_eigval):
    if use_gate_in_kernel or use_beta_sigmoid_in_kernel or allow_neg_eigval:
        g, beta = (x.astype(np.float32) for x in in_kernel_gates(g, beta, use_gate_in_kernel, A_log, dt_bias,
                                                                 use_beta_sigmoid_in_kernel, allow_neg_eigval))
    p = pack(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel, state_v_first, cu_seqlens,
             dtype=np.float32, pad_to_multiple=chunk_size or 1)
    o, S = recurrent_core(p) if chunk_size is None else chunk_core(p, chunk_size)
    final_state = export_state(p, S).astype(np.float32) if output_final_state else None
    return unpack_output(p, o).astype(np.asarray(v).dtype), final_state


def recurrent_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, cu_seqlens=None, state_v_first=False,
                               use_gate_in_kernel=False, A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False,
                               allow_neg_eigval=False):
    """Float32 token loop. Returns ``(o [B, T, HV, V] in v's dtype, final_state float32 | None)``."""
    return _run(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                state_v_first, cu_seqlens, None, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
                allow_neg_eigval)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, cu_seqlens=None, state_v_first=False, chunk_size=64,
                           use_gate_in_kernel=False, A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False,
                           allow_neg_eigval=False):
    """Float32 chunked (WY/UT) form with chunk size 16, 32 or 64."""
    return _run(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                state_v_first, cu_seqlens, chunk_size, use_gate_in_kernel, A_log, dt_bias, use_beta_sigmoid_in_kernel,
                allow_neg_eigval)
