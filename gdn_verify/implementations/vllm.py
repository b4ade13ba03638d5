"""Adapters to vLLM's GDN Triton kernels, loaded from a vLLM wheel's files without installing vLLM.

vLLM keeps FLA-derived GDN kernels in ``vllm/third_party/flash_linear_attention/ops/`` (older
wheels: ``vllm/model_executor/layers/fla/ops/``). The 12 files that ``chunk.py`` and
``fused_recurrent.py`` import need from the rest of vLLM only ``vllm.triton_utils``,
``vllm.platforms.current_platform``, ``vllm.utils.gpu_sync_debug.gpu_sync_allowed``,
``vllm.utils.torch_utils.async_tensor_h2d``, and in 0.34 ``vllm.utils.platform_utils`` and
``l2norm.py``'s warm-up launcher (``vllm.model_executor.warmup``); :func:`load_ops` imports
them under a private package name with the small stand-ins below in ``sys.modules`` for the duration of the import
(then restores what was there). No vLLM code lives in this repository: the folder comes from
``GDN_VERIFY_VLLM_OPS`` (a folder holding ``ops/*.py``) or from an installed ``vllm``.

Adapters (torch CUDA tensors, or CPU tensors under Triton's interpreter). Each follows the row of
``vllm_releases.TABLE`` its folder is identified as (state layout per entry point, padding
marker, which entry points exist, the gate dtypes vLLM's Qwen GDN layer passes: ``g`` float32,
``beta`` per row, raw ``a, b`` in the model dtype); ``docs/adapters.md`` has the table and the
production call each mirrors.

- ``vllm-chunk``: ``chunk_gated_delta_rule``; the state in the row's layout, float32 inputs
  rejected by vLLM (unsupported), ``K <= 256``.
- ``vllm-recurrent``: ``fused_recurrent_gated_delta_rule`` as vLLM calls it: a float32 pool with
  sequence ``n`` in slot ``n + 1`` (slot 0 the null block), 2-D ``ssm_state_indices [N, max(L)]``
  with every column the sequence's slot (1-D indices are wrong for sequences longer than one
  token), ``inplace_final_state=True``.
- ``vllm-spec``: the speculative-decoding form under the row's rules (``Conventions.spec_rules``),
  handed straight to ``fused_recurrent_gated_delta_rule(..., ssm_state_indices, num_accepted_tokens)``.
- ``vllm-sigmoid-spec`` / ``vllm-sigmoid-recurrent`` (0.18 on): ``fused_sigmoid_gating_delta_rule_update``
  (``ops/fused_sigmoid_gating.py``), the kernel vLLM's Qwen GDN layer runs for speculative
  verification (Triton route) and for the decodes of a mixed batch. Its slots and indices are
  ``fused_recurrent``'s, but it takes raw gates ``g = -exp(A_log) softplus(a + dt_bias)``
  (softplus threshold 20), ``beta = sigmoid(b)``: the native ``(g, beta)`` go in as
  ``A_log = dt_bias = 0`` and ``a``, ``b`` in the model dtype (:func:`raw_gate_kwargs`).
- ``vllm-packed-decode`` (0.18 on): ``fused_recurrent_gated_delta_rule_packed_decode``, vLLM's
  default non-speculative decode (``VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE=1``): one token per
  sequence and call, ``mixed_qkv [B, 2 H K + HV V]`` (q | k | v of the token, one dtype), raw
  gates ``a, b [B, HV]``, a pool with 1-D ``ssm_state_indices [B]`` updated in place;
  ``out [B, 1, HV, V]`` is the caller's. A native call of ``T`` tokens becomes ``T`` calls over
  the sequences still running, sequence ``n`` in slot ``n + 1`` of a float32 pool
  (``mamba_ssm_cache_dtype="float32"``; vLLM's default ``auto`` pool is in the model dtype: a
  16-bit state, outside the float32-state contract, so not what these adapters run).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from gdn_verify.core.implementation import SPEC_FORM, ConfigurationError, Implementation
from gdn_verify.implementations import vllm_releases
from gdn_verify.implementations.fla import cuda_library, jit_compiled
from gdn_verify.implementations.flashinfer import NumpyOps, TorchOps, raw_gate_inputs, token_bounds, token_steps

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


class DeviceCapability(NamedTuple):
    """vLLM's ``DeviceCapability``: ``.major``, ``.minor`` of the GPU."""

    major: int
    minor: int


