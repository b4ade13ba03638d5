"""Precision metrics for reports: correct rounding, ULP distance, rounding floor, error maps.

Everything here compares an implementation's output with the float64 oracle's. The oracle's
output rounded once, correctly, to the output dtype is the best any implementation can
return, so its error (the *rounding floor*) is the reference line of every error plot, and
the ULP distance is counted from it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from gdn_verify.core import tolerance as tol

# ULP histogram bins: 0, 1, 2, 3-4, 5-8, ... (upper edges are powers of two), then "more".
ULP_BIN_EDGES = (0, 1, 2) + tuple(2**i for i in range(2, 21))
# ULP counts are taken only where |ref| >= this times the RMS of ref (see ulp_statistics).
ULP_MAGNITUDE_FLOOR = tol.FLOOR
# Per-element relative error histogram: log10 bins shared by every implementation and dtype.
REL_LOG10_EDGES = tuple(float(x) for x in np.arange(-12.0, 2.01, 0.25))


def round_exact(x: np.ndarray, dtype) -> np.ndarray:
    """``x`` (float64) correctly rounded (nearest, ties to even) to ``dtype``, returned in ``dtype``.

    NumPy's float64 -> float32/float16 casts round correctly, but ml_dtypes' float64 ->
    bfloat16 cast goes through float32 and so rounds twice (1 + 2^-8 + 2^-30 becomes 1, not
    1 + 2^-7). Here the significand is rounded once in float64: scaling by the dtype's
    spacing (a power of two) is exact, ``rint`` rounds half to even, and the result is
    representable, so the final cast is exact (or overflows to inf, as rounding should).
    """
    dtype = np.dtype(dtype)
    x = np.asarray(x, np.float64)
    if dtype == np.float64:
        return x.copy()
    info = ml_dtypes.finfo(dtype)
    _, exponent = np.frexp(x)  # x = m 2^e with 0.5 <= |m| < 1
    # Spacing of dtype numbers around x: 2^(e - 1 - nmant) for normals, fixed for subnormals.
    spacing = np.ldexp(1.0, np.maximum(exponent, int(info.minexp) + 1) - (int(info.nmant) + 1))
    with np.errstate(over="ignore", invalid="ignore"):
        return (np.rint(x / spacing) * spacing).astype(dtype)


def _ordered_keys(x: np.ndarray) -> np.ndarray:
    """Integers that count representable values: consecutive floats differ by 1, -0 == +0."""
    bits = np.dtype(x.dtype).itemsize * 8
    unsigned = x.view({16: np.uint16, 32: np.uint32, 64: np.uint64}[bits])
    magnitude = (unsigned & np.array((1 << (bits - 1)) - 1, unsigned.dtype)).astype(np.int64)
    negative = (unsigned >> np.array(bits - 1, unsigned.dtype)).astype(bool)
    return np.where(negative, -magnitude, magnitude)


def ulp_distance(o: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Float64 ``[...]``: how many ``o.dtype`` values lie between ``o`` and ``ref`` correctly rounded.

    ``o`` is an output in its own dtype (bfloat16 via ml_dtypes), ``ref`` the float64 oracle
    output of the same shape. 0 means correctly rounded; NaN where either side is NaN.
    Counts are exact up to 2^53 (they are differences of int64 keys taken in float64).
    """
    o = np.asarray(o)
    rounded = round_exact(ref, o.dtype)
    distance = np.abs(_ordered_keys(o).astype(np.float64) - _ordered_keys(rounded).astype(np.float64))
    nan = np.isnan(np.asarray(o, np.float64)) | np.isnan(np.asarray(ref, np.float64))
    return np.where(nan, np.nan, distance)


def rounding_floor(ref: np.ndarray, dtype, bounds: np.ndarray) -> float:
    """``output_rms`` error (see ``tolerance``) of the oracle output ``[B, T, HV, V]`` rounded to ``dtype``.

    The error that storing the exact output in ``dtype`` alone costs: no implementation
    returning ``dtype`` can be expected below it.
    """
    return tol.output_errors(round_exact(ref, dtype), ref, bounds)[0]


