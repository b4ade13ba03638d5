"""Small composable Hypothesis strategies for GDN problems in the native (FLA) convention.

Structure (shapes, lengths, gate regimes, special positions, flags) is drawn by Hypothesis
so it shrinks to a minimal case; bulk values come from a NumPy generator seeded by a drawn
integer, which keeps large arrays cheap. Problems are well posed: keys are unit-norm unless
``use_qk_l2norm_in_kernel`` normalizes them, and ``beta`` lies in [0, 1].
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from gdn_verify.core.problem import DTYPES, Problem
from gdn_verify.core.shapes import EXPLICIT_SCALES, MAX_BATCH, ShapeClass

CHUNK_SIZES = (16, 32, 64)
AWKWARD_DIMS = (1, 3, 60, 100, 128)
SMALL_DIMS = (2, 4, 8, 16, 32)
# "tiny" and "retention" (tiny decays, then a stretch with no writes, beta = 0) are the long, nearly
# undamped memories where a state or decay rounded to 16 bits drifts and an allowed rounding does not:
# exp(g) for |g| < 2^-9 (float16: 2^-12) rounds to 1, so such a kernel forgets nothing.
GATE_REGIMES = ("none", "mild", "moderate", "strong", "spikes", "strong_run", "mixed", "tiny", "retention")
# Rows of q and k under l2norm: as drawn, some all-zero (padding), or some tiny (norm 10^-4.5 to
# 10^-2.5, where the epsilon of x / sqrt(||x||^2 + 1e-6) decides the result).
ROW_KINDS = ("plain", "zero", "tiny")


@dataclass(frozen=True)
class Limits:
    """What the strategies may draw: the one place problem sizes are configured.

    ``dtype`` the input dtype (None: draw one of float64/32/16 and bfloat16); ``head_dims`` the
    sizes K and V are drawn from (restrict it for kernels built, or compiled, per size);
    ``max_tokens`` the longest T of ``error_growth``; ``shape_classes`` (None: any shape) the
    pool of :class:`ShapeClass` every strategy draws head counts, head sizes, dtype and the
    varlen / initial state / l2norm flags from, for kernels that compile per class (see
    :func:`pool_candidates`); everything else still varies per example.
    """

    dtype: str | None = None
    max_len: int = 130
    max_sequences: int = 6
    max_batch: int = MAX_BATCH
    max_heads: int = 4
    head_ratios: tuple[int, ...] = (1, 2, 4)
    head_dims: tuple[int, ...] = SMALL_DIMS + AWKWARD_DIMS
    max_tokens: int = 2048
    shape_classes: tuple[ShapeClass, ...] | None = None
    scales: tuple[float, ...] = EXPLICIT_SCALES  # drawn besides None (the kernel's 1/sqrt(K))

    def replace(self, **changes: Any) -> Limits:
        return replace(self, **changes)


def supported(limits: Limits, impl: Any) -> Limits:
    """``limits`` narrowed to what ``impl`` (an ``Implementation``) declares it supports, so that no
    example is drawn only to be refused: ``extra["gva"] = False`` (no grouped value heads: H = HV
    only; a shape pool's GVA classes become their H = HV twins) and ``extra["head_dims"]`` (the K
    and V sizes it has kernels for). Undeclared limits show at the call instead: an example the
    kernel refuses with ``NotImplementedError`` is counted as unsupported, with its reason."""
    extra = getattr(impl, "extra", {}) or {}
    if extra.get("gva") is False:
        pool = limits.shape_classes
        pool = None if pool is None else tuple(dict.fromkeys(c.replace(H=c.HV) for c in pool))
        limits = limits.replace(head_ratios=(1,), shape_classes=pool)
    dims = declared_head_dims(impl)
    if dims:
        kept = tuple(d for d in limits.head_dims if d in set(dims)) or dims
        limits = limits.replace(head_dims=kept)
    return limits


def declared_head_dims(impl: Any) -> tuple[int, ...] | None:
    """The head sizes ``impl`` (an ``Implementation``) declares it has kernels for
    (``extra["head_dims"]``, sorted; None: any)."""
    dims = (getattr(impl, "extra", {}) or {}).get("head_dims")
    return tuple(sorted(int(d) for d in dims)) if dims else None


# Larger problems for fuzz campaigns (matches_reference and gate_extremes only): on a CPU what the
# NumPy oracle computes in about a second, on a GPU what the float64 GPU recurrence can check.
LARGE_CPU = Limits(max_len=512, max_sequences=8, head_dims=(1, 3, 16, 32, 60, 64))
LARGE_GPU = Limits(max_len=65536, max_sequences=4, head_ratios=(1, 2, 4, 8), head_dims=(64, 100, 128))


# Shape pools --------------------------------------------------------------------------------
# Properties call the implementation on problems derived from the drawn one; these are the
# derived classes, so that a property draws only classes whose derivatives are compiled too.
def batched_twin(c: ShapeClass) -> ShapeClass:
    """``varlen_equals_separate`` calls each sequence of a varlen pack alone (batched, B = 1)."""
    return c.replace(varlen=False)


def state_twin(c: ShapeClass) -> ShapeClass:
    """``state_continuation`` starts its second call from the first call's final state."""
    return c.replace(initial_state=True)