def _standins() -> dict[str, types.ModuleType]:
    """Modules named like the vLLM modules the kernel files import, with what they use of them."""
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

        def is_device_capability(self, capability: int, device_id: int | None = 0) -> bool:
            device = torch.cuda.current_device() if device_id is None else device_id
            major, minor = torch.cuda.get_device_capability(device)
            return torch.cuda.is_available() and major * 10 + minor == capability

        # vLLM 0.34's utils.py asks these at import on an NVIDIA GPU (is_nvidia_hopper)
        def get_device_name(self, device_id: int = 0) -> str:
            return torch.cuda.get_device_name(device_id)

        def get_device_capability(self, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(*torch.cuda.get_device_capability(device_id))

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

    def cuda_get_device_properties(device, names):
        # vLLM 0.34's utils.py asks it for shared memory on ROCm only; the same answers, from torch
        properties = torch.cuda.get_device_properties(device)
        return tuple(getattr(properties, name) for name in names)

    class WarmupChoices:
        """vLLM 0.34's warm-up options (``jit_warmup``): the adapters never warm up, only hold them."""

        def __init__(self, *choices: Any):
            self.choices = choices

    class TritonWarmupTensor(WarmupChoices):
        pass

    def triton_kernel_dispatcher_with_warmup(kernel, warmup_inputs=None):
        """vLLM 0.34's launcher (``jit_warmup_triton_helper``): ``fn(*args)`` returns ``(grid,
        keywords)``; the kernel runs on the call's leading arguments, bound in order to the
        kernel's parameters the keywords leave open (``l2norm_fwd_block(x, y, eps, block_dim)``
        -> ``l2norm_fwd_kernel2[grid](X=x, Y=y, eps=eps, **keywords)``). Warm-up is skipped."""

        def decorate(fn):
            @functools.wraps(fn)
            def launch(*args):
                grid, keywords = fn(*args)
                free = [name for name in kernel.arg_names if name not in keywords]
                return kernel[grid](**dict(zip(free, args)), **keywords)

            return launch

        return decorate

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
    platform_utils = module("vllm.utils.platform_utils", cuda_get_device_properties=cuda_get_device_properties)
    executor = module("vllm.model_executor", True)
    warmup = module("vllm.model_executor.warmup", True)
    jit_warmup = module("vllm.model_executor.warmup.jit_warmup", WarmupChoices=WarmupChoices)
    helper = module(
        "vllm.model_executor.warmup.jit_warmup_triton_helper",
        DispatchSpec=tuple,
        TritonWarmupTensor=TritonWarmupTensor,
        triton_kernel_dispatcher_with_warmup=triton_kernel_dispatcher_with_warmup,
    )
    loaded = (vllm, triton_utils, platforms, utils, sync, torch_utils, platform_utils)
    return {m.__name__: m for m in (*loaded, executor, warmup, jit_warmup, helper)}


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


def to_kernel_layout(state, state_v_first: bool, kernel_v_first: bool):
    """A ``[.., K, V]`` (or, with ``state_v_first``, ``[.., V, K]``) state as a kernel holding its
    state v-first (``kernel_v_first``) or k-first does: a swapped view where the layouts differ;
    the same call turns the kernel's state back."""
    return state if state_v_first == kernel_v_first else state.swapaxes(-1, -2)


def log_space_gates(ops: Any, beta_float32: bool = True) -> GateKwargs:
    """``(g, beta)`` as vLLM's Qwen GDN layer hands them to ``chunk``/``fused_recurrent``:
    ``g`` float32 (``fused_gdn_gating``), ``beta`` float32 (``fused_post_conv_prep``, 0.20+) or in
    the model dtype (``b.sigmoid()``, earlier). Widening to float32 is exact: nothing is rounded."""

    def gates(g, beta, like=None) -> dict[str, Any]:
        return {"g": ops.float32(g), "beta": ops.float32(beta) if beta_float32 else beta}

    return gates


def chunk_adapter(kernel: Callable, kernel_v_first: bool = True, beta_float32: bool = True, xp: Any = None) -> Callable:
    """Native convention -> vLLM's ``chunk_gated_delta_rule`` (state in the release's layout)."""
    gates = log_space_gates(_array_ops(xp), beta_float32)

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
        # a view in the kernel's layout: vLLM's input_guard makes it contiguous
        state = None if initial_state is None else to_kernel_layout(initial_state, state_v_first, kernel_v_first)
        o, final = kernel(
            q=q,
            k=k,
            v=v,
            **gates(g, beta, q),
            scale=scale,
            initial_state=state,
            output_final_state=output_final_state,
            cu_seqlens=cu_seqlens,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        )
        return o, (to_kernel_layout(final, state_v_first, kernel_v_first) if output_final_state else None)

    return call


def _check_scale(scale) -> None:
    if scale is not None and not scale > 0:
        raise NotImplementedError(f"vLLM's fused_recurrent asserts scale > 0 (scale={scale})")


# (g, beta, like[, options]) -> the kernel's gate keywords; ``like``: an input in the model dtype
# (q); ``options``: FLA's in-kernel gate options, for the raw-gate kernels (flashinfer.raw_gate_inputs)
GateKwargs = Callable[..., dict[str, Any]]


def raw_gate_kwargs(ops: Any) -> GateKwargs:
    """``(g, beta)`` -> the raw-gate keywords of vLLM's fused kernels, as its Qwen GDN layer passes them.

    ``a``, ``b`` ``[tokens, HV]`` (every token of the call) in the model dtype (``like``'s: the
    problem's input dtype), as the column halves of one ``ba = [b | a]`` buffer (``split_ba``'s
    ``ba.chunk(2, -1)``: strided rows, contiguous in the last dim); ``A_log = 0`` in float32 (a
    float32 parameter) and ``dt_bias = 0`` in the model dtype (made under the model's default
    dtype). The 16-bit rounding of ``a, b`` is the one vLLM makes; the implementations declare it
    (``extra["raw_gates"]``), so the oracle sees the gates computed from the rounded values.
    Under FLA's in-kernel gate ``options`` the caller's ``g`` is ``a`` and its ``A_log``,
    ``dt_bias`` go over in the dtypes it gave (``optional_dtypes`` varies them).
    """

    def gates(g, beta, like=None, options: dict | None = None) -> dict[str, Any]:
        HV = g.shape[-1]
        like = g if like is None else like
        g, beta = g.reshape(-1, HV), beta.reshape(-1, HV)  # [tokens, HV] rows, as the layer has them
        a, b, A_log, dt_bias = raw_gate_inputs(ops, g, beta, like, options)
        ba = ops.cat([b, a], axis=-1)
        zeros = ops.zeros((HV,), like=like)
        return dict(
            A_log=ops.float32(zeros) if A_log is None else A_log,
            a=ba[..., HV:],
            b=ba[..., :HV],
            dt_bias=zeros if dt_bias is None else dt_bias,
        )

    return gates


def _array_ops(xp: Any) -> Any:
    return NumpyOps() if xp is np else TorchOps()


def _null_slot_pool(
    ops: Any, dims: tuple[int, int, int, int], like: Any, initial_state, state_v_first: bool, kernel_v_first: bool
) -> Any:
    """The float32 pool of ``dims = (N + 1, HV, K, V)`` in the kernel's layout (``[.., V, K]`` with
    ``kernel_v_first``) on ``like``'s device: slot 0 vLLM's null block (zeros; a live slot before
    0.20, left unused), sequence ``n``'s initial state (zeros without one) in slot ``n + 1``.
    float32 is ``mamba_ssm_cache_dtype="float32"``, a documented option (the default, ``auto``,
    is the model dtype)."""
    slots, HV, K, V = dims
    pool = ops.zeros((slots, HV, V, K) if kernel_v_first else dims, like=like, dtype=ops.state_dtype)
    if initial_state is not None:
        pool[1:] = to_kernel_layout(initial_state, state_v_first, kernel_v_first)
    return pool


def recurrent_adapter(
    kernel: Callable, xp: Any = None, raw: bool = False, kernel_v_first: bool = True, beta_float32: bool = True
) -> Callable:
    """Native convention -> vLLM's ``fused_recurrent_gated_delta_rule`` with a null-slot pool.

    ``xp`` is the array module (torch by default; NumPy for the CPU tests). ``raw``: the kernel
    takes raw gates (``fused_sigmoid_gating_delta_rule_update``), same slots and indices, and
    the adapter takes FLA's in-kernel gate options (:func:`raw_gate_kwargs`); the log-space
    kernel has no such inputs, so its adapter's signature has none (the properties that pass
    them report it unsupported). ``kernel_v_first``, ``beta_float32``: the release's conventions
    (``vllm_releases.Conventions``).
    """
    ops = _array_ops(xp)
    gates: GateKwargs = raw_gate_kwargs(ops) if raw else log_space_gates(ops, beta_float32)

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
        **options,  # FLA's in-kernel gate options: the raw-gate kernel's (raw_gate_kwargs)
    ):
        if options and not raw:
            raise NotImplementedError(f"needs {next(iter(options))}= (vLLM's fused_recurrent takes log-space gates)")
        _check_scale(scale)
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        host = token_bounds(ops, cu_seqlens, B, T)
        N, width = len(host) - 1, max(int(np.diff(host).max(initial=0)), 1)
        pool = _null_slot_pool(ops, (N + 1, HV, K, V), q, initial_state, state_v_first, kernel_v_first)
        slots = np.repeat(np.arange(1, N + 1, dtype=np.int32)[:, None], width, axis=1)  # every token -> its slot
        o, _ = kernel(
            q=q,
            k=k,
            v=v,
            **(gates(g, beta, q, options) if raw else gates(g, beta, q)),
            scale=scale,
            initial_state=pool,
            inplace_final_state=True,
            cu_seqlens=cu_seqlens,
            ssm_state_indices=ops.from_host(slots, like=q),
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        )
        return o, (to_kernel_layout(pool[1:], state_v_first, kernel_v_first) if output_final_state else None)

    if not raw:  # the log-space kernel takes no in-kernel gate options, and its signature says so
        signature = inspect.signature(call)
        kept = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        call.__signature__ = signature.replace(parameters=kept)  # type: ignore[attr-defined]
    return call


