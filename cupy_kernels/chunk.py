"""CuPy launcher for the chunked (WY/UT) GDN forward kernels (``chunk_*.cu``).

Native convention (FLA ``chunk_gated_delta_rule``): ``q, k [B, T, H, K]``, ``v [B, T, HV, V]``,
``g, beta [B, T, HV]``, ``initial_state [N, HV, K, V]`` fp32 (``[N, HV, V, K]`` with
``state_v_first``), ``cu_seqlens [N + 1]`` with ``B == 1``, and FLA's in-kernel gate options.
Inputs are CuPy arrays or DLPack tensors (torch) on the current device: they are used in place
and must be contiguous (the launcher never copies silently); torch bfloat16 travels as an int16
view. Outputs come back in the kind of ``q`` (torch in, torch out). Tensor policy: the
``cupy_kernels`` package docstring; this launcher's documented exception is that device
``cu_seqlens`` are read on the host (one synchronization), since the chunk tables size the grid
and the scratch.

Three kernel paths. bf16 inputs with ``chunk_size = 64``, ``K`` a multiple of 16 up to 128 and
``V`` a multiple of 16 take the fused path by default (``gdn_fused_prep`` + ``gdn_fused_state``: two
launches, bf16 hi / lo scratch of 32 KiB per (chunk, value head), the state kept in registers and the
output computed beside it; see chunk_common.cuh); ``fused=False`` opts out and ``fused=True``
insists. On sm_90 (H100, H200) with ``K`` 64 or 128 and ``V`` a multiple of 64, the state kernel
is the wgmma one (``gdn_fused_state_sm90_k<K>`` in ``chunk_wgmma.cu``, built for sm_90a by
:func:`sources.sm90a_module`; ``wgmma=False`` keeps mma.sync). Otherwise two arithmetic paths of
the three-kernel layout (``chunk_three_kernel.cu``, the ``TC`` template flag): bf16 / fp16 inputs
take the tensor-core path by default (``mma.sync`` bf16 products with fp32 accumulation; fp32 operands
are split into two bf16 parts and multiplied with three MMAs, about 2^-16 relative error), fp32
inputs the plain FP32 path (no TF32); ``use_tensor_cores`` overrides the choice. Both run in
three launches (the fused path two) on the caller's stream (torch's current stream for torch inputs, CuPy's for
CuPy arrays): intra-chunk (W, U), state passing, output. Outputs and scratch come from the
allocator of ``q``'s kind (torch's caching allocator, else CuPy's pool), in stream order; the chunk
tables of each ``cu_seqlens`` content are uploaded once and reused (:class:`_DeviceTables`).
Kernels launch through ``cuLaunchKernel`` (:class:`tensors.Signature`), so a call costs about
0.1 ms of host time. Each path compiles only the kernels it launches (one source file per path:
``chunk_three_kernel.cu``; ``chunk_fused_prep.cu`` with ``chunk_fused.cu`` or ``chunk_wgmma.cu``).
CuPy is imported lazily, so importing this module needs no GPU.
"""

from __future__ import annotations

import functools
import math
import threading
import warnings
from typing import Any, NamedTuple

import numpy as np

from cupy_kernels import sources
from cupy_kernels import tensors as ts

_THREE_KERNEL_SOURCE = "chunk_three_kernel.cu"
_PREP_SOURCE = "chunk_fused_prep.cu"
_FUSED_SOURCE = "chunk_fused.cu"
_WGMMA_SOURCE = "chunk_wgmma.cu"
CHUNK_SIZES = (16, 32, 64)
MAX_HEAD_DIM = 256  # bounded by shared memory: the output kernel needs about 164 KiB at K = V = 256
_THREADS = 256
_STATE_TILE = 16  # kStateTile in chunk_common.cuh
_OUT_TILE = 64  # kOutTile in chunk_common.cuh
FUSED_CHUNK = 64  # gdn_fused::C
FUSED_MAX_K = 128  # gdn_fused::kMaxK: the state rows a CTA holds in registers
_FUSED_PAD = 8  # gdn_fused::kPad
WGMMA_K = (64, 128)  # head sizes K with an sm_90a state kernel (gdn_fused_state_sm90_k<K>)
_WGMMA_COLUMNS = 64  # value columns per CTA of that kernel: one warpgroup, 16 per warp
_CTYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
# gate_flags bits (chunk_common.cuh kGateIsT, kBetaIsT, kGateInKernel, kBetaSigmoid, kNegEigval)
_G_IS_T, _BETA_IS_T, _GATE_IN_KERNEL, _BETA_SIGMOID, _NEG_EIGVAL = 1, 2, 4, 8, 16

