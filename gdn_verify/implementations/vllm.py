"""Adapters to vLLM's GDN Triton kernels, loaded from a vLLM wheel's files without installing vLLM.

vLLM keeps FLA-derived GDN kernels in ``vllm/third_party/flash_linear_attention/ops/`` (older
wheels: ``vllm/model_executor/layers/fla/ops/``). The 12 files that ``chunk.py`` and
``fused_recurrent.py`` import need from the rest of vLLM only ``vllm.triton_utils``,
``vllm.platforms.current_platform``, ``vllm.utils.gpu_sync_debug.gpu_sync_allowed`` and
``vllm.utils.torch_utils.async_tensor_h2d``; :func:`load_ops` imports them under a private
package name with the small stand-ins below in ``sys.modules`` for the duration of the import
(then restores what was there). No vLLM code lives in this repository: the folder comes from
``GDN_VERIFY_VLLM_OPS`` (a folder holding ``ops/*.py``) or from an installed ``vllm``.

Adapters (torch CUDA tensors):

- ``vllm-chunk``: ``chunk_gated_delta_rule``; state ``[N, HV, V, K]`` (k-last), float32 inputs
  rejected by vLLM (unsupported), ``K <= 256``.
- ``vllm-recurrent``: ``fused_recurrent_gated_delta_rule`` as vLLM calls it: a pool with the
  null slot 0 and sequence ``n`` in slot ``n + 1``, 2-D ``ssm_state_indices [N, max(L)]`` with
  every column the sequence's slot (1-D indices are wrong for sequences longer than one token),
  ``inplace_final_state=True``.
- ``vllm-spec``: the speculative-decoding form under :data:`VLLM_SPEC` rules, handed straight to
  ``fused_recurrent_gated_delta_rule(..., ssm_state_indices, num_accepted_tokens)``.
- ``vllm-sigmoid-spec`` / ``vllm-sigmoid-recurrent``: ``fused_sigmoid_gating_delta_rule_update``
  (``ops/fused_sigmoid_gating.py``), the kernel vLLM's Qwen GDN layer runs for speculative
  verification (Triton route) and for the decodes of a mixed batch. Its slots and indices are
  ``fused_recurrent``'s, but it takes raw gates ``g = -exp(A_log) softplus(a + dt_bias)``
  (softplus threshold 20), ``beta = sigmoid(b)``: the native ``(g, beta)`` go in as
  ``A_log = dt_bias = 0`` and float32 ``a``, ``b`` (the kernel reads them as float32 whatever
  their dtype: float32 costs no more than their own float32 gate arithmetic; see
  ``flashinfer.raw_gates``).
- ``vllm-packed-decode``: ``fused_recurrent_gated_delta_rule_packed_decode``, vLLM's default
  non-speculative decode (``VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE=1``): one token per
  sequence and call, ``mixed_qkv [B, 2 H K + HV V]`` (q | k | v of the token, one dtype), raw
  gates ``a, b [B, HV]``, a ``[slots, HV, V, K]`` pool with 1-D ``ssm_state_indices [B]``
  (``<= 0``: output zeros, state untouched), updated in place; ``out [B, 1, HV, V]`` is the
  caller's. A native call of ``T`` tokens becomes ``T`` calls over the sequences still running,
  sequence ``n`` in slot ``n + 1`` of a float32 pool (vLLM's own pool is in the model dtype
  unless ``mamba_ssm_cache_dtype`` says otherwise: that is a bfloat16 state, outside the
  float32-state contract, so not what these adapters run).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gdn_verify.core.conventions import VLLM_SPEC
from gdn_verify.core.implementation import SPEC_FORM, ConfigurationError, Implementation
from gdn_verify.implementations.fla import cuda_library, jit_compiled
from gdn_verify.implementations.flashinfer import NumpyOps, TorchOps, k_last, raw_gates, token_bounds, token_steps

ENV = "GDN_VERIFY_VLLM_OPS"
PRIVATE = "_gdn_verify_vllm_fla"
FILES = (
    "chunk",
    "chunk_delta_h",
    "chunk_o",
    "chunk_scaled_dot_kkt",
    "cumsum",
    "fused_recurrent",
    "index",
    "l2norm",
    "op",
    "solve_tril",
    "utils",
    "wy_fast",
)
# Imported when present (older carried folders lack it): the fused raw-gate kernel, which needs
# nothing beyond vllm.triton_utils.
OPTIONAL = ("fused_sigmoid_gating",)
PACKAGE_DIRS = ("third_party/flash_linear_attention", "model_executor/layers/fla")


def _standins() -> dict[str, types.ModuleType]:
    """Modules named like the four vLLM modules the kernel files import, with what they use of them."""
    import torch
    import triton
    import triton.language as tl

    try:
        import triton.language.extra.libdevice as tldevice
    except ImportError:  # only used with FLA_USE_FAST_OPS=1
        tldevice = None

    class Platform:
        """``current_platform``: what the kernel files ask (CUDA or ROCm, device capability)."""

        def is_cuda(self) -> bool:
            return torch.cuda.is_available() and torch.version.hip is None

        def is_rocm(self) -> bool:
            return torch.cuda.is_available() and torch.version.hip is not None

        def is_cuda_alike(self) -> bool:
            return torch.cuda.is_available()

        def is_xpu(self) -> bool:
            return False

        def is_device_capability_family(self, capability: int, device_id: int | None = 0) -> bool:
            device = torch.cuda.current_device() if device_id is None else device_id
            return torch.cuda.is_available() and torch.cuda.get_device_capability(device)[0] == capability // 10

    def gpu_sync_allowed(first_only: bool = False):
        return contextlib.nullcontext()  # vLLM's sync debugging is off by default

    def async_tensor_h2d(data, device=None, dtype=None, out=None):
        # a host list to the device (chunk indices), as vLLM does: pinned staging, non-blocking copy
        dtype = dtype if dtype is not None or out is None else out.dtype
        host = data if isinstance(data, torch.Tensor) else torch.as_tensor(data, dtype=dtype)
        if torch.cuda.is_available() and not host.is_pinned():
            host = torch.empty(host.shape, dtype=dtype or host.dtype, pin_memory=True).copy_(host)
        if out is not None:
            return out.copy_(host, non_blocking=True)
        return host.to(device=device, dtype=dtype, non_blocking=True)

    def module(name: str, package: bool = False, **attrs: Any) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        if package:
            m.__path__ = []
        return m

    vllm = module("vllm", True)
    triton_utils = module("vllm.triton_utils", tl=tl, triton=triton, tldevice=tldevice, HAS_TRITON=True)
    platforms = module("vllm.platforms", True, current_platform=Platform())
    utils = module("vllm.utils", True)
    sync = module("vllm.utils.gpu_sync_debug", gpu_sync_allowed=gpu_sync_allowed)
    torch_utils = module("vllm.utils.torch_utils", async_tensor_h2d=async_tensor_h2d)
    return {m.__name__: m for m in (vllm, triton_utils, platforms, utils, sync, torch_utils)}


def find_ops_root() -> Path:
    """The folder holding ``ops/*.py``: ``$GDN_VERIFY_VLLM_OPS``, else the installed vLLM's."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    spec = importlib.util.find_spec("vllm")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"set {ENV} to a folder holding vLLM's GDN ops/*.py, or install a vllm wheel")
    base = Path(list(spec.submodule_search_locations)[0])
    for sub in PACKAGE_DIRS:
        if (base / sub / "ops" / "chunk.py").is_file():
            return base / sub
    raise ImportError(f"{base}: no GDN ops folder among {PACKAGE_DIRS}")


def load_ops(root: str | Path | None = None) -> types.SimpleNamespace:
    """Import ``<root>/ops/{chunk,fused_recurrent}.py`` under a private name; vLLM itself is never imported."""
    root = Path(root) if root is not None else find_ops_root()
    ops_dir = root / "ops"
    missing = [f for f in FILES if not (ops_dir / f"{f}.py").is_file()]
    if missing:
        raise ImportError(f"{ops_dir}: missing {', '.join(missing)}")
    if f"{PRIVATE}.ops.fused_recurrent" not in sys.modules:
        package = types.ModuleType(PRIVATE)
        package.__path__ = [str(root)]
        ops = types.ModuleType(f"{PRIVATE}.ops")
        ops.__path__ = [str(ops_dir)]  # its __init__ is never run: it imports much more of vLLM
        standins = _standins()
        saved = {name: sys.modules.get(name) for name in standins}
        sys.modules.update({PRIVATE: package, f"{PRIVATE}.ops": ops, **standins})
        try:
            for name in ("chunk", "fused_recurrent", *(f for f in OPTIONAL if (ops_dir / f"{f}.py").is_file())):
                importlib.import_module(f"{PRIVATE}.ops.{name}")
        except BaseException:
            for name in [n for n in sys.modules if n == PRIVATE or n.startswith(PRIVATE + ".")]:
                del sys.modules[name]
            raise
        finally:  # the loaded modules keep their references; a real vLLM (or nothing) comes back
            for name, previous in saved.items():
                if previous is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = previous
    chunk = sys.modules[f"{PRIVATE}.ops.chunk"]
    recurrent = sys.modules[f"{PRIVATE}.ops.fused_recurrent"]
    sigmoid = sys.modules.get(f"{PRIVATE}.ops.fused_sigmoid_gating")
    return types.SimpleNamespace(
        root=root,
        chunk_gated_delta_rule=chunk.chunk_gated_delta_rule,
        fused_recurrent_gated_delta_rule=recurrent.fused_recurrent_gated_delta_rule,
        # None where the wheel predates them (or the file was not carried)
        packed_decode=getattr(recurrent, "fused_recurrent_gated_delta_rule_packed_decode", None),
        fused_sigmoid_gating_delta_rule_update=getattr(sigmoid, "fused_sigmoid_gating_delta_rule_update", None),
    )


def _is_float32(x) -> bool:
    return str(x.dtype).removeprefix("torch.") in ("float32", "float64")


def chunk_adapter(kernel: Callable) -> Callable:
    """Native convention -> vLLM's ``chunk_gated_delta_rule`` (state transposed to k-last)."""

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
        if _is_float32(q):
            raise NotImplementedError("vLLM's chunk_gated_delta_rule rejects float32 inputs (bfloat16/float16 only)")
        if q.shape[-1] > 256:
            raise NotImplementedError(f"vLLM's chunked kernel needs K <= 256 (K={q.shape[-1]})")
        # a k-last view: vLLM's input_guard makes it contiguous
        state = None if initial_state is None else k_last(initial_state, state_v_first)
        o, final = kernel(
            q=q,
            k=k,
            v=v,
            g=g,
            beta=beta,
            scale=scale,
            initial_state=state,
            output_final_state=output_final_state,
            cu_seqlens=cu_seqlens,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        )
        return o, (k_last(final, state_v_first) if output_final_state else None)

    return call


def _check_scale(scale) -> None:
    if scale is not None and not scale > 0:
        raise NotImplementedError(f"vLLM's fused_recurrent asserts scale > 0 (scale={scale})")


GateKwargs = Callable[[Any, Any], dict[str, Any]]


def _log_space_gates(g, beta) -> dict[str, Any]:
    return {"g": g, "beta": beta}


def raw_gate_kwargs(ops: Any) -> GateKwargs:
    """``(g, beta)`` -> the raw-gate keywords of vLLM's fused kernels (``A_log = dt_bias = 0``).

    ``a``, ``b`` go over in float32: the kernels read them as float32 whatever their dtype, so a
    16-bit copy would only add a rounding of ours (``flashinfer.raw_gates`` bounds the rest).
    """

    def gates(g, beta) -> dict[str, Any]:
        a, b = raw_gates(ops, g, beta)
        zeros = ops.float32(ops.zeros((g.shape[-1],), like=g))
        return dict(A_log=zeros, a=ops.float32(a), b=ops.float32(b), dt_bias=zeros)

    return gates


def _array_ops(xp: Any) -> Any:
    return NumpyOps() if xp is np else TorchOps()


def _null_slot_pool(ops: Any, shape: tuple[int, int, int, int], like: Any, initial_state, state_v_first: bool) -> Any:
    """The float32 k-last pool ``shape = (N + 1, HV, V, K)`` on ``like``'s device: slot 0 vLLM's
    null block (zeros), sequence ``n``'s initial state (zeros without one) in slot ``n + 1``."""
    pool = ops.zeros(shape, like=like, dtype=ops.state_dtype)
    if initial_state is not None:
        pool[1:] = k_last(initial_state, state_v_first)
    return pool


def recurrent_adapter(kernel: Callable, xp: Any = None, raw: bool = False) -> Callable:
    """Native convention -> vLLM's ``fused_recurrent_gated_delta_rule`` with a null-slot pool.

    ``xp`` is the array module (torch by default; NumPy for the CPU tests). ``raw``: the kernel
    takes raw gates (``fused_sigmoid_gating_delta_rule_update``), same slots and indices.
    """
    ops = _array_ops(xp)
    gates: GateKwargs = raw_gate_kwargs(ops) if raw else _log_space_gates

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
        _check_scale(scale)
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        host = token_bounds(ops, cu_seqlens, B, T)
        N, width = len(host) - 1, max(int(np.diff(host).max(initial=0)), 1)
        pool = _null_slot_pool(ops, (N + 1, HV, V, K), q, initial_state, state_v_first)
        slots = np.repeat(np.arange(1, N + 1, dtype=np.int32)[:, None], width, axis=1)  # every token -> its slot
        o, _ = kernel(
            q=q,
            k=k,
            v=v,
            **gates(g, beta),
            scale=scale,
            initial_state=pool,
            inplace_final_state=True,
            cu_seqlens=cu_seqlens,
            ssm_state_indices=ops.from_host(slots, like=q),
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        )
        return o, (k_last(pool[1:], state_v_first) if output_final_state else None)

    return call


def spec_adapter(
    kernel: Callable, poison: Callable[[Any, Any], None] | None = None, gates: GateKwargs = _log_space_gates
) -> Callable:
    """The speculative-decoding form (:data:`VLLM_SPEC` rules) -> ``fused_recurrent_gated_delta_rule``.

    ``state_pool`` ``[slots, HV, V, K]`` (slot 0 null) and the indices go to the kernel as they
    are. vLLM allocates ``o`` itself (``new_empty``), so an ``output=`` buffer is served by
    ``poison(q, v)`` first filling the memory that allocation will most likely reuse with NaN
    (the caching allocator hands back the block just freed), then copying ``o`` into it.
    ``gates``: ``(g, beta)`` -> the kernel's gate keywords (:func:`raw_gate_kwargs` for
    ``fused_sigmoid_gating_delta_rule_update``).
    """

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
        _check_scale(scale)
        if output is not None and poison is not None:
            poison(q, v)
        o, _ = kernel(
            q=q,
            k=k,
            v=v,
            **gates(g, beta),
            scale=scale,
            initial_state=state_pool,
            inplace_final_state=True,
            cu_seqlens=cu_seqlens,
            ssm_state_indices=ssm_state_indices,
            num_accepted_tokens=num_accepted_tokens,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        )
        if output is None:
            return o
        output[...] = o
        return output

    return spec


def packed_decode_adapter(kernel: Callable, ops: Any = None) -> Callable:
    """Native convention -> ``fused_recurrent_gated_delta_rule_packed_decode``, one token per call.

    Step ``t`` hands the kernel the ``t``-th token of every sequence still running, packed as
    ``mixed_qkv = [q | k | v]`` rows, with 1-D ``ssm_state_indices`` naming each sequence's slot
    (``n + 1``) of one float32 pool (slot 0: vLLM's null block) that the kernel updates in place
    across the steps.
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
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        if not (str(q.dtype) == str(k.dtype) == str(v.dtype)):
            raise NotImplementedError(
                f"mixed_qkv is one tensor: q, k, v of one dtype (got {q.dtype}, {k.dtype}, {v.dtype})"
            )
        bounds = token_bounds(ops, cu_seqlens, B, T)
        # token rows [q (H*K) | k (H*K) | v (HV*V)], the layout of the QKV projection vLLM packs
        mixed = ops.cat([q.reshape(B * T, H * K), k.reshape(B * T, H * K), v.reshape(B * T, HV * V)], axis=1)
        gates = raw_gate_kwargs(ops)(g.reshape(B * T, HV), beta.reshape(B * T, HV))
        pool = _null_slot_pool(ops, (len(bounds), HV, V, K), q, initial_state, state_v_first)
        o = ops.zeros((B * T, HV, V), like=v)
        for running, tok in token_steps(ops, bounds, like=q):
            out = ops.zeros((len(running), 1, HV, V), like=v)  # the caller's buffer, as vLLM passes it
            kernel(
                mixed_qkv=ops.contiguous(mixed[tok]),
                a=ops.contiguous(gates["a"][tok]),
                b=ops.contiguous(gates["b"][tok]),
                A_log=gates["A_log"],
                dt_bias=gates["dt_bias"],
                scale=float(K**-0.5 if scale is None else scale),  # required: the kernel has no default
                initial_state=pool,
                out=out,
                ssm_state_indices=ops.from_host((running + 1).astype(np.int32), like=q),
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            )
            o[tok] = out[:, 0]
        final = None
        if output_final_state:
            final = ops.contiguous(k_last(pool[1:], state_v_first))
        return o.reshape(B, T, HV, V), final

    return call


def _poison_allocator(q, v) -> None:
    """Leave a NaN-filled block of ``o``'s size (``[1, *v.shape]`` in q's dtype) in torch's cache."""
    import torch

    block = torch.full((1, *v.shape), float("nan"), dtype=q.dtype, device=q.device)
    del block


def _ops():
    def load():
        try:
            return load_ops()
        except (ImportError, OSError) as exc:
            raise ImportError(f"vLLM's GDN ops not found: {exc}") from None

    return cuda_library("vLLM", f"set {ENV} or pip install vllm", load)


def vllm_chunk() -> Implementation:
    ops = _ops()
    return Implementation(
        "vllm-chunk",
        {"chunk": chunk_adapter(ops.chunk_gated_delta_rule)},
        "torch",
        f"vLLM chunk_gated_delta_rule ({ops.root})",
        "bfloat16",
        # Triton, like FLA's: 82 s per new shape class cold on an H100 (2026-11-26), so its pool
        # compiles in worker processes from the start instead of after a serial probe.
        extra=jit_compiled(),
    )


def vllm_recurrent() -> Implementation:
    ops = _ops()
    return Implementation(
        "vllm-recurrent",
        {"recurrent": recurrent_adapter(ops.fused_recurrent_gated_delta_rule)},
        "torch",
        "vLLM fused_recurrent_gated_delta_rule (null slot 0, 2-D ssm_state_indices, in place)",
        "bfloat16",
    )


def vllm_spec() -> Implementation:
    ops = _ops()
    return Implementation(
        "vllm-spec",
        {SPEC_FORM: spec_adapter(ops.fused_recurrent_gated_delta_rule, _poison_allocator)},
        "torch",
        "vLLM fused_recurrent_gated_delta_rule with num_accepted_tokens (speculative decoding)",
        "bfloat16",
        extra={"spec_rules": VLLM_SPEC},
    )


def _need(ops: types.SimpleNamespace, name: str, what: str) -> Callable:
    kernel = getattr(ops, name)
    if kernel is None:
        raise ConfigurationError(
            "impl", f"{ops.root}/ops has no {what} (vLLM older than 0.33, or the file not carried)"
        )
    return kernel


def vllm_sigmoid_spec() -> Implementation:
    ops = _ops()
    kernel = _need(ops, "fused_sigmoid_gating_delta_rule_update", "fused_sigmoid_gating.py")
    return Implementation(
        "vllm-sigmoid-spec",
        {SPEC_FORM: spec_adapter(kernel, _poison_allocator, raw_gate_kwargs(TorchOps()))},
        "torch",
        "vLLM fused_sigmoid_gating_delta_rule_update (raw gates) with num_accepted_tokens (speculative decoding)",
        "bfloat16",
        extra={"spec_rules": VLLM_SPEC},
    )


def vllm_sigmoid_recurrent() -> Implementation:
    ops = _ops()
    kernel = _need(ops, "fused_sigmoid_gating_delta_rule_update", "fused_sigmoid_gating.py")
    return Implementation(
        "vllm-sigmoid-recurrent",
        {"recurrent": recurrent_adapter(kernel, raw=True)},
        "torch",
        "vLLM fused_sigmoid_gating_delta_rule_update (raw gates; null slot 0, 2-D ssm_state_indices, in place)",
        "bfloat16",
    )


def vllm_packed_decode() -> Implementation:
    ops = _ops()
    kernel = _need(ops, "packed_decode", "fused_recurrent_gated_delta_rule_packed_decode")
    return Implementation(
        "vllm-packed-decode",
        {"recurrent": packed_decode_adapter(kernel, TorchOps())},
        "torch",
        "vLLM fused_recurrent_gated_delta_rule_packed_decode (packed q|k|v, raw gates, float32 pool), a token a step",
        "bfloat16",
    )


__all__ = [
    "ConfigurationError",
    "find_ops_root",
    "load_ops",
    "packed_decode_adapter",
    "raw_gate_kwargs",
    "vllm_chunk",
    "vllm_packed_decode",
    "vllm_recurrent",
    "vllm_sigmoid_recurrent",
    "vllm_sigmoid_spec",
    "vllm_spec",
]