def spec_adapter(
    kernel: Callable,
    poison: Callable[[Any, Any], None] | None = None,
    gates: GateKwargs | None = None,
    padding: str = "null",
) -> Callable:
    """The speculative-decoding form (:data:`VLLM_SPEC` rules) -> ``fused_recurrent_gated_delta_rule``.

    ``state_pool`` ``[slots, HV, V, K]`` (slot 0 null) and the indices go to the kernel as they
    are. vLLM allocates ``o`` itself (``new_empty``), so an ``output=`` buffer is served by
    ``poison(q, v)`` first filling the memory that allocation will most likely reuse with NaN
    (the caching allocator hands back the block just freed), then copying ``o`` into it.
    ``gates``: ``(g, beta)`` -> the kernel's gate keywords (:func:`log_space_gates` by default,
    :func:`raw_gate_kwargs` for ``fused_sigmoid_gating_delta_rule_update``). ``padding``: the
    release's marker (``vllm_releases.PADDINGS``); with ``"none"`` (before 0.16) the kernel has
    no test, vLLM never hands it a padded row, and a negative index is reported unsupported.
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
        if padding == "none" and np.any(np.asarray(_host(ssm_state_indices)) < 0):
            raise NotImplementedError("this vLLM's fused_recurrent has no padding test (PAD_SLOT_ID came in 0.16)")
        if output is not None and poison is not None:
            poison(q, v)
        o, _ = kernel(
            q=q,
            k=k,
            v=v,
            **(gates or log_space_gates(_array_ops(np if isinstance(q, np.ndarray) else None)))(g, beta, q),
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


def _host(x) -> Any:
    return x if isinstance(x, np.ndarray) else x.detach().cpu().numpy()


def packed_decode_adapter(kernel: Callable, ops: Any = None, kernel_v_first: bool = True) -> Callable:
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
        **options,  # FLA's in-kernel gate options (raw_gate_kwargs)
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
        gates = raw_gate_kwargs(ops)(g.reshape(B * T, HV), beta.reshape(B * T, HV), q, options)
        pool = _null_slot_pool(ops, (len(bounds), HV, K, V), q, initial_state, state_v_first, kernel_v_first)
        o = ops.zeros((B * T, HV, V), like=v)
        for running, tok in token_steps(ops, bounds, like=q):
            out = ops.zeros((len(running), 1, HV, V), like=v)  # the caller's buffer, as vLLM passes it
            ba = ops.cat([gates["b"][tok], gates["a"][tok]], axis=1)  # [b | a] rows, as split_ba views them
            kernel(
                mixed_qkv=ops.contiguous(mixed[tok]),
                a=ba[:, HV:],
                b=ba[:, :HV],
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
            final = ops.contiguous(to_kernel_layout(pool[1:], state_v_first, kernel_v_first))
        return o.reshape(B, T, HV, V), final

    return call


def _poison_allocator(q, v) -> None:
    """Leave a NaN-filled block of ``o``'s size (``[1, *v.shape]`` in q's dtype) in torch's cache."""
    import torch

    block = torch.full((1, *v.shape), float("nan"), dtype=q.dtype, device=q.device)
    del block


