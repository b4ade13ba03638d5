"""The physical floor of a chunked GDN prefill: tensor-core FLOP and minimal HBM bytes (pure, no GPU).

FLOP, chunk size ``C`` (64), per value head and per chunk of ``c <= C`` tokens (a sequence of ``L``
tokens has ``ceil(L / C)`` chunks, the last one ``L - C (ceil(L / C) - 1)`` tokens long), each
matrix product ``(m x k)(k x n)`` counted as ``2 m n k``:

===================  ==========================  ============
product              shape                       FLOP
===================  ==========================  ============
``K K^T``            ``(c x K)(K x c)``          ``2 c^2 K``
``Q K^T``            ``(c x K)(K x c)``          ``2 c^2 K``
``(I + A)^-1``       unit lower triangular       ``2 C(c, 3)``
``W = T K``          ``(c x c)(c x K)``          ``2 c^2 K``
``U = T V``          ``(c x c)(c x V)``          ``2 c^2 V``
``W S``              ``(c x K)(K x V)``          ``2 c K V``
``Q S``              ``(c x K)(K x V)``          ``2 c K V``
``K^T v_new``        ``(K x c)(c x V)``          ``2 c K V``
``P v_new``          ``(c x c)(c x V)``          ``2 c^2 V``
===================  ==========================  ============

so ``c = C = 64``, ``K = V = 128`` gives 11.6 MFLOP a chunk, about 0.18 MFLOP per token and value
head (the figure of ``shared/anchors.md``). Counted as a tensor-core kernel computes them: the
``c x c`` products are dense tiles (a kernel that skipped the upper triangles could save about
half of ``K K^T``, ``Q K^T`` and ``P v_new``; the floor does not assume it); every product is
counted per value head, as written (``K K^T`` and ``Q K^T`` depend only on the q-k head up to
elementwise gate and ``beta`` factors, so a kernel sharing them across a head group's
``HV / H`` value heads needs fewer); the triangular inverse is the multiply-adds of forward
substitution on a unit lower-triangular ``c x c`` matrix, ``C(c, 3) = c (c-1) (c-2) / 6``; and
the first chunk's ``W S`` and ``Q S`` are counted though its state is zero without an initial
state. Not counted: elementwise work (gates, decays, ``beta`` scaling, the state's decay), which
runs outside the tensor cores.

Minimal HBM bytes, each tensor read or written once: ``q`` and ``k`` ``T H K`` each (once per q-k
head, however many value heads share it), ``v`` ``T HV V``, ``beta`` ``T HV`` in the input dtype
(``input_bytes``, 2 for bfloat16), ``g`` ``T HV`` float32 (``gate_bytes``); written: ``o``
``T HV V`` in the input dtype and the float32 final state ``N HV K V`` (``state_bytes``).
``cu_seqlens`` (8 bytes a sequence) is left out.

Floor, in ms: ``max(FLOP / peak FLOP/s, bytes / bandwidth)``, from a device's datasheet
(:data:`PEAKS`, dense bfloat16 tensor-core FLOP/s and HBM bandwidth) and, when a run measured
one, from the bandwidth of a device-to-device copy in the same run (bytes read + written per
second, as the decode bench counts them) with the datasheet FLOP/s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

CHUNK = 64
PRODUCTS = ("kkt", "qkt", "inverse", "w", "u", "ws", "qs", "state_update", "pv")


@dataclass(frozen=True)
class Peak:
    """A device's datasheet peaks: dense bfloat16 tensor-core FLOP/s and HBM bytes/s."""

    name: str
    flops: float
    bandwidth: float


# NVIDIA's datasheets (dense, no sparsity): H100 SXM5 989.4 TFLOP/s bf16, HBM3 3.35 TB/s; H200 SXM
# the same tensor cores, HBM3e 4.8 TB/s. PCIe and NVL parts differ and are not listed (None).
PEAKS = {
    "H100 SXM": Peak("H100 SXM", 989.4e12, 3.35e12),
    "H200": Peak("H200", 989.4e12, 4.8e12),
}


def device_peak(device_name: str | None) -> Peak | None:
    """The datasheet peaks of a device by its CUDA name (``"NVIDIA H100 80GB HBM3"``, ``"NVIDIA
    H200"``), None for a device not in :data:`PEAKS` (PCIe and NVL parts included)."""
    name = (device_name or "").upper()
    if "PCIE" in name or "NVL" in name:
        return None
    if "H100" in name and ("SXM" in name or "HBM3" in name):
        return PEAKS["H100 SXM"]
    if "H200" in name:
        return PEAKS["H200"]
    return None


