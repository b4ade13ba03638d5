"""EXPERIMENTAL, not imported by the product: the launcher side of the decode variants that left
``cupy_kernels.recurrent_kernel.VARIANTS`` because they measured slower than the default
(NOTES.md beside this file): the ``narrow`` tilings and the persistent grid of
``decode_persistent.cu``.

This is the code as it was in ``recurrent_kernel.py`` (git: the parent of the commit that moved
it), cut to what differs from the product, so that the variants can be wired in again: add the
entries of :data:`VARIANTS` to ``recurrent_kernel.VARIANTS`` (with ``narrow`` and ``persistent``
fields on ``DecodeVariant``), take the lane tiling from :func:`tiling`, instantiate
:func:`name_expression` from ``decode_persistent.cu`` instead of ``recurrent.cu``, and cap the
persistent grid with :func:`persistent_blocks`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple


class Variant(NamedTuple):
    """A decode (T = 1) tiling: ``narrow`` halves the state per lane; ``streaming`` (CS: evict-first
    state loads and stores), ``min_blocks`` (MINB: ``__launch_bounds__`` min blocks) and
    ``persistent`` (``gdn::decode_persistent_kernel`` instead of ``gdn::recurrent_kernel``)."""

    narrow: bool
    streaming: bool
    min_blocks: int
    persistent: bool = False


VARIANTS = {
    "narrow": Variant(True, False, 4),
    "narrow-cs": Variant(True, True, 4),
    # persistent grid, next item's state tile prefetched into a second register tile (issue 17b):
    # narrow 32 + 32 floats per lane, 168 registers (MINB 3: 12 warps/SM); wide 64 + 64, 255 (MINB 2: 8)
    "narrow-cs-pf": Variant(True, True, 3, True),
    "wide-cs-pf": Variant(False, True, 2, True),
}


def _pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


@functools.cache
def tiling(K: int, V: int, v_first: bool, double: bool, narrow: bool = False) -> tuple[int, int, int, int]:
    """Lane tiling ``(LC, AC, BR, WV)``: ``recurrent_kernel.tiling`` with the ``narrow`` option,
    which halves the per-lane budget: k-first halves LC (LC 2, BR 8 at K = 128: 32-byte row
    segments per warp, 32 floats per lane), v-first halves BR. ``narrow=False`` is the product's."""
    vw = 2 if double else 4
    budget = (16 if double else 32) if narrow else (32 if double else 64)
    if not v_first:
        lc = 2 if (double or K > 128) else 4
        if narrow:
            lc = max(1, lc // 2)
        lc = min(lc, _pow2(-(-V // vw)))
        lr = 32 // lc
        br = _pow2(-(-K // lr))
        ac = 1
        wv = vw * lc * ac
    else:
        lc = 16 if K > 128 else 8
        ac = _pow2(-(-K // (lc * vw)))
        lr = 32 // lc
        br = max(1, min(budget // (ac * vw), _pow2(-(-V // lr))))
        wv = lr * br
    return lc, ac, br, wv


def name_expression(dtype: int, double: bool, v_first: bool, lc: int, ac: int, br: int, variant: Variant) -> str:
    """The C++ name of a persistent instantiation (``decode_persistent.cu``; decode only)."""
    b = {True: "true", False: "false"}
    acc = "double" if double else "float"
    return (
        f"gdn::decode_persistent_kernel<{dtype}, {acc}, {b[v_first]}, {lc}, {ac}, {br}, "
        f"{b[variant.streaming]}, {variant.min_blocks}>"
    )


def resident_ctas(occupancy: int | None, registers: int, threads: int) -> int:
    """CTAs of ``threads`` threads that fit on one SM at once: the occupancy calculator's answer
    (``cuOccupancyMaxActiveBlocksPerMultiprocessor``) where there is one, else from the register
    count (the state tiles make registers the only limit)."""
    if occupancy is not None:
        return max(1, occupancy)
    per_warp = -(-(registers or 255) * 32 // 256) * 256  # registers are allocated per warp in units of 256
    return max(1, min(32, (65536 // per_warp) // (threads // 32)))


def persistent_blocks(blocks: int, sms: int, resident: int) -> int:
    """The persistent grid: one warp per resident slot at most; each loops over items w, w + stride, ..."""
    return min(blocks, sms * resident) if blocks else 0
