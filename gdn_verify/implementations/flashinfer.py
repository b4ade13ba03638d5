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
cast to the input dtype (FlashInfer takes ``a, b`` in float16/bfloat16). The implementation
declares it (``extra["raw_gates"]``), so the oracle sees the gates the kernel computes from the
rounded ``a, b`` (``core.gating.through_raw_gates``), not the drawn ones. Round trip, with
``u`` the unit roundoff of that dtype (derivatives of softplus and sigmoid times ``|a| u``):

- ``|exp(g') - exp(g)| <= u / e`` (absolute; ``|g' - g| <= u (|g| + 0.28)``);
- ``|beta' - beta| <= 0.224 u``;
- where ``g == 0`` or ``beta`` is exactly 0 or 1, which need infinite raw gates, ``a`` and ``b``
  are clamped to ``[-RAW_LIMIT, RAW_LIMIT]`` = ``[-200, 200]`` (``core.gating``): finite, and far
  enough out that a float32 kernel computes the exact gate (``exp(200)`` overflows and ``exp(-200)`` underflows in
  float32, so ``sigmoid(-200)``, ``1 - sigmoid(200)`` and ``softplus(-200)`` are exactly 0); read in
  float64 they are off by ``1.4e-87``. A nearer clamp is not harmless: ``sigmoid(-40) = 4.2e-18``
  per token wrote a float32 kernel's state where ``beta = 0`` must leave a memory to decay, and in
  ``error_growth``'s retention regime (65536 tokens) that leak was 1e9 times the tolerance of a
  state that had decayed by ``e^-100``.

``flashinfer-decode-kmajor``: ``gated_delta_rule_decode``, the same steps with the state in
the native k-first layout ``[B, HV, K, V]`` (no transpose).

``flashinfer-prefill-cp``: the prefill with ``use_cp=True``, the context-parallel kernel
(``delta_rule_cp_sm90``: SM90, SM100, SM120; head size 128, float16/bfloat16) that ``auto``
picks for few sequences times heads; same convention as the prefill, plus the ``max_seqlen``
hint. ``flashinfer-decode-bf16``: the decode above with a bfloat16 ``[B, HV, V, K]`` state
(``K = V = 128``), which selects FlashInfer's bf16-state kernels (SM90 included): the state is
read and stored in bfloat16 every token, outside the float32-state precision contract.

``flashinfer-mtp``: ``gated_delta_rule_mtp``, the speculative-decoding form under
:data:`FLASHINFER_SPEC` rules: requests of one token count ``L`` as ``[N, L]`` views of the packed
tokens, the read slot ``initial_state_indices[n] = ssm_state_indices[n, num_accepted[n] - 1]``
(FlashInfer has no accepted counts: that gather is the caller's job, so a count outside ``1..C``
raises ``ValueError`` here), per-token writes through ``ssm_state_indices [N, L]`` with
``disable_state_update=False`` and ``L >= 2`` (MTP's documented domain is ``T > 1``; ``T = 1``
raised a CuTe DSL layout error on an H100, 2026-11-23), a float32 k-last pool handed over as
is, padding by a negative read index.

The translations take an :class:`ArrayOps` so that the CPU tests can run them on NumPy arrays
with the float64 oracle standing in for the kernel; only :func:`_flashinfer_kernels` imports
FlashInfer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from gdn_verify.core import backends, gating
from gdn_verify.core.conventions import FLASHINFER_SPEC
from gdn_verify.core.implementation import SPEC_FORM, ConfigurationError, Implementation
from gdn_verify.implementations.fla import cuda_library, jit_compiled
from gdn_verify.implementations.speculative import check_accepted


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

    def copy_as(self, x, dtype):
        """A contiguous copy in ``dtype`` (a copy even where the dtype is already ``dtype``)."""
        return np.array(x, dtype=dtype, order="C", copy=True)

    def cat(self, xs, axis: int):
        return np.concatenate(xs, axis=axis)

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

    def copy_as(self, x, dtype):
        return x.to(dtype=dtype, copy=True).contiguous()

    def cat(self, xs, axis: int):
        return self.lib.cat(list(xs), dim=axis)

    def zeros(self, shape, like, dtype=None):
        return self.lib.zeros(shape, dtype=dtype if dtype is not None else like.dtype, device=like.device)

    def from_host(self, a: np.ndarray, like):
        return self.lib.as_tensor(a, device=like.device)

    def to_host(self, x) -> np.ndarray:
        return x.detach().cpu().numpy()


