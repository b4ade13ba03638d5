"""The recurrent (token-by-token) gated delta rule on the GPU: prefill, decode and the GPU oracle.

:func:`recurrent_gated_delta_rule` takes FLA's arguments (``chunk_gated_delta_rule`` /
``fused_recurrent_gated_delta_rule``), fixed-length batches or ``cu_seqlens``, and FLA's in-kernel
gate options. The decode family (state pools, speculative decoding, FlashInfer's raw-gate step,
:class:`DecodeStep`) lives in ``decode.py``.
Tensor policy (copies, synchronization, streams, errors): the ``cupy_kernels`` package docstring.
"""

from __future__ import annotations

import sys
from typing import Any

from cupy_kernels import recurrent_kernel
from cupy_kernels import tensors as ts


def _to_double(x: Any) -> Any:
    """Float64 copy of an initial state for the GPU oracle (a documented copy; none if already float64)."""
    if ts.is_torch(x):
        return x.to(sys.modules["torch"].float64).contiguous()
    cp = ts.cupy()
    arr = x if isinstance(x, cp.ndarray) else cp.from_dlpack(x)
    return cp.ascontiguousarray(arr, dtype=cp.float64)


def recurrent_gated_delta_rule(
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    scale: float | None = None,
    initial_state: Any = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Any = None,
    *,
    use_gate_in_kernel: bool = False,
    A_log: Any = None,
    dt_bias: Any = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    precision: str = "float32",
    checked: bool | None = None,
) -> tuple[Any, Any | None]:
    """Gated delta rule, token by token on the GPU, in the native (FLA) convention.

    ``q, k`` ``[B, T, H, K]`` and ``v`` ``[B, T, HV, V]`` (one float dtype: float32, float16,
    bfloat16 via torch, float64; any strides with the last dim contiguous); ``g, beta``
    ``[B, T, HV]`` (any float dtype); ``initial_state`` ``[N, HV, K, V]`` (``[N, HV, V, K]`` with
    ``state_v_first``) float32, contiguous; ``cu_seqlens`` ``[N + 1]`` int32/int64 with ``B == 1``
    (zero-length sequences allowed). ``1 <= K, V <= 256``.

    FLA's options: ``use_gate_in_kernel`` (``g`` raw, decay ``-exp(A_log) * softplus(g + dt_bias)``,
    ``A_log [HV]`` required, ``dt_bias [HV]`` optional), ``use_beta_sigmoid_in_kernel`` (``beta``
    holds logits) and ``allow_neg_eigval`` (``beta = 2 * sigmoid(beta)``).

    ``cu_seqlens`` must satisfy ``0 = c[0] <= ... <= c[N] = T``: checked on the host when it is on
    the host, by the kernel when it is on the device (``ValueError`` now with ``checked=True``, else
    from the next launcher call or ``cupy_kernels.check_errors()``).

    Returns ``(o [B, T, HV, V] in q's dtype, final_state [N, HV, K, V] float32 or None)``.
    ``precision="float64"`` is the GPU oracle: compute and state in float64, ``o`` and the final
    state float64 (a float32 ``initial_state`` is promoted, which copies it).
    """
    if precision not in ("float32", "float64"):
        raise ValueError(f"precision: expected 'float32' or 'float64', got {precision!r}")
    recurrent_kernel.options(use_gate_in_kernel, A_log, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    double = precision == "float64"
    if double and initial_state is not None:
        initial_state = _to_double(initial_state)
    req = recurrent_kernel.Request(
        "initial",
        scale,
        bool(use_qk_l2norm_in_kernel),
        bool(state_v_first),
        double,
        bool(output_final_state),
        bool(use_gate_in_kernel),
        bool(use_beta_sigmoid_in_kernel),
        bool(allow_neg_eigval),
    )
    args = (q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens, None, None)
    return recurrent_kernel.run(req, args, checked=checked, source="recurrent_gated_delta_rule")
