"""Adapters from the native convention to FlashInfer's GDN kernels (translation only).

``flashinfer-prefill``: ``flashinfer.gdn_prefill.chunk_gated_delta_rule``. Packed ``[T_total, H, D]``
tokens with int64 ``cu_seqlens`` (a batched native call is flattened and given generated
offsets), the decay as ``alpha = exp(g)`` in linear space (float32), ``beta`` float32, and a
k-last state ``[N, HV, V, K]``. FlashInfer has one ``head_size``, so ``K != V`` is unsupported,
and it reads ``scale = 0`` as "the default", so that is unsupported too.

``flashinfer-decode``: ``flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose``. One token
per sequence per call with raw gates ``g = -exp(A_log) softplus(a + dt_bias)``,
``beta = sigmoid(b)`` and a k-last float32 state updated in place. A native call of ``T``
tokens becomes ``T`` decode steps over the sequences still running. The native ``(g, beta)``
are encoded as ``A_log = 0``, ``dt_bias = 0``, ``a = softplus^-1(-g)``, ``b = logit(beta)``,
cast to the input dtype (FlashInfer takes ``a, b`` in float16/bfloat16). Round trip, with
``u`` the unit roundoff of that dtype (derivatives of softplus and sigmoid times ``|a| u``):

- ``|exp(g') - exp(g)| <= u / e`` (absolute; ``|g' - g| <= u (|g| + 0.28)``);
- ``|beta' - beta| <= 0.224 u``;
- plus at most ``4.3e-18`` where ``g == 0`` or ``beta`` is exactly 0 or 1: those need infinite
  raw gates, so ``a`` and ``b`` are clamped to ``[-RAW_LIMIT, RAW_LIMIT]``
  (``sigmoid(-40) = 4.2e-18``; ``exp(-4.2e-18)`` rounds to 1 even in float64).

The translations take an :class:`ArrayOps` so that the CPU tests can run them on NumPy arrays
with the float64 oracle standing in for the kernel; only :func:`_flashinfer_kernels` imports
FlashInfer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gdn_verify.core.implementation import Implementation
from gdn_verify.implementations.fla import cuda_library, jit_compiled

RAW_LIMIT = 40.0


class NumpyOps:
    """The few array operations the translations need, for NumPy arrays."""

    lib = np
    state_dtype = np.float32  # dtype of state buffers the decode adapter allocates

    def float32(self, x):
        return np.ascontiguousarray(x, dtype=np.float32)

    def float64(self, x):
        return np.asarray(x, dtype=np.float64)

    def cast_like(self, x, like):
        return np.asarray(x).astype(np.asarray(like).dtype)

    def contiguous(self, x):
        return np.ascontiguousarray(x)

    def copy(self, x):
        return np.array(x, copy=True)

    def zeros(self, shape, like, dtype=None):
        return np.zeros(shape, dtype if dtype is not None else np.asarray(like).dtype)

    def from_host(self, a: np.ndarray, like):
        return a

    def to_host(self, x) -> np.ndarray:
        return np.asarray(x)


class TorchOps(NumpyOps):
    """The same operations for torch tensors (imported on first use)."""

    def __init__(self):
        import torch

        self.lib = torch
        self.state_dtype = torch.float32

    def float32(self, x):
        return x.to(self.lib.float32).contiguous()

    def float64(self, x):
        return x.to(self.lib.float64)

    def cast_like(self, x, like):
        return x.to(like.dtype)

    def contiguous(self, x):
        return x.contiguous()

    def copy(self, x):
        return x.clone()

    def zeros(self, shape, like, dtype=None):
        return self.lib.zeros(shape, dtype=dtype if dtype is not None else like.dtype, device=like.device)

    def from_host(self, a: np.ndarray, like):
        return self.lib.as_tensor(a, device=like.device)

    def to_host(self, x) -> np.ndarray:
        return x.detach().cpu().numpy()


def _bounds(ops, cu_seqlens, B: int, T: int) -> np.ndarray:
    if cu_seqlens is None:
        return np.arange(B + 1, dtype=np.int64) * T
    return ops.to_host(cu_seqlens).astype(np.int64)


def _state_in(ops, initial_state, state_v_first: bool):
    """Native ``[N, HV, K, V]`` (or already k-last with ``state_v_first``) -> k-last ``[N, HV, V, K]``."""
    if initial_state is None:
        return None
    return ops.contiguous(initial_state if state_v_first else initial_state.swapaxes(-1, -2))


def _state_out(ops, state, state_v_first: bool):
    return ops.contiguous(state if state_v_first else state.swapaxes(-1, -2))


def _head_shapes(q, v, scale) -> tuple[int, int, int, int, int, int]:
    """``(B, T, H, K, HV, V)``; ``scale=0`` is not expressible (FlashInfer reads it as the default)."""
    if scale is not None and scale == 0.0:
        raise NotImplementedError("FlashInfer reads scale=0 as the default K**-0.5")
    B, T, H, K = q.shape
    return B, T, H, K, v.shape[2], v.shape[3]


def prefill_adapter(kernel: Callable, ops=None) -> Callable:
    """A native-convention callable running FlashInfer's prefill ``kernel`` (same signature)."""
    ops = ops or NumpyOps()

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
        B, T, H, K, HV, V = _head_shapes(q, v, scale)
        if K != V:
            raise NotImplementedError(f"FlashInfer's GDN has one head_size; K={K} != V={V}")
        cu = ops.from_host(_bounds(ops, cu_seqlens, B, T), like=q)
        result = kernel(
            q=ops.contiguous(q.reshape(B * T, H, K)),
            k=ops.contiguous(k.reshape(B * T, H, K)),
            v=ops.contiguous(v.reshape(B * T, HV, V)),
            g=ops.float32(ops.lib.exp(ops.float64(g.reshape(B * T, HV)))),  # alpha: linear space
            beta=ops.float32(beta.reshape(B * T, HV)),
            scale=scale,
            initial_state=_state_in(ops, initial_state, state_v_first),
            output_final_state=output_final_state,
            cu_seqlens=cu,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        )
        o, final_state = result if output_final_state else (result, None)
        o = o.reshape(B, T, HV, V)
        return o, None if final_state is None else _state_out(ops, final_state, state_v_first)

    return call