def token_bounds(ops, cu_seqlens, B: int, T: int) -> np.ndarray:
    """The sequences' token offsets on the host (int64): ``cu_seqlens``, or ``B`` runs of ``T``."""
    if cu_seqlens is None:
        return np.arange(B + 1, dtype=np.int64) * T
    return ops.to_host(cu_seqlens).astype(np.int64)


def token_steps(ops, bounds: np.ndarray, like):
    """``(running, tok)`` for step ``t`` of a token-per-step call: the sequences still running
    (host indices) and the packed rows of their ``t``-th tokens (on ``like``'s device)."""
    lengths = np.diff(bounds)
    if not lengths.any():
        backends.note(backends.NO_KERNEL)  # no token, no step: the kernel is never launched
    for t in range(int(lengths.max(initial=0))):
        running = np.flatnonzero(lengths > t)
        yield running, ops.from_host(bounds[running] + t, like=like)


def k_last(state, state_v_first: bool):
    """A native k-first ``[..., K, V]`` state as a k-last ``[..., V, K]`` view (as it is with
    ``state_v_first``: already k-last); the same swap turns a k-last state back."""
    return state if state_v_first else state.swapaxes(-1, -2)


def _state_in(ops, initial_state, state_v_first: bool):
    """Native ``[N, HV, K, V]`` (or already k-last with ``state_v_first``) -> k-last ``[N, HV, V, K]``."""
    if initial_state is None:
        return None
    return ops.contiguous(k_last(initial_state, state_v_first))


def _state_out(ops, state, state_v_first: bool):
    return ops.contiguous(k_last(state, state_v_first))


def _head_shapes(q, v, scale) -> tuple[int, int, int, int, int, int]:
    """``(B, T, H, K, HV, V)``; ``scale=0`` is not expressible (FlashInfer reads it as the default)."""
    if scale is not None and scale == 0.0:
        raise NotImplementedError("FlashInfer reads scale=0 as the default K**-0.5")
    B, T, H, K = q.shape
    return B, T, H, K, v.shape[2], v.shape[3]


def prefill_adapter(kernel: Callable, ops=None, max_seqlen: bool = False) -> Callable:
    """A native-convention callable running FlashInfer's prefill ``kernel`` (same signature).

    ``max_seqlen``: also pass the longest sequence's length, the host-side hint that sizes the
    context-parallel kernel's grids (without it CP assumes the whole packed length).
    """
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
        bounds = token_bounds(ops, cu_seqlens, B, T)
        if bounds[-1] == 0:
            # FlashInfer 0.7.2 refuses a call without tokens ("max_seqlen must be positive, got 0"),
            # CP or not (called directly on an H100, 2026-11-26): an unsupported input, not a crash
            raise NotImplementedError("FlashInfer's prefill refuses a call with no tokens")
        cu = ops.from_host(bounds, like=q)
        hint: dict[str, Any] = {}
        if max_seqlen:
            hint["max_seqlen"] = int(np.diff(bounds).max())
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
            **hint,
        )
        o, final_state = result if output_final_state else (result, None)
        o = o.reshape(B, T, HV, V)
        return o, None if final_state is None else _state_out(ops, final_state, state_v_first)

    return call


def raw_gates(ops, g, beta):
    """``(a, b)`` with ``-softplus(a) = g`` and ``sigmoid(b) = beta`` (float64, clamped; see module doc)."""
    return gating.raw_gates(ops.lib, ops.float64(g), ops.float64(beta))


