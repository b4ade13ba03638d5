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
output computed beside it; see chunk_common.cuh); ``fused=False`` opts out and ``fused=True`` insists.
On sm_90 (H100, H200) with ``K`` 64 or 128 and ``V`` a multiple of 64, the state kernel is the wgmma
one (``gdn_fused_state_sm90_k<K>`` in ``chunk_wgmma.cu``, built for sm_90a by
:func:`sources.sm90a_module`; ``wgmma=False`` keeps mma.sync). Otherwise two arithmetic paths of
the three-kernel layout (``chunk_three_kernel.cu``, the ``TC`` template flag): bf16 / fp16 inputs
take the tensor-core path by default (``mma.sync`` bf16 products with fp32 accumulation; fp32
operands are split into two bf16 parts and multiplied with three MMAs, about 2^-16 relative error),
fp32 inputs the plain FP32 path (no TF32); ``use_tensor_cores`` overrides the choice. Both run in
three launches (the fused path two) on the caller's stream (torch's current stream for torch inputs,
CuPy's for CuPy arrays): intra-chunk (W, U), state passing, output.

Context parallelism (fused paths, ``context_parallel``): where the state kernel's CTAs (sequences x
column tiles x value heads) would leave most SMs idle over a long sequence, each sequence is split
into J runs of whole chunks that the state kernel walks in parallel, in three passes (each
segment's affine term from a zero state, its K x K transition from the identity with zero values,
then the output from the true start states), the start states chained by a float64 scan between
them (``context_parallel.py``); ``chunk_plan.context_parallel_segments`` picks J from a cost model.