def expanded_twin(c: ShapeClass) -> ShapeClass:
    """``head_mapping`` compares a GVA call with q/k repeated to ``H == HV``."""
    return c.replace(H=c.HV)


# Flag combinations (varlen, initial_state, l2norm) in the order a pool takes them: the first two
# already cover varlen and batched, with and without a state and l2norm; each varlen entry comes
# after (or with) its batched twin, and each stateless batched one before its state twin.
FLAG_ORDER = (
    (False, True, False),
    (True, False, True),
    (False, False, True),
    (True, True, False),
    (False, True, True),
    (True, False, False),
    (False, False, False),
    (True, True, True),
)


def _pick(dims: tuple[int, ...], preferred: Sequence[int], keep: Callable[[int], bool] = lambda d: True) -> int | None:
    for d in preferred:
        if d in dims and keep(d):
            return d
    rest = [d for d in dims if keep(d)]
    return max(rest) if rest else None


def pool_candidates(limits: Limits) -> tuple[ShapeClass, ...]:
    """Shape classes for a kernel that compiles per class, most informative first, within ``head_dims``.

    Three geometries: ``g1 = (H=2, HV=4, K=128, V=100)`` (GVA, K != V, a size that is not a
    multiple of 16), its expansion ``e1 = (4, 4, 128, 100)`` (``head_mapping``'s second call, and
    plain MHA), and ``g2 = (1, 2, 60, 32)`` (an awkward K, a small V, one q/k head), each with the
    flag combinations of ``FLAG_ORDER`` (e1 with the first two only): 18 classes. Any prefix of 4
    or more covers GVA, K != V, an awkward size, varlen and batched, with and without an initial
    state and l2norm (as far as ``head_dims`` allows); 12 add every flag combination of g1 and two
    of g2. Sizes come from ``head_dims``:
    128 (else the largest), 100 or 60 (else the largest size not a multiple of 16).
    """
    dims = tuple(sorted(set(limits.head_dims)))
    dtype = limits.dtype or "float32"
    big = _pick(dims, (128,)) or max(dims)
    awkward = _pick(dims, (100, 60), lambda d: d % 16 != 0)
    v1 = awkward if awkward is not None and awkward != big else _pick(dims, (64, 100, 60, 32), lambda d: d != big)
    v1 = v1 if v1 is not None else big
    k2 = _pick(dims, (60, 100), lambda d: d % 16 != 0 and d != v1) or _pick(dims, (64, 32), lambda d: d != big) or big
    v2 = _pick(dims, (32, 16, 64), lambda d: d != k2) or k2
    ratio = 2 if 2 in limits.head_ratios else max(limits.head_ratios)
    H1 = min(2, limits.max_heads)
    g1, g2 = (H1, H1 * ratio, big, v1), (1, ratio, k2, v2)
    e1 = (g1[1], g1[1], big, v1)

    def cls(geometry: tuple[int, int, int, int], flags: tuple[bool, bool, bool]) -> ShapeClass:
        return ShapeClass(*geometry, dtype, *flags)

    order = [cls(g1, FLAG_ORDER[0]), cls(g1, FLAG_ORDER[1]), cls(g1, FLAG_ORDER[2]), cls(e1, FLAG_ORDER[0])]
    order += [cls(g2, FLAG_ORDER[0]), cls(g2, FLAG_ORDER[1])]
    order += [cls(g1, f) for f in FLAG_ORDER[3:]] + [cls(e1, FLAG_ORDER[1])]
    order += [cls(g2, f) for f in FLAG_ORDER[2:]]  # e1 only as the twin of g1's first two: fewer large classes
    return tuple(dict.fromkeys(order))  # geometries coincide when head_dims holds one or two sizes