def raw_gate_inputs(ops, g, beta, like, options: dict | None = None) -> tuple[Any, Any, Any, Any]:
    """``(a, b, A_log, dt_bias)`` for a raw-gate kernel, ``a`` and ``b`` in ``like``'s dtype.

    ``a``, ``b`` encode ``(g, beta)`` (:func:`raw_gates`) with ``A_log``, ``dt_bias`` None (the
    adapter's zeros). FLA's in-kernel gate ``options`` (``gating.OPTION_NAMES``) hand the caller's
    raw inputs over as they are: ``use_gate_in_kernel`` ``g`` as ``a`` with the caller's ``A_log``
    and ``dt_bias`` (in its dtypes), ``use_beta_sigmoid_in_kernel`` ``beta`` as ``b``; both are
    then only rounded to ``like``'s dtype (``Implementation.as_called`` models it).
    ``allow_neg_eigval`` (``beta = 2 sigmoid(b)``) has no raw-gate form: unsupported.
    """
    options = options or {}
    for name in options:
        if name not in gating.OPTION_NAMES:
            raise NotImplementedError(f"needs {name}= (not an input of the raw-gate kernels)")
    if options.get("allow_neg_eigval"):
        raise NotImplementedError("the raw-gate kernels compute beta = sigmoid(b): no allow_neg_eigval")
    A_log, dt_bias = None, None
    if options.get("use_gate_in_kernel"):
        A_log, dt_bias = options.get("A_log"), options.get("dt_bias")
        if A_log is None:
            raise ValueError("A_log: required when use_gate_in_kernel=True")
        a = g
    else:
        a = gating.raw_decay_input(ops.lib, ops.float64(g))
    b = beta if options.get("use_beta_sigmoid_in_kernel") else gating.raw_beta_input(ops.lib, ops.float64(beta))
    return ops.cast_like(a, like), ops.cast_like(b, like), A_log, dt_bias


def decode_adapter(kernel: Callable, ops=None, kmajor: bool = False, state_dtype: Any = None) -> Callable:
    """A native-convention callable running FlashInfer's decode ``kernel`` one token per step.

    ``kmajor``: the kernel keeps the state k-first ``[B, HV, K, V]`` (``gated_delta_rule_decode``).
    ``state_dtype``: the dtype of the state the kernel carries (FlashInfer picks its kernel by it:
    bfloat16 selects the bf16-state kernels); ``None`` keeps the initial state's dtype, float32
    (``ops.state_dtype``) when there is none. The final state is returned in that dtype.
    """
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
        **options,  # FLA's in-kernel gate options (raw_gate_inputs)
    ):
        B, T, H, K, HV, V = _head_shapes(q, v, scale)
        bounds = token_bounds(ops, cu_seqlens, B, T)
        lengths = np.diff(bounds)
        flat = [x.reshape((B * T,) + tuple(x.shape[2:])) for x in (q, k, v)]
        a, b, A_log, dt_bias = raw_gate_inputs(ops, g, beta, q, options)
        a, b = a.reshape(B * T, HV), b.reshape(B * T, HV)
        # the kernel's layout: k-last, or k-first for the k-major kernel
        state = _state_in(ops, initial_state, state_v_first != kmajor)
        if state is None:
            shape = (len(lengths), HV, K, V) if kmajor else (len(lengths), HV, V, K)
            state = ops.zeros(shape, like=q, dtype=state_dtype if state_dtype is not None else ops.state_dtype)
        elif state_dtype is not None:
            state = ops.copy_as(state, state_dtype)  # a new buffer: the caller's state stays intact
        else:
            state = ops.copy(state)  # the kernel updates its state in place; the caller's stays intact
        zeros = ops.float32(ops.zeros((HV,), like=q))  # FlashInfer's A_log and dt_bias: float32 by default
        A_log = zeros if A_log is None else A_log
        dt_bias = zeros if dt_bias is None else dt_bias
        o = ops.zeros((B * T, HV, V), like=v)
        for running, tok in token_steps(ops, bounds, like=q):
            seq = ops.from_host(running, like=q)
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
        final_state = _state_out(ops, state, state_v_first != kmajor) if output_final_state else None
        return o.reshape(B, T, HV, V), final_state

    return call