def _ops() -> tuple[types.SimpleNamespace, vllm_releases.Release]:
    """The loaded ops and the release conventions they are run with (``vllm_releases.identify``)."""

    def load():
        try:
            return load_ops()
        except (ImportError, OSError) as exc:
            raise ImportError(f"vLLM's GDN ops not found: {exc}") from None

    ops = cuda_library("vLLM", f"set {ENV} or pip install vllm", load)
    return ops, vllm_releases.identify(ops)


def _extra(release: vllm_releases.Release, **extra: Any) -> dict[str, Any]:
    # Its own raise is a refusal: vLLM's ops load as PRIVATE's modules. Its backend is recorded (Triton).
    return {**extra, "vllm_release": release.label(), "library": "vllm", "library_modules": (PRIVATE,)}


# The raw-gate kernels' A_log and dt_bias, passed in vLLM's dtypes first (A_log a float32
# parameter, dt_bias in the model dtype) and then in the other (``optional_dtypes``): Triton
# specialises on pointer dtypes, so a second dtype compiles a second kernel. The initial state is
# copied into the float32 pool, its dtype never reaches the kernel: not varied.
RAW_GATE_OPTIONAL_DTYPES = {"A_log": ("float32", "half"), "dt_bias": ("half", "float32")}


def vllm_chunk() -> Implementation:
    ops, release = _ops()
    row = release.conventions
    return Implementation(
        "vllm-chunk",
        {"chunk": chunk_adapter(ops.chunk_gated_delta_rule, row.chunk_v_first, row.beta_float32)},
        "torch",
        f"vLLM chunk_gated_delta_rule ({ops.root}; {release.label()})",
        "bfloat16",
        # Triton, like FLA's: 82 s per new shape class cold on an H100 (2026-11-26), so its pool
        # compiles in worker processes from the start instead of after a serial probe.
        extra=_extra(release, **jit_compiled()),
    )


