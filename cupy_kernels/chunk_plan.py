"""Which kernels a chunked call launches, and how: the host heuristics of ``chunk.py`` as one pure
function, :func:`select_plan` (standard library only: testable on the CPU without CuPy or a GPU).

Three paths (``chunk.py``'s docstring says when each applies):

- ``"three-kernel"`` (``chunk_three_kernel.cu``): ``gdn_chunk_intra``, ``gdn_chunk_state``,
  ``gdn_chunk_output``, each templated on the input type, the chunk size and the arithmetic (plain
  FP32 or tensor cores).
- ``"fused"``: ``gdn_fused_prep`` (``chunk_fused_prep.cu``) then ``gdn_fused_state<W, KS>``
  (``chunk_fused.cu``, mma.sync).
- ``"wgmma"``: the same prep, then ``gdn_fused_state_sm90_k<K>`` (``chunk_wgmma.cu``, built for
  sm_90a; :func:`state_only` names its output-free form for the context-parallel B and M passes).

A :class:`ChunkPlan` names each kernel's source, its name expression, its CTA size and dynamic
shared memory (``layout.py``); the launcher compiles exactly those kernels.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from cupy_kernels import layout

CHUNK_SIZES = (16, 32, 64)
WGMMA_K = (64, 128)  # head sizes K with an sm_90a state kernel (gdn_fused_state_sm90_k<K>)
CTYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}

THREE_KERNEL_SOURCE = "chunk_three_kernel.cu"
PREP_SOURCE = "chunk_fused_prep.cu"
FUSED_SOURCE = "chunk_fused.cu"
WGMMA_SOURCE = "chunk_wgmma.cu"


@dataclass(frozen=True)
class Kernel:
    """One launch of a chunked call."""

    source: str  # the .cu file under cupy_kernels/
    name: str  # the name expression (sm_90 builds) or the extern "C" name (sm_90a builds)
    sm90a: bool  # built for sm_90a (sources.sm90a_module) instead of the device's plain architecture
    threads: int
    smem: int  # dynamic shared memory, bytes
    columns: int = 0  # state kernels: value columns per CTA (grid N * ceil(V / columns) x HV); 0: (chunks, HV)


@dataclass(frozen=True)
class ChunkPlan:
    """The kernels of one chunked call, in launch order: (intra, state, output) or (prep, state)."""

    path: str  # "three-kernel", "fused" or "wgmma"
    tensor_cores: bool
    warps: int  # fused state kernel: 16-column slabs per CTA (0 on the three-kernel path)
    k_split: int  # fused state kernel: warps per slab (1 elsewhere)
    kernels: tuple[Kernel, ...]

    @property
    def label(self) -> str:
        """What ``chunk.last_kernels`` reports: "three-kernel", "fused mma.sync <W, KS>" or "fused wgmma sm_90a"."""
        if self.path == "three-kernel":
            return "three-kernel"
        if self.path == "wgmma":
            return "fused wgmma sm_90a"
        return f"fused mma.sync <{self.warps}, {self.k_split}>"


def fused_warps(dtype: str, chunk_size: int, K: int, V: int, tensor_cores: bool) -> int | None:
    """Warps per CTA of the fused state kernel (each owns 16 value columns) for these inputs, or
    None where the fused path does not apply. Four warps share one load of k, q, T' and P' per
    chunk; fewer where V is not a multiple of 64."""
    if dtype != "bfloat16" or not tensor_cores or chunk_size != layout.FUSED_CHUNK:
        return None
    if K % 16 or K > layout.FUSED_MAX_K or V % 16:
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


def wgmma_applies(K: int, V: int, capability: tuple[int, int]) -> bool:
    """Whether the sm_90a wgmma state kernel applies: an sm_90 device (H100, H200), ``K`` in
    ``WGMMA_K`` and ``V`` a multiple of 64 (one warpgroup per 64 value columns)."""
    return K in WGMMA_K and V % layout.WGMMA_COLUMNS == 0 and capability == (9, 0)


@functools.lru_cache(maxsize=4096)
def select_plan(
    dtype: str,
    chunk_size: int,
    K: int,
    V: int,
    sequences: int,
    HV: int,
    aligned: bool,
    use_tensor_cores: bool | None,
    fused: bool | None,
    k_split: int | None,
    wgmma: bool | None,
    sms: int,
    capability: tuple[int, int],
    sm90a_builds: bool = True,
) -> ChunkPlan:
    """The kernels for validated inputs and options (``chunk.chunk_gated_delta_rule``'s ``fused``,
    ``k_split``, ``wgmma``, ``use_tensor_cores``) on a device with ``sms`` SMs of compute
    ``capability``: ``aligned`` says q, k, v are 16-byte aligned (the fused path copies 16-byte
    pieces), ``sm90a_builds`` whether the sm_90a module builds here (the default ``wgmma=None``
    then takes the wgmma state kernel wherever it applies). ``ValueError`` naming the option where
    an option asks for a path that does not apply. Pure and cached: computed once per key."""
    tensor_cores = dtype != "float32" if use_tensor_cores is None else bool(use_tensor_cores)
    warps = None if fused is False else fused_warps(dtype, chunk_size, K, V, tensor_cores)
    if warps is not None and not aligned:
        warps = None  # the fused path copies 16-byte pieces
    if fused and warps is None:
        raise ValueError(
            "fused: the fused path needs bf16 inputs, tensor cores, chunk_size=64, K % 16 == 0, K <= 128, "
            f"V % 16 == 0 and 16-byte aligned q, k, v (got {dtype}, chunk_size={chunk_size}, K={K}, V={V})"
        )
    if warps is None and k_split is not None:
        raise ValueError("k_split: only the fused path takes it, and it does not apply to these inputs")
    if wgmma and (warps is None or k_split is not None or not wgmma_applies(K, V, capability)):
        raise ValueError(
            "wgmma: the wgmma state kernel needs the fused path, an sm_90 device, K in (64, 128), V % 64 == 0 "
            f"and no k_split (got {dtype}, K={K}, V={V}, k_split={k_split}, compute capability {capability})"
        )
    use_wgmma = bool(wgmma)
    if warps is not None and wgmma is None and k_split is None and wgmma_applies(K, V, capability):
        use_wgmma = sm90a_builds
    if warps is not None and not use_wgmma:
        if k_split is None:
            k_split = fused_k_split(K, V, sequences, HV, sms)
        elif k_split == 2 and (K % 32 or V % 32):
            raise ValueError(f"k_split: 2 needs K % 32 == 0 and V % 32 == 0 (got K={K}, V={V})")
        warps = 2 if k_split == 2 else warps  # two slabs of two warps: one CTA per SM (shared memory)

    threads = layout.CHUNK_THREADS
    if warps is None:
        ctype, tc = CTYPES[dtype], "true" if tensor_cores else "false"
        src = THREE_KERNEL_SOURCE
        kernels: tuple[Kernel, ...] = (
            Kernel(src, f"gdn_chunk_intra<{ctype}, {chunk_size}, {tc}>", False, threads,
                   layout.chunk_intra_smem(chunk_size, K, V)),
            Kernel(src, f"gdn_chunk_state<{chunk_size}, {tc}>", False, threads,
                   layout.chunk_state_smem(chunk_size, K, tensor_cores), layout.STATE_TILE),
            Kernel(src, f"gdn_chunk_output<{ctype}, {chunk_size}, {tc}>", False, threads,
                   layout.chunk_output_smem(chunk_size, K)),
        )  # fmt: skip
        return ChunkPlan("three-kernel", tensor_cores, 0, 1, kernels)
    prep = Kernel(PREP_SOURCE, "gdn_fused_prep", False, threads, layout.fused_prep_smem(K))
    if use_wgmma:
        state = Kernel(WGMMA_SOURCE, f"gdn_fused_state_sm90_k{K}", True, layout.WGMMA_THREADS,
                       layout.wgmma_state_smem(K), layout.WGMMA_COLUMNS)  # fmt: skip
        return ChunkPlan("wgmma", tensor_cores, warps, 1, (prep, state))
    ks = k_split or 1
    state = Kernel(FUSED_SOURCE, f"gdn_fused_state<{warps}, {ks}>", False, 32 * warps * ks,
                   layout.fused_state_smem(K, warps, ks), 16 * warps)  # fmt: skip
    return ChunkPlan("fused", tensor_cores, warps, ks, (prep, state))


@functools.lru_cache(maxsize=64)
def state_only(plan: ChunkPlan, values: bool = True) -> ChunkPlan:
    """``plan`` with its state kernel in the form that writes no output, where there is one (the
    wgmma path: ``gdn_fused_state_sm90_k<K>_state_only``: no Y_q, output product or q / P' copies;
    with ``values=False`` ``..._transition``, which also reads no v: zero values). The
    context-parallel passes that build B (values) and M (zero values) never read their output.
    Other paths: ``plan``, whose kernel writes an output and reads v."""
    if plan.path != "wgmma":
        return plan
    prep, state = plan.kernels
    name = state.name + ("_state_only" if values else "_transition")
    return dataclasses.replace(plan, kernels=(prep, dataclasses.replace(state, name=name)))


# --------------------------------------------------------------------------- context parallelism
#
# At few (sequence, value head) pairs the state kernel's CTAs leave most SMs idle while each walks
# its sequence's chunks in series (1 x 65536 tokens at 8 value heads: 16 wgmma CTAs on 132 SMs).
# The context-parallel form (``context_parallel.py``) splits each sequence into J runs of whole
# chunks and runs three state passes over the N * J segments: the value pass from a zero state
# (the segment's affine term B), the transition pass (zero values, the identity as initial state,
# K columns: the segment's transition M), then, after a scan S_{j+1} = M_j S_j + B_j, the value pass
# again from the true start states, which writes the output. Three passes of 1 / J the chunks each.
#
# The choice below is a cost model in units of one chunk step of a state CTA (about 2.8 us on an
# H100 for the wgmma kernel): a pass costs its waves times its chunks per segment, plus overheads
# fitted (least squares) to forced J = 2..32 at 8 value heads, T = 8192..131072 (H100,
# 2026-11-27, reports/2026-11-27-context-parallel/): 294 us fixed (the extra launches, the zero
# values and identity states, the scan's set-up) and 70 us per segment (the scan's step, a few
# small torch kernels each). The first guesses (20 and 4 steps) chose J = 8 at 8192 and 16384
# tokens, where it took 2.3x and 1.5x the plain call's time.
SHARED_PER_SM = {(9, 0): 228 * 1024, (8, 0): 164 * 1024, (8, 7): 164 * 1024}  # else 100 KiB (sm_86, sm_89)
CP_MIN_SEGMENT_CHUNKS = 8  # a segment shorter than this spends more on the passes' fixed costs than it saves
CP_FIXED_STEPS = 105  # the two extra launches, the zero-fill and the scan's set-up, in chunk steps
CP_SCAN_STEPS = 25  # one segment step of the scan (a few small kernels), in chunk steps
CP_GAIN = 1.25  # the modelled speed-up below which the auto choice keeps one pass
CP_MAX_SEGMENTS = 256  # the most the choice considers (the scan is one step per segment)


def resident_ctas(kernel: Kernel, sms: int, capability: tuple[int, int]) -> int:
    """CTAs of ``kernel`` resident on the device at once, by shared memory and threads (1 KiB of
    shared memory per CTA is reserved by the driver)."""
    shared = SHARED_PER_SM.get(capability, 100 * 1024)
    per_sm = max(1, min(shared // (kernel.smem + 1024), 2048 // kernel.threads))
    return sms * per_sm


def context_parallel_cost(chunks: int, segments: int, passes: tuple[tuple[int, int], ...]) -> int:
    """Modelled time, in chunk steps, of state passes over ``segments`` runs of a sequence of
    ``chunks`` chunks; ``passes``: ``(CTAs per segment, resident CTAs)`` of each pass. One segment
    with one pass is the plain call."""
    per_segment = -(-chunks // segments)
    waves = sum(-(-(segments * ctas) // slots) for ctas, slots in passes)
    overhead = 0 if segments == 1 else CP_FIXED_STEPS + CP_SCAN_STEPS * segments
    return waves * per_segment + overhead


def context_parallel_passes(
    plan: ChunkPlan, plan_m: ChunkPlan, sequences: int, HV: int, K: int, V: int, sms: int, capability: tuple[int, int]
) -> tuple[int, int, int, int]:
    """``(ctas, slots, ctas_m, slots_m)`` of :func:`context_parallel_segments`: the value passes' CTAs
    per segment (sequences x value heads x column tiles of V) and how many are resident at once, and
    the transition pass's (column tiles of K); ``plan`` is the call's, ``plan_m`` the K-column one's."""
    state, state_m = plan.kernels[-1], plan_m.kernels[-1]
    return (
        sequences * HV * -(-V // state.columns),
        resident_ctas(state, sms, capability),
        sequences * HV * -(-K // state_m.columns),
        resident_ctas(state_m, sms, capability),
    )


@functools.lru_cache(maxsize=4096)
def context_parallel_segments(
    chunks: int, ctas: int, slots: int, ctas_m: int, slots_m: int, requested: bool | int | None = None
) -> int:
    """Segments per sequence J for a call whose longest sequence has ``chunks`` chunks; the value
    pass has ``ctas`` CTAs per segment (sequences x column tiles x value heads) of which ``slots``
    fit on the device at once, the transition pass ``ctas_m`` and ``slots_m``. ``requested``: None
    (auto: the J of least modelled time, if it beats one pass by ``CP_GAIN``, else 1), True (that J
    even where it does not pay, at least 2, segments down to one chunk) or an int >= 2 (exactly
    that J; segments past a sequence's chunks are empty). Pure and cached."""
    if requested is False:
        return 1
    if requested is not None and requested is not True:
        return int(requested)
    if not requested and chunks < 2 * CP_MIN_SEGMENT_CHUNKS:
        return 1
    plain = context_parallel_cost(chunks, 1, ((ctas, slots),))
    shortest = 1 if requested else CP_MIN_SEGMENT_CHUNKS
    candidates = range(2, max(2, min(chunks // shortest, CP_MAX_SEGMENTS)) + 1)
    passes = ((ctas, slots), (ctas_m, slots_m), (ctas, slots))
    best = min(candidates, key=lambda j: (context_parallel_cost(chunks, j, passes), j))
    if requested or context_parallel_cost(chunks, best, passes) * CP_GAIN <= plain:
        return best
    return 1