# The kernels the latest call launched, for benchmarks and reports: "three-kernel", "fused mma.sync
# <warps, k_split>" or "fused wgmma sm_90a" (a diagnostic, not an input).
last_kernels = ""

# Tests set this to fill outputs and scratch with NaN before the launches, so any element a
# kernel fails to write (or any scratch it reads before writing) shows up as NaN.
_debug_poison = False


@functools.cache
def _sm90a_builds() -> bool:
    """Whether the sm_90a wgmma state kernel builds here (:func:`sources.sm90a_module`); warns once,
    with NVRTC's reason, where it does not (the default then keeps the mma.sync state kernel)."""
    try:
        sources.sm90a_module(_WGMMA_SOURCE)
    except (ImportError, RuntimeError) as e:
        warnings.warn(f"the sm_90a wgmma state kernel is not available, using mma.sync: {e}", stacklevel=3)
        return False
    return True


def wgmma_state(K: int, V: int, device: int) -> bool:
    """Whether the sm_90a wgmma state kernel applies: an sm_90 device (H100, H200), ``K`` in
    ``WGMMA_K`` and ``V`` a multiple of 64 (one warpgroup per 64 value columns)."""
    return K in WGMMA_K and V % _WGMMA_COLUMNS == 0 and ts.compute_capability(device) == (9, 0)


def _prep_kernel():
    """The compiled prep kernel of both fused paths (its own source: neither state kernel is built to get it)."""
    return sources.raw_module(_PREP_SOURCE, ("gdn_fused_prep",))[0]


def _fused_state_kernel(warps: int, k_split: int):
    """The compiled mma.sync state kernel: ``warps`` slabs of 16 value columns, ``k_split`` warps per slab."""
    return sources.raw_module(_FUSED_SOURCE, (f"gdn_fused_state<{warps}, {k_split}>",))[0]


def fused_warps(dtype: str, chunk_size: int, K: int, V: int, tensor_cores: bool) -> int | None:
    """Warps per CTA of the fused state kernel (each owns 16 value columns) for these inputs, or
    None where the fused path does not apply. Four warps share one load of k, q, T' and P' per
    chunk; fewer where V is not a multiple of 64."""
    if dtype != "bfloat16" or not tensor_cores or chunk_size != FUSED_CHUNK:
        return None
    if K % 16 or K > FUSED_MAX_K or V % 16:
        return None
    return next(w for w in (4, 2, 1) if V % (16 * w) == 0)


