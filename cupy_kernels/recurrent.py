"""Launchers for the recurrent gated delta rule kernel (``recurrent.cu``): prefill, decode, pools.

Public entry points (all launch on the current CuPy stream and never synchronize):

- :func:`recurrent_gated_delta_rule`: the native convention (FLA ``chunk_gated_delta_rule``
  arguments), prefill or decode, fixed-length batches or ``cu_seqlens``; ``precision="float64"``
  runs the GPU oracle (compute and state in float64).
- :func:`fused_decode_raw_gates`: FlashInfer / FlashInfer-Bench decode (raw gates, k-last state
  ``[B, HV, V, K]`` updated in place).
- :func:`pooled_decode`: requests addressing a state pool by slot index (negative = padding).
- :func:`spec_decode`: vLLM speculative decoding (accepted-token slot read, per-token slots written).

Inputs are CuPy arrays or DLPack tensors, used without copies. Torch tensors are read through
``data_ptr()``/``stride()`` directly (zero copy, and cheaper than a DLPack round trip, which also
handles bfloat16 that CuPy has no dtype for); torch in gives torch out, anything else CuPy out.
When mixing with torch, run both on one stream (e.g. ``cupy.cuda.ExternalStream``).
The kernel reads every argument with its own strides (last dim contiguous) and never copies.
Index tensors (``cu_seqlens``, slots) are not inspected on the host: that would synchronize.
The kernel clamps ``cu_seqlens`` into ``[0, T]`` and treats out-of-range slots as padding, so bad
indices cannot touch memory out of bounds, but rows no sequence covers are left unwritten.
"""

from __future__ import annotations

import functools
import math
import struct
import sys
import threading
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("recurrent.cu")

# dtype codes shared with recurrent.cu (enum gdn::DType)
_FLOAT_CODES = (0, 1, 2, 3)
_INDEX_CODES = (4, 5)
MODE_DECODE, MODE_PREFILL, MODE_SPEC = 0, 1, 2
_FLAG_L2NORM, _FLAG_RAW_GATES, _FLAG_STATE_VEC, _FLAG_QK_VEC, _FLAG_V_VEC, _FLAG_O_VEC = 1, 2, 4, 8, 16, 32
MAX_HEAD_DIM = 256

# struct gdn::Params: 13 pointers, 30 int64, 1 double; every field 8 bytes, so no padding rules.
_PARAMS = struct.Struct("<13Q30qd")
_POINTERS = struct.Struct("<13Q")  # the per-call head of Params
_SCALARS = struct.Struct("<30qd")  # the per-signature tail, packed once into plan.static


# --------------------------------------------------------------------------- kernel selection


def _pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


# Decode (T = 1) kernel variants, timed side by side by gdn_verify/bench.py (see RECURRENT_NOTES.md):
# name -> (narrow tiling, streaming state accesses, MINB). "wide" is the original kernel.
DECODE_VARIANTS = {
    "wide": (False, False, 0),
    "wide-cs": (False, True, 0),
    "narrow": (True, False, 4),
    "narrow-cs": (True, True, 4),
}
# wide-cs: fastest at B >= 64 on an H100 (2026-11-22; reports/bench-h100-2026-11-22.md), within 1 us below.
DEFAULT_DECODE_VARIANT = "wide-cs"


def _decode_variant(name: str | None) -> tuple[bool, bool, int]:
    try:
        return DECODE_VARIANTS[DEFAULT_DECODE_VARIANT if name is None else name]
    except KeyError:
        raise ValueError(f"decode_variant: expected one of {sorted(DECODE_VARIANTS)}, got {name!r}") from None