def vllm_recurrent() -> Implementation:
    ops, release = _ops()
    row = release.conventions
    kernel = recurrent_adapter(
        ops.fused_recurrent_gated_delta_rule, kernel_v_first=row.state_v_first, beta_float32=row.beta_float32
    )
    return Implementation(
        "vllm-recurrent",
        {"recurrent": kernel},
        "torch",
        f"vLLM fused_recurrent_gated_delta_rule (null slot 0, 2-D ssm_state_indices, in place; {release.label()})",
        "bfloat16",
        extra=_extra(release),
    )


def vllm_spec() -> Implementation:
    ops, release = _ops()
    row = release.conventions
    gates = log_space_gates(TorchOps(), row.beta_float32)
    return Implementation(
        "vllm-spec",
        {SPEC_FORM: spec_adapter(ops.fused_recurrent_gated_delta_rule, _poison_allocator, gates, row.padding)},
        "torch",
        f"vLLM fused_recurrent_gated_delta_rule with num_accepted_tokens (speculative decoding; {release.label()})",
        "bfloat16",
        extra=_extra(release, spec_rules=row.spec_rules),
    )


def _need(ops: types.SimpleNamespace, release: vllm_releases.Release, name: str, what: str) -> Callable:
    kernel = getattr(ops, name)
    if kernel is None:
        raise ConfigurationError(
            "impl",
            f"{ops.root}/ops has no {what} ({release.label()}; it came in 0.18, or was not carried)",
        )
    return kernel