def pool_classes(
    limits: Limits,
    *,
    varlen: bool | None = None,
    initial_state: bool | None = None,
    gva: bool = False,
    twins: Sequence[Callable[[ShapeClass], ShapeClass]] = (),
    smallest: bool = False,
    first: int | None = None,
) -> tuple[ShapeClass, ...] | None:
    """The classes of ``limits.shape_classes`` a strategy may draw (None: no pool, draw freely).

    ``varlen``, ``initial_state``, ``gva`` (HV > H) must hold; classes whose ``twins`` (the derived
    calls the property makes) are in the pool are preferred, and with ``smallest`` those of the
    smallest head sizes (cheap oracles for long problems). ``first``: only the pool's first classes
    (for options that compile one more variant of every class they meet). When no class qualifies,
    the first is adapted: a class outside the pool, compiled when first met.
    """
    pool = limits.shape_classes
    if not pool:
        return None
    pool = pool[:first] if first else pool

    def fits(c: ShapeClass) -> bool:
        return (
            (varlen is None or c.varlen == varlen)
            and (initial_state is None or c.initial_state == initial_state)
            and (not gva or c.HV > c.H)
        )

    eligible = [c for c in pool if fits(c)]
    if not eligible:
        c = pool[0]
        c = c.replace(varlen=c.varlen if varlen is None else varlen)
        c = c.replace(initial_state=c.initial_state if initial_state is None else initial_state)
        eligible = [c.replace(HV=2 * c.H) if gva and c.HV <= c.H else c]
    eligible = [c for c in eligible if all(t(c) in pool for t in twins)] or eligible
    if smallest:
        size = min(max(c.K, c.V) for c in eligible)
        eligible = [c for c in eligible if max(c.K, c.V) == size]
    return tuple(eligible)


def head_counts(limits: Limits) -> st.SearchStrategy[tuple[int, int]]:
    """``(H, HV)`` with ``H`` in 1..max_heads and ``HV / H`` in ``head_ratios`` (GVA)."""
    return st.tuples(st.integers(1, limits.max_heads), st.sampled_from(limits.head_ratios)).map(
        lambda t: (t[0], t[0] * t[1])
    )


def allowed_dims(limits: Limits, max_dim: int | None = None) -> tuple[int, ...]:
    """``limits.head_dims`` up to ``max_dim`` (the smallest allowed size if none fits)."""
    dims = limits.head_dims
    limit = max_dim if max_dim is not None else max(dims)
    return tuple(d for d in dims if d <= limit) or (min(dims),)


def head_dims(limits: Limits, max_dim: int | None = None) -> st.SearchStrategy[tuple[int, int]]:
    """``(K, V)``, small or awkward sizes, ``K != V`` allowed."""
    dims = st.sampled_from(allowed_dims(limits, max_dim))
    return st.tuples(dims, dims)


def sequence_length(chunk_size: int, max_len: int, min_len: int = 0) -> st.SearchStrategy[int]:
    """Lengths where chunked kernels break: 0, 1, C-1, C, C+1, multiples of C, or any (at least ``min_len``)."""
    C = chunk_size
    special = [n for n in (0, 1, C - 1, C, C + 1, 2 * C, 3 * C - 1) if min_len <= n <= max_len]
    return st.one_of(st.sampled_from(special), st.integers(min_len, max_len))