def _flashinfer_kernels() -> dict[str, Callable]:
    """FlashInfer's GDN entry points by name; the only place that imports FlashInfer.

    ``backend="flashinfer"`` names the CuTe DSL route (``auto`` tries Cake GDN first, SM100 only)
    and the prefill runs with ``use_cp=False``: ``auto`` takes the context-parallel kernel for
    small problems (``N * H < 66`` on 132-SM parts), a different kernel from the one large
    prefills run; ``prefill_cp`` forces that one (``use_cp=True`` raises where CP cannot run
    instead of falling back). ``decode_bf16`` is the same pretranspose entry point: a bfloat16
    state with ``K = V = 128`` selects the bf16-state kernels, so their absence is checked here.
    """

    def load():
        import flashinfer.gdn_decode as decode
        from flashinfer.gdn_prefill import chunk_gated_delta_rule

        if not decode._PRETRANSPOSE_AVAILABLE:  # noqa: SLF001 - its try/except hides a missing cutlass
            raise ImportError("flashinfer.gdn_decode loaded without its CuTe DSL kernels (is cutlass importable?)")
        pretranspose = functools.partial(decode.gated_delta_rule_decode_pretranspose, backend="flashinfer")
        bf16_state = getattr(decode, "_GDN_DECODE_BF16_STATE_AVAILABLE", False)
        return dict(
            prefill=functools.partial(chunk_gated_delta_rule, backend="flashinfer", use_cp=False),
            prefill_cp=functools.partial(chunk_gated_delta_rule, backend="flashinfer", use_cp=True),
            decode=pretranspose,
            # without the bf16-state kernels a bfloat16 state would reach the float32 path's assert
            decode_bf16=pretranspose if bf16_state else None,
            decode_kmajor=functools.partial(decode.gated_delta_rule_decode, backend="flashinfer"),
            mtp=decode.gated_delta_rule_mtp,
        )

    return cuda_library("FlashInfer", "pip install flashinfer-python", load)


def _half_inputs(q) -> None:
    if str(q.dtype) not in ("torch.float16", "torch.bfloat16", "float16", "bfloat16"):
        raise NotImplementedError(f"FlashInfer's GDN kernels take float16/bfloat16 q, k, v; got {q.dtype}")


def _decode_limits(kernel: Callable, v_multiple: int = 8) -> Callable:
    """Report FlashInfer decode's documented input limits as unsupported rather than as crashes."""

    def call(q, k, v, state, **kw) -> Any:
        K, V = q.shape[-1], v.shape[-1]
        _half_inputs(q)
        if K < 128 or V < 128 or V % v_multiple:
            raise NotImplementedError(
                f"FlashInfer's float32-state decode needs K, V >= 128, V % {v_multiple} == 0 (K={K}, V={V})"
            )
        return kernel(q=q, k=k, v=v, state=state, **kw)

    return call


def _bf16_state_limits(kernel: Callable) -> Callable:
    """FlashInfer's bf16-state decode: ``K = V = 128`` only (other sizes take the float32 path)."""

    def call(q, k, v, state, **kw) -> Any:
        _half_inputs(q)
        if q.shape[-1] != 128 or v.shape[-1] != 128:
            raise NotImplementedError(
                f"FlashInfer's bfloat16-state decode needs K = V = 128 (K={q.shape[-1]}, V={v.shape[-1]})"
            )
        return kernel(q=q, k=k, v=v, state=state, **kw)

    return call


def _prefill_limits(kernel: Callable) -> Callable:
    """SM90 prefill: one head size of 128, float16/bfloat16 inputs (``delta_rule_prefill_dsl_sm90``)."""

    def call(q, k, v, **kw) -> Any:
        _half_inputs(q)
        if q.shape[-1] != 128:
            raise NotImplementedError(f"FlashInfer's SM90 prefill supports head size 128 only (got {q.shape[-1]})")
        return kernel(q=q, k=k, v=v, **kw)

    return call


