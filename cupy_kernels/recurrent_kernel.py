"""The core shared by the recurrent launchers (``recurrent.py``, ``decode.py``), in three steps:

- :func:`validate`: one call signature (what the caller asks, as a :class:`Request`, and the
  tensors' shapes, strides, dtypes and alignments) into a :class:`Problem`, or ``ValueError``
  naming the argument. Pure.
- :func:`select_plan`: the kernel instantiation and the grid for a problem, from the host
  heuristics (lane tiling, warps per CTA) and the device's SM count. Pure, cached: testable on
  the CPU without CuPy or a GPU.
- :func:`plan` compiles the selection and packs the launch parameters once per signature (a
  :class:`Plan`, cached); :func:`launch` / :func:`run` launch it.

A repeated call costs attribute reads, one dict lookup and the launch. :class:`KernelMode`
mirrors the template parameters of ``gdn::recurrent_kernel`` in ``recurrent.cu`` one to one; the
layout of ``gdn::Params`` is ``layout.PARAMS``.
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from cupy_kernels import layout, sources
from cupy_kernels import tensors as ts

SOURCE = "recurrent.cu"
MAX_HEAD_DIM = 256
MODE_DECODE, MODE_PREFILL, MODE_SPEC = layout.MODE_DECODE, layout.MODE_PREFILL, layout.MODE_SPEC

FLAG_L2NORM = layout.FLAGS["FLAG_L2NORM"]
FLAG_GATE_IN_KERNEL = layout.FLAGS["FLAG_GATE_IN_KERNEL"]
FLAG_STATE_VEC = layout.FLAGS["FLAG_STATE_VEC"]
FLAG_QK_VEC = layout.FLAGS["FLAG_QK_VEC"]
FLAG_V_VEC = layout.FLAGS["FLAG_V_VEC"]
FLAG_O_VEC = layout.FLAGS["FLAG_O_VEC"]
FLAG_BETA_SIGMOID = layout.FLAGS["FLAG_BETA_SIGMOID"]
FLAG_NEG_EIGVAL = layout.FLAGS["FLAG_NEG_EIGVAL"]

# gdn::Params: the per-call pointer head and the per-signature scalar tail (packed once into Plan.static)
POINTERS = layout.POINTERS
SCALARS = layout.SCALARS
PARAMS_SIZE = layout.PARAMS_SIZE


@dataclass(frozen=True)
class KernelMode:
    """One instantiation of ``gdn::recurrent_kernel<DT, AccT, VFIRST, LC, AC, BR, MODE, CS, MINB>``."""

    dtype: int  # DT: q/k/v element type code (tensors.F32 / F16 / BF16 / F64)
    double: bool  # AccT: double (the GPU oracle) or float
    v_first: bool  # VFIRST: state [.., V, K] instead of [.., K, V]
    lc: int  # LC, AC, BR: the lane tiling (see tiling())
    ac: int
    br: int
    mode: int  # MODE_DECODE / MODE_PREFILL / MODE_SPEC
    streaming: bool = False  # CS: evict-first state loads and stores
    min_blocks: int = 0  # MINB: __launch_bounds__ min blocks (0: ptxas decides)

    def name_expression(self) -> str:
        """The C++ name of the instantiation (for ``cupy.RawModule(name_expressions=...)``)."""
        b = {True: "true", False: "false"}
        acc = "double" if self.double else "float"
        return (
            f"gdn::recurrent_kernel<{self.dtype}, {acc}, {b[self.v_first]}, {self.lc}, {self.ac}, {self.br}, "
            f"{self.mode}, {b[self.streaming]}, {self.min_blocks}>"
        )


@dataclass(frozen=True)
class DecodeVariant:
    """A decode (T = 1) form of the kernel: ``streaming`` and ``min_blocks`` are :class:`KernelMode`'s
    CS and MINB. See RECURRENT_NOTES.md (and experimental/NOTES.md for the variants that left)."""

    streaming: bool
    min_blocks: int
    rows: bool = False  # v-first float state: K over all 32 lanes, a warp per few value rows (tiling())


# Decode kernel variants, timed side by side by gdn_verify/bench/decode.py. "wide" is the original kernel.
VARIANTS = {
    "wide": DecodeVariant(False, 0),
    "wide-cs": DecodeVariant(True, 0),
    # v-first: 16 state floats a lane, 80 registers, no spill under MINB 6 (24 warps per SM; ptxas
    # sm_90a, nvcc 13, 2026-12-05), the tiling of FlashInfer's V-major decode; k-first: as wide-cs
    "rows-cs": DecodeVariant(True, 6, rows=True),
}
# wide-cs: fastest at B >= 64 on an H100, within 1 us below
# (2026-11-22; reports/2026-11-23-decode-validation/README.md).
DEFAULT_VARIANT = "wide-cs"
_NOT_DECODE = DecodeVariant(False, 0)  # prefill and speculative decoding


def variant(name: str | None) -> DecodeVariant:
    try:
        return VARIANTS[DEFAULT_VARIANT if name is None else name]
    except KeyError:
        raise ValueError(f"decode_variant: expected one of {sorted(VARIANTS)}, got {name!r}") from None


@dataclass(frozen=True)
class Request:
    """What a launcher asks of the kernel (hashable: part of the plan cache key).

    ``state`` is the role of the state argument: ``"initial"`` (``initial_state [N, ..]`` read, the
    final state written to a new tensor when ``output_final_state``), ``"inplace"`` (``[N, ..]``
    updated in place), ``"pool"`` (``[slots, ..]`` addressed by ``slot_indices``, in place) or
    ``"spec"`` (vLLM speculative decoding against a pool). ``names`` are the argument names that
    error messages use for (g, beta, state).
    """

    state: str = "initial"
    scale: float | None = None
    l2norm: bool = False
    v_first: bool = False
    double: bool = False
    output_final_state: bool = False
    gate_in_kernel: bool = False
    beta_sigmoid: bool = False
    neg_eigval: bool = False
    variant: str | None = None
    names: tuple[str, str, str] = ("g", "beta", "initial_state")


def options(use_gate_in_kernel: bool, A_log: Any, use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool) -> None:
    """FLA's rules for its in-kernel gate options (raises ``ValueError`` naming the argument)."""
    if use_gate_in_kernel and A_log is None:
        raise ValueError("A_log: required when use_gate_in_kernel=True")
    if not use_gate_in_kernel and A_log is not None:
        raise ValueError("A_log: only read with use_gate_in_kernel=True")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("allow_neg_eigval: requires use_beta_sigmoid_in_kernel=True")