def varlen_lengths(
    max_sequences: int = 6, max_len: int = 130, min_sequences: int = 1, min_len: int = 0
) -> st.SearchStrategy:
    """Per-sequence lengths of a ``cu_seqlens`` pack, biased to chunk boundaries of 16/32/64."""
    return st.sampled_from(CHUNK_SIZES).flatmap(
        lambda C: st.lists(sequence_length(C, max_len, min_len), min_size=min_sequences, max_size=max_sequences)
    )


@st.composite
def layouts(
    draw,
    max_batch: int = MAX_BATCH,
    max_sequences: int = 6,
    max_len: int = 130,
    varlen: bool | None = None,
    min_sequences: int | None = None,
    min_len: int = 0,
):
    """``(B, T, cu_seqlens | None)``: batched ``B > 1`` or a varlen pack with ``B == 1``
    (at least ``min_sequences`` sequences: by default 2 when ``varlen`` is asked for, else 1;
    every sequence at least ``min_len`` tokens)."""
    use_varlen = draw(st.booleans()) if varlen is None else varlen
    if use_varlen:
        least = min_sequences if min_sequences is not None else (2 if varlen else 1)
        lengths = draw(varlen_lengths(max_sequences, max_len, min_sequences=least, min_len=min_len))
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return 1, int(cu[-1]), cu
    B = draw(st.integers(1, max_batch))  # drawn first: the same seed draws the same B as before min_len
    return B, draw(sequence_length(draw(st.sampled_from(CHUNK_SIZES)), max_len, min_len)), None