def mtp_adapter(kernel: Callable, ops=None) -> Callable:
    """The speculative-decoding form (``FLASHINFER_SPEC`` rules) running ``gated_delta_rule_mtp``.

    ``state_pool`` ``[slots, HV, V, K]`` float32 is the kernel's pool (updated in place, no copy);
    q, k ``[1, T, H, K]`` and v ``[1, T, HV, V]`` become ``[N, L, ...]`` views (every request has
    ``L`` tokens); ``output`` ``[1, T, HV, V]``, when given, is the kernel's output buffer.
    """
    ops = ops or NumpyOps()

    def spec(
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
        output=None,
    ):
        _, T, H, K, HV, V = _head_shapes(q, v, scale)
        lengths = np.diff(ops.to_host(cu_seqlens).astype(np.int64))
        N, L = len(lengths), int(lengths[0]) if len(lengths) else 0
        if np.any(lengths != L) or L < 2:  # MTP's documented domain: [B, T] tokens, T > 1
            raise NotImplementedError(f"gated_delta_rule_mtp takes [B, T] tokens, T >= 2: got lengths {lengths}")
        accepted = ops.to_host(num_accepted_tokens).astype(np.int64)
        check_accepted(accepted, ssm_state_indices.shape[1])  # the caller's gather; FlashInfer never sees counts
        indices = ops.to_host(ssm_state_indices).astype(np.int64)
        read = ops.from_host(indices[np.arange(N), accepted - 1].astype(np.int32), like=q)
        a, b = (ops.cast_like(x.reshape(N, L, HV), q) for x in raw_gates(ops, g, beta))
        zeros = ops.float32(ops.zeros((HV,), like=q))
        out = None if output is None else output.reshape(N, L, HV, V)
        scatter = ops.from_host(np.ascontiguousarray(indices[:, :L], np.int32), like=q)
        kw: dict[str, Any] = dict(disable_state_update=False, ssm_state_indices=scatter)
        o, _ = kernel(
            q=q.reshape(N, L, H, K),
            k=k.reshape(N, L, H, K),
            v=v.reshape(N, L, HV, V),
            initial_state=state_pool,
            initial_state_indices=read,
            A_log=zeros,
            a=a,
            dt_bias=zeros,
            b=b,
            scale=scale,
            output=out,
            use_qk_l2norm=use_qk_l2norm_in_kernel,
            **kw,
        )
        return o.reshape(1, T, HV, V) if output is None else output

    return spec


def _mtp_limits(kernel: Callable) -> Callable:
    def call(q, v, initial_state, **kw) -> Any:
        _half_inputs(q)
        K, V = q.shape[-1], v.shape[-1]
        if K < 128 or V < 128:
            raise NotImplementedError(f"gated_delta_rule_mtp needs K, V >= 128 (K={K}, V={V})")
        return kernel(q=q, v=v, initial_state=initial_state, **kw)

    return call


# The optional argument the decode adapters pass in either dtype (``optional_dtypes``): FlashInfer
# documents dt_bias as bfloat16 or float32 (A_log float32 only); a compile cache keyed without such
# a dtype runs the first call's kernel on the second call's bytes (FlashInfer PR #4219). The
# initial state is not varied: its dtype selects another kernel family (the bf16-state kernels,
# another precision contract: flashinfer-decode-bf16), and that adapter copies it to its own.
DECODE_OPTIONAL_DTYPES = {"dt_bias": ("float32", "bfloat16")}


# Head sizes declared for every FlashInfer GDN adapter (``extra["head_dims"]``, narrowing what
# properties draw): the prefill takes one head_size for K and V, its Cake backend 128 only; the
# float32-state decode K, V >= 128 with V % 8 (k-major: % 32); the MTP kernel K, V >= 128. Of the
# sizes the strategies draw, 128 is the one all of them take. The call-time limits above still
# refuse other sizes passed through the API.
HEAD_DIMS = (128,)
# FlashInfer's decode kernels (pretranspose, bf16-state, k-major, MTP) compile one CuTe DSL kernel
# per scale value: ``scale`` is in each one's compile cache key (``gdn_kernels/gdn_decode_*.py`` of
# 0.7.2.post1), beside T, H, HV, K, V, the dtypes and l2norm. Declared (``extra["compile_scales"]``),
# check draws None and ``shapes.COMPILED_SCALES`` only: half the compiles of the three explicit scales.
DECODE_COMPILE = {"compile_scales": True, "head_dims": HEAD_DIMS}