def fused_k_split(K: int, V: int, sequences: int, HV: int, sms: int) -> int:
    """Warps sharing one 16-column slab's state rows in the fused state kernel: 2 where the CTAs of
    that form (two slabs, four warps, one CTA per SM for its shared memory) still fit in one wave
    on ``sms`` SMs, so each chunk's dependent MMA chain is about half as long (few sequences: the
    1 x T rows, where four warps per SM leave the chain's latency exposed); else 1, where the
    waves it would add cost more than the chain it shortens. Needs K % 32 == 0 and V % 32 == 0."""
    if K % 32 or V % 32:
        return 1
    return 2 if sequences * HV * (V // 32) <= sms else 1


def _kernels(ctype: str, chunk_size: int, tensor_cores: bool = False):
    """Compiled ``(intra, state, output)`` kernels for one input type, chunk size and path."""
    tc = "true" if tensor_cores else "false"
    return sources.raw_module(
        _THREE_KERNEL_SOURCE,
        (
            f"gdn_chunk_intra<{ctype}, {chunk_size}, {tc}>",
            f"gdn_chunk_state<{chunk_size}, {tc}>",
            f"gdn_chunk_output<{ctype}, {chunk_size}, {tc}>",
        ),
    )


class _Input:
    """One input read in place (:func:`tensors.read`): its pointer, shape, dtype code and name.
    Float inputs only, contiguous (the launcher never copies silently)."""

    __slots__ = ("ptr", "shape", "code", "dtype")

    def __init__(self, name: str, x: Any, device: int):
        ptr, shape, strides, code = ts.elements(ts.read(x, name, device))
        if code not in (ts.F32, ts.F16, ts.BF16):
            raise ValueError(f"{name}: expected float32, float16 or bfloat16, got {ts.CODE_NAME.get(code, code)}")
        ts.check_contiguous(name, (ptr, shape, strides, code))
        self.ptr, self.shape, self.code, self.dtype = ptr, tuple(shape), code, ts.CODE_NAME[code]


def _bounds(cu_seqlens: Any, B: int, T: int) -> np.ndarray:
    """Validated ``[N + 1]`` int64 offsets on the host (device ``cu_seqlens``: one synchronizing copy)."""
    if cu_seqlens is None:
        return np.arange(B + 1, dtype=np.int64) * T
    host = ts.host_ints(cu_seqlens)
    if host is None:
        if ts.is_torch(cu_seqlens):
            host = cu_seqlens.detach().cpu().numpy()  # ordered after torch's current stream
        elif hasattr(cu_seqlens, "get"):
            host = cu_seqlens.get()  # CuPy: ordered after CuPy's current stream
        else:
            try:
                host = ts.cupy().from_dlpack(cu_seqlens).get()
            except Exception as exc:  # noqa: BLE001
                raise ValueError(f"cu_seqlens: cannot be read on the host ({exc})") from None
    return ts.check_cu_seqlens_host(host, B, T)


def _head_params(name: str, x: Any, HV: int, device: int) -> int:
    """Pointer of ``A_log`` / ``dt_bias``: float32 ``[HV]``, contiguous, on the device (0 when absent)."""
    if x is None:
        return 0
    a = _Input(name, x, device)
    if a.shape != (HV,) or a.dtype != "float32":
        raise ValueError(f"{name}: expected float32 [HV] = ({HV},), got {a.dtype} {a.shape}")
    return a.ptr


def chunk_tables(bounds: np.ndarray, chunk_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-sequence chunking of validated offsets ``bounds [N + 1]`` (int64).

    Returns ``(chunk_start [NC] int64, chunk_len [NC] int32, seq_chunk_off [N + 1] int32)``:
    chunk ``c`` covers flat tokens ``chunk_start[c] .. + chunk_len[c]`` (the last chunk of a
    sequence is ragged, an empty sequence has none) and sequence ``n`` owns chunks
    ``seq_chunk_off[n] .. seq_chunk_off[n + 1]``.
    """
    lengths = np.diff(bounds)
    counts = -(-lengths // chunk_size)
    seq_chunk_off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    if seq_chunk_off[-1] >= 2**31:
        raise ValueError("cu_seqlens: too many chunks for int32 chunk indices")
    seq = np.repeat(np.arange(lengths.size), counts)
    local = np.arange(seq_chunk_off[-1]) - seq_chunk_off[:-1][seq]
    start = bounds[:-1][seq] + local * chunk_size
    length = np.minimum(chunk_size, bounds[1:][seq] - start)
    return start.astype(np.int64), length.astype(np.int32), seq_chunk_off.astype(np.int32)


def _smem_bytes(chunk_size: int, K: int, V: int, tensor_cores: bool = False) -> tuple[int, int, int]:
    """Dynamic shared memory of the (intra, state, output) kernels; mirrors the layouts in chunk_three_kernel.cu."""
    C = chunk_size
    xs = max(K, V) | 1
    intra = C * xs + 2 * C * (C + 1) + C * C // 4 + 6 * C
    kp = K + 4 if tensor_cores else K  # padded W / Kd rows on the tensor-core path
    state = 2 * C * kp + 2 * C * _STATE_TILE + K * _STATE_TILE
    ks = K | 1
    output = C * ks + max(C * ks, _OUT_TILE * (K + C)) + C * (C + 1) + 2 * C
    return 4 * intra, 4 * state, 4 * output


def _fused_smem_bytes(K: int, warps: int, k_split: int = 1, wgmma: bool = False) -> tuple[int, int]:
    """Dynamic shared memory of the fused (prep, state) kernels; mirrors their layouts (chunk_fused*.cu,
    chunk_wgmma.cu)."""
    C, kp, vp, cp = FUSED_CHUNK, K + _FUSED_PAD, 16 * warps + _FUSED_PAD, FUSED_CHUNK + _FUSED_PAD
    # G fp64, four fp32 vectors, A; then k and q, whose space T and tmp take over
    prep = (2 * C + 4 * C + C * (C + 1)) * 4 + max(2 * C * kp * 2, (C * (C + 1) + C * C // 4) * 4)
    if wgmma:  # two stages of k, q, T'/P' (unpadded swizzled tiles), v and vectors; the output tile
        vp = _WGMMA_COLUMNS + _FUSED_PAD
        stage = 2 * C * K * 2 + 4 * C * C * 2 + C * vp * 2 + 4 * C * 4
        return prep, 2 * stage + C * vp * 2
    k_and_vectors = C * kp * 2 + 4 * C * 4  # double-buffered
    q_v_mats = (C * kp * 2 + C * vp * 2 + 4 * C * cp * 2) * (2 if k_split > 1 else 1)  # single unless split
    exchange = warps * k_split * C * 32 * 4 if k_split > 1 else 0  # per warp: partial Y_k, Y_q, C floats a lane
    state = 2 * k_and_vectors + q_v_mats + C * vp * 2 + exchange  # ... + the output tile
    return prep, state


# Kernel parameter lists (the kernels' signatures): P pointer, i int, f float.
_SIG_INTRA = ts.Signature("PPPPiPPPPiiiiiPPPP")
_SIG_STATE = ts.Signature("PPPPPPiiiiiPPPi")
_SIG_OUTPUT = ts.Signature("PPPiPPPPPPPiiiiifP")
_SIG_PREP = ts.Signature("PPPPiPPPPiiiifPP")
_SIG_FUSED_STATE = ts.Signature("PPPPPPPPPiiiiiiPPi")  # gdn_fused_state and the sm_90a kernels
_HANDLES: dict[tuple[int, int], tuple[Any, int, int]] = {}


def _handle(kernel: Any, smem: int, device: int) -> int:
    """The CUfunction of a compiled kernel on ``device``, opted in (once per size) to ``smem`` bytes of
    dynamic shared memory beyond the 48 KiB default, with all of L1 as shared memory (more CTAs per SM)."""
    got = _HANDLES.get((id(kernel), device))
    if got is None or got[2] < smem:
        if smem > 48 * 1024:
            kernel.max_dynamic_shared_size_bytes = smem
            kernel.preferred_shared_memory_carveout = 100
        got = _HANDLES[(id(kernel), device)] = (kernel, kernel.kernel.ptr, smem)  # the kernel stays alive
    return got[1]


@functools.cache
def _wgmma_kernel(K: int):
    return sources.sm90a_module(_WGMMA_SOURCE).get_function(f"gdn_fused_state_sm90_k{K}")


def pack_tables(bounds: np.ndarray, chunk_size: int) -> tuple[np.ndarray, tuple[int, int, int], int]:
    """:func:`chunk_tables` of ``bounds`` in one int64 buffer, for a single upload: returns ``(packed,
    byte offsets of chunk_start (int64), chunk_len and seq_chunk_off (int32), NC)``."""
    start, length, off = chunk_tables(bounds, chunk_size)
    NC = int(start.size)
    n_len, n_off = -(-NC // 2), -(-off.size // 2)  # int32 tables, two to an int64 slot
    packed = np.zeros(NC + n_len + n_off, np.int64)
    packed[:NC] = start
    packed[NC : NC + n_len].view(np.int32)[:NC] = length
    packed[NC + n_len :].view(np.int32)[: off.size] = off
    return packed, (0, 8 * NC, 8 * (NC + n_len)), NC


class _DeviceTables:
    """The chunk tables of one ``cu_seqlens`` content on one device, uploaded once: staged through
    pinned memory (so the copy never waits for the stream), with an event after the upload that
    every use waits on (any stream, no host synchronization) and an event after the latest use
    that eviction waits on before the memory goes back to the pool."""

    def __init__(self, bounds: np.ndarray, chunk_size: int, stream: int):
        cp = ts.cupy()
        rt = cp.cuda.runtime
        packed, offsets, self.NC = pack_tables(bounds, chunk_size)
        nbytes = max(packed.nbytes, 8)
        self.host = cp.cuda.alloc_pinned_memory(nbytes)
        np.frombuffer(self.host, np.uint8, packed.nbytes)[:] = packed.view(np.uint8)
        self.device = cp.cuda.alloc(nbytes)
        rt.memcpyAsync(self.device.ptr, self.host.ptr, packed.nbytes, 1, stream)  # 1: host to device
        self.ready, self.used = (rt.eventCreateWithFlags(2) for _ in range(2))  # 2: no timing
        rt.eventRecord(self.ready, stream)
        self.ptrs = (self.device.ptr + offsets[0], self.device.ptr + offsets[1], self.device.ptr + offsets[2])

    def acquire(self, stream: int) -> tuple[int, int, int]:
        """The three table pointers, with ``stream`` ordered after the upload."""
        ts.cupy().cuda.runtime.streamWaitEvent(stream, self.ready, 0)
        return self.ptrs

    def release(self, stream: int) -> None:
        ts.cupy().cuda.runtime.eventRecord(self.used, stream)

    def close(self) -> None:
        rt = ts.cupy().cuda.runtime
        rt.eventSynchronize(self.used)  # the last kernel that read the tables has finished
        rt.eventDestroy(self.ready)
        rt.eventDestroy(self.used)


# Chunk tables by (offsets, chunk_size, device): a repeated call (the same lengths, cu_seqlens=None
# included) builds and uploads nothing. Bounded: a new entry evicts the oldest.
_TABLES: dict[tuple[bytes, int, int], _DeviceTables] = {}
_TABLES_MAX = 32
_TABLES_LOCK = threading.Lock()


def _device_tables(bounds: np.ndarray, chunk_size: int, stream: int, device: int) -> _DeviceTables:
    key = (bounds.tobytes(), chunk_size, device)
    tables = _TABLES.get(key)
    if tables is None:
        with _TABLES_LOCK:
            tables = _TABLES.get(key)
            if tables is None:
                if len(_TABLES) >= _TABLES_MAX:
                    _TABLES.pop(next(iter(_TABLES))).close()
                tables = _TABLES[key] = _DeviceTables(bounds, chunk_size, stream)
    return tables


def chunk_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    scale: float | None = None,
    initial_state=None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    state_v_first: bool = False,
    cu_seqlens=None,
    *,
    use_gate_in_kernel: bool = False,
    A_log: Any = None,
    dt_bias: Any = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    chunk_size: int = 64,
    use_tensor_cores: bool | None = None,
    fused: bool | None = None,
    k_split: int | None = None,
    wgmma: bool | None = None,
    checked: bool | None = None,
) -> tuple[Any, Any | None]:
    """Chunked GDN forward on the GPU. Returns ``(o [B, T, HV, V] in q's dtype, final_state | None)``.

    ``final_state`` is fp32 ``[N, HV, K, V]`` (``[N, HV, V, K]`` with ``state_v_first``).
    ``chunk_size`` is 16, 32 or 64; head sizes ``K, V`` up to 256. Bad arguments raise
    ``ValueError`` naming the argument; ``cu_seqlens`` is always validated on the host (so
    ``checked`` changes nothing here; it exists for symmetry with the recurrent launchers).
    FLA's options: ``use_gate_in_kernel`` (``g`` raw, decay ``-exp(A_log) * softplus(g + dt_bias)``;
    ``A_log``, ``dt_bias`` float32 ``[HV]``, ``dt_bias`` optional), ``use_beta_sigmoid_in_kernel``
    (``beta`` holds logits) with ``allow_neg_eigval`` (``beta = 2 * sigmoid``).
    ``use_tensor_cores`` picks the arithmetic path: ``None`` (default) uses tensor cores for
    bf16 / fp16 inputs and plain FP32 for fp32 inputs. ``fused``: ``None`` (default) takes the
    fused two-kernel path wherever it applies (bf16 inputs, tensor cores, ``chunk_size = 64``,
    ``K % 16 == 0``, ``K <= 128``, ``V % 16 == 0``, 16-byte aligned q, k, v), ``False`` never,
    ``True`` always (``ValueError`` where it does not apply). ``k_split``: warps that share one
    16-column slab of the state in the fused state kernel, 1 or 2 (2 needs ``K % 32 == 0`` and
    ``V % 32 == 0``); ``None`` (default) picks it from the grid size (:func:`fused_k_split`).
    ``wgmma``: the fused path's state kernel on sm_90a wgmma (:func:`wgmma_state`: H100 / H200,
    ``K`` 64 or 128, ``V % 64 == 0``; no ``k_split``). ``None`` (default) takes it wherever it
    applies and builds, ``False`` never, ``True`` always (``ValueError`` where it does not apply).
    """
    del checked  # always checked: the chunk tables are built on the host from validated offsets
    if chunk_size not in CHUNK_SIZES:
        raise ValueError(f"chunk_size: must be one of {CHUNK_SIZES}, got {chunk_size!r}")
    if use_tensor_cores not in (None, True, False):
        raise ValueError(f"use_tensor_cores: must be None, True or False, got {use_tensor_cores!r}")
    if fused not in (None, True, False):
        raise ValueError(f"fused: must be None, True or False, got {fused!r}")
    if k_split not in (None, 1, 2) or isinstance(k_split, bool):
        raise ValueError(f"k_split: must be None, 1 or 2, got {k_split!r}")
    if wgmma not in (None, True, False):
        raise ValueError(f"wgmma: must be None, True or False, got {wgmma!r}")
    if use_gate_in_kernel and A_log is None:
        raise ValueError("A_log: required when use_gate_in_kernel=True")
    if not use_gate_in_kernel and A_log is not None:
        raise ValueError("A_log: only read with use_gate_in_kernel=True")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("allow_neg_eigval: requires use_beta_sigmoid_in_kernel=True")
    device = ts.current_device()
    words = ts.error_words(device)
    if words.pending():  # an earlier recurrent launch's bad metadata: report it before going on
        words.raise_pending(deferred=True)
    qa, ka, va, ga, ba = (_Input(n, x, device) for n, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)))
    for name, a, rank, layout in (
        ("q", qa, 4, "[B, T, H, K]"),
        ("k", ka, 4, "[B, T, H, K]"),
        ("v", va, 4, "[B, T, HV, V]"),
        ("g", ga, 3, "[B, T, HV]"),
        ("beta", ba, 3, "[B, T, HV]"),
    ):
        if len(a.shape) != rank:
            raise ValueError(f"{name}: expected rank {rank} {layout}, got shape {a.shape}")
    B, T, H, K = qa.shape
    if ka.shape != qa.shape:
        raise ValueError(f"k: expected shape {qa.shape} like q, got {ka.shape}")
    if va.shape[:2] != (B, T):
        raise ValueError(f"v: expected leading dims [B, T] = {(B, T)}, got {va.shape[:2]}")
    HV, V = va.shape[2:]
    if min(H, HV, K, V) < 1 or max(K, V) > MAX_HEAD_DIM:
        raise ValueError(f"v: need H, HV >= 1 and 1 <= K, V <= {MAX_HEAD_DIM} (H={H}, HV={HV}, K={K}, V={V})")
    if HV % H != 0 or HV > 65535:
        raise ValueError(f"v: value heads HV = {HV} must be a multiple of H = {H} and at most 65535")
    for name, a in (("g", ga), ("beta", ba)):
        if a.shape != (B, T, HV):
            raise ValueError(f"{name}: expected shape [B, T, HV] = {(B, T, HV)}, got {a.shape}")
    for name, a in (("k", ka), ("v", va)):
        if a.dtype != qa.dtype:
            raise ValueError(f"{name}: expected dtype {qa.dtype} like q, got {a.dtype}")
    for name, a in (("g", ga), ("beta", ba)):
        if a.dtype not in ("float32", qa.dtype):
            raise ValueError(f"{name}: expected float32 or q's dtype {qa.dtype}, got {a.dtype}")
    if scale is None:
        scale = K**-0.5
    elif not math.isfinite(scale):
        raise ValueError(f"scale: must be finite, got {scale}")
    a_log, d_bias = _head_params("A_log", A_log, HV, device), _head_params("dt_bias", dt_bias, HV, device)
    gate_flags = (_G_IS_T if ga.dtype != "float32" else 0) | (_BETA_IS_T if ba.dtype != "float32" else 0)
    gate_flags |= _GATE_IN_KERNEL if use_gate_in_kernel else 0
    gate_flags |= (_BETA_SIGMOID if use_beta_sigmoid_in_kernel else 0) | (_NEG_EIGVAL if allow_neg_eigval else 0)

    bounds = _bounds(cu_seqlens, B, T)
    N = bounds.size - 1
    init = 0
    if initial_state is not None:
        ia = _Input("initial_state", initial_state, device)
        want = (N, HV, V, K) if state_v_first else (N, HV, K, V)
        if ia.shape != want or ia.dtype != "float32":
            layout = "[N, HV, V, K]" if state_v_first else "[N, HV, K, V]"
            raise ValueError(f"initial_state: expected float32 {layout} = {want}, got {ia.dtype} {ia.shape}")
        init = ia.ptr

    tensor_cores = qa.dtype != "float32" if use_tensor_cores is None else bool(use_tensor_cores)
    warps = None if fused is False else fused_warps(qa.dtype, chunk_size, K, V, tensor_cores)
    if warps is not None and any(a.ptr % 16 for a in (qa, ka, va)):
        warps = None  # the fused path copies 16-byte pieces
    if fused and warps is None:
        raise ValueError(
            "fused: the fused path needs bf16 inputs, tensor cores, chunk_size=64, K % 16 == 0, K <= 128, "
            f"V % 16 == 0 and 16-byte aligned q, k, v (got {qa.dtype}, chunk_size={chunk_size}, K={K}, V={V})"
        )
    if warps is None and k_split is not None:
        raise ValueError("k_split: only the fused path takes it, and it does not apply to these inputs")
    if wgmma and (warps is None or k_split is not None or not wgmma_state(K, V, device)):
        raise ValueError(
            "wgmma: the wgmma state kernel needs the fused path, an sm_90 device, K in (64, 128), V % 64 == 0 "
            f"and no k_split (got {qa.dtype}, K={K}, V={V}, k_split={k_split}, "
            f"compute capability {ts.compute_capability(device)})"
        )
    if warps is not None and wgmma is None and k_split is None and wgmma_state(K, V, device):
        wgmma = _sm90a_builds()
    if warps is not None and not wgmma:
        if k_split is None:
            k_split = fused_k_split(K, V, N, HV, ts.num_sms(device))
        elif k_split == 2 and (K % 32 or V % 32):
            raise ValueError(f"k_split: 2 needs K % 32 == 0 and V % 32 == 0 (got K={K}, V={V})")
        warps = 2 if k_split == 2 else warps  # two slabs of two warps: one CTA per SM (shared memory)

    like = q if ts.is_torch(q) else None  # outputs and scratch in the kind of q (torch in, torch out)
    stream = ts.launch_stream(like is not None, device)
    tables = _device_tables(np.ascontiguousarray(bounds, np.int64), chunk_size, stream, device)
    NC = tables.NC
    o = _empty(like, (B, T, HV, V), qa.code)
    final_shape = (N, HV, V, K) if state_v_first else (N, HV, K, V)
    final_state = _empty(like, final_shape, ts.F32) if output_final_state else None
    call = _Call(
        q=qa.ptr,
        k=ka.ptr,
        v=va.ptr,
        g=ga.ptr,
        beta=ba.ptr,
        a_log=a_log,
        dt_bias=d_bias,
        initial_state=init,
        o=ts.pointer(o),
        final_state=0 if final_state is None else ts.pointer(final_state),
        tables=tables.acquire(stream),
        heads=(H, HV, K, V),
        dtype=qa.dtype,
        scale=float(scale),
        gate_flags=gate_flags,
        l2norm=int(use_qk_l2norm_in_kernel),
        state_v_first=int(state_v_first),
        N=N,
        NC=NC,
        C=chunk_size,
        like=like,
        stream=stream,
        device=device,
    )
    global last_kernels
    if warps is None:
        last_kernels = "three-kernel"
        _run(call, tensor_cores)
    else:
        last_kernels = "fused wgmma sm_90a" if wgmma else f"fused mma.sync <{warps}, {k_split or 1}>"
        _run_fused(call, warps, k_split or 1, bool(wgmma))
    tables.release(stream)
    return o, final_state


def _empty(like: Any, shape: tuple, code: int):
    """Uninitialised memory of dtype ``code`` in the kind of ``like`` (torch, else CuPy), filled with
    NaN while ``_debug_poison`` is set, so that an element no kernel writes shows up."""
    x = ts.empty(like, shape, code)
    if _debug_poison:
        if like is not None:
            x.fill_(float("nan"))
        else:
            x.fill(np.nan)
    return x


class _Call(NamedTuple):
    """One call, resolved: device pointers, sizes and options, as the kernels take them."""

    q: int
    k: int
    v: int
    g: int
    beta: int
    a_log: int
    dt_bias: int
    initial_state: int  # 0: none
    o: int
    final_state: int  # 0: not asked for
    tables: tuple[int, int, int]  # chunk_start, chunk_len, seq_chunk_off
    heads: tuple[int, int, int, int]  # H, HV, K, V
    dtype: str
    scale: float
    gate_flags: int
    l2norm: int
    state_v_first: int
    N: int
    NC: int
    C: int
    like: Any
    stream: int
    device: int


def _run(c: _Call, tensor_cores: bool) -> None:
    """The three-kernel path: fp32 scratch W, U, Kd, gates, per-chunk states and v_new (from the
    allocator of ``c.like``), then intra, state and output on ``c.stream``."""
    H, HV, K, V = c.heads
    C, NC, dev = c.C, c.NC, c.device
    intra, state, output = _kernels(_CTYPES[c.dtype], C, tensor_cores)
    smem_intra, smem_state, smem_output = _smem_bytes(C, K, V, tensor_cores)
    shapes = ((NC, HV, C, K), (NC, HV, C, V), (NC, HV, C, K), (NC, HV, 2, C), (NC, HV, K, V), (NC, HV, C, V))
    scratch = [_empty(c.like, shape, ts.F32) for shape in shapes]
    pw, pu, pkd, pgates, pstates, pvnew = (ts.pointer(x) for x in scratch)
    start, length, off = c.tables
    if NC > 0:
        _SIG_INTRA.launch(
            _handle(intra, smem_intra, dev), (NC, HV), _THREADS, smem_intra, c.stream,
            c.k, c.v, c.g, c.beta, c.gate_flags, c.a_log, c.dt_bias, start, length, H, HV, K, V, c.l2norm,
            pw, pu, pkd, pgates,
        )  # fmt: skip
    if NC > 0 or c.final_state:
        _SIG_STATE.launch(
            _handle(state, smem_state, dev), (c.N * -(-V // _STATE_TILE), HV), _THREADS, smem_state, c.stream,
            pw, pu, pkd, pgates, off, c.initial_state, int(c.initial_state != 0), c.state_v_first, HV, K, V,
            pstates, pvnew, c.final_state, int(c.final_state != 0),
        )  # fmt: skip
    if NC > 0:
        _SIG_OUTPUT.launch(
            _handle(output, smem_output, dev), (NC, HV), _THREADS, smem_output, c.stream,
            c.q, c.k, c.g, c.gate_flags, c.a_log, c.dt_bias, start, length, pstates, pvnew, pgates,
            H, HV, K, V, c.l2norm, c.scale, c.o,
        )  # fmt: skip
    del scratch  # returned to the allocator in stream order


def _run_fused(c: _Call, warps: int, k_split: int, wgmma: bool) -> None:
    """The fused bf16 path: prep (parallel over chunks) then state + output (sequential per sequence),
    the state kernel on mma.sync (``warps`` slabs of 16 columns, ``k_split`` warps each) or on wgmma."""
    H, HV, K, V = c.heads
    C, NC, dev = c.C, c.NC, c.device
    prep = _prep_kernel()
    smem_prep, smem_state = _fused_smem_bytes(K, warps, k_split, wgmma)
    columns, threads = 16 * warps, 32 * warps * k_split
    if wgmma:
        state = _wgmma_kernel(K)
        columns, threads = _WGMMA_COLUMNS, 192  # a consumer warpgroup and two producer warps
    else:
        state = _fused_state_kernel(warps, k_split)
    mats = _empty(c.like, (NC, HV, 4, C, C), ts.BF16)  # T'hi, T'lo, P'hi, P'lo
    vecs = _empty(c.like, (NC, HV, 4, C), ts.F32)  # a, c, d, G
    pmats, pvecs = ts.pointer(mats), ts.pointer(vecs)
    start, length, off = c.tables
    if NC > 0:
        _SIG_PREP.launch(
            _handle(prep, smem_prep, dev), (NC, HV), _THREADS, smem_prep, c.stream,
            c.q, c.k, c.g, c.beta, c.gate_flags, c.a_log, c.dt_bias, start, length, H, HV, K, c.l2norm, c.scale,
            pmats, pvecs,
        )  # fmt: skip
    if NC > 0 or c.final_state:
        _SIG_FUSED_STATE.launch(
            _handle(state, smem_state, dev), (c.N * (V // columns), HV), threads, smem_state, c.stream,
            c.q, c.k, c.v, pmats, pvecs, start, length, off, c.initial_state, int(c.initial_state != 0),
            c.state_v_first, H, HV, K, V, c.o, c.final_state, int(c.final_state != 0),
        )  # fmt: skip
    del mats, vecs  # returned to the allocator in stream order