def raw_gates(ops, g, beta):
    """``(a, b)`` with ``-softplus(a) = g`` and ``sigmoid(b) = beta`` (float64, clamped; see module doc)."""
    lib = ops.lib
    y = lib.clip(-ops.float64(g), float(np.log1p(np.exp(-RAW_LIMIT))), None)  # -g >= softplus(-RAW_LIMIT)
    a = y + lib.log(-lib.expm1(-y))  # softplus^-1(y), stable for large and tiny y
    p = lib.clip(ops.float64(beta), float(1.0 / (1.0 + np.exp(RAW_LIMIT))), 1.0 - 2.0**-53)
    b = lib.log(p) - lib.log1p(-p)
    return a, lib.clip(b, -RAW_LIMIT, RAW_LIMIT)


def decode_adapter(kernel: Callable, ops=None) -> Callable:
    """A native-convention callable running FlashInfer's decode ``kernel`` one token per step."""
    ops = ops or NumpyOps()

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
        B, T, H, K, HV, V = _head_shapes(q, v, scale)
        bounds = _bounds(ops, cu_seqlens, B, T)
        lengths = np.diff(bounds)
        flat = [x.reshape((B * T,) + tuple(x.shape[2:])) for x in (q, k, v)]
        a, b = (ops.cast_like(x.reshape(B * T, HV), q) for x in raw_gates(ops, g, beta))
        state = _state_in(ops, initial_state, state_v_first)
        if state is None:
            state = ops.zeros((len(lengths), HV, V, K), like=q, dtype=ops.state_dtype)
        else:
            state = ops.copy(state)  # the kernel updates its state in place; the caller's stays intact
        A_log = ops.float32(ops.zeros((HV,), like=q))  # FlashInfer takes A_log and dt_bias in float32
        dt_bias = ops.float32(ops.zeros((HV,), like=q))
        o = ops.zeros((B * T, HV, V), like=v)
        for t in range(int(lengths.max(initial=0))):
            running = np.flatnonzero(lengths > t)
            seq = ops.from_host(running, like=q)
            tok = ops.from_host(bounds[running] + t, like=q)
            step_state = ops.contiguous(state[seq])
            o_t, step_state = kernel(
                q=ops.contiguous(flat[0][tok][:, None]),
                k=ops.contiguous(flat[1][tok][:, None]),
                v=ops.contiguous(flat[2][tok][:, None]),
                state=step_state,
                A_log=A_log,
                a=a[tok][:, None],
                dt_bias=dt_bias,
                b=b[tok][:, None],
                scale=scale,
                use_qk_l2norm=use_qk_l2norm_in_kernel,
            )
            o[tok] = ops.cast_like(o_t[:, 0], o)
            state[seq] = step_state
        final_state = _state_out(ops, state, state_v_first) if output_final_state else None
        return o.reshape(B, T, HV, V), final_state

    return call


def _flashinfer_kernels() -> tuple[Callable, Callable]:
    """FlashInfer's prefill and decode entry points; the only place that imports FlashInfer."""

    def load():
        from flashinfer.gdn_decode import gated_delta_rule_decode_pretranspose
        from flashinfer.gdn_prefill import chunk_gated_delta_rule

        return chunk_gated_delta_rule, gated_delta_rule_decode_pretranspose

    return cuda_library("FlashInfer", "pip install flashinfer-python", load)


def _decode_limits(kernel: Callable) -> Callable:
    """Report FlashInfer decode's documented input limits as unsupported rather than as crashes."""

    def call(q, k, v, state, **kw) -> Any:
        K, V = q.shape[-1], v.shape[-1]
        if str(q.dtype) not in ("torch.float16", "torch.bfloat16"):
            raise NotImplementedError(f"FlashInfer decode takes float16/bfloat16 q, k, v; got {q.dtype}")
        if K < 128 or V < 128 or V % 8:
            raise NotImplementedError(f"FlashInfer's float32-state decode needs K, V >= 128, V % 8 == 0 (K={K}, V={V})")
        return kernel(q=q, k=k, v=v, state=state, **kw)

    return call


def flashinfer_prefill() -> Implementation:
    prefill, _ = _flashinfer_kernels()
    return Implementation(
        "flashinfer-prefill",
        {"chunk": prefill_adapter(prefill, TorchOps())},
        "torch",
        "FlashInfer chunk_gated_delta_rule (alpha gate, k-last state, packed tokens)",
        "bfloat16",
        extra=jit_compiled(),
    )


def flashinfer_decode() -> Implementation:
    _, decode = _flashinfer_kernels()
    return Implementation(
        "flashinfer-decode",
        {"recurrent": decode_adapter(_decode_limits(decode), TorchOps())},
        "torch",
        "FlashInfer gated_delta_rule_decode_pretranspose, one token per step",
        "bfloat16",
        extra=jit_compiled(),
    )
