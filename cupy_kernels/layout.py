"""Every layout fact the launchers share with the CUDA sources, in one table each (pure: standard
library only, importable without CuPy or a GPU).

- :data:`PARAMS`: the fields of ``struct gdn::Params`` (``recurrent.cu``) in order, with their C
  types. The launch structs (:data:`POINTERS`, :data:`SCALARS`), the field offsets and
  :data:`PARAMS_SIZE` are derived from it, with C's alignment rules; :func:`pack_scalars` packs the
  scalar tail by field name.
- The codes and bits the recurrent kernel reads (``gdn::DType``, ``MODE_*``, ``FLAG_*``, ``ERR_*``).
- The chunked kernels' constants (``chunk_common.cuh``: ``gdn_chunk::kThreads`` ...) and the
  dynamic shared memory of each of their kernels (``gdn_layout::*_smem_bytes``).

The CUDA side keeps its own definitions (the compiler needs them); ``tests/test_kernel_layout.py``
compiles a host program with nvcc that prints ``sizeof`` / ``offsetof`` of ``gdn::Params``, every
constant and the shared-memory sizes over a grid of shapes, and checks them against this module.
"""

from __future__ import annotations

import struct
from typing import Any

# --------------------------------------------------------------------------- recurrent.cu

# enum gdn::DType: element type codes of q/k/v, gates, indices and the accumulator
F32, F16, BF16, F64, I32, I64 = 0, 1, 2, 3, 4, 5
DTYPES = {"F32": F32, "F16": F16, "BF16": BF16, "F64": F64, "I32": I32, "I64": I64}

# MODE template argument of gdn::recurrent_kernel
MODE_DECODE, MODE_PREFILL, MODE_SPEC = 0, 1, 2
MODES = {"MODE_DECODE": MODE_DECODE, "MODE_PREFILL": MODE_PREFILL, "MODE_SPEC": MODE_SPEC}

# Params::flags bits
FLAGS = {
    "FLAG_L2NORM": 1,
    "FLAG_GATE_IN_KERNEL": 2,
    "FLAG_STATE_VEC": 4,
    "FLAG_QK_VEC": 8,
    "FLAG_V_VEC": 16,
    "FLAG_O_VEC": 32,
    "FLAG_BETA_SIGMOID": 64,
    "FLAG_NEG_EIGVAL": 128,
}

# Params::err words, one per metadata argument (tensors.ERROR_ARGUMENTS names them in this order)
ERRORS = {"ERR_CU_SEQLENS": 0, "ERR_SLOT_INDICES": 1, "ERR_STATE_INDICES": 2, "ERR_ACCEPTED": 3}
ERR_WORDS = 4

# struct gdn::Params, passed by value: (field, C type) in declaration order.
PARAMS: tuple[tuple[str, str], ...] = (
    ("q", "pointer"),
    ("k", "pointer"),
    ("v", "pointer"),
    ("g", "pointer"),
    ("beta", "pointer"),
    ("A_log", "pointer"),
    ("dt_bias", "pointer"),
    ("state_in", "pointer"),
    ("state_out", "pointer"),
    ("o", "pointer"),
    ("cu_seqlens", "pointer"),
    ("slot_idx", "pointer"),
    ("num_accepted", "pointer"),
    ("err", "pointer"),
    *((f"{tensor}_{stride}", "long long") for tensor in ("q", "k", "v", "g", "b") for stride in ("sb", "st", "sh")),
    ("B", "long long"),
    ("T", "long long"),
    ("N", "long long"),
    ("H", "long long"),
    ("HV", "long long"),
    ("K", "long long"),
    ("V", "long long"),
    ("num_slots", "long long"),
    ("idx_stride", "long long"),
    ("idx_cols", "long long"),
    ("slot_mode", "long long"),
    ("dtypes", "long long"),
    ("flags", "long long"),
    ("vtiles", "long long"),
    ("total_warps", "long long"),
    ("scale", "double"),
)

# C type -> (struct code, size = alignment on the x86-64 / aarch64 ABIs CUDA supports)
_C_TYPES = {"pointer": ("Q", 8), "long long": ("q", 8), "int": ("i", 4), "float": ("f", 4), "double": ("d", 8)}