def flashinfer_prefill() -> Implementation:
    kernels = _flashinfer_kernels()
    return Implementation(
        "flashinfer-prefill",
        {"chunk": prefill_adapter(_prefill_limits(kernels["prefill"]), TorchOps())},
        "torch",
        "FlashInfer chunk_gated_delta_rule (alpha gate, k-last state, packed tokens)",
        "bfloat16",
        # use_cp=False: never the CP kernel
        extra=jit_compiled(backend="flashinfer", library="flashinfer", head_dims=HEAD_DIMS),
    )


def flashinfer_prefill_cp() -> Implementation:
    kernels = _flashinfer_kernels()
    return Implementation(
        "flashinfer-prefill-cp",
        {"chunk": prefill_adapter(_prefill_limits(kernels["prefill_cp"]), TorchOps(), max_seqlen=True)},
        "torch",
        "FlashInfer chunk_gated_delta_rule(use_cp=True): context-parallel prefill, exact max_seqlen hint",
        "bfloat16",
        # use_cp=True raises, never falls back
        extra=jit_compiled(backend="flashinfer-cp", library="flashinfer", head_dims=HEAD_DIMS),
    )


def flashinfer_decode() -> Implementation:
    kernels = _flashinfer_kernels()
    return Implementation(
        "flashinfer-decode",
        {"recurrent": decode_adapter(_decode_limits(kernels["decode"]), TorchOps())},
        "torch",
        "FlashInfer gated_delta_rule_decode_pretranspose, one token per step",
        "bfloat16",
        extra=jit_compiled(
            raw_gates=True,
            optional_dtypes=DECODE_OPTIONAL_DTYPES,
            backend="flashinfer-decode",
            library="flashinfer",
            token_steps=True,
            **DECODE_COMPILE,
        ),
    )


def flashinfer_decode_bf16() -> Implementation:
    """The bf16-state decode. Its state is rounded to bfloat16 every token, by design, and declared
    (``extra["state_dtype"]``): the tolerance model adds that rounding's term and the output
    contract expects a bfloat16 final state (docs/precision.md, "a declared state dtype").
    """
    kernels = _flashinfer_kernels()
    if kernels["decode_bf16"] is None:
        raise ConfigurationError("impl", "this FlashInfer has no bfloat16-state GDN decode kernels")
    import torch

    return Implementation(
        "flashinfer-decode-bf16",
        {
            "recurrent": decode_adapter(
                _bf16_state_limits(kernels["decode_bf16"]), TorchOps(), state_dtype=torch.bfloat16
            )
        },
        "torch",
        "FlashInfer gated_delta_rule_decode_pretranspose with a bfloat16 state (K = V = 128), one token per step",
        "bfloat16",
        extra=jit_compiled(
            state_dtype="bfloat16",
            raw_gates=True,
            optional_dtypes=DECODE_OPTIONAL_DTYPES,
            backend="flashinfer-decode-bf16",
            library="flashinfer",
            token_steps=True,
            **DECODE_COMPILE,
        ),
    )


def flashinfer_decode_kmajor() -> Implementation:
    kernels = _flashinfer_kernels()
    return Implementation(
        "flashinfer-decode-kmajor",
        {"recurrent": decode_adapter(_decode_limits(kernels["decode_kmajor"], 32), TorchOps(), kmajor=True)},
        "torch",
        "FlashInfer gated_delta_rule_decode (k-major state), one token per step",
        "bfloat16",
        extra={
            "raw_gates": True,
            "optional_dtypes": DECODE_OPTIONAL_DTYPES,
            "backend": "flashinfer-decode-kmajor",
            "library": "flashinfer",
            "token_steps": True,
            **DECODE_COMPILE,
        },
    )


def flashinfer_mtp() -> Implementation:
    kernels = _flashinfer_kernels()
    return Implementation(
        "flashinfer-mtp",
        {SPEC_FORM: mtp_adapter(_mtp_limits(kernels["mtp"]), TorchOps())},
        "torch",
        "FlashInfer gated_delta_rule_mtp (speculative verify, per-token pool scatter)",
        "bfloat16",
        extra={
            "spec_rules": FLASHINFER_SPEC,
            "raw_gates": True,
            "backend": "flashinfer-mtp",
            "library": "flashinfer",
            **DECODE_COMPILE,
        },
    )