def elementwise_relative_error(o: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """``|o - ref| / |ref|`` per element (float64).

    NaN where ``ref == 0`` (undefined), inf where ``o`` is not finite.
    """
    o = np.asarray(o, np.float64)
    ref = np.asarray(ref, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(o - ref) / np.abs(ref)
    return np.where(ref == 0, np.nan, np.where(np.isfinite(o), rel, np.inf))


def growth_exponent(lengths, errors) -> float | None:
    """Least-squares slope of log(error) against log(T); None with fewer than 2 positive errors."""
    points = [(T, e) for T, e in zip(lengths, errors) if e is not None and np.isfinite(e) and e > 0]
    if len(points) < 2:
        return None
    x, y = np.log([p[0] for p in points]), np.log([p[1] for p in points])
    return float(np.polyfit(x, y, 1)[0])


def ulp_histogram(distance: np.ndarray) -> dict:
    """Counts of ULP distances in ``ULP_BIN_EDGES`` bins (last bin open), plus NaN count and quantiles."""
    d = np.asarray(distance, np.float64).ravel()
    finite = d[~np.isnan(d)]
    labels, counts, low = [], [], 0
    for high in ULP_BIN_EDGES:  # closed bins [low, high] of whole ULP counts
        labels.append(str(high) if low == high else f"{low}-{high}")
        counts.append(int(np.sum((finite >= low) & (finite <= high))))
        low = high + 1
    labels.append(f">{ULP_BIN_EDGES[-1]}")
    counts.append(int(np.sum(finite > ULP_BIN_EDGES[-1])))
    n = finite.size
    return dict(
        labels=labels,
        counts=counts,
        nan=int(d.size - n),
        total=int(d.size),
        correctly_rounded=float(np.mean(finite == 0)) if n else None,
        within_1ulp=float(np.mean(finite <= 1)) if n else None,
        median=float(np.median(finite)) if n else None,
        p99=float(np.quantile(finite, 0.99)) if n else None,
        max=float(finite.max()) if n else None,
    )


def ulp_statistics(o: np.ndarray, ref: np.ndarray, floor: float = ULP_MAGNITUDE_FLOOR) -> dict:
    """:func:`ulp_histogram` of ``ulp_distance(o, ref)`` over the elements where ``|ref|`` is at
    least ``floor`` times the RMS of ``ref``, with ``magnitude_floor`` (that threshold, absolute)
    and ``below_floor`` (how many elements it leaves out).

    Near zero a ULP is tiny: an output of 1e-12 where the exact value is 1e-20 is a harmless
    absolute error yet ~1e9 float32 ULPs away, so ULP counts there say nothing about accuracy
    (a correct float32 kernel would show "max ULP 1.6e+09"). The floor is the tolerance model's
    (``tolerance.FLOOR``), below which errors are judged in absolute terms too.
    """
    ref = np.asarray(ref, np.float64)
    threshold = floor * float(np.sqrt(np.mean(ref**2))) if ref.size else 0.0
    keep = np.abs(ref) >= threshold
    stats = ulp_histogram(ulp_distance(o, ref)[keep])
    stats.update(magnitude_floor=threshold, floor_relative_to_rms=floor, below_floor=int(keep.size - keep.sum()))
    return stats


def relative_error_histogram(rel: np.ndarray) -> dict:
    """Counts of ``log10`` relative errors in ``REL_LOG10_EDGES`` bins (clipped into the end bins);
    ``exact`` (0), ``undefined`` (NaN: the oracle is 0) and ``nonfinite`` (inf: the output is not) counts."""
    r = np.asarray(rel, np.float64).ravel()
    defined = r[~np.isnan(r)]
    exact = int(np.sum(defined == 0))
    positive = defined[(defined > 0) & np.isfinite(defined)]
    logs = np.clip(np.log10(positive), REL_LOG10_EDGES[0], REL_LOG10_EDGES[-1] - 1e-9)
    counts, _ = np.histogram(logs, bins=np.array(REL_LOG10_EDGES))
    n = defined.size
    return dict(
        log10_edges=list(REL_LOG10_EDGES),
        counts=counts.astype(int).tolist(),
        exact=exact,
        undefined=int(r.size - n),
        nonfinite=int(np.sum(np.isinf(defined))),
        total=int(r.size),
        median=float(np.median(defined)) if n else None,
        p99=float(np.quantile(defined, 0.99)) if n else None,
        max=float(defined.max()) if n else None,
    )