def gate_values(rng: np.random.Generator, shape: tuple[int, ...], regime: str) -> np.ndarray:
    """Log-space decays ``g [..., T, HV]`` for one regime (token axis second to last)."""
    mild = np.log(rng.uniform(0.9, 1.0, shape))
    if regime == "none":
        return np.zeros(shape)
    if regime == "mild":
        return mild
    if regime == "moderate":
        return -rng.uniform(0.0, 3.0, shape)
    if regime == "strong":
        return -rng.uniform(20.0, 60.0, shape)
    if regime in ("tiny", "retention"):
        return -(10.0 ** rng.uniform(-4.0, -2.5, shape))
    T = shape[-2]
    if regime == "spikes":  # saturated single tokens
        g = mild.copy()
        if T:
            g[..., rng.integers(0, T, size=max(1, T // 16)), :] = -1e4
        return g
    if regime == "strong_run":  # a run of strong decay inside one chunk
        g = mild.copy()
        start = int(rng.integers(0, max(T, 1)))
        g[..., start : start + 40, :] = -rng.uniform(20.0, 40.0)
        return g
    # mixed: every regime somewhere, including exact zeros
    choice = rng.integers(0, 4, shape)
    return np.select([choice == 0, choice == 1, choice == 2], [0.0, mild, -rng.uniform(20, 60, shape)], -1e4)


def beta_values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """``beta`` in [0, 1], with exact 0 and 1 mixed in."""
    beta = rng.uniform(0.0, 1.0, shape)
    pick = rng.uniform(size=shape)
    return np.where(pick < 0.1, 0.0, np.where(pick > 0.9, 1.0, beta))


def unit_rows(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    x = rng.standard_normal(shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@st.composite
def problems(
    draw,
    limits: Limits,
    max_len: int | None = None,
    max_dim: int | None = None,
    varlen: bool | None = None,
    heads: st.SearchStrategy | None = None,
    gate_regimes=GATE_REGIMES,
    state_layouts: bool = False,
    classes: Sequence[ShapeClass] | None = None,
    min_len: int = 0,
) -> Problem:
    """A well-posed GDN problem within ``limits`` (``max_len`` and ``max_dim`` tighten them;
    every sequence at least ``min_len`` tokens).

    With a shape pool (``limits.shape_classes``) the class comes from ``classes`` (default: the
    pool's classes of the requested ``varlen``; ``heads`` and ``max_dim`` then do not apply):
    it fixes the head counts and sizes, dtype, layout kind, whether there is an initial state and
    l2norm, and everything else varies as without a pool.
    """
    if classes is None:
        classes = pool_classes(limits, varlen=varlen)
    layout_kw = dict(
        max_batch=limits.max_batch,
        max_sequences=limits.max_sequences,
        max_len=limits.max_len if max_len is None else max_len,
        min_len=min_len,
    )
    if classes:
        c = draw(st.sampled_from(tuple(classes)))
        H, HV, K, V, dtype_name = c.H, c.HV, c.K, c.V, c.dtype
        B, T, cu = draw(layouts(**layout_kw, varlen=c.varlen, min_sequences=2 if varlen else 1))
        regime = draw(st.sampled_from(gate_regimes))
        l2norm = c.l2norm
        rows = draw(st.sampled_from(ROW_KINDS)) if l2norm else "plain"
        state_kind = draw(st.sampled_from(("zero", "random", "large"))) if c.initial_state else "absent"
        scale = draw(st.one_of(st.none(), st.sampled_from(limits.scales)))
    else:
        H, HV = draw(heads if heads is not None else head_counts(limits))
        K, V = draw(head_dims(limits, max_dim))
        B, T, cu = draw(layouts(**layout_kw, varlen=varlen))
        regime = draw(st.sampled_from(gate_regimes))
        l2norm = draw(st.booleans())
        rows = draw(st.sampled_from(ROW_KINDS)) if l2norm else "plain"
        state_kind = draw(st.sampled_from(("absent", "zero", "random", "large")))
        scale = draw(st.one_of(st.none(), st.sampled_from(limits.scales)))
        dtype_name = limits.dtype if limits.dtype is not None else draw(st.sampled_from(tuple(DTYPES)))
    v_first = state_layouts and draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    q = rng.standard_normal((B, T, H, K))
    k = rng.standard_normal((B, T, H, K)) * (rng.uniform(0.1, 3.0) if l2norm else 1.0)
    if not l2norm:
        k = unit_rows(rng, (B, T, H, K))
    if rows != "plain" and T:  # padding tokens are zeros: l2norm must map them to zero, not NaN
        picked = rng.integers(0, T, size=max(1, T // 8))
        size = 0.0 if rows == "zero" else 10.0 ** rng.uniform(-4.5, -2.5, (1, len(picked), 1, 1))
        q[:, picked] *= size / np.linalg.norm(q[:, picked], axis=-1, keepdims=True).clip(1e-30)
        k[:, picked] *= size / np.linalg.norm(k[:, picked], axis=-1, keepdims=True).clip(1e-30)
    v = rng.standard_normal((B, T, HV, V))
    g = gate_values(rng, (B, T, HV), regime)
    beta = beta_values(rng, (B, T, HV))
    if regime == "retention" and T:  # writes up to a random token, then none: the memory is only read
        beta[:, int(rng.integers(1, max(2, T // 3))) :] = 0.0
    N = B if cu is None else len(cu) - 1
    state_scale = {"absent": None, "zero": 0.0, "random": 1.0, "large": 100.0}[state_kind]
    initial_state = None
    if state_scale is not None:
        initial_state = (rng.standard_normal((N, HV, K, V)) * state_scale).astype(np.float32)
        if v_first:
            initial_state = np.ascontiguousarray(initial_state.swapaxes(-1, -2))
    problem = Problem(
        q,
        k,
        v,
        g,
        beta,
        scale=scale,
        initial_state=initial_state,
        cu_seqlens=cu,
        use_qk_l2norm_in_kernel=l2norm,
        state_v_first=v_first,
        notes=dict(gate_regime=regime, state=state_kind, rows=rows),
    )
    return problem.astype(DTYPES[dtype_name])


def long_problems(limits: Limits, gate_regimes=GATE_REGIMES) -> st.SearchStrategy[Problem]:
    """:func:`problems` reaching ``limits.max_len`` (fuzz campaigns), lengths biased to powers of two."""
    lengths = st.sampled_from(tuple(2**i for i in range(17) if 2**i <= limits.max_len))
    if limits.shape_classes:
        return lengths.flatmap(lambda T: problems(limits, max_len=T, gate_regimes=gate_regimes, state_layouts=True))
    return st.tuples(head_counts(limits), head_dims(limits), lengths).flatmap(
        lambda t: problems(
            limits, max_len=t[2], max_dim=max(t[1]), heads=st.just(t[0]), gate_regimes=gate_regimes, state_layouts=True
        )
    )