A call goes through three steps: validation (``ValueError`` naming the argument), the pure
:func:`chunk_plan.select_plan` (which path, which kernels, their CTA and shared-memory sizes; cached,
testable on the CPU) and the launch, which compiles only the kernels of that plan. Outputs and
scratch come from the allocator of ``q``'s kind (torch's caching allocator, else CuPy's pool), in
stream order; the chunk tables of each ``cu_seqlens`` content are uploaded once and reused
(:class:`_DeviceTables`). Kernels launch through ``cuLaunchKernel`` (:class:`tensors.Signature`), so
a call costs about 0.1 ms of host time. CuPy is imported lazily, so importing this module needs no GPU.
"""

from __future__ import annotations

import functools
import math
import sys
import threading
import warnings
from typing import Any, NamedTuple

import numpy as np

from cupy_kernels import layout, sources
from cupy_kernels import tensors as ts
from cupy_kernels.chunk_plan import (
    CHUNK_SIZES,
    WGMMA_SOURCE,
    ChunkPlan,
    context_parallel_passes,
    context_parallel_segments,
    select_plan,
    state_only,
)
from cupy_kernels.context_parallel import scan_segment_states, segment_bounds
from cupy_kernels.recurrent_kernel import options as gate_options

MAX_HEAD_DIM = 256  # bounded by shared memory: the output kernel needs about 164 KiB at K = V = 256
# gate_flags bits (chunk_common.cuh kGateIsT, kBetaIsT, kGateInKernel, kBetaSigmoid, kNegEigval)
_G_IS_T, _BETA_IS_T, _GATE_IN_KERNEL, _BETA_SIGMOID, _NEG_EIGVAL = (
    layout.GATE_FLAGS[name] for name in ("kGateIsT", "kBetaIsT", "kGateInKernel", "kBetaSigmoid", "kNegEigval")
)

# The kernels the latest call launched, for benchmarks and reports: "three-kernel", "fused mma.sync
# <warps, k_split>" or "fused wgmma sm_90a" (a diagnostic, not an input).
last_kernels = ""

# Tests set this to fill outputs and scratch with NaN before the launches, so any element a
# kernel fails to write (or any scratch it reads before writing) shows up as NaN.
_debug_poison = False


@functools.cache
def _sm90a_builds() -> bool:
    """Whether the sm_90a wgmma state kernel builds here; warns once, with NVRTC's reason, where it
    does not (the default then keeps the mma.sync state kernel)."""
    try:
        sources.sm90a_module(WGMMA_SOURCE)
    except (ImportError, RuntimeError) as e:
        warnings.warn(f"the sm_90a wgmma state kernel is not available, using mma.sync: {e}", stacklevel=4)
        return False
    return True


@functools.cache
def _functions(plan: ChunkPlan) -> tuple[Any, ...]:
    """The compiled kernels of ``plan``, in launch order: one build per source file, holding only the
    kernels the plan launches (CuPy also caches each build on disk)."""
    functions: dict[str, Any] = {}
    for source in dict.fromkeys(k.source for k in plan.kernels):
        kernels = [k for k in plan.kernels if k.source == source]
        if kernels[0].sm90a:
            module = sources.sm90a_module(source)
            built = [module.get_function(k.name) for k in kernels]
        else:
            built = list(sources.raw_module(source, tuple(k.name for k in kernels)))
        functions.update(zip((k.name for k in kernels), built))
    return tuple(functions[k.name] for k in plan.kernels)


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
    context_parallel: bool | int | None = None,
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
    ``V % 32 == 0``); ``None`` (default) picks it from the grid size (:func:`chunk_plan.fused_k_split`).
    ``wgmma``: the fused path's state kernel on sm_90a wgmma (:func:`chunk_plan.wgmma_applies`: H100 /
    H200, ``K`` 64 or 128, ``V % 64 == 0``; no ``k_split``). ``None`` (default) takes it wherever it
    applies and builds, ``False`` never, ``True`` always (``ValueError`` where it does not apply).
    ``context_parallel`` (fused paths only): split each sequence into J runs of whole chunks whose
    state passes run in parallel, chained by a float64 scan (``context_parallel.py``), for calls
    whose state kernel would leave most SMs idle (few sequences and value heads).
    ``None`` (default) picks J from a cost model (:func:`chunk_plan.context_parallel_segments`; 1:
    the plain call), ``False`` never, ``True`` at least 2, an int >= 2 exactly J.
    """
    del checked  # always checked: the chunk tables are built on the host from validated offsets
    _check_options(chunk_size, use_tensor_cores, fused, k_split, wgmma, context_parallel)
    gate_options(use_gate_in_kernel, A_log, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    device = ts.current_device()
    words = ts.error_words(device)
    if words.pending():  # an earlier recurrent launch's bad metadata: report it before going on
        words.raise_pending(deferred=True)
    x = _validate(q, k, v, g, beta, scale, initial_state, state_v_first, cu_seqlens, A_log, dt_bias, device)
    gate_flags = x.gate_flags | (_GATE_IN_KERNEL if use_gate_in_kernel else 0)
    gate_flags |= (_BETA_SIGMOID if use_beta_sigmoid_in_kernel else 0) | (_NEG_EIGVAL if allow_neg_eigval else 0)
    plan = _plan(x, chunk_size, use_tensor_cores, fused, k_split, wgmma, device)
    segments = _segments(x, plan, context_parallel, chunk_size, use_tensor_cores, k_split, wgmma, device)
    plan_m = plan
    if segments > 1:  # the same chunks, N * segments "sequences" for the state kernel
        sequences = (x.bounds.size - 1) * segments
        plan = _plan(x, chunk_size, use_tensor_cores, True, k_split, wgmma, device, sequences=sequences)
        plan_m = _plan(x, chunk_size, use_tensor_cores, True, k_split, wgmma, device, x.heads[2], sequences)

    like = q if ts.is_torch(q) else None  # outputs and scratch in the kind of q (torch in, torch out)
    stream = ts.launch_stream(like is not None, device)
    bounds = x.bounds if segments == 1 else segment_bounds(x.bounds, chunk_size, segments)
    tables = _device_tables(np.ascontiguousarray(bounds, np.int64), chunk_size, stream, device)
    B, T, N = x.q.shape[0], x.q.shape[1], x.bounds.size - 1
    _, HV, K, V = x.heads
    o = _empty(like, (B, T, HV, V), x.q.code)
    final_shape = (N, HV, V, K) if state_v_first else (N, HV, K, V)
    final_state = _empty(like, final_shape, ts.F32) if output_final_state else None
    call = _Call(
        q=x.q.ptr,
        k=x.k.ptr,
        v=x.v.ptr,
        g=x.g.ptr,
        beta=x.beta.ptr,
        a_log=x.a_log,
        dt_bias=x.dt_bias,
        initial_state=x.initial_state,
        o=ts.pointer(o),
        final_state=0 if final_state is None else ts.pointer(final_state),
        tables=tables.acquire(stream),
        heads=x.heads,
        scale=x.scale,
        gate_flags=gate_flags,
        l2norm=int(use_qk_l2norm_in_kernel),
        state_v_first=int(state_v_first),
        N=bounds.size - 1,
        NC=tables.NC,
        C=chunk_size,
        like=like,
        stream=stream,
        device=device,
    )
    global last_kernels
    last_kernels = plan.label
    if plan.path == "three-kernel":
        _run(call, plan)
    elif segments == 1:
        _run_fused(call, plan)
    else:
        last_kernels += f", context-parallel x {segments}"
        _run_context_parallel(call, plan, plan_m, segments, initial_state, final_state)
    tables.release(stream)
    return o, final_state


def _check_options(
    chunk_size: Any, use_tensor_cores: Any, fused: Any, k_split: Any, wgmma: Any, context_parallel: Any
) -> None:
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
    if context_parallel not in (None, True, False) and not (
        isinstance(context_parallel, (int, np.integer)) and 2 <= context_parallel <= 2**16
    ):
        raise ValueError(
            f"context_parallel: must be None, True, False or an int from 2 to 65536, got {context_parallel!r}"
        )


class _Inputs(NamedTuple):
    """The validated tensors of one call."""

    q: _Input
    k: _Input
    v: _Input
    g: _Input
    beta: _Input
    heads: tuple[int, int, int, int]  # H, HV, K, V
    bounds: np.ndarray  # validated [N + 1] int64 offsets
    a_log: int  # pointers (0: absent)
    dt_bias: int
    initial_state: int
    scale: float
    gate_flags: int  # how g and beta are stored (the in-kernel option bits are the caller's)

    def longest(self, chunk_size: int) -> int:
        """Chunks of the longest sequence."""
        lengths = np.diff(self.bounds)
        return int(-(-lengths.max() // chunk_size)) if lengths.size else 0


def _validate(
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    scale: float | None,
    initial_state: Any,
    state_v_first: bool,
    cu_seqlens: Any,
    A_log: Any,
    dt_bias: Any,
    device: int,
) -> _Inputs:
    """Shapes, dtypes, contiguity and metadata of one call (``ValueError`` naming the argument)."""
    qa, ka, va, ga, ba = (_Input(n, x, device) for n, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)))
    for name, a, rank, layout_text in (
        ("q", qa, 4, "[B, T, H, K]"),
        ("k", ka, 4, "[B, T, H, K]"),
        ("v", va, 4, "[B, T, HV, V]"),
        ("g", ga, 3, "[B, T, HV]"),
        ("beta", ba, 3, "[B, T, HV]"),
    ):
        if len(a.shape) != rank:
            raise ValueError(f"{name}: expected rank {rank} {layout_text}, got shape {a.shape}")
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

    bounds = _bounds(cu_seqlens, B, T)
    N = bounds.size - 1
    init = 0
    if initial_state is not None:
        ia = _Input("initial_state", initial_state, device)
        want = (N, HV, V, K) if state_v_first else (N, HV, K, V)
        if ia.shape != want or ia.dtype != "float32":
            layout_text = "[N, HV, V, K]" if state_v_first else "[N, HV, K, V]"
            raise ValueError(f"initial_state: expected float32 {layout_text} = {want}, got {ia.dtype} {ia.shape}")
        init = ia.ptr
    return _Inputs(qa, ka, va, ga, ba, (H, HV, K, V), bounds, a_log, d_bias, init, float(scale), gate_flags)


def _plan(
    x: _Inputs,
    chunk_size: int,
    use_tensor_cores: bool | None,
    fused: bool | None,
    k_split: int | None,
    wgmma: bool | None,
    device: int,
    V: int | None = None,
    sequences: int | None = None,
) -> ChunkPlan:
    """:func:`chunk_plan.select_plan` for these inputs on ``device``; ``V`` and ``sequences``
    override the value columns and the sequence count the state kernel sees (the context-parallel
    passes: K columns in the transition pass, N x J segments). The sm_90a build is tried only
    where the default would take the wgmma kernel; where it fails the plan falls back to mma.sync."""
    _, HV, K, V = (*x.heads[:3], x.heads[3] if V is None else V)
    N = x.bounds.size - 1 if sequences is None else sequences
    aligned = not any(a.ptr % 16 for a in (x.q, x.k, x.v))
    key = (x.q.dtype, chunk_size, K, V, N, HV, aligned, use_tensor_cores, fused, k_split, wgmma)
    facts = (ts.num_sms(device), ts.compute_capability(device))
    plan = select_plan(*key, *facts)
    if plan.path == "wgmma" and wgmma is None and not _sm90a_builds():
        plan = select_plan(*key, *facts, sm90a_builds=False)
    return plan


def _segments(
    x: _Inputs,
    plan: ChunkPlan,
    requested: bool | int | None,
    chunk_size: int,
    use_tensor_cores: bool | None,
    k_split: int | None,
    wgmma: bool | None,
    device: int,
) -> int:
    """Segments per sequence (1: the plain call), for a call on the fused paths (``ValueError``
    where ``context_parallel`` asks for it elsewhere); ``plan`` is the plain call's."""
    if requested is False or (requested is None and plan.path == "three-kernel"):
        return 1
    if plan.path == "three-kernel":
        raise ValueError(
            "context_parallel: needs the fused path (bf16 inputs, chunk_size=64, K % 16 == 0, K <= 128, V % 16 == 0)"
        )
    H, HV, K, V = x.heads
    N = x.bounds.size - 1
    plan_m = _plan(x, chunk_size, use_tensor_cores, True, k_split, wgmma, device, K)
    passes = context_parallel_passes(plan, plan_m, N, HV, K, V, ts.num_sms(device), ts.compute_capability(device))
    return context_parallel_segments(x.longest(chunk_size), *passes, requested)


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


def _run(c: _Call, plan: ChunkPlan) -> None:
    """The three-kernel path: fp32 scratch W, U, Kd, gates, per-chunk states and v_new (from the
    allocator of ``c.like``), then intra, state and output on ``c.stream``."""
    H, HV, K, V = c.heads
    C, NC, dev = c.C, c.NC, c.device
    intra, state, output = _functions(plan)
    ki, ks, ko = plan.kernels
    shapes = ((NC, HV, C, K), (NC, HV, C, V), (NC, HV, C, K), (NC, HV, 2, C), (NC, HV, K, V), (NC, HV, C, V))
    scratch = [_empty(c.like, shape, ts.F32) for shape in shapes]
    pw, pu, pkd, pgates, pstates, pvnew = (ts.pointer(x) for x in scratch)
    start, length, off = c.tables
    if NC > 0:
        _SIG_INTRA.launch(
            _handle(intra, ki.smem, dev), (NC, HV), ki.threads, ki.smem, c.stream,
            c.k, c.v, c.g, c.beta, c.gate_flags, c.a_log, c.dt_bias, start, length, H, HV, K, V, c.l2norm,
            pw, pu, pkd, pgates,
        )  # fmt: skip
    if NC > 0 or c.final_state:
        _SIG_STATE.launch(
            _handle(state, ks.smem, dev), (c.N * -(-V // ks.columns), HV), ks.threads, ks.smem, c.stream,
            pw, pu, pkd, pgates, off, c.initial_state, int(c.initial_state != 0), c.state_v_first, HV, K, V,
            pstates, pvnew, c.final_state, int(c.final_state != 0),
        )  # fmt: skip
    if NC > 0:
        _SIG_OUTPUT.launch(
            _handle(output, ko.smem, dev), (NC, HV), ko.threads, ko.smem, c.stream,
            c.q, c.k, c.g, c.gate_flags, c.a_log, c.dt_bias, start, length, pstates, pvnew, pgates,
            H, HV, K, V, c.l2norm, c.scale, c.o,
        )  # fmt: skip
    del scratch  # returned to the allocator in stream order


def _run_fused(c: _Call, plan: ChunkPlan) -> None:
    """The fused bf16 path: prep (parallel over chunks) then state + output (sequential per sequence),
    the state kernel on mma.sync (``plan.warps`` slabs of 16 columns, ``plan.k_split`` warps each)
    or on wgmma (one warpgroup per 64 columns and two producer warps)."""
    prep = _prep(c, plan)
    _state(c, plan, prep)
    del prep  # returned to the allocator in stream order


def _prep(c: _Call, plan: ChunkPlan) -> tuple[Any, Any]:
    """prep's bf16 T'hi, T'lo, P'hi, P'lo ``[NC, HV, 4, C, C]`` and fp32 a, c, d, G ``[NC, HV, 4, C]``
    (they depend on the chunks alone, not on the sequences they belong to)."""
    H, HV, K, V = c.heads
    C, NC, dev = c.C, c.NC, c.device
    kp = plan.kernels[0]
    mats = _empty(c.like, (NC, HV, 4, C, C), ts.BF16)
    vecs = _empty(c.like, (NC, HV, 4, C), ts.F32)
    start, length, _ = c.tables
    if NC > 0:
        _SIG_PREP.launch(
            _handle(_functions(plan)[0], kp.smem, dev), (NC, HV), kp.threads, kp.smem, c.stream,
            c.q, c.k, c.g, c.beta, c.gate_flags, c.a_log, c.dt_bias, start, length, H, HV, K, c.l2norm, c.scale,
            ts.pointer(mats), ts.pointer(vecs),
        )  # fmt: skip
    return mats, vecs


def _state(c: _Call, plan: ChunkPlan, prep: tuple[Any, Any]) -> None:
    """The fused state kernel of ``plan`` over ``c``'s sequences: ``c.v``, ``c.heads``' V columns,
    ``c.initial_state`` (0: zero), output ``c.o``, final state ``c.final_state`` (0: none)."""
    H, HV, K, V = c.heads
    ks = plan.kernels[1]
    start, length, off = c.tables
    if c.NC > 0 or c.final_state:
        _SIG_FUSED_STATE.launch(
            _handle(_functions(plan)[1], ks.smem, c.device), (c.N * -(-V // ks.columns), HV), ks.threads, ks.smem,
            c.stream, c.q, c.k, c.v, ts.pointer(prep[0]), ts.pointer(prep[1]), start, length, off, c.initial_state,
            int(c.initial_state != 0), c.state_v_first, H, HV, K, V, c.o, c.final_state, int(c.final_state != 0),
        )  # fmt: skip


def _run_context_parallel(
    c: _Call, plan: ChunkPlan, plan_m: ChunkPlan, segments: int, initial_state: Any, final_state: Any
) -> None:
    """The fused path over ``c.N = N x segments`` segments (``context_parallel.py``): one prep, the
    value pass from zero (each segment's B), the transition pass (zero values and the identity over
    K columns: each segment's M), both without output where the state kernel has that form
    (``chunk_plan.state_only``), the float64 scan of the start states on the same stream, then the
    value pass from them, which writes the output. torch inputs only (bf16: the fused paths' inputs)."""
    torch = sys.modules["torch"]
    H, HV, K, V = c.heads
    N = c.N // segments
    device = c.like.device
    prep = _prep(c, plan)
    # The B and M passes' outputs are never read (the last pass writes o): where the state kernel has
    # forms without output (wgmma), they run them, o is not touched and the M pass reads no values;
    # else they write o (B's, and M's into scratch where K != V), which the last pass overwrites,
    # and the M pass reads zero values.
    plan_b, plan_t = state_only(plan), state_only(plan_m, values=False)
    b = _empty(c.like, (c.N, HV, K, V), ts.F32)
    _state(c._replace(initial_state=0, final_state=ts.pointer(b), state_v_first=0), plan_b, prep)
    m = _empty(c.like, (c.N, HV, K, K), ts.F32)
    eye = torch.eye(K, dtype=torch.float32, device=device).expand(c.N, HV, K, K).contiguous()
    plain = plan_t == plan_m  # no transition form: the M pass reads values and writes an output of K columns
    zeros = torch.zeros(c.like.shape[:2] + (HV, K), dtype=c.like.dtype, device=device) if plain else None
    scratch = None if K == V or not plain else _empty(c.like, c.like.shape[:2] + (HV, K), ts.BF16)
    transition = c._replace(
        v=c.v if zeros is None else ts.pointer(zeros),
        heads=(H, HV, K, K),
        initial_state=ts.pointer(eye),
        o=c.o if scratch is None else ts.pointer(scratch),
        final_state=ts.pointer(m),
        state_v_first=0,
    )
    _state(transition, plan_t, prep)

    if initial_state is None:
        start = torch.zeros((N, HV, K, V), dtype=torch.float64, device=device)
    else:
        given = initial_state if ts.is_torch(initial_state) else torch.from_dlpack(initial_state)
        start = (given.transpose(-1, -2) if c.state_v_first else given).double()
    starts, final = scan_segment_states(m, b, start, segments)  # float64 scan, float32 starts
    _state(c._replace(initial_state=ts.pointer(starts), final_state=0, state_v_first=0), plan, prep)
    if final_state is not None:
        final_state.copy_(final.transpose(-1, -2) if c.state_v_first else final)
    del prep, b, m, zeros, eye, scratch, starts  # returned to the allocator in stream order