# --------------------------------------------------------------------------- kernel selection


def _pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


@functools.cache
def tiling(K: int, V: int, v_first: bool, double: bool, rows: bool = False) -> tuple[int, int, int, int]:
    """Lane tiling ``(LC, AC, BR, WV)`` for head sizes ``K, V`` (see the comment atop recurrent.cu).

    A lane holds ``BR * AC * VW`` state values (VW = 4 floats or 2 doubles per 16 bytes): at most
    64 floats / 32 doubles, which keeps the decode kernel near 168 registers without spills.
    ``WV`` is the number of value columns one warp owns. ``rows`` (v-first float state only): K
    spread over up to 32 lanes (a 512-byte row segment at K = 128) and at most 16 floats a lane,
    so that sums over K are whole-warp butterflies and many more warps fit on an SM.
    """
    vw = 2 if double else 4
    if rows and v_first and not double:
        lc = min(32, _pow2(-(-K // vw)))
        ac = _pow2(-(-K // (lc * vw)))
        lr = 32 // lc
        br = max(1, min(16 // (ac * vw), _pow2(-(-V // lr))))
        return lc, ac, br, lr * br
    budget = 32 if double else 64
    if not v_first:
        # vectors run along V; 4 lanes x 4 floats = 64-byte row segments per warp for K <= 128
        lc = 2 if (double or K > 128) else 4
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


def _warps_per_cta(total_warps: int, sms: int) -> int:
    # Small problems (batch-1 decode) get 1-warp CTAs so they spread over every SM; large ones 4.
    target = 2 * sms
    w = 4
    while w > 1 and -(-total_warps // w) < target:
        w //= 2
    return w


@dataclass(frozen=True)
class Selection:
    """The kernel and grid :func:`select_plan` picks for a problem."""

    kernel: KernelMode
    vtiles: int  # V tiles (warps) per value head: Params::vtiles
    total_warps: int  # N * HV * vtiles: Params::total_warps
    blocks: int
    threads: int


def select_plan(
    dtype: int,
    double: bool,
    v_first: bool,
    mode: int,
    variant_name: str | None,
    N: int,
    HV: int,
    K: int,
    V: int,
    sms: int,
) -> Selection:
    """The instantiation and grid for a validated problem on a device with ``sms`` SMs: the lane
    tiling of ``K, V`` (:func:`tiling`), the decode variant's cache hints and register cap (decode
    only; ``None`` is :data:`DEFAULT_VARIANT`), one warp per (sequence, value head, V tile), 1 to 4
    warps per CTA. Pure (no CuPy, no device) and cached: ``ValueError`` for an unknown variant.
    ``None`` is resolved before the cache, so a changed :data:`DEFAULT_VARIANT` (the GPU tests and
    sanitize_decode.py set it, then drop ``_PLANS``) takes effect."""
    name = DEFAULT_VARIANT if variant_name is None else variant_name
    return _select_plan(dtype, double, v_first, mode, name, N, HV, K, V, sms)


@functools.cache
def _select_plan(
    dtype: int, double: bool, v_first: bool, mode: int, variant_name: str, N: int, HV: int, K: int, V: int, sms: int
) -> Selection:
    var = variant(variant_name) if mode == MODE_DECODE else _NOT_DECODE
    rows = var.rows and v_first and not double  # elsewhere a rows variant is the wide tile, uncapped
    lc, ac, br, wv = tiling(K, V, v_first, double, rows)
    minb = var.min_blocks if rows or not var.rows else 0
    kernel = KernelMode(dtype, double, v_first, lc, ac, br, mode, var.streaming, minb)
    vtiles = -(-V // wv)
    total_warps = N * HV * vtiles
    w = _warps_per_cta(total_warps, sms)
    return Selection(kernel, vtiles, total_warps, -(-total_warps // w), 32 * w)


@functools.cache
def compiled(mode: KernelMode, device: int) -> tuple[Any, int]:
    """``(RawKernel, CUfunction handle)`` of one instantiation, compiled once per process and device
    (CuPy also caches the binary on disk). The cache keeps the kernel, hence its module, alive."""
    cp = ts.cupy()
    expr = mode.name_expression()
    with cp.cuda.Device(device):
        module = cp.RawModule(code=sources.source(SOURCE), options=("-std=c++17",), name_expressions=[expr])
        kernel = module.get_function(expr)
        kernel.kernel.ptr  # noqa: B018 - loads the module on this device now, not inside a graph capture
    return kernel, kernel.kernel.ptr


# --------------------------------------------------------------------------- validation

# Argument slots of a call, in Params pointer order (state_out, o and err come from the launcher).
SLOTS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "state", "cu_seqlens", "slots", "num_accepted")


@dataclass(frozen=True)
class Problem:
    """One validated call signature: what :func:`select_plan` and the Params scalars depend on."""

    dtype: int  # q/k/v element type code
    mode: int  # MODE_*
    N: int
    HV: int
    K: int
    V: int
    flags: int  # Params::flags without the grid (FLAG_*)
    scalars: dict  # every Params scalar but vtiles and total_warps, by field name
    o_code: int
    o_shape: tuple
    state_shape: tuple | None  # the new final-state tensor (None: not asked for, or in place)
    state_code: int
    masks: tuple  # the pointer alignment (bytes - 1) the vector flags promise: q/k, v, o, state


def validate(req: Request, infos: tuple) -> Problem:
    """Validate one argument signature (``tensors.read`` tuples in ``SLOTS`` order); ``ValueError``
    naming the argument. Pure: reads only the tuples (pointers for alignment only)."""
    qi, ki, vi, gi, bi, ai, di, si, ci, xi, ni = (ts.elements(i) for i in infos)
    gn, bn, sn = req.names
    B, T, H, K = ts.rank("q", qi, 4, "[B, T, H, K]")
    ts.rank("v", vi, 4, "[B, T, HV, V]")
    HV, V = vi[1][2], vi[1][3]
    if vi[1][:2] != (B, T):
        raise ValueError(f"v: expected leading dims [B, T] = {(B, T)}, got {vi[1][:2]}")
    if not (1 <= K <= MAX_HEAD_DIM and 1 <= V <= MAX_HEAD_DIM):
        raise ValueError(f"v: head sizes must be in [1, {MAX_HEAD_DIM}], got K = {K}, V = {V}")
    if H < 1 or HV < 1 or HV % H != 0:
        raise ValueError(f"v: value heads HV = {HV} must be a positive multiple of query/key heads H = {H}")
    dt = ts.check("q", qi, (B, T, H, K), "[B, T, H, K]", ts.FLOAT_CODES, "a float dtype")
    ts.check("k", ki, (B, T, H, K), "[B, T, H, K]", (dt,), f"dtype {ts.CODE_NAME[dt]} like q")
    ts.check("v", vi, (B, T, HV, V), "[B, T, HV, V]", (dt,), f"dtype {ts.CODE_NAME[dt]} like q")
    g_code = ts.check(gn, gi, (B, T, HV), "[B, T, HV]", ts.FLOAT_CODES, "a float dtype")
    b_code = ts.check(bn, bi, (B, T, HV), "[B, T, HV]", ts.FLOAT_CODES, "a float dtype")
    a_code = d_code = 0
    if ai is not None:
        a_code = ts.check("A_log", ai, (HV,), "[HV]", ts.FLOAT_CODES, "a float dtype")
    if di is not None:
        d_code = ts.check("dt_bias", di, (HV,), "[HV]", ts.FLOAT_CODES, "a float dtype")

    cu_code = 0
    N = B
    if ci is not None:
        if len(ci[1]) != 1 or ci[1][0] < 2:
            raise ValueError(f"cu_seqlens: expected shape [N + 1] with N >= 1, got {ci[1]}")
        cu_code = ts.check("cu_seqlens", ci, ci[1], "[N + 1]", ts.INDEX_CODES, "int32 or int64")
        if B != 1:
            raise ValueError(f"cu_seqlens: requires batch size B == 1, got B = {B}")
        N = ci[1][0] - 1
    elif req.state == "spec":
        raise ValueError("cu_seqlens: required for speculative decoding")

    acc_code = ts.F64 if req.double else ts.F32
    state_dims = (V, K) if req.v_first else (K, V)
    num_slots = N
    layout_text = "[.., HV, V, K]" if req.v_first else "[.., HV, K, V]"
    if si is None and req.state != "initial":
        raise ValueError(f"{sn}: required")
    if si is not None:
        rows = N if req.state in ("initial", "inplace") else (si[1][0] if si[1] else 0)
        ts.check(sn, si, (rows, HV) + state_dims, layout_text, (acc_code,), ts.CODE_NAME[acc_code])
        ts.check_contiguous(sn, si)
        num_slots = rows
    vw = 2 if req.double else 4
    # 16-byte state vectors: aligned heads and rows (row length a multiple of VW); outputs we
    # allocate are allocator-aligned
    state_vec = state_dims[1] % vw == 0 and (si is None or si[0] % 16 == 0)

    slot_code = accn_code = idx_stride = idx_cols = slot_mode = 0
    if req.state == "spec":
        if xi is None or len(xi[1]) != 2 or xi[1][0] != N or xi[1][1] < 1:
            got = None if xi is None else xi[1]
            raise ValueError(f"ssm_state_indices: expected shape [N, num_spec + 1] with N = {N}, got {got}")
        slot_code = ts.check("ssm_state_indices", xi, xi[1], "[N, S]", ts.INDEX_CODES, "int32 or int64")
        idx_stride, idx_cols = xi[2][0], xi[1][1]
        if ni is None:
            raise ValueError("num_accepted_tokens: required for speculative decoding")
        accn_code = ts.check("num_accepted_tokens", ni, (N,), "[N]", ts.INDEX_CODES, "int32 or int64")
        slot_mode = 2
    elif req.state == "pool":
        if xi is None:
            raise ValueError("slot_indices: required with a state pool")
        slot_code = ts.check("slot_indices", xi, (N,), "[B]", ts.INDEX_CODES, "int32 or int64")
        slot_mode = 1

    scale = req.scale
    if scale is None:
        scale = K**-0.5
    elif not math.isfinite(scale):
        raise ValueError(f"scale: must be finite, got {scale}")

    mode = MODE_SPEC if req.state == "spec" else (MODE_PREFILL if T > 1 else MODE_DECODE)
    in_item = ts.ITEM[dt]
    flags = (FLAG_L2NORM if req.l2norm else 0) | (FLAG_GATE_IN_KERNEL if req.gate_in_kernel else 0)
    flags |= (FLAG_BETA_SIGMOID if req.beta_sigmoid else 0) | (FLAG_NEG_EIGVAL if req.neg_eigval else 0)
    if state_vec:
        flags |= FLAG_STATE_VEC
    if ts.vec_ok(qi, vw, in_item) and ts.vec_ok(ki, vw, in_item):
        flags |= FLAG_QK_VEC
    if ts.vec_ok(vi, vw, in_item):
        flags |= FLAG_V_VEC
    if V % vw == 0:
        flags |= FLAG_O_VEC
    dtypes = g_code | b_code << 4 | a_code << 8 | d_code << 12 | slot_code << 16 | accn_code << 20 | cu_code << 24
    strides = {}
    for tensor, info in (("q", qi), ("k", ki), ("v", vi), ("g", gi), ("b", bi)):
        strides.update(zip((f"{tensor}_sb", f"{tensor}_st", f"{tensor}_sh"), info[2]))
    scalars = dict(
        strides,
        B=B,
        T=T,
        N=N,
        H=H,
        HV=HV,
        K=K,
        V=V,
        num_slots=num_slots,
        idx_stride=idx_stride,
        idx_cols=idx_cols,
        slot_mode=slot_mode,
        dtypes=dtypes,
        flags=flags,
        scale=float(scale),
    )
    o_code = acc_code if req.double else dt
    return Problem(
        dtype=dt,
        mode=mode,
        N=N,
        HV=HV,
        K=K,
        V=V,
        flags=flags,
        scalars=scalars,
        o_code=o_code,
        o_shape=(B, T, HV, V),
        state_shape=(N, HV) + state_dims if req.state == "initial" and req.output_final_state else None,
        state_code=acc_code,
        masks=(
            vw * in_item - 1 if flags & FLAG_QK_VEC else 0,
            vw * in_item - 1 if flags & FLAG_V_VEC else 0,
            vw * ts.ITEM[o_code] - 1 if flags & FLAG_O_VEC else 0,
            15 if flags & FLAG_STATE_VEC else 0,
        ),
    )


# --------------------------------------------------------------------------- plans


class Plan:
    """Everything a call's request, shapes, strides, dtypes and alignments determine: validated,
    selected, compiled and packed once."""

    __slots__ = (
        "fn",
        "blocks",
        "threads",
        "static",
        "flags",
        "kernel",
        "o_shape",
        "o_code",
        "state_shape",
        "state_code",
        "masks",
    )


def plan(req: Request, infos: tuple, device: int) -> Plan:
    """:func:`validate`, :func:`select_plan` on ``device``, compile, and pack the Params scalars."""
    prob = validate(req, infos)
    sel = select_plan(
        prob.dtype, req.double, req.v_first, prob.mode, req.variant, prob.N, prob.HV, prob.K, prob.V, ts.num_sms(device)
    )
    p = Plan()
    p.kernel = sel.kernel
    p.fn = compiled(sel.kernel, device)[1]
    p.blocks, p.threads = sel.blocks, sel.threads
    p.static = layout.pack_scalars(dict(prob.scalars, vtiles=sel.vtiles, total_warps=sel.total_warps))
    p.flags = prob.flags
    p.o_code, p.o_shape = prob.o_code, prob.o_shape
    p.state_shape, p.state_code = prob.state_shape, prob.state_code
    p.masks = prob.masks
    return p


_PLANS: dict = {}


def cached_plan(req: Request, infos: tuple, device: int) -> Plan:
    # alignment (ptr & 15) decides the vector flags, so it is part of the signature
    key = (device, req, tuple([None if i is None else (i[1], i[2], i[3], i[4], i[0] & 15) for i in infos]))
    p = _PLANS.get(key)
    if p is None:
        if len(_PLANS) > 4096:  # many distinct shapes (e.g. every batch size): start over
            _PLANS.clear()
        p = _PLANS[key] = plan(req, infos, device)
    return p


# --------------------------------------------------------------------------- launching


class _Launch(threading.local):
    """Per-thread parameter buffer: ``cuLaunchKernel`` copies it at launch, so it is reusable."""

    def __init__(self) -> None:
        self.buf = np.zeros(PARAMS_SIZE // 8, np.uint64)
        self.bytes = memoryview(self.buf).cast("B")
        self.argv = np.array([self.buf.ctypes.data], np.uint64)  # void* kernelParams[1]
        self.argv_ptr = self.argv.ctypes.data


_launch_state: _Launch | None = None


def launch(p: Plan, ptrs: tuple, stream: int) -> None:
    """Pack the pointer head of Params, copy the plan's pre-packed scalar tail, launch on ``stream``."""
    global _launch_state
    if _launch_state is None:
        _launch_state = _Launch()
    st = _launch_state
    POINTERS.pack_into(st.buf, 0, *ptrs)
    st.bytes[POINTERS.size :] = p.static
    ts.cupy().cuda.driver.launchKernel(p.fn, p.blocks, 1, 1, p.threads, 1, 1, 0, stream, st.argv_ptr, 0)


def run(req: Request, args: tuple, *, checked: bool | None, source: str) -> tuple[Any, Any]:
    """Validate (once per signature), allocate outputs and launch; returns ``(o, state_out)``.

    ``args`` are the call's tensors in ``SLOTS`` order (None where absent). Metadata already on the
    host is validated there and copied to the device; device metadata is validated by the kernel,
    whose error is raised here when ``checked`` (after synchronizing the launch stream) or else by
    the next launcher call / ``tensors.check_errors()`` (deferred).
    """
    device = ts.current_device()
    words = ts.error_words(device)
    if words.pending():
        words.raise_pending(deferred=True)
    q = args[0]
    torch_like = q if ts.is_torch(q) else None
    stream = ts.launch_stream(torch_like is not None, device)
    args = list(args)
    device_metadata = False
    if args[8] is not None or args[9] is not None or args[10] is not None:
        device_metadata = _host_metadata(req, args, stream)
    gn, bn, sn = req.names
    names = (
        "q",
        "k",
        "v",
        gn,
        bn,
        "A_log",
        "dt_bias",
        sn,
        "cu_seqlens",
        "ssm_state_indices" if req.state == "spec" else "slot_indices",
        "num_accepted_tokens",
    )
    infos = tuple([None if x is None else ts.read(x, name, device) for x, name in zip(args, names)])
    p = cached_plan(req, infos, device)
    o = ts.empty(torch_like, p.o_shape, p.o_code)
    state_out = None if p.state_shape is None else ts.empty(torch_like, p.state_shape, p.state_code)
    si = infos[7]
    in_ptr = 0 if si is None else si[0]
    out_ptr = in_ptr if req.state != "initial" else (0 if state_out is None else ts.pointer(state_out))
    if p.blocks == 0:
        return o, state_out  # empty batch: nothing to launch
    ptrs = [0 if i is None else i[0] for i in infos]
    launch(
        p,
        (
            ptrs[0],
            ptrs[1],
            ptrs[2],
            ptrs[3],
            ptrs[4],
            ptrs[5],
            ptrs[6],
            in_ptr,
            out_ptr,
            ts.pointer(o),
            ptrs[8],
            ptrs[9],
            ptrs[10],
            words.ptr,
        ),
        stream,
    )
    if device_metadata:
        words.source = source
        if ts.checked_default() if checked is None else checked:
            ts.finish_checked(words, stream)
    return o, state_out


def _host_metadata(req: Request, args: list, stream: int) -> bool:
    """Validate metadata that is on the host and replace it by a device copy (in ``args``).

    Returns True when some metadata stays on the device (validated by the kernel instead).
    """
    on_device = False
    q, state = args[0], args[7]
    T = q.shape[1] if len(q.shape) > 1 else 0
    B = q.shape[0] if len(q.shape) > 0 else 0
    cu = ts.host_ints(args[8])
    slots_name = "ssm_state_indices" if req.state == "spec" else "slot_indices"
    slots = ts.host_ints(args[9])
    S = None
    if req.state == "spec" and args[9] is not None and len(args[9].shape) == 2:
        S = int(args[9].shape[1])
    if cu is not None:
        args[8] = ts.upload(ts.check_cu_seqlens_host(cu, B, T, S), stream)
    elif args[8] is not None:
        on_device = True
    if slots is not None:
        num_slots = int(state.shape[0]) if state is not None and len(state.shape) else 0
        args[9] = ts.upload(ts.check_slots_host(slots_name, slots, num_slots), stream)
    elif args[9] is not None:
        on_device = True
    accepted = ts.host_ints(args[10])
    if accepted is not None:
        args[10] = ts.upload(ts.check_accepted_host(accepted, S or 0), stream)
    elif args[10] is not None:
        on_device = True
    return on_device