def vllm_sigmoid_spec() -> Implementation:
    ops, release = _ops()
    row = release.conventions
    kernel = _need(ops, release, "fused_sigmoid_gating_delta_rule_update", "fused_sigmoid_gating.py")
    return Implementation(
        "vllm-sigmoid-spec",
        {SPEC_FORM: spec_adapter(kernel, _poison_allocator, raw_gate_kwargs(TorchOps()), row.padding)},
        "torch",
        f"vLLM fused_sigmoid_gating_delta_rule_update (raw gates) with num_accepted_tokens ({release.label()})",
        "bfloat16",
        extra=_extra(release, spec_rules=row.spec_rules, raw_gates=True),
    )


def vllm_sigmoid_recurrent() -> Implementation:
    ops, release = _ops()
    row = release.conventions
    kernel = _need(ops, release, "fused_sigmoid_gating_delta_rule_update", "fused_sigmoid_gating.py")
    return Implementation(
        "vllm-sigmoid-recurrent",
        {"recurrent": recurrent_adapter(kernel, raw=True, kernel_v_first=row.state_v_first)},
        "torch",
        f"vLLM fused_sigmoid_gating_delta_rule_update (raw gates, null slot 0, in place; {release.label()})",
        "bfloat16",
        extra=_extra(release, raw_gates=True, optional_dtypes=RAW_GATE_OPTIONAL_DTYPES),
    )


def vllm_packed_decode() -> Implementation:
    ops, release = _ops()
    row = release.conventions
    kernel = _need(ops, release, "packed_decode", "fused_recurrent_gated_delta_rule_packed_decode")
    return Implementation(
        "vllm-packed-decode",
        {"recurrent": packed_decode_adapter(kernel, TorchOps(), row.state_v_first)},
        "torch",
        f"vLLM fused_recurrent_gated_delta_rule_packed_decode (packed q|k|v, raw gates; {release.label()})",
        "bfloat16",
        extra=_extra(release, raw_gates=True, optional_dtypes=RAW_GATE_OPTIONAL_DTYPES, token_steps=True),
    )


__all__ = [
    "ConfigurationError",
    "chunk_adapter",
    "log_space_gates",
    "recurrent_adapter",
    "spec_adapter",
    "to_kernel_layout",
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
