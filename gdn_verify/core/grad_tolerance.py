"""How far from the float64 gradients a correct backward may land: metric and tolerance model.

The backward counterpart of ``core.tolerance`` (read its docstring first: the same ideas, the same
constants). The derivation is written out in ``docs/gradients.md`` ("The gradient tolerance
model"); the precision contract of the backward in ``docs/precision.md``.

**Metric.** Per gradient, relative, the maximum over (sequence, head) blocks: q/k heads for
``dq``, ``dk``, value heads for ``dv``, ``dg``, ``dbeta``, ``dh0``. A block's error is the larger
of the RMS over its tokens of ``|x_t - x_ref_t|`` and the worst token's ``|x_t - x_ref_t|``
divided by ``TOKEN_FACTOR``, both over the block's scale (the forward's ``output_token``: a
mistake confined to a few tokens, a chunk boundary's, is not averaged away); for ``dh0`` the
Frobenius norm of each (sequence, value head) state over its scale. Tokens after
``cu_seqlens[-1]`` must be exactly zero. Where the exact value (give or take the bound) rounds to
+-inf in the dtype the gradient came back in, a same-signed inf is exact (:func:`expected_infinite`:
a float16 ``dq`` of 1e5 cannot be returned otherwise).

**Scales: what the inputs could produce.** Each gradient is a sum of products of exact per-token
quantities of the adjoint (``docs/gradients.md``); a correct backward's rounding errors spread
over every direction of them, so they have the size of the *typical* product of factors of those
norms, ``|A| |x| / sqrt(n)`` for ``A x`` with ``x`` of length ``n`` (the RMS over directions),
whatever the exact value is. Per token and value head, from the float64 adjoint's norms::

    dq_t     scale |S_t| |do_t| / sqrt(V)                 (dq = scale S_t do_t)
    dk_t     (|dS_t| |u_t| + |D_t| |dp_t|) / sqrt(V)      (dk = dS_t u_t + D_t dp_t: both halves)
    dv_t     beta_t |dS_t| |k_t| / sqrt(K)                (dv = beta dS^T k)
    dbeta_t  max(|du_t|, |dS_t||k_t|/sqrt(K)) max(|r_t|, (|v_t|^2 + (|D_t||k_t|/sqrt(K))^2)^1/2) / sqrt(V)
    dg_t     max(|dD_t| |D_t| / sqrt(K V), p_t)           (dg = <dD_t, D_t>; p_t: the parts
                                                          a chunked backward sums into it)
    p_t      (|do_t||o_t| + |u_t||w_t| + beta_t (|pred_t||w_t| + |v_t||e_t|)) / sqrt(V)
             + [a chunk may end at t] |S_t| |dS_t^later| / sqrt(K V)

``dq``/``dk`` of a q/k head take the root-sum-square over the value heads of its group, divided by
``sqrt(|x|^2 + eps)`` under the in-kernel l2norm; ``dh0``'s scale is the largest the state
cotangent was, carried back to the start by the decays alone, ``max_t |dS_t| exp(G_t)`` (``dht``
included): the backward erases as the forward does, and the erased part's rounding stays. A
block is judged on ``max(RMS |x_ref_t|, RMS m_t)`` over its tokens, floored at ``FLOOR`` times
the problem-wide RMS. A gradient dropped or doubled errs by about its own size, which is the
scale; a block whose exact gradient is tiny by cancellation is judged on what its factors
could produce. For ``dg`` those factors include the parts a chunked backward sums into it (the
last term below): ``<dD_t, D_t>`` is 0 at a sequence's first token without an initial state
(``D = 0``, for every input) and ``exp(-40)``-small under saturated gates, while the parts are
of order 1 and cancel only exactly, so any 16-bit rounding of their operands leaves ``u_in``
times their size. With ``<dD, D>`` alone as the scale such a block was judged on float64's
``tiny`` (or ``FLOOR`` of the problem): its measured responses, and with them ``dg``'s one
bound for every block of the problem, reached 1e10 to 1e305 (FLA on an H100, 2026-11-27:
3.2e304), and a ``dg`` wrong by half its size in the other sequences of a pack passed.

**The bound: one derived term per source of error** (per gradient ``x``)::

    bound_x = u_out(x) max(1, max_t |x_ref_t| / (TOKEN_FACTOR scale))   output rounding (x's dtype)
            + sqrt(elements per token) eta_out / min scale      its underflow (float16: eta = 2^-25)
            + sum_r C_ROUND u_in kappa_r(x)             allowed 16-bit roundings (GRAD_ROUNDINGS)
            + C_WORK sqrt(n) u_fp32 kappa(x)            float32 arithmetic, n = max(K, MAX_CHUNK)
            + C_EXP u_fp32 kappa_decay(x)               float32 exp(g), same sign every token
            + C_GATE u_fp32 kappa_gate(x)               float32 chunk-local gate cumsum (forward)
            + [x = dg] C_GATE u_fp32 a_dg / scale       float32 reverse cumsum that forms dg

Each ``kappa`` is measured, not set, as the relative change of the metric per unit relative
perturbation (``PERTURBATION``, random signs, the larger of ``PROBES`` draws), on the float64
adjoint of ``implementations.numpy_grad`` (the engine every NumPy backward model and planted bug
runs, here in float64 with a perturbing hook; ``dg`` both as the oracle forms it and as a chunked
backward does, the larger response counting): ``kappa(x)`` for every input *and* both cotangents
perturbed (at least 1); ``kappa_r(x)`` for exactly rounding ``r``'s intermediates: the
l2-normalised q/k (``qk``), the state entering each chunk as the chunk reads it and each token's
write (``recompute``: FLA's ``h`` and ``v_new``), the state cotangent leaving each chunk as the
chunk reads it and each token's ``du`` (``cotangents``: FLA's ``dh`` and ``dv2``), the
per-value-head parts of ``dq`` and ``dk`` (``parts``, local: perturbed on the unperturbed run's
parts, no rerun), the reverse pass's product operands (``operands``: ``scale q_t`` of the
cotangent update, ``k_t`` of ``du_t`` and of the erase update, and the same with the chunk-local
decays folded in, FLA's ``q scale exp(G)``, decayed ``k`` and ``W``, whose rounding reaches the
chunk's start cotangent and ``du``'s part from later chunks; adopted when FLA's and FlashQLA's
``dh0`` at T = 1 erred by 0.4-0.9 ``u_in``, H100 2026-11-26), and for float16 the same
intermediates' underflow (absolute ``underflow_unit`` per element, capped at the element's own
size, which rounding to nearest never exceeds: a decayed operand below 2^-25 comes back 0,
so under gates of -40 a float16 backward may return ``dh0 = 0`` for an exact 3e-18, FlashQLA on an
H100, 2026-11-27); ``kappa_gate`` for each gate shifted by ``PERTURBATION r a`` with ``a =
tolerance.chunk_gate_sums`` (two draws, the second with every other sign flipped), and
``kappa_decay`` for every nonzero gate shifted alike. All draws run as one float64 engine call,
the problem copied along the sequence axis (in batches that bound the memory). With float32
inputs the intermediates are stored in float32 and no rounding is probed (the float32 term
covers them); a problem whose probes would exceed ``PROBE_BUDGET`` gives every rounding the
inputs' ``kappa``, at least 1 (the forward's fallback; the floor counts where a gradient is
identically zero for every input, as ``dg`` above, so that the inputs' response is float64 noise
while a rounding's is not: bfloat16, ``T = 1``, ``K = V = 128``, gates -9984, the correct 16-bit model: 0.22 to 0.35 of
the bound without the floor, 0.03 to 0.05 with it; the model before dg's scale of its parts,
unfloored, put it at 17 to 28 times, a false failure).

With 16-bit inputs, an allowed rounding whose intermediate (the float64 run's largest element of a
state, write, cotangent or ``dq``/``dk`` part) lies beyond the input dtype's range has no finite
error: the gradients it reaches get the term ``RANGE_TEXT = inf`` (the problem is outside what a
kernel storing those intermediates in the input dtype can compute; such a kernel returns inf or NaN).

The last term is algorithm-aware and analytic: a production backward forms ``dg`` as a reverse
chunk-local cumsum of per-token terms (``numpy_grad``'s ``dg_form="cumsum"``: FLA's split of
``do_t . o_t - v_t . dv_t`` over its two kernels, plus ``<S, dh>`` at each chunk's last token),
whose parts may be far larger than ``dg`` (under strong gates ``dg`` is tiny and its terms are
not). A float32 scan errs by up to ``C_GATE u_fp32 a_t`` with ``a_t`` the sum of the parts'
magnitudes (norm products) over the 64-token chunk of ``t`` (aligned to the sequence start;
chunk ends every 16 tokens allowed), ``C_GATE`` covering a tree scan and a random-walk sequential
one as in the forward. It enters through the metric itself (block RMS and worst token).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from gdn_verify.core import processes, timing
from gdn_verify.core.adjoint import STAGES, cotangent
from gdn_verify.core.conventions import L2NORM_EPS, Packed, pack
from gdn_verify.core.gating import OPTION_NAMES, SOFTPLUS_THRESHOLD, in_kernel_gates, sigmoid
from gdn_verify.core.gradients import problem_gradients
from gdn_verify.core.implementation import GRADIENTS
from gdn_verify.core.problem import Problem
from gdn_verify.core.tolerance import (
    C_EXP,
    C_GATE,
    C_ROUND,
    C_WORK,
    FLOOR,
    MAX_CHUNK,
    PERTURBATION,
    PROBES,
    TOKEN_FACTOR,
    UNDERFLOW_NEGLIGIBLE,
    UNIT_ROUNDOFF_FP32,
    chunk_gate_sums,
    underflow_unit,
    unit_roundoff,
)

QK_GRADIENTS = ("dq", "dk")
# The allowed 16-bit roundings of the backward's precision contract, each a group of the engine's
# stages (numpy_grad.STAGES) rounded to the input dtype once; each gets its own term.
GRAD_ROUNDINGS: dict[str, tuple[str, ...]] = {
    "qk": ("qk",),
    "recompute": ("h", "v_new"),
    "cotangents": ("dh", "dv_new"),
    "parts": ("dq", "dk_state", "dk_pred"),
    "operands": ("q_operand", "k_operand", "w_operand", "q_decayed", "k_decayed", "w_decayed"),
    "underflow": STAGES,
}
GRAD_ROUNDING_TEXT = {
    "qk": "l2-normalised q/k stored in the input dtype",
    "recompute": "chunk-start states h and v_new stored in the input dtype",
    "cotangents": "chunk-end state cotangents dh and dv2 stored in the input dtype",
    "parts": "per-value-head dq and dk parts stored in the input dtype",
    "operands": "the backward's product operands (scale q, k, W; undecayed and decayed) in the input dtype",
    "underflow": "underflow of the intermediates stored in the input dtype",
}
OUTPUT_TEXT = "output rounding"
OUTPUT_UNDERFLOW_TEXT = "output underflow"
WORK_TEXT = "float32 arithmetic"
DECAY_TEXT = "float32 decay factors"
GATE_TEXT = "float32 chunk-local gate cumsum"
DG_SCAN_TEXT = "float32 reverse cumsum forming dg"
RANGE_TEXT = "intermediates beyond the input dtype's range"
# Chunk ends a chunked backward may have: every 16 tokens (C = 16, 32, 64) and each sequence's end.
CHUNK_END_EVERY = 16
# float64 elements of one array the engine keeps per chunk ([C, N, HV, K, V]); probe copies are
# batched so that one engine call stays within it (3 such arrays: about 400 MiB at most).
COPY_BUDGET = 1 << 24
# State elements times padded tokens times copies that the rounding probes may cost (each copy is
# about one float64 adjoint); beyond it every rounding answers like the inputs (the forward's
# fallback for problems too large for its probes), and only the input and gate probes run.
PROBE_BUDGET = 1 << 27


@dataclass(frozen=True, eq=False)
class GradTolerance:
    """Bounds per gradient on the metric of :func:`grad_errors`.

    ``bounds``: per gradient present in the reference (``GRADIENTS`` order); ``terms``: per
    gradient, the named terms that sum to its bound; ``scales``: per gradient, the denominator of
    each (sequence, head) block, ``[N, heads]``; ``kappa``: per gradient, the input-and-cotangent
    condition number (at least 1); ``per_token``: the gradients whose block error includes its
    worst token (all token gradients; none of dh0's)."""

    bounds: dict[str, float]
    terms: dict[str, dict[str, float]]
    scales: dict[str, np.ndarray]
    kappa: dict[str, float] = field(default_factory=dict)
    # Token gradients whose block error includes the worst token (over the block's scale, divided
    # by TOKEN_FACTOR); absent: blocks are judged on their RMS alone.
    per_token: tuple[str, ...] = ()
    # The dtype each gradient is judged as returned in (its output rounding; where the exact value
    # rounds to +-inf in it, a same-signed inf is exact: expected_infinite).
    dtypes: dict[str, str] = field(default_factory=dict)

    def breakdown(self, name: str) -> str:
        """Gradient ``name``'s bound as the sum of its named terms, largest first."""
        parts = sorted(((v, k) for k, v in self.terms.get(name, {}).items() if v > 0), reverse=True)
        return " + ".join(f"{value:.2g} {term}" for value, term in parts)


@dataclass
class _Inputs:
    """One copy's native inputs (float64, tokens up to ``cu_seqlens[-1]``) and cotangents."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    g: np.ndarray
    beta: np.ndarray
    h0: np.ndarray | None
    do: np.ndarray
    dht: np.ndarray | None

    def replace(self, **changes: Any) -> _Inputs:
        return dataclasses.replace(self, **changes)


def _check_cotangents(problem: Problem, do, dht) -> tuple[np.ndarray, np.ndarray | None]:
    """``do`` ``[B, T, HV, V]`` and ``dht`` (the final state's shape, or None) as finite float64."""
    s = problem.shape
    do_arr = cotangent("do", do, (s["B"], s["T"], s["HV"], s["V"]), np.float64)
    if dht is None:
        return do_arr, None
    return do_arr, cotangent("dht", dht, problem.state_shape(), np.float64)


def _check_options(options) -> dict:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ValueError(f"options: expected a dict of FLA's in-kernel gate keywords, got {type(options).__name__}")
    unknown = [name for name in options if name not in OPTION_NAMES]
    if unknown:
        raise ValueError(f"options: unknown keyword {unknown[0]!r}; expected some of {', '.join(OPTION_NAMES)}")
    return dict(options)


def _output_dtypes(problem: Problem, grad_dtypes) -> dict[str, np.dtype]:
    if grad_dtypes is not None and not isinstance(grad_dtypes, Mapping):
        raise ValueError(f"grad_dtypes: expected a mapping gradient -> dtype, got {type(grad_dtypes).__name__}")
    given = dict(grad_dtypes or {})
    unknown = [name for name in given if name not in GRADIENTS]
    if unknown:
        raise ValueError(f"grad_dtypes: unknown gradient {unknown[0]!r}; expected some of {', '.join(GRADIENTS)}")
    state = np.float32 if problem.initial_state is None else np.asarray(problem.initial_state).dtype
    defaults = dict(
        dq=problem.q.dtype,
        dk=problem.k.dtype,
        dv=problem.v.dtype,
        dg=problem.g.dtype,
        dbeta=problem.beta.dtype,
        dh0=np.promote_types(np.float32, state),
    )
    out = {}
    for name in GRADIENTS:
        value = given.get(name)
        try:
            out[name] = np.dtype(defaults[name] if value is None else str(value).removeprefix("torch."))
        except TypeError:
            raise ValueError(f"grad_dtypes: {name}: not a dtype: {value!r}") from None
    return out


def _pad_tokens(x: np.ndarray, T: int) -> np.ndarray:
    if x.shape[1] == T:
        return x
    out = np.zeros((x.shape[0], T) + x.shape[2:], x.dtype)
    out[:, : x.shape[1]] = x
    return out


def _chain_factors(problem: Problem, options: dict, end: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Native ``(g, beta)`` of the in-kernel options and the factors that turn native ``dg``,
    ``dbeta`` into those of the raw arguments (``core.gradients``), all ``[B, end, HV]``."""
    g_raw = np.asarray(problem.g, np.float64)[:, :end]
    b_raw = np.asarray(problem.beta, np.float64)[:, :end]
    g, beta = in_kernel_gates(
        g_raw,
        b_raw,
        bool(options.get("use_gate_in_kernel", False)),
        options.get("A_log"),
        options.get("dt_bias"),
        bool(options.get("use_beta_sigmoid_in_kernel", False)),
        bool(options.get("allow_neg_eigval", False)),
    )
    fg = np.ones_like(g)
    fb = np.ones_like(beta)
    if options.get("use_gate_in_kernel"):
        HV = g.shape[-1]
        bias = np.zeros(HV) if options.get("dt_bias") is None else np.asarray(options["dt_bias"], np.float64)
        x = g_raw + bias
        slope = np.where(x > SOFTPLUS_THRESHOLD, 1.0, sigmoid(x))
        fg = -np.exp(np.asarray(options["A_log"], np.float64)) * slope
    if options.get("use_beta_sigmoid_in_kernel"):
        fb = (2.0 if options.get("allow_neg_eigval") else 1.0) * sigmoid(b_raw) * sigmoid(-b_raw)
    return g, beta, fg, fb


def _packed(problem: Problem, x: _Inputs) -> tuple[Packed, np.ndarray, np.ndarray]:
    from gdn_verify.core.adjoint import gather

    p = pack(
        x.q,
        x.k,
        x.v,
        x.g,
        x.beta,
        problem.scale,
        x.h0,
        problem.use_qk_l2norm_in_kernel,
        problem.state_v_first,
        problem.cu_seqlens,
        dtype=np.float64,
        pad_to_multiple=MAX_CHUNK,
    )
    N, HV, K, V = p.initial_state.shape
    if x.dht is None:
        dS = np.zeros((N, HV, K, V))
    else:
        dS = np.array(x.dht.swapaxes(-1, -2) if problem.state_v_first else x.dht, np.float64)
    return p, gather(p, x.do, np.float64), dS


@dataclass
class _Copy:
    """One probe: its inputs, and which engine stages it perturbs (relatively, or by ``absolute``)."""

    name: str
    inputs: _Inputs
    stages: tuple[str, ...] = ()
    absolute: float = 0.0  # the size of one absolute perturbation (underflow), 0: relative


def _batches(problem: Problem, count: int) -> list[range]:
    """The batches of ``count`` copies that :func:`_run_batch` runs (each within ``COPY_BUDGET``):
    a batch's results depend on its own copies and its first index alone, so batches may run
    anywhere, in any order."""
    s = problem.shape
    per_copy = MAX_CHUNK * s["N"] * s["HV"] * s["K"] * s["V"]
    batch = max(1, COPY_BUDGET // max(per_copy, 1))
    return [range(first, min(first + batch, count)) for first in range(0, count, batch)]


def _run_batch(
    problem: Problem, copies: list[_Copy], first: int, seed: int, H: int
) -> tuple[list[dict], dict[str, np.ndarray] | None, Any]:
    """Copies ``first``, ``first + 1``, ... through the float64 engine, stacked along the sequence
    axis; returns each copy's assembled gradients and, for the batch holding copy 0, its per-token
    magnitudes and its packed (per value head) gradients (else None, None)."""
    from gdn_verify.core import adjoint as ng

    packed = [_packed(problem, c.inputs) for c in copies]
    N = packed[0][0].v.shape[0]
    rng = np.random.default_rng([seed, 99, first])
    ps = []
    for copy, (p, _, _) in zip(copies, packed):
        if "qk" in copy.stages:  # the l2-normalised q/k stored in the input dtype
            p = dataclasses.replace(p, q=_perturb(p.q, copy, rng), k=_perturb(p.k, copy, rng))
        ps.append(p)
    stacked = dataclasses.replace(
        ps[0],
        q=np.concatenate([p.q for p in ps]),
        k=np.concatenate([p.k for p in ps]),
        v=np.concatenate([p.v for p in ps]),
        g=np.concatenate([p.g for p in ps]),
        beta=np.concatenate([p.beta for p in ps]),
        initial_state=np.concatenate([p.initial_state for p in ps]),
    )
    do = np.concatenate([x[1] for x in packed])
    dS = np.concatenate([x[2] for x in packed])
    mags: dict[str, np.ndarray] | None = {} if first == 0 else None
    # every copy is padding past the longest sequence: the engine stops there (the same results)
    grads = ng.adjoint(
        stacked,
        do,
        dS,
        chunk_size=MAX_CHUNK,
        hook=_probe_hook(copies, N, seed),
        dg_form="both",
        magnitudes=mags,
        length=int(packed[0][0].lengths.max(initial=0)),
        magnitude_rows=N,  # the first copy's (the unperturbed run's)
    )
    results: list[dict] = []
    first_packed = None
    for j, copy in enumerate(copies):
        rows = slice(j * N, (j + 1) * N)
        own = ng.PackedGradients(
            dq=grads.dq[rows],
            dk_state=grads.dk_state[rows],
            dk_pred=grads.dk_pred[rows],
            dv=grads.dv[rows],
            dg=grads.dg[rows],
            dbeta=grads.dbeta[rows],
            dh0=grads.dh0[rows],
            dg_cumsum=_rows(grads.dg_cumsum, rows),
        )
        x = copy.inputs
        results.append(ng.assemble(packed[j][0], own, x.q, x.k, H, problem.use_qk_l2norm_in_kernel))
        if first + j == 0:
            first_packed = own
    return results, mags, first_packed


def _collect(batches: list[tuple[list[dict], dict[str, np.ndarray] | None, Any]]) -> tuple[list[dict], dict, Any]:
    """The batches' results together: each copy's assembled gradients, the first copy's per-token
    magnitudes and its packed (per value head) gradients."""
    results = [r for rs, _, _ in batches for r in rs]
    _, magnitudes, first_packed = batches[0]
    return results, magnitudes or {}, first_packed


def _rows(x: np.ndarray | None, rows: slice) -> np.ndarray | None:
    return None if x is None else x[rows]


def _perturb(x: np.ndarray, copy: _Copy, rng: np.random.Generator) -> np.ndarray:
    signs = rng.integers(0, 2, size=x.shape, dtype=np.int8) * 2.0 - 1.0
    if copy.absolute:
        return x + PERTURBATION * _underflow_size(x, copy.absolute) * signs
    return x * (1.0 + PERTURBATION * signs)


def _underflow_size(x: np.ndarray, eta: float) -> np.ndarray:
    """The largest absolute error of rounding each element of ``x`` below the dtype's normal range:
    ``eta`` (half the smallest subnormal), and never more than the element itself (rounding to
    nearest is at least as close as 0). Without the cap a decayed operand of 1e-20 got an error of
    2^-25, which left float16's dh0 unjudged under strong gates (a dropped dh0 at 0.08 of its bound)."""
    return np.minimum(eta, np.abs(x))


def _probe_hook(specs: list[_Copy], N: int, seed: int):
    """The engine hook of a batch of stacked copies: copy ``i`` owns rows ``[i N, (i + 1) N)`` and
    perturbs its stages. Signs depend only on ``(seed, stage, index)``, so a chunk recomputed in
    the reverse pass sees the same perturbation as in the forward pass."""

    def hook(stage: str, x: np.ndarray, index: int) -> np.ndarray:
        chosen = [i for i, c in enumerate(specs) if stage in c.stages]
        if not chosen:
            return x
        rng = np.random.default_rng([seed, STAGES.index(stage), index])
        signs = rng.integers(0, 2, size=x.shape, dtype=np.int8) * 2.0 - 1.0
        out = x.copy()
        for i in chosen:
            rows = slice(i * N, (i + 1) * N)
            if specs[i].absolute:
                out[rows] += PERTURBATION * _underflow_size(x[rows], specs[i].absolute) * signs[rows]
            else:
                out[rows] *= 1.0 + PERTURBATION * signs[rows]
        return out

    return hook


def _group_rss(x: np.ndarray, H: int) -> np.ndarray:
    """``[B, T, HV]`` -> ``[B, T, H]``: root-sum-square over the value heads of each q/k head."""
    B, T, HV = x.shape
    return np.sqrt(np.sum(x.reshape(B, T, H, HV // H) ** 2, axis=3))


def _token_norms(x: np.ndarray, name: str) -> np.ndarray:
    """Per token and head ``|x_t|``: ``[B, T, heads]`` (the last axis reduced unless dg/dbeta)."""
    x = np.asarray(x, np.float64)
    return np.abs(x) if name in ("dg", "dbeta") else np.sqrt(np.einsum("...i,...i->...", x, x))


def _natural(
    problem: Problem,
    p: Packed,
    x: _Inputs,
    m: dict[str, np.ndarray],
    fg: np.ndarray,
    fb: np.ndarray,
    end: int,
    dg_parts: tuple[np.ndarray, np.ndarray],
) -> dict[str, np.ndarray]:
    """Per-token natural magnitudes ``[B, T, heads]`` of each token gradient (module docstring);
    ``dg_parts``: :func:`_dg_parts` of ``p``, ``x`` and ``m``."""
    from gdn_verify.core.adjoint import scatter

    s = problem.shape
    H, K, V, T = s["H"], s["K"], s["V"], s["T"]
    mag = {name: _pad_tokens(scatter(p, value), T) for name, value in m.items()}
    knorm = _pad_tokens(scatter(p, np.sqrt(np.einsum("nlhk,nlhk->nlh", p.k, p.k))), T)
    beta = _pad_tokens(np.abs(x.beta), T)
    do = _pad_tokens(np.sqrt(np.einsum("bthv,bthv->bth", x.do, x.do)), T)
    v = _pad_tokens(np.sqrt(np.einsum("bthv,bthv->bth", x.v, x.v)), T)
    dq = abs(p.scale) * mag["S"] * do / np.sqrt(V)
    dk = (mag["dS"] * mag["u"] + mag["D"] * beta * mag["du"]) / np.sqrt(V)
    dq, dk = _group_rss(dq, H), _group_rss(dk, H)
    if problem.use_qk_l2norm_in_kernel:
        for name, raw in (("q", x.q), ("k", x.k)):
            n = np.ones(dq.shape)  # the tokens after cu_seqlens[-1] (no block) keep theirs
            n[:, :end] = np.sqrt(np.einsum("bthk,bthk->bth", raw, raw) + L2NORM_EPS)
            if name == "q":
                dq = dq / n
            else:
                dk = dk / n
    du = np.maximum(mag["du"], mag["dS"] * knorm / np.sqrt(K))
    r = np.maximum(mag["r"], np.sqrt(v**2 + (mag["D"] * knorm / np.sqrt(K)) ** 2))
    return dict(
        dq=dq,
        dk=dk,
        dv=beta * mag["dS"] * knorm / np.sqrt(K),
        dg=np.maximum(mag["dD"] * mag["D"] / np.sqrt(K * V), _dg_natural(problem, p, dg_parts))
        * _pad_tokens(np.abs(fg), T),
        dbeta=du * r / np.sqrt(V) * _pad_tokens(np.abs(fb), T),
    )


def _block_rms(values: np.ndarray, bounds: np.ndarray, reduce=np.mean) -> np.ndarray:
    """``values [B, T, heads]`` (squared norms) -> ``[N, heads]``: mean (``reduce``) over each
    sequence's tokens (0 for an empty sequence)."""
    heads = values.shape[-1]
    flat = values.reshape(-1, heads)
    out = np.zeros((len(bounds) - 1, heads))
    for n, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        if b > a:
            out[n] = reduce(flat[a:b], axis=0)
    return out


def _block_error(d: np.ndarray, name: str, problem: Problem, tolerance: GradTolerance) -> np.ndarray:
    """``[N, heads]`` block errors of per-token error norms ``d [B, T, heads]``: the larger of the
    block's RMS and its worst token divided by ``TOKEN_FACTOR``, both over the block's scale."""
    rms = np.sqrt(_block_rms(d**2, problem.bounds))
    if name in tolerance.per_token:
        rms = np.maximum(rms, _block_rms(d, problem.bounds, reduce=np.max) / TOKEN_FACTOR)  # NaN stays NaN
    return rms / tolerance.scales[name]


def _scales(
    problem: Problem, reference: dict, natural: dict[str, np.ndarray], dh0_natural: np.ndarray | None
) -> dict[str, np.ndarray]:
    """Per-block denominators ``[N, heads]``."""
    bounds = problem.bounds
    out: dict[str, np.ndarray] = {}
    for name, m in natural.items():
        norm_sq = np.maximum(_token_norms(reference[name], name) ** 2, m**2)
        end = int(bounds[-1])
        flat = norm_sq.reshape(-1, norm_sq.shape[-1])[:end]
        typical = float(np.sqrt(np.mean(flat))) if flat.size else 0.0
        out[name] = np.maximum(np.sqrt(_block_rms(norm_sq, bounds)), max(FLOOR * typical, np.finfo(np.float64).tiny))
    if dh0_natural is not None and reference.get("dh0") is not None:
        ref = np.asarray(reference["dh0"], np.float64)
        norm = np.maximum(np.sqrt(np.einsum("nhij,nhij->nh", ref, ref)), dh0_natural)
        typical = float(np.sqrt(np.mean(norm**2))) if norm.size else 0.0
        out["dh0"] = np.maximum(norm, max(FLOOR * typical, np.finfo(np.float64).tiny))
    return out


def _dh0_natural(p: Packed, m: dict[str, np.ndarray], dS_final: np.ndarray) -> np.ndarray:
    """``[N, HV]``: ``max_t |dS_t| exp(G_t)`` (inclusive gate cumsum from the start), ``dht`` too."""
    G = np.cumsum(p.g, axis=1)
    with np.errstate(over="ignore", under="ignore"):
        carried = np.max(m["dS"] * np.exp(G), axis=1)
        final = np.sqrt(np.einsum("nhkv,nhkv->nh", dS_final, dS_final)) * np.exp(G[:, -1])
    return np.maximum(carried, final)


def _dg_parts(p: Packed, x: _Inputs, m: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Packed ``[N, L, HV]`` norm products of the parts a chunked backward sums into ``dg``
    (module docstring): per token ``|do||o| + |u||w| + beta (|pred||w| + |v||e|)`` (products of
    V-vectors), and at each token where a chunk may end ``|S||later|`` (of K x V states; 0 elsewhere).
    Padding tokens get 0."""
    from gdn_verify.core.adjoint import gather

    do = gather(p, np.sqrt(np.einsum("bthv,bthv->bth", x.do, x.do)), np.float64)
    v = np.sqrt(np.einsum("nlhv,nlhv->nlh", p.v, p.v))
    beta = np.abs(p.beta)
    tokens = do * m["o"] + m["u"] * m["w"] + beta * (m["pred"] * m["w"] + v * m["e"])
    position = np.arange(p.v.shape[1])[None, :]
    last = p.lengths[:, None] - 1
    boundary = ((position + 1) % CHUNK_END_EVERY == 0) | (position == last)
    ends = np.where(boundary[..., None], m["S"] * m["later"], 0.0)
    real = (p.token_index >= 0)[..., None]
    return np.where(real, tokens, 0.0), np.where(real, ends, 0.0)


def _dg_natural(problem: Problem, p: Packed, parts: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """``[B, T, HV]``: the typical size of the parts a chunked backward sums into ``dg_t``, the
    per-token parts over ``sqrt(V)`` and a chunk end's ``<S, dh>`` over ``sqrt(K V)`` (module
    docstring: they cancel where ``dg`` is tiny, and their rounding does not); ``parts``:
    :func:`_dg_parts`."""
    from gdn_verify.core.adjoint import scatter

    s = problem.shape
    tokens, ends = parts
    typical = tokens / np.sqrt(s["V"]) + ends / np.sqrt(s["K"] * s["V"])
    return _pad_tokens(scatter(p, np.ascontiguousarray(typical)), s["T"])


def _dg_scan_magnitudes(problem: Problem, p: Packed, parts: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """``[B, T, HV]``: ``a_t``, the sum over the 64-token chunk of ``t`` of the magnitudes of the
    per-token terms a chunked backward's reverse cumsum adds to form ``dg`` (module docstring);
    ``parts``: :func:`_dg_parts`."""
    from gdn_verify.core.adjoint import scatter

    tokens, ends = parts
    w = tokens + ends
    N, L, HV = w.shape
    chunks = w.reshape(N, L // MAX_CHUNK, MAX_CHUNK, HV).sum(axis=2, keepdims=True)
    a = np.broadcast_to(chunks, (N, L // MAX_CHUNK, MAX_CHUNK, HV)).reshape(N, L, HV)
    return _pad_tokens(scatter(p, np.ascontiguousarray(a)), problem.shape["T"])


def overflow_threshold(dtype) -> float:
    """The smallest magnitude that rounds to inf in ``dtype`` (its largest finite value plus half
    an ulp there): float16 65520, bfloat16 about 3.40e38."""
    info = ml_dtypes.finfo(np.dtype(dtype))
    largest, eps = float(info.max), float(info.eps)
    return largest + 0.5 * eps * largest / (2.0 - eps)


def expected_infinite(tolerance: GradTolerance, name: str, grads: Any, reference: Any) -> np.ndarray:
    """Where gradient ``name`` is +-inf because its exact value, or one within the gradient's bound
    of it (relative: ``|x_ref| (1 + bound)``), rounds to +-inf in the dtype it was returned in
    (``tolerance.dtypes``): a float16 ``dq`` of 1e6 must come back inf, one of 65502 may. Boolean,
    shaped like the gradient; all False when the dtype is not recorded."""
    x = np.asarray(grads, np.float64)
    dtype = tolerance.dtypes.get(name)
    if dtype is None:
        return np.zeros(x.shape, bool)
    ref = np.asarray(reference, np.float64)
    reach = np.abs(ref) * (1.0 + tolerance.bounds.get(name, 0.0))
    return np.isinf(x) & (reach >= overflow_threshold(dtype)) & (np.sign(x) == np.sign(ref))


def _out_of_range(problem: Problem, groups: list[str], mags: dict[str, np.ndarray], parts: Any) -> dict[str, str]:
    """The gradients that an allowed 16-bit rounding cannot represent (gradient -> which
    intermediate), from the float64 run's largest elements at the contract's stages."""
    if not groups:
        return {}
    threshold = overflow_threshold(problem.dtype)
    out: dict[str, str] = {}
    stored = {"recompute": ("S_max", "u_max"), "cotangents": ("dS_max", "du_max")}
    for group, names in stored.items():
        if group in groups and any(float(mags[n].max(initial=0.0)) >= threshold for n in names):
            out.update(dict.fromkeys(GRADIENTS, group))
    if "parts" in groups and parts is not None:
        if float(np.abs(parts.dq).max(initial=0.0)) >= threshold:
            out.setdefault("dq", "parts")
        if max(float(np.abs(x).max(initial=0.0)) for x in (parts.dk_state, parts.dk_pred)) >= threshold:
            out.setdefault("dk", "parts")
    return out


def grad_block_errors(
    problem: Problem,
    grads: Mapping[str, Any],
    against: Mapping[str, Any],
    tolerance: GradTolerance,
) -> dict[str, np.ndarray]:
    """Per gradient present in ``grads``, ``against`` and the tolerance, the relative error of each
    (sequence, head) block, ``[N, heads]`` (q/k heads for dq, dk); NaN stays NaN, and an inf where
    the exact value itself overflows the returned dtype counts as exact (:func:`expected_infinite`)."""
    out: dict[str, np.ndarray] = {}
    for name in GRADIENTS:
        x, ref = grads.get(name), against.get(name)
        if x is None or ref is None or name not in tolerance.scales:
            continue
        x64, ref64 = np.asarray(x, np.float64), np.asarray(ref, np.float64)
        with np.errstate(invalid="ignore"):
            diff = np.where(expected_infinite(tolerance, name, x64, ref64), 0.0, x64 - ref64)
        if name == "dh0":
            out[name] = np.sqrt(np.einsum("nhij,nhij->nh", diff, diff)) / tolerance.scales[name]
        else:
            out[name] = _block_error(_token_norms(diff, name), name, problem, tolerance)
    return out


def grad_errors(
    problem: Problem,
    grads: Mapping[str, Any],
    against: Mapping[str, Any],
    tolerance: GradTolerance,
) -> dict[str, float]:
    """The metric per gradient present in both ``grads`` and ``against``: the largest block error
    (:func:`grad_block_errors`; NaN when any block is NaN). Tokens after ``cu_seqlens[-1]`` belong
    to no block and must be exactly zero: otherwise the error is inf (NaN when they hold NaN).
    ``against`` may be the oracle or an error model's output; the scales are always the oracle's,
    from ``tolerance``."""
    out = {}
    end = int(problem.bounds[-1])
    for name, blocks in grad_block_errors(problem, grads, against, tolerance).items():
        error = float("nan") if np.isnan(blocks).any() else float(np.max(blocks, initial=0.0))
        if name != "dh0":  # the tokens after cu_seqlens[-1]: exactly zero, or no bound holds
            x = np.asarray(grads[name])
            tail = np.asarray(x.reshape((-1,) + x.shape[2:])[end:], np.float64)
            if tail.size and not (tail == 0).all():
                error = float("nan") if np.isnan(tail).any() else float("inf")
        out[name] = error
    return out


def _checked(
    problem: Problem, do, dht, grad_dtypes, options
) -> tuple[Problem, np.ndarray, np.ndarray | None, dict, dict[str, np.dtype]]:
    """The arguments of :func:`grad_reference_and_tolerance`, checked (``ValueError`` naming them)."""
    if not isinstance(problem, Problem):
        raise ValueError(f"problem: expected a Problem, got {type(problem).__name__}")
    do_arr, dht_arr = _check_cotangents(problem, do, dht)
    return problem, do_arr, dht_arr, _check_options(options), _output_dtypes(problem, grad_dtypes)


def grad_reference_and_tolerance(
    problem: Problem,
    do,
    dht,
    *,
    grad_dtypes: Mapping[str, str | None] | None = None,
    options: Mapping[str, Any] | None = None,
    seed: int = 0,
    workers: int | None = None,
) -> tuple[dict[str, np.ndarray | None], GradTolerance]:
    """The float64 gradients of ``problem`` for cotangents ``do`` (``[B, T, HV, V]``) and ``dht``
    (like the final state, or None), and the bound a correct backward meets on each.

    ``grad_dtypes``: the dtype each gradient came back in (``Gradients.dtypes``; None: the input
    dtype, float32 for ``dh0``), whose unit roundoff is that gradient's output-rounding term;
    ``options``: FLA's in-kernel gate keywords (``dg``/``dbeta`` are then those of the raw
    arguments); ``seed``: the probes' random signs. Tokens after ``cu_seqlens[-1]`` belong to no
    block and get zero reference gradients. Bad arguments raise ``ValueError`` naming them.
    ``workers``: as :func:`grad_references_and_tolerances` (a large problem's reference and probe
    batches run side by side in worker processes; the same results, bitwise).
    """
    job = (problem, do, dht, grad_dtypes, options)
    return grad_references_and_tolerances([job], seed, workers)[0]


# Below this much work in all (padded tokens times state elements, summed over the problems) the
# gradient oracles run here, one task after another; above it in the shared worker processes
# (core.processes), a problem's reference and probe batches side by side.
PARALLEL_GRAD_WORK = 1 << 22


def grad_work(problem: Problem) -> int:
    """Padded tokens times state elements: what one float64 adjoint of ``problem`` costs."""
    s = problem.shape
    L = -(-max(int(problem.lengths.max(initial=1)), 1) // MAX_CHUNK) * MAX_CHUNK
    return s["N"] * s["HV"] * s["K"] * s["V"] * L


def grad_references_and_tolerances(
    jobs: Sequence[tuple[Problem, Any, Any, Mapping[str, str | None] | None, Mapping[str, Any] | None]],
    seed: int,
    workers: int | None = None,
) -> list[tuple[dict[str, np.ndarray | None], GradTolerance]]:
    """:func:`grad_reference_and_tolerance` of each ``(problem, do, dht, grad_dtypes, options)``
    with the probes' ``seed``, in order.

    Each problem's work is independent tasks: its float64 reference, and its probe copies in
    batches (:func:`_batches`, each seeded by its own first index); what joins them (scales,
    responses, bounds) runs here. Every task of every job is submitted first, the largest job's
    first, so that the tasks of several problems (``grad_error_growth``'s prefixes, a pack's
    sequences) and of one problem fill the cores together. ``workers``: processes
    (``core.processes``; 1: all here); default the CPUs when the jobs' work
    (:func:`grad_work`) adds up to ``PARALLEL_GRAD_WORK``, else all here. The results are the
    same, bitwise, either way: every task is pure NumPy and seeded by what it computes.
    """
    checked = [_checked(p, do, dht, dtypes, options) for p, do, dht, dtypes, options in jobs]
    n = processes.workers_for([grad_work(c[0]) for c in checked], PARALLEL_GRAD_WORK, workers)
    with timing.timed(timing.ORACLE), processes.Tasks(n) as tasks:  # a pool's wait is this process's
        order = sorted(range(len(checked)), key=lambda i: -grad_work(checked[i][0]))
        started = {i: _start(*checked[i], seed, tasks) for i in order}
        return [_finish(started[i]) for i in range(len(checked))]


@dataclass
class _Started:
    """One problem's gradient oracle in flight: its tasks, and the bound waiting for their results."""

    problem: Problem
    end: int
    reference: Any  # the task of the float64 gradients (a future)
    batches: list  # the tasks of the probe batches
    bound: Any  # the generator of :func:`_tolerance`, waiting for the copies' results


def _start(
    problem: Problem, do_arr: np.ndarray, dht_arr: np.ndarray | None, opts: dict, out_dtypes: dict, seed: int, tasks
) -> _Started:
    T = problem.shape["T"]
    end = int(problem.bounds[-1]) if problem.cu_seqlens is not None else T
    trimmed = problem if end == T else problem.tokens(0, end).replace(cu_seqlens=problem.cu_seqlens)
    reference = tasks.submit(problem_gradients, trimmed, do_arr[:, :end], dht_arr, opts)
    bound = _tolerance(problem, do_arr[:, :end], dht_arr, opts, out_dtypes, seed, end)
    copies = next(bound)
    H = problem.shape["H"]
    batches = [
        tasks.submit(_run_batch, problem, [copies[i] for i in b], b.start, seed, H)
        for b in _batches(problem, len(copies))
    ]
    return _Started(problem, end, reference, batches, bound)


def _finish(job: _Started) -> tuple[dict[str, np.ndarray | None], GradTolerance]:
    T = job.problem.shape["T"]
    oracle = job.reference.result()
    reference: dict[str, np.ndarray | None] = {
        name: None if x is None else (_pad_tokens(x, T) if name in GRADIENTS[:5] else x) for name, x in oracle.items()
    }
    try:
        job.bound.send((reference, _collect([b.result() for b in job.batches])))
    except StopIteration as done:
        return reference, done.value
    raise AssertionError("_tolerance yields once")


def _tolerance(
    problem: Problem,
    do: np.ndarray,
    dht: np.ndarray | None,
    options: dict,
    out_dtypes: dict[str, np.dtype],
    seed: int,
    end: int,
) -> Generator[list[_Copy], tuple[dict, tuple[list[dict], dict, Any]], GradTolerance]:
    """The bound, in two steps (a generator): it yields the probe copies to run, is sent the
    reference gradients and the copies' results (:func:`_collect` of the batches), and returns
    the :class:`GradTolerance`. The random draws of the copies and of the later local probes come
    from one stream, in this order, whichever process ran the copies."""
    s = problem.shape
    H, T = s["H"], s["T"]
    rng = np.random.default_rng(seed)
    g, beta, fg, fb = _chain_factors(problem, options, end)
    h0 = None if problem.initial_state is None else np.asarray(problem.initial_state, np.float64)
    base = _Inputs(
        q=np.asarray(problem.q, np.float64)[:, :end],
        k=np.asarray(problem.k, np.float64)[:, :end],
        v=np.asarray(problem.v, np.float64)[:, :end],
        g=g,
        beta=beta,
        h0=h0,
        do=do,
        dht=dht,
    )

    def nudge(x: np.ndarray | None) -> np.ndarray | None:
        return None if x is None else x * (1.0 + PERTURBATION * rng.choice([-1.0, 1.0], size=x.shape))

    u_in = unit_roundoff(problem.dtype)
    eta = underflow_unit(problem.dtype)
    # The 16-bit roundings of the contract. With float32 (or wider) inputs the intermediates are
    # stored in float32: their rounding is float32 arithmetic, which its own term covers.
    groups = []
    if u_in > UNIT_ROUNDOFF_FP32:
        groups = [
            name
            for name in GRAD_ROUNDINGS
            if (name != "qk" or problem.use_qk_l2norm_in_kernel) and (name != "underflow" or eta > UNDERFLOW_NEGLIGIBLE)
        ]
    copies = [_Copy("base", base)]
    copies.append(
        _Copy(
            "inputs",
            base.replace(**{f: nudge(getattr(base, f)) for f in ("q", "k", "v", "g", "beta", "h0", "do", "dht")}),
        )
    )
    # "parts" is local (no later stage reads it): measured on the base run below, not by a copy.
    probed = [name for name in groups if name != "parts"]
    L = -(-max(int(problem.lengths.max(initial=1)), 1) // MAX_CHUNK) * MAX_CHUNK
    state = s["N"] * s["HV"] * s["K"] * s["V"] * L
    affordable = (len(copies) + PROBES * len(probed) + 3) * state <= PROBE_BUDGET
    if affordable:
        for name in probed:
            for _ in range(PROBES):
                copies.append(_Copy(name, base, GRAD_ROUNDINGS[name], eta if name == "underflow" else 0.0))
    # The gate probes (the forward's: tolerance.condition): each gate shifted by PERTURBATION r a.
    gated = bool(np.any(g != 0))
    if gated:
        native = problem.replace(g=_pad_tokens(g, T).astype(np.float64))
        a = chunk_gate_sums(native)[:, :end]
        signs = rng.choice([-1.0, 1.0], a.shape)
        flip = np.where(np.arange(a.shape[1]) % 2 == 0, 1.0, -1.0)[None, :, None]
        for r in (signs, signs * flip):
            copies.append(_Copy("gate", base.replace(g=g + PERTURBATION * r * a)))
        copies.append(_Copy("decay", base.replace(g=g + PERTURBATION * (g != 0))))

    reference, (results, mags, base_packed) = yield copies
    p0, _, dS0 = _packed(problem, base)
    dg_parts = _dg_parts(p0, base, mags)  # dg's scale and its scan term, from the same norm products
    natural = _natural(problem, p0, base, mags, fg, fb, end, dg_parts)
    names = [name for name in GRADIENTS if reference.get(name) is not None]
    scales = _scales(
        problem,
        reference,
        {n: natural[n] for n in names if n in natural},
        _dh0_natural(p0, mags, dS0) if "dh0" in names else None,
    )
    per_token = tuple(n for n in names if n != "dh0")
    tolerance0 = GradTolerance({}, {}, scales, per_token=per_token)

    def response(grads: dict) -> dict[str, float]:
        # dg both ways: as the oracle forms it and as a chunked backward does (FLA's per-token terms
        # and reverse cumsum), whose response to the same roundings differs; the larger counts.
        raw = {name: (_pad_tokens(x, T) if name != "dh0" else x) for name, x in grads.items()}
        raw["dg"] = raw["dg"] * _pad_tokens(fg, T)
        raw["dbeta"] = raw["dbeta"] * _pad_tokens(fb, T)
        errors = grad_errors(problem, raw, reference, tolerance0)
        if "dg" in errors:
            alt = grad_errors(problem, {"dg": raw["dg_cumsum"] * _pad_tokens(fg, T)}, reference, tolerance0)
            errors["dg"] = max(errors["dg"], alt["dg"])
        return {name: errors.get(name, 0.0) / PERTURBATION for name in names}

    measured: dict[str, dict[str, float]] = {}

    def record(group: str, grads: dict) -> None:
        values = response(grads)
        old = measured.setdefault(group, dict.fromkeys(names, 0.0))
        for name in names:
            old[name] = max(old[name], values[name])

    for copy, grads in zip(copies[1:], results[1:]):
        record(copy.name, grads)
    if "parts" in groups:  # the per-value-head dq and dk parts perturbed on the base run
        from gdn_verify.core.adjoint import assemble

        for _ in range(PROBES):
            nudged = dataclasses.replace(
                base_packed, **{f: nudge(getattr(base_packed, f)) for f in ("dq", "dk_state", "dk_pred")}
            )
            record("parts", assemble(p0, nudged, base.q, base.k, H, problem.use_qk_l2norm_in_kernel))
    # Too large for the probes: every rounding answers like the inputs, with their kappa (at least
    # 1, as the forward's fallback). The floor matters where a gradient is identically zero for every
    # input and so does not respond to them at all, while a rounding does respond: dg at a sequence's
    # first token without an initial state (D = 0) is the sum of a chunked backward's parts that
    # cancel only exactly (bfloat16, T = 1, K = V = 128, gates -9984: numpy-grad16 at 0.22 to 0.35
    # of the bound without the floor, 0.03 to 0.05 with it).
    for group in groups:
        if group not in measured and group != "underflow":
            measured[group] = {name: max(1.0, value) for name, value in measured["inputs"].items()}

    dot_length = max(s["K"], MAX_CHUNK)
    a_dg = _dg_scan_magnitudes(problem, p0, dg_parts) * _pad_tokens(np.abs(fg), T)
    dg_scan = 0.0
    if "dg" in scales:
        scan = _block_error(C_GATE * UNIT_ROUNDOFF_FP32 * a_dg, "dg", problem, tolerance0)
        dg_scan = float(np.max(scan, initial=0.0))
    bounds, terms, kappa = {}, {}, {}
    for name in names:
        # Rounding the output errs by up to u_out |x_ref_t| at each token: u_out on the RMS, and on
        # the worst token its largest |x_ref_t| over TOKEN_FACTOR times the block's scale.
        largest = 1.0
        if name in per_token:
            ref_norm = _token_norms(reference[name], name)
            worst = _block_rms(ref_norm, problem.bounds, reduce=np.max) / TOKEN_FACTOR / scales[name]
            largest = max(1.0, float(np.max(worst, initial=0.0)))
        t: dict[str, float] = {OUTPUT_TEXT: unit_roundoff(out_dtypes[name]) * largest}
        # ... plus its absolute part, up to half the smallest subnormal per element (x (1 + d) + e):
        # a float16 dg of 1e-15 comes back 0. Per token sqrt(elements) eta, over the block's scale.
        eta_out = underflow_unit(out_dtypes[name])
        if eta_out > UNDERFLOW_NEGLIGIBLE:
            ref = np.asarray(reference[name])
            elements = int(np.prod(ref.shape[-2:] if name == "dh0" else ref.shape[3:]))
            sizes = np.diff(problem.bounds)
            scale = scales[name] if name == "dh0" else scales[name][sizes > 0]
            t[OUTPUT_UNDERFLOW_TEXT] = float(np.sqrt(elements) * eta_out / np.min(scale, initial=np.inf))
        for group in groups:
            if group in measured:
                size = C_ROUND * (1.0 if group == "underflow" else u_in)
                t[GRAD_ROUNDING_TEXT[group]] = size * measured[group][name]
        kappa[name] = max(1.0, measured["inputs"][name])
        t[WORK_TEXT] = C_WORK * np.sqrt(dot_length) * UNIT_ROUNDOFF_FP32 * kappa[name]
        if gated:
            t[DECAY_TEXT] = C_EXP * UNIT_ROUNDOFF_FP32 * measured["decay"][name]
            t[GATE_TEXT] = C_GATE * UNIT_ROUNDOFF_FP32 * measured["gate"][name]
        if name == "dg":
            t[DG_SCAN_TEXT] = dg_scan
        terms[name] = {k: float(v) for k, v in t.items()}
        bounds[name] = float(sum(t.values()))
    # An allowed rounding of a value beyond the input dtype's range is inf: no bound holds for the
    # gradients it reaches (float16: a state of norm 2e4 with scale 1 makes dq parts past 65504).
    for name in _out_of_range(problem, groups, mags, base_packed):
        if name in terms:
            terms[name][RANGE_TEXT] = float("inf")
            bounds[name] = float("inf")
    dtypes = {name: out_dtypes[name].name for name in names}
    return GradTolerance(bounds, terms, scales, kappa, per_token, dtypes)