def _offsets(fields: tuple[tuple[str, str], ...]) -> tuple[dict[str, int], int]:
    """C layout of a struct of ``fields``: each at the next multiple of its alignment; the size
    rounded up to the largest alignment."""
    offsets, end, widest = {}, 0, 1
    for name, ctype in fields:
        size = _C_TYPES[ctype][1]
        end = -(-end // size) * size
        offsets[name] = end
        end += size
        widest = max(widest, size)
    return offsets, -(-end // widest) * widest


def _struct(fields: tuple[tuple[str, str], ...], start: int, end: int) -> struct.Struct:
    """A little-endian ``struct.Struct`` of ``fields`` laid out from byte ``start`` to ``end`` of
    Params, with pad bytes where C's alignment puts them."""
    codes, at = "<", start
    for name, ctype in fields:
        pad = OFFSETS[name] - at
        codes += "x" * pad + _C_TYPES[ctype][0]
        at = OFFSETS[name] + _C_TYPES[ctype][1]
    return struct.Struct(codes + "x" * (end - at))


OFFSETS, PARAMS_SIZE = _offsets(PARAMS)
POINTER_FIELDS = tuple(name for name, ctype in PARAMS if ctype == "pointer")
SCALAR_FIELDS = tuple(name for name, ctype in PARAMS if ctype != "pointer")
# The pointer head (packed per call) and the scalar tail (packed once per signature into Plan.static).
assert PARAMS[: len(POINTER_FIELDS)] == tuple((name, "pointer") for name in POINTER_FIELDS), "pointers first"
POINTERS = _struct(PARAMS[: len(POINTER_FIELDS)], 0, OFFSETS[SCALAR_FIELDS[0]])
SCALARS = _struct(PARAMS[len(POINTER_FIELDS) :], OFFSETS[SCALAR_FIELDS[0]], PARAMS_SIZE)
assert POINTERS.size + SCALARS.size == PARAMS_SIZE


def pack_scalars(values: dict[str, Any]) -> bytes:
    """The scalar tail of Params from ``values`` by field name (every field, no other key)."""
    if set(values) != set(SCALAR_FIELDS):
        missing, extra = set(SCALAR_FIELDS) - set(values), set(values) - set(SCALAR_FIELDS)
        raise KeyError(f"Params scalars: missing {sorted(missing)}, unknown {sorted(extra)}")
    return SCALARS.pack(*(values[name] for name in SCALAR_FIELDS))


def unpack_params(raw: bytes) -> dict[str, Any]:
    """A packed Params by field name (for tests and debugging)."""
    pointers = POINTERS.unpack_from(raw, 0)
    scalars = SCALARS.unpack_from(raw, POINTERS.size)
    return dict(zip(POINTER_FIELDS + SCALAR_FIELDS, pointers + scalars))


# --------------------------------------------------------------------------- chunk_common.cuh

CHUNK_THREADS = 256  # gdn_chunk::kThreads: every CTA of the three-kernel path and of prep
STATE_TILE = 16  # gdn_chunk::kStateTile: value columns per CTA of gdn_chunk_state
OUT_TILE = 64  # gdn_chunk::kOutTile: value columns per pass of gdn_chunk_output
FUSED_CHUNK = 64  # gdn_fused::C: the fused paths' chunk size
FUSED_PAD = 8  # gdn_fused::kPad: bf16 row padding of the ldmatrix operands
FUSED_MAX_K = 128  # gdn_fused::kMaxK: the state rows a fused state CTA holds in registers
FUSED_MATS = 4  # gdn_fused::kMats: T'hi, T'lo, P'hi, P'lo
FUSED_VECS = 4  # gdn_fused::kVecs: a, c, d, G
WGMMA_COLUMNS = 64  # gdn_fused::kWgmmaColumns: value columns per CTA of the sm_90a state kernel
WGMMA_THREADS = 192  # gdn_fused::kWgmmaThreads: a consumer warpgroup and two producer warps

# gate_flags bits (gdn_chunk::kGateIsT, kBetaIsT, kGateInKernel, kBetaSigmoid, kNegEigval)
GATE_FLAGS = {"kGateIsT": 1, "kBetaIsT": 2, "kGateInKernel": 4, "kBetaSigmoid": 8, "kNegEigval": 16}

CHUNK_CONSTANTS = {
    "gdn_chunk::kThreads": CHUNK_THREADS,
    "gdn_chunk::kStateTile": STATE_TILE,
    "gdn_chunk::kOutTile": OUT_TILE,
    "gdn_fused::C": FUSED_CHUNK,
    "gdn_fused::kPad": FUSED_PAD,
    "gdn_fused::kMaxK": FUSED_MAX_K,
    "gdn_fused::kMats": FUSED_MATS,
    "gdn_fused::kVecs": FUSED_VECS,
    "gdn_fused::kWgmmaColumns": WGMMA_COLUMNS,
    "gdn_fused::kWgmmaThreads": WGMMA_THREADS,
    **{f"gdn_chunk::{name}": bit for name, bit in GATE_FLAGS.items()},
}


def chunk_intra_smem(C: int, K: int, V: int) -> int:
    """gdn_chunk_intra: xs C (max(K, V) | 1), A and T C (C + 1) each, tmp C C / 4, 6 vectors (floats)."""
    return 4 * (C * (max(K, V) | 1) + 2 * C * (C + 1) + C * C // 4 + 6 * C)


def chunk_state_smem(C: int, K: int, tensor_cores: bool) -> int:
    """gdn_chunk_state: W and Kd C KP each (KP = K, or K + 4 with tensor cores), U and v_new
    C STATE_TILE each, S K STATE_TILE (floats)."""
    kp = K + 4 if tensor_cores else K
    return 4 * (2 * C * kp + 2 * C * STATE_TILE + K * STATE_TILE)


def chunk_output_smem(C: int, K: int) -> int:
    """gdn_chunk_output: qs C KS (KS = K | 1), xs max(C KS, OUT_TILE (K + C)), P C (C + 1), 2 vectors (floats)."""
    ks = K | 1
    return 4 * (C * ks + max(C * ks, OUT_TILE * (K + C)) + C * (C + 1) + 2 * C)


def fused_prep_smem(K: int) -> int:
    """gdn_fused_prep: G fp64, four fp32 vectors, A; then k and q, whose space T and tmp take over."""
    C, kp = FUSED_CHUNK, K + FUSED_PAD
    return (2 * C + 4 * C + C * (C + 1)) * 4 + max(2 * C * kp * 2, (C * (C + 1) + C * C // 4) * 4)


def fused_state_smem(K: int, warps: int, k_split: int) -> int:
    """gdn_fused_state<warps, k_split>: k and the vectors double-buffered; q, v and T'/P' single
    (k_split 1) or double (2); the output tile; with k_split 2 one exchange buffer per warp."""
    C, kp, vp, cp = FUSED_CHUNK, K + FUSED_PAD, 16 * warps + FUSED_PAD, FUSED_CHUNK + FUSED_PAD
    k_and_vectors = C * kp * 2 + FUSED_VECS * C * 4
    q_v_mats = (C * kp * 2 + C * vp * 2 + FUSED_MATS * C * cp * 2) * (2 if k_split > 1 else 1)
    exchange = warps * k_split * C * 32 * 4 if k_split > 1 else 0  # per warp: partial Y_k, Y_q, C floats a lane
    return 2 * k_and_vectors + q_v_mats + C * vp * 2 + exchange


def wgmma_state_smem(K: int) -> int:
    """gdn_fused_state_sm90_k<K>: two stages of k, q, T'/P' (unpadded swizzled tiles), v and the
    vectors; then the output tile."""
    C, vp = FUSED_CHUNK, WGMMA_COLUMNS + FUSED_PAD
    stage = 2 * C * K * 2 + FUSED_MATS * C * C * 2 + C * vp * 2 + FUSED_VECS * C * 4
    return 2 * stage + C * vp * 2