@functools.cache
def tiling(K: int, V: int, v_first: bool, double: bool, narrow: bool = False) -> tuple[int, int, int, int]:
    """Lane tiling ``(LC, AC, BR, WV)`` for head sizes ``K, V`` (see the comment atop recurrent.cu).

    A lane holds ``BR * AC * VW`` state values (VW = 4 floats or 2 doubles per 16 bytes): at most
    64 floats / 32 doubles, which keeps the decode kernel near 168 registers without spills.
    ``WV`` is the number of value columns one warp owns. ``narrow`` (decode variant) halves the
    per-lane budget: k-first halves LC (LC 2, BR 8 at K = 128: 32-byte row segments per warp, 32
    floats per lane), v-first halves BR.
    """
    vw = 2 if double else 4
    budget = (16 if double else 32) if narrow else (32 if double else 64)
    if not v_first:
        # vectors run along V; 4 lanes x 4 floats = 64-byte row segments per warp for K <= 128
        lc = 2 if (double or K > 128) else 4
        if narrow:
            lc = max(1, lc // 2)
        lc = min(lc, _pow2(-(-V // vw)))
        lr = 32 // lc
        br = _pow2(-(-K // lr))
        ac = 1
        wv = vw * lc * ac
    else:
        # vectors run along K: 8 (16 for K > 128) lanes x 16 bytes = 128-byte row segments or more,
        # keeping q and k at <= 16 registers each
        lc = 16 if K > 128 else 8
        ac = _pow2(-(-K // (lc * vw)))
        lr = 32 // lc
        br = max(1, min(budget // (ac * vw), _pow2(-(-V // lr))))
        wv = lr * br
    return lc, ac, br, wv


def name_expression(
    dt: int, double: bool, v_first: bool, lc: int, ac: int, br: int, mode: int, cs: bool = False, minb: int = 0
) -> str:
    """The C++ name of one kernel instantiation (for ``cupy.RawModule(name_expressions=...)``)."""
    acc = "double" if double else "float"
    vf = "true" if v_first else "false"
    return f"gdn::recurrent_kernel<{dt}, {acc}, {vf}, {lc}, {ac}, {br}, {mode}, {'true' if cs else 'false'}, {minb}>"


@functools.cache
def _compiled(expr: str, device: int) -> tuple[Any, int]:
    """``(RawKernel, CUfunction handle)`` of one instantiation, compiled once per process and device
    (CuPy also caches the binary on disk). The cache keeps the kernel, hence its module, alive."""
    cupy = _cupy()
    module = cupy.RawModule(code=SOURCE.read_text(), options=("-std=c++17",), name_expressions=[expr])
    kernel = module.get_function(expr)
    return kernel, kernel.kernel.ptr


@functools.cache
def _num_sms(device: int) -> int:
    return _cupy().cuda.Device(device).attributes["MultiProcessorCount"]


def _warps_per_cta(total_warps: int, device: int) -> int:
    # Small problems (batch-1 decode) get 1-warp CTAs so they spread over every SM; large ones 4.
    target = 2 * _num_sms(device)
    w = 4
    while w > 1 and -(-total_warps // w) < target:
        w //= 2
    return w


class _Launch(threading.local):
    """Per-thread parameter buffer: ``cuLaunchKernel`` copies it at launch, so it is reusable."""

    def __init__(self) -> None:
        import numpy as np

        self.buf = np.zeros(_PARAMS.size // 8, np.uint64)
        self.bytes = memoryview(self.buf).cast("B")
        self.argv = np.array([self.buf.ctypes.data], np.uint64)  # void* kernelParams[1]
        self.argv_ptr = self.argv.ctypes.data


_launch_state: _Launch | None = None


def _launch(plan, ptrs: tuple) -> None:
    """Pack the 13 pointers, copy the plan's pre-packed scalar tail, launch on the current stream."""
    global _launch_state
    cupy = _CUPY or _cupy()
    if _launch_state is None:
        _launch_state = _Launch()
    st = _launch_state
    _POINTERS.pack_into(st.buf, 0, *ptrs)
    st.bytes[_POINTERS.size :] = plan.static
    cupy.cuda.driver.launchKernel(
        plan.fn, plan.blocks, 1, 1, plan.threads, 1, 1, 0, cupy.cuda.get_current_stream().ptr, st.argv_ptr, 0
    )


# --------------------------------------------------------------------------- tensors

# numpy/CuPy dtype.char -> code ('l' and 'q' are both int64 on LP64)
_CHAR_CODE = {"f": 0, "e": 1, "d": 3, "i": 4, "l": 5, "q": 5}
_CODE_NAME = {0: "float32", 1: "float16", 2: "bfloat16", 3: "float64", 4: "int32", 5: "int64", -1: "unsupported"}
_TORCH_CODE: dict | None = None
_CUPY = None


def _cupy():
    global _CUPY
    if _CUPY is None:
        import cupy

        _CUPY = cupy
    return _CUPY


def _is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _tensor(x: Any, name: str, device: int) -> tuple[int, tuple, tuple, int, int]:
    """``(pointer, shape, raw strides, dtype code, stride unit)`` of a CuPy array or DLPack tensor, no copy.

    Raw strides are in bytes (CuPy, unit = itemsize) or elements (torch, unit = 1); ``_elements``
    normalizes them once per signature, keeping this per-call path to attribute reads.
    """
    global _TORCH_CODE
    cupy = _CUPY or _cupy()
    if type(x) is cupy.ndarray or isinstance(x, cupy.ndarray):
        mem = x.data
        if mem.device_id != device:
            raise ValueError(f"{name}: array lives on device {mem.device_id}, the current device is {device}")
        return mem.ptr, x.shape, x.strides, _CHAR_CODE.get(x.dtype.char, -1), x.itemsize
    if _is_torch(x):
        if not x.is_cuda or x.get_device() != device:
            raise ValueError(f"{name}: expected a tensor on the current CUDA device ({device}), got {x.device}")
        if _TORCH_CODE is None:
            torch = sys.modules["torch"]
            _TORCH_CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3,
                           torch.int32: 4, torch.int64: 5}  # fmt: skip
        return x.data_ptr(), tuple(x.shape), x.stride(), _TORCH_CODE.get(x.dtype, -1), 1
    if hasattr(x, "__dlpack__"):
        try:
            arr = cupy.from_dlpack(x)
        except Exception as exc:  # noqa: BLE001 - any import failure is the caller's input error
            raise ValueError(f"{name}: cannot be imported through DLPack ({exc})") from None
        return _tensor(arr, name, device)
    raise ValueError(f"{name}: expected a CuPy array or a DLPack (e.g. torch) CUDA tensor, got {type(x).__name__}")


def _elements(info: tuple | None) -> tuple | None:
    """``(pointer, shape, strides in elements, dtype code)``; size-1 dims get stride 0 (never
    multiplied by a nonzero index, and torch may give them any value), so alignment checks hold."""
    if info is None:
        return None
    ptr, shape, strides, code, unit = info
    return ptr, shape, tuple([s // unit if d != 1 else 0 for s, d in zip(strides, shape)]), code


def _check(name: str, info: tuple, shape: tuple, layout: str, codes: tuple, what: str) -> int:
    """Shape and dtype check (last dim contiguous); returns the dtype code."""
    if info[1] != shape:
        raise ValueError(f"{name}: expected shape {layout} = {shape}, got {info[1]}")
    if info[3] not in codes:
        raise ValueError(f"{name}: expected {what}, got dtype {_CODE_NAME.get(info[3], info[3])}")
    if shape and shape[-1] > 1 and 0 not in shape and info[2][-1] != 1:  # empty tensors have any strides
        raise ValueError(f"{name}: the last dimension must be contiguous (stride 1), got strides {info[2]}")
    return info[3]


def _check_contiguous(name: str, info: tuple) -> None:
    if 0 in info[1]:
        return
    expect, acc = [], 1
    for d in reversed(info[1]):
        expect.append(acc if d != 1 else 0)
        acc *= d
    if tuple(reversed(expect)) != info[2]:
        raise ValueError(f"{name}: must be contiguous, got strides {info[2]} (elements) for shape {info[1]}")


def _rank(name: str, info: tuple, rank: int, layout: str) -> tuple:
    if len(info[1]) != rank:
        raise ValueError(f"{name}: expected rank {rank} {layout}, got shape {info[1]}")
    return info[1]


def _vec_ok(info: tuple, vw: int, item: int) -> bool:
    """Rows of ``info`` can be read as ``vw``-element vectors: aligned pointer and strides."""
    return info[0] % (vw * item) == 0 and all(s % vw == 0 for s in info[2][:-1]) and info[1][-1] % vw == 0


_ITEM = {0: 4, 1: 2, 2: 2, 3: 8}


def _empty(like_torch: Any, shape: tuple, code: int):
    """Uninitialized output: torch when the inputs were torch (on q's device), else CuPy."""
    if like_torch is not None:
        torch = sys.modules["torch"]
        dtype = (torch.float32, torch.float16, torch.bfloat16, torch.float64)[code]
        return torch.empty(shape, dtype=dtype, device=like_torch.device)
    cupy = _CUPY or _cupy()
    if code == 2:
        raise ValueError("q: bfloat16 inputs need torch tensors (CuPy has no bfloat16 dtype)")
    return cupy.empty(shape, (cupy.float32, cupy.float16, None, cupy.float64)[code])


def _out_ptr(x) -> int:
    return x.data_ptr() if hasattr(x, "data_ptr") else x.data.ptr


# --------------------------------------------------------------------------- the common core

# Argument slots of a launch, in Params pointer order (state_out and o come from the plan).
_SLOTS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "state", "cu_seqlens", "slots", "num_accepted")


class _Plan:
    """Everything a call's shapes, strides, dtypes and alignments determine: validated once."""

    __slots__ = ("fn", "blocks", "threads", "static", "flags", "o_shape", "o_code", "state_shape", "state_code")


_PLANS: dict = {}


def _plan(infos: tuple, device: int, opts: tuple) -> _Plan:
    """Validate one argument signature and derive its launch (cached by the caller)."""
    scale, l2norm, v_first, double, new_state_out, fixed_state_rows, spec, gate_names, variant = opts
    qi, ki, vi, gi, bi, ai, di, si, ci, xi, ni = (_elements(i) for i in infos)
    B, T, H, K = _rank("q", qi, 4, "[B, T, H, K]")
    _rank("v", vi, 4, "[B, T, HV, V]")
    HV, V = vi[1][2], vi[1][3]
    if vi[1][:2] != (B, T):
        raise ValueError(f"v: expected leading dims [B, T] = {(B, T)}, got {vi[1][:2]}")
    if not (1 <= K <= MAX_HEAD_DIM and 1 <= V <= MAX_HEAD_DIM):
        raise ValueError(f"v: head sizes must be in [1, {MAX_HEAD_DIM}], got K = {K}, V = {V}")
    if H < 1 or HV < 1 or HV % H != 0:
        raise ValueError(f"v: value heads HV = {HV} must be a positive multiple of query/key heads H = {H}")
    dt = _check("q", qi, (B, T, H, K), "[B, T, H, K]", _FLOAT_CODES, "a float dtype")
    _check("k", ki, (B, T, H, K), "[B, T, H, K]", (dt,), f"dtype {_CODE_NAME[dt]} like q")
    _check("v", vi, (B, T, HV, V), "[B, T, HV, V]", (dt,), f"dtype {_CODE_NAME[dt]} like q")
    gn, bn = gate_names
    g_code = _check(gn, gi, (B, T, HV), "[B, T, HV]", _FLOAT_CODES, "a float dtype")
    b_code = _check(bn, bi, (B, T, HV), "[B, T, HV]", _FLOAT_CODES, "a float dtype")
    a_code = d_code = 0
    if ai is not None:
        a_code = _check("A_log", ai, (HV,), "[HV]", _FLOAT_CODES, "a float dtype")
        d_code = _check("dt_bias", di, (HV,), "[HV]", _FLOAT_CODES, "a float dtype")

    cu_code = 0
    N = B
    if ci is not None:
        if len(ci[1]) != 1 or ci[1][0] < 2:
            raise ValueError(f"cu_seqlens: expected shape [N + 1] with N >= 1, got {ci[1]}")
        cu_code = _check("cu_seqlens", ci, ci[1], "[N + 1]", _INDEX_CODES, "int32 or int64")
        if B != 1:
            raise ValueError(f"cu_seqlens: requires batch size B == 1, got B = {B}")
        N = ci[1][0] - 1

    acc_code = 3 if double else 0
    state_dims = (V, K) if v_first else (K, V)
    num_slots = N
    if si is not None:
        name = "initial_state" if fixed_state_rows else "state"
        rows = N if fixed_state_rows else (si[1][0] if si[1] else 0)
        layout = "[N, HV, V, K]" if v_first else "[N, HV, K, V]"
        _check(name, si, (rows, HV) + state_dims, layout, (acc_code,), _CODE_NAME[acc_code])
        _check_contiguous(name, si)
        num_slots = rows
    vw = 2 if double else 4
    # 16-byte state vectors: aligned heads and rows (row length a multiple of VW); outputs we
    # allocate are allocator-aligned
    state_vec = state_dims[1] % vw == 0 and (si is None or si[0] % 16 == 0)

    slot_code = accn_code = idx_stride = idx_cols = slot_mode = 0
    if xi is not None:
        if spec:
            if len(xi[1]) != 2 or xi[1][0] != N or xi[1][1] < 1:
                raise ValueError(f"ssm_state_indices: expected shape [N, num_spec + 1] with N = {N}, got {xi[1]}")
            slot_code = _check("ssm_state_indices", xi, xi[1], "[N, S]", _INDEX_CODES, "int32 or int64")
            idx_stride, idx_cols = xi[2][0], xi[1][1]
            accn_code = _check("num_accepted_tokens", ni, (N,), "[N]", _INDEX_CODES, "int32 or int64")
            slot_mode = 2
        else:
            slot_code = _check("slot_indices", xi, (N,), "[B]", _INDEX_CODES, "int32 or int64")
            slot_mode = 1

    if scale is None:
        scale = K**-0.5
    elif not math.isfinite(scale):
        raise ValueError(f"scale: must be finite, got {scale}")

    mode = MODE_SPEC if spec else (MODE_PREFILL if T > 1 else MODE_DECODE)
    narrow, cs, minb = _decode_variant(variant) if mode == MODE_DECODE else (False, False, 0)
    lc, ac, br, wv = tiling(K, V, v_first, double, narrow)
    vtiles = -(-V // wv)
    total_warps = N * HV * vtiles
    in_item = _ITEM[dt]
    flags = (_FLAG_L2NORM if l2norm else 0) | (_FLAG_RAW_GATES if ai is not None else 0)
    if state_vec:
        flags |= _FLAG_STATE_VEC
    if _vec_ok(qi, vw, in_item) and _vec_ok(ki, vw, in_item):
        flags |= _FLAG_QK_VEC
    if _vec_ok(vi, vw, in_item):
        flags |= _FLAG_V_VEC
    if V % vw == 0:
        flags |= _FLAG_O_VEC
    qs, ks, vs, gs, bs = qi[2], ki[2], vi[2], gi[2], bi[2]
    dtypes = g_code | b_code << 4 | a_code << 8 | d_code << 12 | slot_code << 16 | accn_code << 20 | cu_code << 24
    plan = _Plan()
    plan.fn = _compiled(name_expression(dt, double, v_first, lc, ac, br, mode, cs, minb), device)[1]
    w = _warps_per_cta(total_warps, device)
    plan.blocks, plan.threads = -(-total_warps // w), 32 * w
    plan.static = _SCALARS.pack(
        qs[0], qs[1], qs[2], ks[0], ks[1], ks[2], vs[0], vs[1], vs[2],
        gs[0], gs[1], gs[2], bs[0], bs[1], bs[2],
        B, T, N, H, HV, K, V,
        num_slots, idx_stride, idx_cols, slot_mode, dtypes, flags, vtiles, total_warps,
        float(scale),
    )  # fmt: skip
    plan.flags = flags
    plan.o_shape, plan.o_code = (B, T, HV, V), acc_code if double else dt
    plan.state_shape = (N, HV) + state_dims if new_state_out else None
    plan.state_code = acc_code
    return plan


def _run(
    q,
    k,
    v,
    g,
    beta,
    a_log=None,
    dt_bias=None,
    state=None,
    cu_seqlens=None,
    slot_idx=None,
    num_accepted=None,
    *,
    scale: float | None,
    l2norm: bool,
    v_first: bool,
    double: bool = False,
    inplace: bool = False,
    new_state_out: bool = False,
    fixed_state_rows: bool = True,
    spec: bool = False,
    gate_names: tuple[str, str] = ("g", "beta"),
    decode_variant: str | None = None,
):
    """Validate (once per signature), allocate outputs and launch; returns ``(o, state_out)``.

    ``state``: initial state (leading dim N when ``fixed_state_rows``) or pool (any leading dim);
    ``inplace`` writes the result back into it, ``new_state_out`` into a fresh ``[N, HV, ..]``.
    Raw gates: ``a_log``/``dt_bias`` given, ``g``/``beta`` carry ``a``/``b``. The per-call cost is
    reading each tensor's pointer, shape, strides and dtype plus one dict lookup.
    """
    cupy = _CUPY or _cupy()
    device = cupy.cuda.runtime.getDevice()
    args = (q, k, v, g, beta, a_log, dt_bias, state, cu_seqlens, slot_idx, num_accepted)
    infos = tuple([None if x is None else _tensor(x, name, device) for x, name in zip(args, _SLOTS)])
    variant = decode_variant or DEFAULT_DECODE_VARIANT  # T = 1 only; part of the signature
    opts = (scale, l2norm, v_first, double, new_state_out, fixed_state_rows, spec, gate_names, variant)
    # alignment (ptr & 15) decides the vector flags, so it is part of the signature
    key = (device, opts, tuple([None if i is None else (i[1], i[2], i[3], i[4], i[0] & 15) for i in infos]))
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) > 4096:  # many distinct shapes (e.g. every batch size): start over
            _PLANS.clear()
        plan = _PLANS[key] = _plan(infos, device, opts)
    torch_like = q if _is_torch(q) else None
    o = _empty(torch_like, plan.o_shape, plan.o_code)
    state_out = None
    if new_state_out:
        state_out = _empty(torch_like, plan.state_shape, plan.state_code)
    in_ptr = 0 if infos[7] is None else infos[7][0]
    out_ptr = in_ptr if inplace else (0 if state_out is None else _out_ptr(state_out))
    ptrs = [0 if i is None else i[0] for i in infos]
    if plan.blocks == 0:
        return o, state_out  # empty batch: nothing to launch
    _launch(
        plan,
        (ptrs[0], ptrs[1], ptrs[2], ptrs[3], ptrs[4], ptrs[5], ptrs[6], in_ptr, out_ptr, _out_ptr(o), ptrs[8],
         ptrs[9], ptrs[10]),
    )  # fmt: skip
    return o, state_out


def _to_double(x):
    """Float64 version of an initial state for the GPU oracle (copies unless already float64)."""
    if _is_torch(x):
        return x.to(sys.modules["torch"].float64).contiguous()
    cupy = _cupy()
    arr = x if isinstance(x, cupy.ndarray) else cupy.from_dlpack(x)
    return cupy.ascontiguousarray(arr, dtype=cupy.float64)


# --------------------------------------------------------------------------- public API


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
    precision: str = "float32",
) -> tuple[Any, Any | None]:
    """Gated delta rule, token by token on the GPU, in the native (FLA) convention.

    ``q, k`` ``[B, T, H, K]`` and ``v`` ``[B, T, HV, V]`` (one float dtype: float32, float16,
    bfloat16 via torch, float64); ``g, beta`` ``[B, T, HV]`` (any float dtype); ``initial_state``
    ``[N, HV, K, V]`` (``[N, HV, V, K]`` with ``state_v_first``) float32, contiguous;
    ``cu_seqlens`` ``[N + 1]`` int64 (or int32) with ``B == 1``, zero-length sequences allowed,
    ``cu_seqlens[-1] == T`` (not checked: that would synchronize). ``1 <= K, V <= 256``.

    Returns ``(o [B, T, HV, V] in q's dtype, final_state [N, HV, K, V] float32 or None)``.
    ``precision="float64"`` is the GPU oracle: compute and state in float64, ``o`` and the final
    state float64 (a float32 ``initial_state`` is promoted, which copies it).
    """
    if precision not in ("float32", "float64"):
        raise ValueError(f"precision: expected 'float32' or 'float64', got {precision!r}")
    double = precision == "float64"
    if double and initial_state is not None:
        initial_state = _to_double(initial_state)
    return _run(
        q, k, v, g, beta, state=initial_state, cu_seqlens=cu_seqlens, scale=scale, l2norm=use_qk_l2norm_in_kernel,
        v_first=state_v_first, double=double, new_state_out=output_final_state,
    )  # fmt: skip


def fused_decode_raw_gates(
    q: Any,
    k: Any,
    v: Any,
    state: Any,
    A_log: Any,
    a: Any,
    dt_bias: Any,
    b: Any,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
) -> tuple[Any, Any]:
    """FlashInfer / FlashInfer-Bench decode step with raw gates; ``state`` is updated in place.

    ``q, k`` ``[B, 1, H, K]``, ``v`` ``[B, 1, HV, V]`` (bfloat16/float16/float32); ``state``
    ``[B, HV, V, K]`` float32 (k-last), contiguous; ``A_log, dt_bias`` ``[HV]``; ``a, b``
    ``[B, 1, HV]`` (any float dtype). ``g = -exp(A_log) * softplus(a + dt_bias)`` (softplus is the
    identity above 20), ``beta = sigmoid(b)``; ``scale`` None or 0 means ``K ** -0.5``.
    Returns ``(o [B, 1, HV, V] in q's dtype, state)`` (the same state object).
    """
    o, _ = _run(
        q, k, v, a, b, A_log, dt_bias, state, scale=None if scale == 0 else scale, l2norm=use_qk_l2norm,
        v_first=True, inplace=True, gate_names=("a", "b"),
    )  # fmt: skip
    return o, state


def pooled_decode(
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    state_pool: Any,
    slot_indices: Any,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    state_v_first: bool = False,
) -> Any:
    """Decode (or a short per-request prefill) against a state pool, updated in place.

    ``q, k`` ``[B, T, H, K]`` (T = 1 for decode), ``v`` ``[B, T, HV, V]``, ``g, beta``
    ``[B, T, HV]``; ``state_pool`` ``[slots, HV, K, V]`` float32 (``[slots, HV, V, K]`` with
    ``state_v_first``), contiguous; ``slot_indices`` ``[B]`` int32/int64. Request ``b`` reads and
    writes slot ``slot_indices[b]``; a negative (or out-of-range) index is padding: its output rows
    are zero and no slot is touched. Slots nobody addresses stay bitwise unchanged.
    Returns ``o [B, T, HV, V]`` in q's dtype.
    """
    o, _ = _run(
        q, k, v, g, beta, state=state_pool, slot_idx=slot_indices, scale=scale, l2norm=use_qk_l2norm_in_kernel,
        v_first=state_v_first, inplace=True, fixed_state_rows=False,
    )  # fmt: skip
    return o


def spec_decode(
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    state_pool: Any,
    cu_seqlens: Any,
    ssm_state_indices: Any,
    num_accepted_tokens: Any,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    state_v_first: bool = False,
) -> Any:
    """vLLM speculative-decoding step against a state pool (updated in place).

    ``q, k`` ``[1, T, H, K]``, ``v`` ``[1, T, HV, V]``, ``g, beta`` ``[1, T, HV]`` with all
    requests' tokens packed; ``cu_seqlens`` ``[N + 1]`` (each request 1..S tokens);
    ``ssm_state_indices`` ``[N, S]`` int32/int64 (S = num_spec + 1); ``num_accepted_tokens`` ``[N]``
    int32/int64; ``state_pool`` ``[slots, HV, K, V]`` float32 (or v-first). Request ``n`` starts
    from slot ``ssm_state_indices[n, num_accepted_tokens[n] - 1]`` and writes the state after its
    ``t``-th token to slot ``ssm_state_indices[n, t]`` (negative entries are skipped). A negative
    starting slot makes the request padding: zero output, no slot touched.
    Returns ``o [1, T, HV, V]`` in q's dtype.
    """
    o, _ = _run(
        q, k, v, g, beta, state=state_pool, cu_seqlens=cu_seqlens, slot_idx=ssm_state_indices,
        num_accepted=num_accepted_tokens, scale=scale, l2norm=use_qk_l2norm_in_kernel, v_first=state_v_first,
        inplace=True, fixed_state_rows=False, spec=True,
    )  # fmt: skip
    return o


# --------------------------------------------------------------------------- the fast decode path

_STEP_POINTERS = struct.Struct("<12Q")  # Params.q .. Params.slot_idx (num_accepted stays 0)


class DecodeStep:
    """One decode step (T = 1) prepared once for fixed shapes, strides and dtypes: the low-latency path.

    ``step = DecodeStep(q, k, v, g, beta, state, slot_indices=None, ...)`` validates the example
    tensors exactly as :func:`recurrent_gated_delta_rule` / :func:`pooled_decode` would (same
    kernel), compiles, and packs the launch parameters. ``o = step(q, k, v, g, beta, state)`` then
    only reads the data pointers, patches them into the packed parameters and launches: no shape,
    stride or dtype checks, no plan lookup, and no allocation when ``out=`` is given or the step was
    built with ``reuse_output=True``. ``state`` (``[B, HV, K, V]``, or a pool ``[slots, HV, K, V]``
    addressed by ``slot_indices``; ``[.., V, K]`` with ``state_v_first``) is updated in place.

    Contract (not re-checked per call, for speed): every call passes tensors of the same kind
    (torch or CuPy), shapes, strides and dtypes as the example, on the device that was current at
    construction; only the pointer alignment the kernel's vector accesses rely on is checked (two
    integer tests). Breaking it reads or writes out of bounds. Use :meth:`checked` (full
    validation, then the same launch) when in doubt.

    ``reuse_output=True``: every call returns the SAME output buffer, overwritten by the next call.
    That is safe for consumers ordered on the launch stream (the usual decode loop: the next layer
    reads ``o`` before the next step is launched on the same stream), and unsafe if ``o`` is kept
    across steps, read on another stream, or captured by a CUDA graph together with a later step.
    The default allocates a fresh ``o`` per call (``torch.empty`` / ``cupy.empty``, ~3-5 us).

    ``stream``: a fixed stream to launch on (a CuPy stream, a torch stream, or a raw
    ``cudaStream_t`` integer); None launches on CuPy's current stream at each call. An instance
    keeps one parameter buffer: do not call the same instance from two threads at once.
    """

    def __init__(
        self,
        q: Any,
        k: Any,
        v: Any,
        g: Any,
        beta: Any,
        state: Any,
        slot_indices: Any = None,
        *,
        scale: float | None = None,
        use_qk_l2norm_in_kernel: bool = False,
        state_v_first: bool = False,
        reuse_output: bool = False,
        stream: Any = None,
        decode_variant: str | None = None,
    ) -> None:
        import numpy as np

        cupy = _cupy()
        self._kw = dict(
            scale=scale, l2norm=use_qk_l2norm_in_kernel, v_first=state_v_first, inplace=True,
            fixed_state_rows=slot_indices is None, decode_variant=decode_variant,
        )  # fmt: skip
        device = cupy.cuda.runtime.getDevice()
        args = (q, k, v, g, beta, None, None, state, None, slot_indices, None)
        infos = tuple([None if x is None else _tensor(x, name, device) for x, name in zip(args, _SLOTS)])
        if infos[0][1][1:2] != (1,):
            raise ValueError(f"q: DecodeStep is for one token (T = 1), got shape {infos[0][1]}")
        variant = decode_variant or DEFAULT_DECODE_VARIANT
        opts = (scale, use_qk_l2norm_in_kernel, state_v_first, False, False, slot_indices is None, False,
                ("g", "beta"), variant)  # fmt: skip
        plan = self._plan = _plan(infos, device, opts)
        self._torch = _is_torch(q)
        self._torch_like = q if self._torch else None
        self._pool = slot_indices is not None
        # the alignment the vector flags promise (bytes - 1); checked per call
        flags, vw = plan.flags, 4  # float32 state: 4-element vectors
        self._qk_mask = vw * _ITEM[infos[0][3]] - 1 if flags & _FLAG_QK_VEC else 0
        self._v_mask = vw * _ITEM[infos[0][3]] - 1 if flags & _FLAG_V_VEC else 0
        self._o_mask = vw * _ITEM[plan.o_code] - 1 if flags & _FLAG_O_VEC else 0
        self._state_mask = 15 if flags & _FLAG_STATE_VEC else 0
        self._out = _empty(self._torch_like, plan.o_shape, plan.o_code) if reuse_output else None
        self._buf = np.zeros(_PARAMS.size // 8, np.uint64)
        memoryview(self._buf).cast("B")[_POINTERS.size :] = plan.static
        self._argv = np.array([self._buf.ctypes.data], np.uint64)
        self._argv_ptr = int(self._argv.ctypes.data)
        self._fn, self._blocks, self._threads = plan.fn, plan.blocks, plan.threads
        self._launch_kernel = cupy.cuda.driver.launchKernel
        self._current_stream = cupy.cuda.get_current_stream
        if stream is None:
            self._stream = None
        elif isinstance(stream, int):
            self._stream = stream
        else:
            self._stream = int(getattr(stream, "ptr", None) or getattr(stream, "cuda_stream", 0))

    def __call__(self, q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any, slot_indices: Any = None,
                 *, out: Any = None) -> Any:  # fmt: skip
        """Launch one step; returns ``o [B, 1, HV, V]`` (``out`` when given). Never synchronizes."""
        if self._torch:
            pq, pk, pv, pg, pb = q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(), beta.data_ptr()
            ps = state.data_ptr()
            px = slot_indices.data_ptr() if self._pool else 0
        else:
            pq, pk, pv, pg, pb = q.data.ptr, k.data.ptr, v.data.ptr, g.data.ptr, beta.data.ptr
            ps = state.data.ptr
            px = slot_indices.data.ptr if self._pool else 0
        if out is None:
            out = self._out
            if out is None:
                plan = self._plan
                out = _empty(self._torch_like, plan.o_shape, plan.o_code)
        po = out.data_ptr() if self._torch else out.data.ptr
        if (pq | pk) & self._qk_mask or pv & self._v_mask or po & self._o_mask or ps & self._state_mask:
            raise ValueError("DecodeStep: a tensor is less aligned than the prepared one; use .checked()")
        if self._blocks:
            _STEP_POINTERS.pack_into(self._buf, 0, pq, pk, pv, pg, pb, 0, 0, ps, ps, po, 0, px)
            stream = self._stream
            if stream is None:
                stream = self._current_stream().ptr
            self._launch_kernel(self._fn, self._blocks, 1, 1, self._threads, 1, 1, 0, stream, self._argv_ptr, 0)
        return out

    def checked(self, q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any, slot_indices: Any = None,
                *, out: Any = None) -> Any:  # fmt: skip
        """The same step through the general, fully validating launcher (allocates ``o`` unless ``out``)."""
        o, _ = _run(q, k, v, g, beta, state=state, slot_idx=slot_indices, **self._kw)
        if out is not None:
            out[...] = o
            return out
        return o