def chunk_lengths(lengths: Sequence[int], chunk: int = CHUNK) -> list[int]:
    """The chunk lengths of sequences of ``lengths`` tokens: whole chunks, then the remainder."""
    out = []
    for L in lengths:
        whole, rest = divmod(int(L), chunk)
        out += [chunk] * whole + ([rest] if rest else [])
    return out


def chunk_flop(c: int, K: int, V: int) -> dict[str, int]:
    """FLOP of one chunk of ``c`` tokens for one value head, by product (:data:`PRODUCTS`)."""
    return dict(
        kkt=2 * c * c * K,
        qkt=2 * c * c * K,
        inverse=2 * math.comb(c, 3),
        w=2 * c * c * K,
        u=2 * c * c * V,
        ws=2 * c * K * V,
        qs=2 * c * K * V,
        state_update=2 * c * K * V,
        pv=2 * c * c * V,
    )


def forward_flop(lengths: Sequence[int], HV: int, K: int, V: int, chunk: int = CHUNK) -> dict[str, int]:
    """Tensor-core FLOP of the chunked forward over sequences of ``lengths`` tokens with ``HV``
    value heads, by product, plus ``total``."""
    totals = dict.fromkeys(PRODUCTS, 0)
    counts: dict[int, int] = {}
    for c in chunk_lengths(lengths, chunk):
        counts[c] = counts.get(c, 0) + 1
    for c, n in counts.items():
        for name, flop in chunk_flop(c, K, V).items():
            totals[name] += n * HV * flop
    totals["total"] = sum(totals[name] for name in PRODUCTS)
    return totals


def hbm_bytes(
    lengths: Sequence[int],
    H: int,
    HV: int,
    K: int,
    V: int,
    input_bytes: int = 2,
    gate_bytes: int = 4,
    state_bytes: int = 4,
) -> dict[str, int]:
    """Minimal HBM traffic in bytes, by tensor (``q``, ``k``, ``v``, ``g``, ``beta``, ``o``,
    ``state``), plus ``total``: every input read once, the output and the final state written once."""
    T, N = int(sum(lengths)), len(lengths)
    parts = dict(
        q=T * H * K * input_bytes,
        k=T * H * K * input_bytes,
        v=T * HV * V * input_bytes,
        g=T * HV * gate_bytes,
        beta=T * HV * input_bytes,
        o=T * HV * V * input_bytes,
        state=N * HV * K * V * state_bytes,
    )
    parts["total"] = sum(parts.values())
    return parts


def floor_ms(flop: float, nbytes: float, flops: float, bandwidth: float) -> dict[str, float | str]:
    """``compute_ms`` (FLOP at ``flops`` FLOP/s), ``memory_ms`` (bytes at ``bandwidth`` bytes/s),
    ``floor_ms`` (the larger) and ``bound`` (``"compute"`` or ``"memory"``, whichever it is)."""
    compute, memory = flop / flops * 1e3, nbytes / bandwidth * 1e3
    return dict(
        compute_ms=compute,
        memory_ms=memory,
        floor_ms=max(compute, memory),
        bound="compute" if compute >= memory else "memory",
    )


def row_floor(
    lengths: Sequence[int],
    H: int,
    HV: int,
    K: int,
    V: int,
    device_name: str | None,
    copy_gbps: float | None = None,
    chunk: int = CHUNK,
) -> dict:
    """The floor of one bench row: ``flop`` and ``bytes`` (totals), ``flop_by_product``,
    ``bytes_by_tensor``, ``peak`` (the datasheet entry's name, None for an unknown device),
    ``datasheet`` (:func:`floor_ms` at the datasheet peaks, None for an unknown device) and
    ``copy`` (:func:`floor_ms` at the datasheet FLOP/s and ``copy_gbps`` GB/s, the bandwidth of a
    copy measured in the same run; None without one, or for an unknown device)."""
    flop = forward_flop(lengths, HV, K, V, chunk)
    nbytes = hbm_bytes(lengths, H, HV, K, V)
    peak = device_peak(device_name)
    datasheet = copy = None
    if peak is not None:
        datasheet = floor_ms(flop["total"], nbytes["total"], peak.flops, peak.bandwidth)
        if copy_gbps:
            copy = floor_ms(flop["total"], nbytes["total"], peak.flops, copy_gbps * 1e9)
    return dict(
        flop=flop["total"],
        bytes=nbytes["total"],
        flop_by_product={n: flop[n] for n in PRODUCTS},
        bytes_by_tensor={n: v for n, v in nbytes.items() if n != "total"},
        peak=None if peak is None else peak.name,
        datasheet=datasheet,
        copy=copy,
    )
