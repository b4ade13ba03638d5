"""How far from the float64 oracle a correct implementation may land: metrics and tolerance model.

Metrics (all relative, all maxima so that one bad sequence, head or token is not averaged away):

- ``output_rms``: over (sequence, value head) blocks, ``||o - o_ref||_F`` over the block's scale;
- ``output_token``: over (token, value head), ``||o_t - o_ref_t||_2`` over the same block scale;
- ``state``: over (sequence, value head), ``||S - S_ref||_F`` over the block's state scale.

**Scales: what the inputs could produce, not what they happened to.** A correct kernel's error
at token ``t`` is ``scale (dS_t^T q_t + S_t^T dq_t)``: rounding errors spread over every
direction of the state, so they have the size of the *typical* output of a query of this norm
against this state, ``m_t = scale |q_t| ||S_t||_F / sqrt(K)`` (the RMS of ``|S_t^T q|`` over
query directions), whatever ``|o_t|`` is. A query nearly orthogonal to the memory gives a tiny
exact output that the rounding error of any correct kernel dwarfs (seen on FLA's kernel: one
one-token block with ``q . k ~ 0`` at 27 times the bound while the whole output was within
it). So a block is judged on ``max(RMS |o_ref_t|, RMS m_t)`` (:class:`Scales`, from the exact
state norms of :func:`natural_scales`), and the final state on the largest norm the state had,
decayed to the end, ``max_t ||S_t|| exp(G_end - G_t)`` (the initial state included): the
delta rule erases, and the erased part's rounding stays. A real mistake still shows: it errs
by the size of what it computes wrongly, which is the scale itself. Denominators are floored
at ``FLOOR`` of the problem-wide magnitude so that an all-zero block (zero queries, a sequence
of length 0) is compared absolutely. The oracle's run gives the state norms at any size; only
where they are not given and the problem is too large to run the recurrence for them (more than
``SCALE_BUDGET`` state elements times tokens) are the blocks judged on their own norms.

**The bound: one derived term per source of error** (the precision contract,
``docs/precision.md``, lists which roundings a correct kernel may make and which it may not).
Inputs are exact (the oracle sees the same rounded inputs), so error comes from

1. rounding the output to its dtype: at most ``u_out`` of the scale;
2. each *allowed rounding* ``r`` of :data:`ROUNDINGS`: intermediates that a production kernel
   stores, or feeds to a tensor-core product, in the input dtype, once per chunk (the
   l2-normalised q/k; the product operands; W, U, the chunk-start state and v_new). Its term is
   ``C_ROUND u_in kappa_r``: ``kappa_r`` is the metric's change per unit relative perturbation of
   exactly those intermediates in the float64 chunked oracle (``reference.chunk_core``'s hook,
   C = ``MAX_CHUNK``), random signs at full amplitude, i.e. the corners of the box
   ``|d| <= u |x|`` that rounding to nearest lands in (its RMS is ``1/sqrt(3)`` of a corner's,
   so ``C_ROUND = 2`` puts the term at 3.5 standard deviations of the rounding's own error);
   the larger of ``PROBES`` draws, so that one draw's cancellation cannot shrink it;
3. float32 arithmetic (accumulation, the float32 carried state): ``C_WORK sqrt(n) u_work
   kappa``, with ``kappa`` the response to a relative perturbation of every input, ``n =
   max(K, MAX_CHUNK)`` the longest dot product, ``C_WORK`` calibrated once on the correct
   float32 implementations;
4. the float32 decay factors: a kernel computes ``exp(g)`` in float32 every token (or every
   chunk), each with a relative error up to ``C_EXP`` ulps that can have the same sign every
   token (a fast ``exp`` is biased), so over a long undamped memory the errors add coherently:
   ``C_EXP u_work kappa_decay``, where ``kappa_decay`` is the response to shifting every
   nonzero gate by the same amount (FLA's float32 recurrent kernel drifts so by 2.6e-5 of its
   state over 4096 tokens of retention on an H100);
5. the float32 chunk-local gate cumsum (below);
6. only for an implementation that declares a state dtype coarser than float32
   (``Implementation.extra["state_dtype"]``, passed as ``condition(..., state_dtype=)``): its
   carried state stored in that dtype as loaded and after every token,
   ``expm1(C_ROUND u_state kappa_state)`` (:func:`state_rounding_condition`; below).

::

    output_rms   <= u_out + sum_r C_ROUND u_in kappa_r + C_WORK sqrt(n) u_work kappa + C_EXP u_work kappa_decay + gate
    output_token <= TOKEN_FACTOR * (same)
    state        <=         sum_r C_ROUND u_in kappa_r + C_WORK sqrt(n) u_work kappa + C_EXP u_work kappa_decay + gate

``TOKEN_FACTOR`` covers the maximum of many per-token errors against their RMS (about
``sqrt(2 ln n)`` for n tokens, 4.4 at n = 4096). What is *not* in the bound: a carried state
rounded to 16 bits (every token or every chunk) that the implementation does not declare, gates
or beta rounded inside the state update,
a missing or wrong l2norm epsilon; the properties draw the problems that expose them (long
retention with no writes, tiny rows) and ``benchmarks/precision_contract.py`` measures the
margins of both sides. Problems too large for the NumPy probes give each rounding the input
perturbation's ``kappa`` instead (the earlier, uniform model).

Algorithm-aware term: the float32 chunk-local gate cumsum. The uniform model above assumes
each gate factor is computed to a few units of roundoff. Production chunked kernels (FLA,
FlashInfer, vLLM) instead form ``G = cumsum(g)`` in float32, restarting at each chunk, and
take every gate factor as ``exp`` of a difference of it (``exp(G_i - G_j)``, ``exp(G_i)``,
``exp(G_last - G_j)``). Rounding a partial sum costs up to ``u_acc |G_m|`` (``u_acc = 2^-24``,
float32 accumulation whatever the input dtype), so the computed ``G_m = G_m + e_m`` with
``|e_m| <= h u_acc a_m``, where ``h`` is the depth of the summation and ``a_m`` bounds the
chunk-local ``sum |g|`` entering ``G_m``. ``exp(G_i - G_j)`` then has relative error
``|e_i - e_j|``, which is not small when ``i - j`` is: after a ``g = -1e4`` spike, two
neighbours' factor is off by about ``u_acc * 1e4 = 6e-4``. Because every factor is a
difference of the same computed ``G``, the algorithm is exact for perturbed gates
``g_m + (e_m - e_{m-1})`` (a backward error), so the forward error is the oracle's sensitivity
to an absolute gate shift of size ``u_acc a_m`` at each token. ``condition`` measures it like
``kappa``: it shifts every ``g_m`` by ``PERTURBATION * r_m * a_m`` (random signs ``r_m``) and
takes the relative change of each metric per unit ``PERTURBATION`` (``kappa_gate``). Here

    a_m = sum of |g_j| over the MAX_CHUNK tokens of m's sequence ending at m,

which bounds the chunk-local ``|cumsum|`` for every chunk size up to ``MAX_CHUNK`` and every
chunk alignment (a continuation call starts its chunks at its split point). The random signs
give a random-walk sum over a span of ``n`` tokens, ``sqrt(n) a``; ``C_GATE`` turns that into
the worst case of either summation order: a sequential scan whose roundings all have one
sign (a run of equal gates) costs ``n u a <= sqrt(MAX_CHUNK) sqrt(n) u a``, a tree scan
(Triton's ``tl.cumsum``) costs ``|e_i| + |e_j| <= 2 log2(MAX_CHUNK) u a``; so
``C_GATE = max(sqrt(MAX_CHUNK), 2 log2(MAX_CHUNK)) = 12``. Chunks round independently, so
across chunks the errors add like the rest of the model's (a random walk). The extra terms::

    output_rms   += C_GATE * u_acc * kappa_gate_rms
    output_token += TOKEN_FACTOR * C_GATE * u_acc * kappa_gate_token
    state        += C_GATE * u_acc * kappa_gate_state

are zero without gates and negligible for mild ones (``a_m`` ~ 3 for ``g`` ~ -0.05); they
matter for saturated gates inside a chunk. :class:`Tolerance` keeps them apart from the
uniform bound, and ``Tolerance.note`` names the cause (``|cumsum|`` up to X, where) when an
error lies between the uniform and the full bound.

A declared state dtype (term 6). ``kappa_state`` is measured like the roundings' responses, on
the float64 oracle run token by token (``chunk_core`` at chunk size 1, its ``CARRIED`` hook), the
carried state perturbed at load and after every token by ``PERTURBATION`` times the size of one
rounding: ``u_state |x|``, but never more than the token's change ``|x - S_prev|`` (the stored
previous value is representable, so rounding to nearest lands no farther). Two draws have fresh
random signs every token, one the same signs every token (a rounding that repeats: a decay below
half an ulp rounds back to the undecayed value every token, so a retained memory drifts
coherently), the latter only at elements the token wrote less than an ulp beyond their decay (a
larger write randomises where the value falls between representable numbers). A token's output
may read the stored state, so each perturbation also enters ``o_t`` directly. The term is
``C_ROUND u_state kappa_state`` to first order; ``expm1`` of it because repeated roundings compound
(``prod (1 + d_t) <= exp(sum |d_t|)``), which matters once a retained state drifts by its own size.
Without a declaration (or with float32) nothing is measured and the bound is bit-identical.

``C_WORK`` and ``TOKEN_FACTOR`` were set once from the model above and checked on the correct
float32 NumPy implementations (token loop, chunk 16 and 64; all gate regimes; K from 4 to 128;
large initial states): ``benchmarks/calibrate_tolerance.py`` prints the largest error / bound.
``C_ROUND`` is derived (3.5 standard deviations of a uniform rounding), not fitted; with 1 the
first contract table put allowed models at 0.5 to 0.7 of the bound on ``error_growth``, the
1/sqrt(3) a sum of many roundings concentrates at. ``tests/test_precision_contract.py``,
``tests/test_properties.py`` and ``tests/test_tolerance.py`` assert both sides. The constants
are not adjusted per test.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import ml_dtypes
import numpy as np

from gdn_verify.core.conventions import export_state, unpack_output
from gdn_verify.core.oracle import Oracle, numpy_oracle, numpy_oracle_stacked, pack_problem, token_loop
from gdn_verify.core.problem import Problem
from gdn_verify.core.reference import CARRIED, STAGES, chunk_core, recurrent_core, stack_packed

C_WORK = 16.0
TOKEN_FACTOR = 8.0
MAX_CHUNK = 64
C_GATE = float(max(np.sqrt(MAX_CHUNK), 2 * np.log2(MAX_CHUNK)))  # 12: see the module docstring
C_EXP = 4.0  # ulps of a float32 exp(g): CUDA's fast exp (ex2.approx of g log2 e) errs by up to about 2^-22
# A probe's random signs at full amplitude give the size of a corner of the rounding box; a rounding
# to nearest lands uniformly inside it, at 1/sqrt(3) of that in RMS, so twice the corner is 2 sqrt(3)
# = 3.5 times the rounding's own RMS: 3.5 standard deviations (with C_ROUND = 1 a kernel whose error
# is one rounding summed over many elements sits at 0.58 of its bound, measured 0.5 to 0.7).
C_ROUND = 2.0
PERTURBATION = 2.0**-30
PROBES = 2  # draws per rounding; the larger response counts
FLOOR = 1e-3
UNIT_ROUNDOFF_FP32 = 2.0**-24
# Largest problem (state elements x padded tokens) whose rounding responses (and, where the oracle
# did not give the state norms, scales) are computed with NumPy (about a second); larger ones take
# every rounding's response to be the inputs' (and without norms, the blocks' own norms as scales).
SCALE_BUDGET = 1 << 28

# The allowed roundings of the precision contract, each a group of the chunked form's
# intermediates (``reference.STAGES``; "qk" is the l2-normalised q and k) rounded to the input
# dtype once per chunk. Each gets its own term in the bound.
ROUNDINGS: dict[str, tuple[str, ...]] = {
    "qk": ("qk",),
    "operands": ("kkt_operand", "inverse", "wu_operands", "attn", "v_new_decayed"),
    "stored": ("wu", "h", "v_new"),
    # The same intermediates' absolute error where they underflow: rounding to a dtype is
    # x (1 + d) + e with |d| <= u and |e| <= half its smallest subnormal (float16: 2^-25), so a
    # float16 kernel flushes a decayed write of 1e-25 to zero. Negligible for the other dtypes.
    "underflow": ("qk", *STAGES),
}
ROUNDING_TEXT = {
    "qk": "l2-normalised q/k stored in the input dtype",
    "operands": "tensor-core product operands in the input dtype",
    "stored": "W, U, chunk-start states and v_new stored in the input dtype",
    "underflow": "underflow of the intermediates stored in the input dtype",
}
UNDERFLOW_NEGLIGIBLE = 1e-30  # below this half-subnormal (bfloat16 2^-134, float32 2^-150) no term
assert set(STAGES) == {stage for group in ROUNDINGS.values() for stage in group} - {"qk"}
STATE_TEXT = "carried state stored in the declared {}"
STORED_STATE_TEXT = "state loaded from and stored to the declared {} once per call"


def unit_roundoff(dtype) -> float:
    """Half the machine epsilon: float64 2^-53, float32 2^-24, float16 2^-11, bfloat16 2^-8."""
    return float(ml_dtypes.finfo(np.dtype(dtype)).eps) / 2


def underflow_unit(dtype) -> float:
    """Half the smallest subnormal: the largest absolute error of rounding a tiny value to ``dtype``."""
    return float(ml_dtypes.finfo(np.dtype(dtype)).smallest_subnormal) / 2


class StoredState(str):
    """A declared state dtype that the kernel rounds only where the state leaves it: the initial
    state read from a pool of that dtype and the final state written back, once per call, while
    the carried state stays in float32 in between (MAX's recurrence keeps each state column in
    registers over the sequence). ``verdict.state_dtype_of`` returns it for an implementation
    declaring ``extra["state_rounding"] = "stored"``; as a ``str`` it is the dtype's name wherever
    only the dtype matters. :func:`tolerance` then adds one rounding of the initial and of the final
    state instead of one after every token (which on long sequences allows any state at all)."""

    __slots__ = ()


def narrow_state_dtype(state_dtype) -> str | None:
    """The name of a declared state dtype that gets a term of its own (coarser than float32), else None.

    ``state_dtype``: ``Implementation.extra["state_dtype"]`` as declared (a name, a NumPy dtype or a
    torch dtype such as ``torch.bfloat16``); None, float32 or float64 is the default contract, whose
    float32 carried state the float32 arithmetic term covers.
    """
    if state_dtype is None:
        return None
    name = str(state_dtype)
    dtype = np.dtype(name.removeprefix("torch.") if name.startswith("torch.") else state_dtype)
    return dtype.name if unit_roundoff(dtype) > UNIT_ROUNDOFF_FP32 else None


@dataclass(frozen=True)
class Errors:
    output_rms: float
    output_token: float
    state: float
    worst_token: tuple[int, int] | None = None  # (flat token index, value head) of the worst token
    worst_sequence: tuple[int, int] | None = None  # (sequence, value head) of the worst state block

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, eq=False)
class Scales:
    """Natural magnitudes the metrics divide by (see the module docstring).

    ``token [B*T, HV]``: ``scale |q_t| ||S_t||_F / sqrt(K)`` per token; ``state [N, HV]``: the
    largest norm the state had, decayed to the end.
    """

    token: np.ndarray
    state: np.ndarray
    of: int = 0  # id() of the problem they were computed for


@dataclass(frozen=True, eq=False)
class Kappa:
    """Condition numbers of ``output_rms``, ``output_token`` and ``state`` (see :func:`condition`)."""

    output_rms: float
    output_token: float
    state: float
    # Sensitivity to the float32 chunk-local gate cumsum's rounding (0 without gates).
    gate: tuple[float, ...] = (0.0, 0.0, 0.0)
    # Sensitivity to every nonzero gate shifted alike: float32 decay factors rounded the same way.
    decay: tuple[float, ...] = (0.0, 0.0, 0.0)
    # Per allowed rounding (ROUNDINGS): the three metrics' response to it; None: not measured.
    rounding: dict[str, tuple[float, float, float]] | None = None
    scales: Scales | None = None
    # A declared state dtype coarser than float32 (narrow_state_dtype; None: the default contract) and
    # the response to rounding the carried state to it after every token (state_rounding_condition):
    # "relative" per unit relative perturbation, "underflow" per absolute perturbation of the dtype's
    # underflow_unit (float16 only); None with a declared dtype: too large for the NumPy probe.
    state_dtype: str | None = None
    state_rounding: dict[str, tuple[float, float, float]] | None = None
    # The declared dtype rounds the state once per call, as it is loaded and stored (StoredState).
    state_stored: bool = False


METRICS = ("output_rms", "output_token", "state")
ABOVE_UNIFORM = "within the algorithm-aware bound but above the uniform one"


@dataclass(frozen=True, eq=False)
class Tolerance:
    """Bounds per metric: ``output_rms``, ``output_token`` and ``state`` are what the checks
    enforce, the uniform model plus ``algorithm``, the algorithm-aware part (float32 chunk-local
    gate cumsum), whose cause ``cause`` names in one line. ``terms``: the bound's named parts,
    each ``(name, (rms, token, state))``; ``scales``: what the metrics divide by."""

    output_rms: float
    output_token: float
    state: float
    kappa_output: float
    kappa_state: float
    algorithm: tuple[float, ...] = (0.0, 0.0, 0.0)
    cause: str = ""
    terms: tuple[tuple[str, tuple[float, ...]], ...] = ()
    scales: Scales | None = None

    def for_problem(self, problem: Problem) -> Tolerance:
        """This bound with its scales naming ``problem`` (a copy of the problem they were computed
        for, such as the one a worker process received)."""
        if self.scales is None:
            return self
        return dataclasses.replace(self, scales=dataclasses.replace(self.scales, of=id(problem)))

    def uniform(self, name: str) -> float:
        """The uniform model's bound for metric ``name`` (without the algorithm-aware part)."""
        return getattr(self, name) - self.algorithm[METRICS.index(name)]

    def scaled(self, factor: float) -> Tolerance:
        return dataclasses.replace(
            self,
            output_rms=self.output_rms * factor,
            output_token=self.output_token * factor,
            state=self.state * factor,
            algorithm=tuple(x * factor for x in self.algorithm),
            terms=tuple((name, tuple(x * factor for x in values)) for name, values in self.terms),
        )

    def breakdown(self, name: str) -> str:
        """The bound of metric ``name`` as the sum of its named terms, largest first."""
        i = METRICS.index(name)
        parts = sorted(((values[i], term) for term, values in self.terms if values[i] > 0), reverse=True)
        return " + ".join(f"{value:.2g} {term}" for value, term in parts)

    def violations(self, errors: Errors) -> list[str]:
        """Human-readable list of the metrics that exceed their bound (empty when within)."""
        out = []
        for name in METRICS:
            err, tol = getattr(errors, name), getattr(self, name)
            if not err <= tol:  # NaN counts as a violation
                extra = self.algorithm[METRICS.index(name)]
                part = f" (uniform {self.uniform(name):.3g} + {extra:.3g} for the {self.cause})" if extra else ""
                out.append(f"{name} error {err:.3g} > tolerance {tol:.3g}{part}")
        return out

    def note(self, errors: Errors) -> str:
        """One line when every metric is within its bound but one is above its uniform bound."""
        if self.violations(errors):
            return ""
        above = [
            f"{name} {getattr(errors, name):.3g} > {self.uniform(name):.3g}"
            for name in METRICS
            if getattr(errors, name) > self.uniform(name)
        ]
        return f"{ABOVE_UNIFORM} ({', '.join(above)}): {self.cause}" if above else ""


def _safe_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return num / np.maximum(den, np.finfo(np.float64).tiny)


def token_errors(o: np.ndarray, ref: np.ndarray, bounds: np.ndarray, magnitude: np.ndarray | None = None) -> np.ndarray:
    """``[B*T, HV]``: ``||o_t - ref_t||`` over its (sequence, value head) block's scale.

    The scale is the larger of the block's RMS token norm and the RMS of ``magnitude`` (``[B*T,
    HV]``, :attr:`Scales.token`) over the block, floored at ``FLOOR`` times the problem-wide
    RMS, so an all-zero block is compared absolutely. NaN in ``o`` stays NaN.
    """
    HV, V = ref.shape[2], ref.shape[3]
    o = np.asarray(o, np.float64).reshape(-1, HV, V)
    ref = np.asarray(ref, np.float64).reshape(-1, HV, V)
    diff = np.linalg.norm(o - ref, axis=-1)
    norm = np.linalg.norm(ref, axis=-1)
    if magnitude is not None:
        norm_sq = np.maximum(norm**2, np.asarray(magnitude, np.float64).reshape(norm.shape) ** 2)
    else:
        norm_sq = norm**2
    typical = np.sqrt(np.mean(norm_sq)) if norm.size else 0.0
    out = np.zeros_like(diff)
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end > start:
            block = np.sqrt(np.maximum(np.mean(norm[start:end] ** 2, axis=0), np.mean(norm_sq[start:end], axis=0)))
            out[start:end] = _safe_ratio(diff[start:end], np.maximum(block, FLOOR * typical))
    return out


def _rms(x: np.ndarray) -> np.ndarray:
    """Root mean square over axis 0, scaled by the largest value so that errors past 1e154 (a
    kernel far off, or a 16-bit output against a tiny reference) do not overflow their squares:
    the size of such an error is reported rather than inf, and no warning of ours is counted
    among the kernel's."""
    top = np.max(np.abs(x), axis=0)
    scale = np.where(np.isfinite(top) & (top > 0), top, 1.0)
    return scale * np.sqrt(np.mean((x / scale) ** 2, axis=0))


def output_errors(
    o: np.ndarray, ref: np.ndarray, bounds: np.ndarray, magnitude: np.ndarray | None = None
) -> tuple[float, float, tuple[int, int] | None]:
    """``(output_rms, output_token, worst (token, head))`` for ``o, ref`` ``[B, T, HV, V]``."""
    tok = token_errors(o, ref, bounds, magnitude)
    if tok.size == 0:
        return 0.0, 0.0, None
    if np.isnan(tok).any():
        t, h = np.argwhere(np.isnan(tok))[0]
        return float("nan"), float("nan"), (int(t), int(h))
    # Within a block the denominator is constant, so the block's relative RMS error is the
    # RMS of its per-token errors.
    rms = max((float(np.max(_rms(tok[a:b]))) for a, b in zip(bounds[:-1], bounds[1:]) if b > a), default=0.0)
    t, h = np.unravel_index(np.argmax(tok), tok.shape)
    return rms, float(tok[t, h]), (int(t), int(h))


def state_errors(
    state: np.ndarray, ref: np.ndarray, initial_state=None, magnitude: np.ndarray | None = None
) -> tuple[float, tuple[int, int] | None]:
    """Worst relative Frobenius error over (sequence, value head) blocks of ``[N, HV, *, *]``.

    Relative to the larger of the final state and ``magnitude`` (``[N, HV]``,
    :attr:`Scales.state`: the largest the state was, decayed to the end); without it, to the
    larger of the final and the initial state. The delta rule can erase a large state, and
    every correct algorithm carries error of the size of what it erased (the chunked form
    computes ``S0 - K^T W S0`` by cancellation).
    """
    state = np.asarray(state, np.float64)
    ref = np.asarray(ref, np.float64)
    if ref.size == 0:
        return 0.0, None
    diff = np.linalg.norm(state - ref, axis=(-2, -1))
    norm = np.linalg.norm(ref, axis=(-2, -1))
    if magnitude is not None:
        norm = np.maximum(norm, np.asarray(magnitude, np.float64).reshape(norm.shape))
    elif initial_state is not None:
        norm = np.maximum(norm, np.linalg.norm(np.asarray(initial_state, np.float64), axis=(-2, -1)))
    den = np.maximum(norm, FLOOR * np.sqrt(np.mean(norm**2)))
    rel = _safe_ratio(diff, den)
    if np.isnan(rel).any():
        n, h = np.argwhere(np.isnan(rel))[0]
        return float("nan"), (int(n), int(h))
    n, h = np.unravel_index(np.argmax(rel), rel.shape)
    return float(rel[n, h]), (int(n), int(h))


def measure(o, final_state, ref_o, ref_state, problem: Problem, scales: Scales | None = None) -> Errors:
    """Errors of an implementation's outputs against the oracle's, both as NumPy arrays.

    ``scales`` (:func:`natural_scales`, carried by a :class:`Tolerance`): what each block is
    judged on; None: the blocks' own norms.
    """
    token = None if scales is None else scales.token
    rms, worst_token, where = output_errors(o, ref_o, problem.bounds, token)
    if ref_state is None or final_state is None:
        state, seq = 0.0, None
    else:
        natural = None if scales is None else scales.state
        state, seq = state_errors(final_state, ref_state, problem.initial_state, natural)
    return Errors(rms, worst_token, state, where, seq)


def _affordable(problem: Problem) -> bool:
    s = problem.shape
    padded = s["N"] * (int(problem.lengths.max(initial=0)) + MAX_CHUNK)
    return padded * s["HV"] * s["K"] * s["V"] <= SCALE_BUDGET


def natural_scales(problem: Problem, norms: np.ndarray | None = None) -> Scales | None:
    """The :class:`Scales` of ``problem`` from its exact state norms; None when they are not given
    and the problem is too large to run the recurrence for them.

    ``norms``: the state's norm after each token ``[N, L, HV]`` (packed layout) where the oracle's
    run already gave them (``oracle.numpy_oracle_with_norms``); else the recurrence runs for them.
    Given norms cost only ``[N, L, HV]`` arrays here, whatever the size: without scales every block
    would be judged on its own output's norm, and one block whose query is nearly orthogonal to its
    key (a near-zero output) sets a vacuous bound for the whole problem (bounds of 1.1 and 5.4,
    relative, on Qwen3.5's whole layers, H100 campaigns of 2026-11-28).
    """
    if norms is None and not _affordable(problem):
        return None
    p = pack_problem(problem)
    N, L, HV, _ = p.v.shape
    if norms is None:
        norms = np.zeros((N, L, HV))
        recurrent_core(p, norms)
    K, V = p.q.shape[-1], p.v.shape[-1]
    # The state's norm from t = -1 (the initial state) to the last token: [N, 1 + L, HV]
    history = np.concatenate([np.linalg.norm(p.initial_state, axis=(-2, -1))[:, None], norms], 1)
    # Below the smallest normal number a binary format has no relative precision left: a state
    # decayed past it (exp(G) < 2^-126 in float32) is the remnant of a larger one, and a correct
    # kernel's float32 decay carries an absolute error of up to 2^-150 of that larger norm (a
    # correct float32 kernel returns 0 for exp(-200) S0, an error of 1 on the remnant's own scale).
    # So each scale is at least the smallest normal times the largest norm the state has had so far
    # (plus sqrt(K V) for the elements' own rounding), in float64 for float64 inputs.
    tiny = float(np.finfo(np.float64 if np.dtype(problem.dtype) == np.float64 else np.float32).tiny)
    floor = tiny * (np.maximum.accumulate(history, axis=1) + np.sqrt(K * V))  # [N, 1 + L, HV]
    magnitude = p.scale * np.linalg.norm(p.q, axis=-1) * np.maximum(norms, floor[:, 1:]) / np.sqrt(K)  # [N, L, HV]
    B, T = problem.q.shape[:2]
    flat = np.zeros((B * T, HV))
    valid = p.token_index >= 0
    flat[p.token_index[valid]] = magnitude[valid]
    # The state: max over t of ||S_t|| exp(G_end - G_t), with the initial state as t = -1.
    G = np.cumsum(p.g, axis=1)  # padding has g = 0, so G_end is G at the padded end
    with np.errstate(divide="ignore"):
        log_norms = np.log(history)
    decay_to_end = np.concatenate([G[:, -1:], G[:, -1:] - G], axis=1)
    state = np.maximum(np.exp(np.max(log_norms + decay_to_end, axis=1)), floor[:, -1])
    return Scales(flat, state, id(problem))


def scales_for(problem: Problem, bound: Tolerance) -> Scales | None:
    """The scales to judge ``problem`` on with ``bound``: the bound's own when it was computed for
    this problem, else ``problem``'s own (a property that holds one sequence of a pack, a split or
    a related call to one problem's bound: each is judged on what its own inputs could produce)."""
    s = bound.scales
    return s if s is not None and s.of == id(problem) else natural_scales(problem)


def chunk_gate_sums(problem: Problem) -> np.ndarray:
    """``a [B, T, HV]``: ``sum |g_j|`` over the ``MAX_CHUNK`` tokens of the sequence ending at each token.

    It bounds the magnitude of a chunk-local gate cumsum at that token for any chunk size up
    to ``MAX_CHUNK`` and any chunk alignment.
    """
    B, T, HV = problem.g.shape
    g = np.abs(np.asarray(problem.g, np.float64)).reshape(B * T, HV)
    out = np.zeros_like(g)
    for start, end in zip(problem.bounds[:-1], problem.bounds[1:]):
        if end > start:
            total = np.cumsum(g[start:end], axis=0)
            window = total.copy()
            window[MAX_CHUNK:] -= total[:-MAX_CHUNK]
            out[start:end] = np.maximum(window, 0.0)  # exact zeros stay zero after the subtraction
    return out.reshape(B, T, HV)


def gate_cumsum_cause(problem: Problem) -> str:
    """One line naming the float32 chunk-local gate cumsum and where its magnitude peaks."""
    a = chunk_gate_sums(problem)
    if not a.size or a.max() == 0:
        return ""
    b, t, h = np.unravel_index(np.argmax(a), a.shape)
    flat = b * a.shape[1] + t
    n = int(np.searchsorted(problem.bounds, flat, side="right") - 1)
    position = int(flat - problem.bounds[n])
    first = max(position - MAX_CHUNK + 1, 0)
    return (
        f"float32 chunk-local gate cumsum (|cumsum| up to {a.max():.3g} in the {MAX_CHUNK}-token chunk "
        f"[{first}, {position}] of sequence {n}, value head {h})"
    )


def _rounding_names(problem: Problem) -> list[str]:
    """The allowed roundings that apply to ``problem`` (``qk`` with the in-kernel l2norm, ``underflow``
    for a dtype whose underflow is not negligible)."""
    eta = underflow_unit(problem.dtype)
    return [
        name
        for name in ROUNDINGS
        if (name != "qk" or problem.use_qk_l2norm_in_kernel) and (name != "underflow" or eta > UNDERFLOW_NEGLIGIBLE)
    ]


def rounding_copies(problem: Problem) -> list[tuple[str, int]]:
    """The draws :func:`rounding_condition` runs: ``(rounding, draw)`` for each allowed rounding that
    applies to ``problem`` and each of its ``PROBES`` draws."""
    return [(name, probe) for name in _rounding_names(problem) for probe in range(PROBES)]


def rounding_condition(
    problem: Problem,
    reference: tuple[np.ndarray, np.ndarray],
    scales: Scales | None,
    seed: int,
    copies: Sequence[tuple[str, int]] | None = None,
) -> dict[str, tuple[float, float, float]]:
    """Each allowed rounding's response: the three metrics' relative change per unit relative
    perturbation of its intermediates (random signs, the larger of ``PROBES`` draws). ``copies``:
    these draws only (``(rounding, draw)`` of :func:`rounding_copies`; default all).

    All draws run as one float64 ``chunk_core`` call over copies of the problem stacked along the
    sequence axis; each copy perturbs one rounding's intermediates through the hook, with random
    numbers of its own (seeded by ``seed``, the rounding and the draw): a draw's response is the
    same run alone or stacked with the others.
    """
    eta = underflow_unit(problem.dtype)
    copies = rounding_copies(problem) if copies is None else list(copies)
    order = list(ROUNDINGS)
    streams = [np.random.default_rng([seed, 2, order.index(name), probe]) for name, probe in copies]
    # Sequences shorter than a chunk are one chunk of the next power of two: padding tokens (beta = 0,
    # g = 0) make zero intermediates, so the response is the same as at MAX_CHUNK, and cheaper.
    longest = int(problem.lengths.max(initial=1))
    C = min(MAX_CHUNK, 1 << max(1, (longest - 1).bit_length()))
    p = pack_problem(problem, C)
    N = p.v.shape[0]
    # A drawn bit b gives the factor 1 + PERTURBATION (2b - 1) (relative) or the term PERTURBATION eta
    # (2b - 1) (absolute), computed as step b + low: the same values (powers of two), in fewer passes.
    steps = {False: (2 * PERTURBATION, 1.0 - PERTURBATION), True: (2 * PERTURBATION * eta, -PERTURBATION * eta)}

    def perturb(x: np.ndarray, stage: str, own: bool = False) -> np.ndarray:
        """``x [copies * N, ...]`` with the chosen copies' rows perturbed; ``own``: ``x`` may be overwritten."""
        out = x
        for i, (name, _) in enumerate(copies):
            if stage not in ROUNDINGS[name]:
                continue
            out = x.copy() if out is x and not own else out
            # relative (x (1 + d)) or, for "underflow", absolute (x + e); a copy's rows are a slice
            step, low = steps[name == "underflow"]
            values = streams[i].integers(0, 2, size=(N,) + x.shape[1:], dtype=np.int8) * step
            values += low
            if name == "underflow":
                out[i * N : (i + 1) * N] += values
            else:
                out[i * N : (i + 1) * N] *= values
        return out

    stacked = stack_packed([p] * len(copies))
    stacked = dataclasses.replace(stacked, q=perturb(stacked.q, "qk"), k=perturb(stacked.k, "qk"))
    o, S = chunk_core(stacked, C, hook=lambda stage, x: perturb(x, stage, own=stage != "h"))
    out: dict[str, np.ndarray] = {}
    for i, (name, _) in enumerate(copies):
        part = slice(i * N, (i + 1) * N)
        o_i = unpack_output(p, o[part])
        s_i = export_state(p, S[part])
        errors = measure(o_i, s_i, reference[0], reference[1], problem, scales)
        out[name] = np.maximum(out.get(name, 0.0), [getattr(errors, m) / PERTURBATION for m in METRICS])
    return {name: (float(x[0]), float(x[1]), float(x[2])) for name, x in out.items()}


def state_rounding_condition(
    problem: Problem,
    reference: tuple[np.ndarray, np.ndarray],
    scales: Scales | None,
    rng: np.random.Generator,
    state_dtype: str,
) -> dict[str, tuple[float, float, float]]:
    """The response to rounding the carried state to ``state_dtype`` as it is loaded and after every token.

    The float64 oracle runs token by token (``chunk_core`` at chunk size 1, its ``CARRIED`` hook)
    with the carried state multiplied by ``1 + PERTURBATION r`` each time: ``PROBES`` draws with
    fresh random signs at every token (roundings that are independent, a random walk) and one with
    the same random signs at every token (roundings that repeat: a decay smaller than half an ulp
    rounds back to the undecayed state every token, so a retained memory drifts coherently). The
    larger response counts. For a dtype with a non-negligible underflow unit (float16) the same
    three draws add ``PERTURBATION r underflow_unit`` instead ("underflow"). Rounding stops at each
    sequence's end (the padding of shorter sequences is not rounded).

    A kernel may read token t's output from the stored (rounded) state, so besides propagating
    through the later tokens each perturbation of the state after token t also changes o_t by
    ``scale q_t^T dS_t`` (the chunked form computes o_t from the state entering the token, which the
    hook does not reach): added to the outputs. With strong gates this is the whole effect (the
    propagated part decays by exp(g) before the next token reads it).
    """
    u, eta = unit_roundoff(state_dtype), underflow_unit(state_dtype)
    kinds = ["relative"] + (["underflow"] if eta > UNDERFLOW_NEGLIGIBLE else [])
    copies = [(kind, coherent) for kind in kinds for coherent in (False,) * PROBES + (True,)]
    p = pack_problem(problem)
    N = p.v.shape[0]
    shape = (len(copies) * N,) + p.initial_state.shape[1:]
    owner = np.repeat(np.arange(len(copies)), N)
    coherent = np.array([c for _, c in copies])[owner]
    absolute = np.array([kind == "underflow" for kind, _ in copies])[owner]
    fixed = rng.integers(0, 2, size=shape, dtype=np.int8) * 2.0 - 1.0
    lengths = np.tile(p.lengths, len(copies))
    absolute = absolute[:, None, None, None]
    stacked = stack_packed([p] * len(copies))
    q = stacked.q
    decay = np.exp(stacked.g)
    read = np.zeros((q.shape[0],) + p.v.shape[1:])  # o_t's change when it reads the perturbed state
    step = 0  # 0: the state as loaded; t: after token t
    stored = None  # the state stored after the previous token (perturbed)

    def hook(stage: str, x: np.ndarray) -> np.ndarray:
        nonlocal step, stored
        if stage != CARRIED:
            return x
        signs = rng.integers(0, 2, size=shape, dtype=np.int8) * 2.0 - 1.0
        signs[coherent] = fixed[coherent]
        signs *= (lengths >= step)[:, None, None, None]
        # The error of one rounding: up to u |x| (relative) or eta (absolute), and never more than the
        # token's change |x - stored| (the stored value is representable, the nearest is no farther).
        unit = np.where(absolute, eta, u * np.abs(x))
        size = unit
        if stored is not None:
            size = np.minimum(unit, np.abs(x - stored))
            # Only an element that this token wrote less than an ulp (beyond decaying it) rounds the
            # same way again; a larger write lands it at an effectively random place between
            # representable numbers, which the random draws model.
            written = np.abs(x - decay[:, step - 1, :, None, None] * stored) >= 2 * unit
            size = np.where(coherent[:, None, None, None] & written, 0.0, size)
        delta = PERTURBATION * signs * np.where(absolute, size, size / u)  # per unit u, or per eta itself
        if step > 0:
            read[:, step - 1] = p.scale * np.einsum("nhk,nhkv->nhv", q[:, step - 1], delta)
        step += 1
        stored = x + delta
        return stored

    o, S = chunk_core(stacked, 1, chunks_per_block=64, hook=hook)
    o += read
    out = {kind: np.zeros(3) for kind in kinds}
    for i, (kind, _) in enumerate(copies):
        part = slice(i * N, (i + 1) * N)
        errors = measure(
            unpack_output(p, o[part]), export_state(p, S[part]), reference[0], reference[1], problem, scales
        )
        out[kind] = np.maximum(out[kind], [getattr(errors, m) / PERTURBATION for m in METRICS])
    return {kind: (float(x[0]), float(x[1]), float(x[2])) for kind, x in out.items()}


def condition_parts(problem: Problem, state_dtype=None) -> tuple[str, ...]:
    """The parts :func:`condition` measures, each on its own random draws, so that they can run side
    by side (``verdict.oracles_and_tolerances`` runs a long problem's parts in worker processes).

    ``"state_rounding"`` (a declared state dtype coarser than float32, where affordable); the
    rounding responses (``"rounding"``: all draws in one stacked run; past the token loop one
    ``"rounding:<name>:<draw>"`` per draw, :func:`rounding_copies`); the oracle reruns (``"reruns"``:
    stacked in one token loop; past it ``"inputs"``, and with gates ``"gates"`` and ``"decay"``).
    Which parts a problem has depends on the problem alone: a part's result is the same wherever it runs.
    """
    affordable = _affordable(problem)
    per_token = not isinstance(state_dtype, StoredState)  # a state rounded once per call needs no probe
    parts = ["state_rounding"] if narrow_state_dtype(state_dtype) is not None and per_token and affordable else []
    if token_loop(problem):
        parts += ["rounding"] if affordable else []
        return (*parts, "reruns")
    parts += [f"rounding:{name}:{probe}" for name, probe in rounding_copies(problem)] if affordable else []
    a = chunk_gate_sums(problem)
    gated = bool(a.size) and a.max() > 0
    return (*parts, "inputs", *(("gates", "decay") if gated else ()))


def _reruns(problem: Problem, part: str, seed: int) -> dict[str, list[Problem]]:
    """The perturbed problems a reruns part runs, by the response they measure (see :func:`condition`)."""
    out: dict[str, list[Problem]] = {}
    if part in ("reruns", "inputs"):
        rng = np.random.default_rng([seed, 0])

        def nudge(x):
            if x is None:
                return None
            x = np.asarray(x, np.float64)
            return x * (1.0 + PERTURBATION * rng.choice([-1.0, 1.0], size=x.shape))

        nudged = problem.replace(
            **{name: nudge(getattr(problem, name)) for name in ("q", "k", "v", "g", "beta", "initial_state")}
        )
        if problem.scale is not None:
            nudged = nudged.replace(scale=problem.scale * (1.0 + PERTURBATION))
        out["inputs"] = [nudged]
    if part == "inputs":
        return out
    a = chunk_gate_sums(problem)
    if not (a.size and a.max() > 0):
        return out
    g = np.asarray(problem.g, np.float64)
    if part in ("reruns", "gates"):
        # Two draws, the second with every other token's sign flipped: a gate factor spanning two
        # tokens sees r_i a_i + r_j a_j, which one random draw cancels half the time (seen: a -1e4
        # spike followed by two gates); the flipped draw then adds them. Longer spans add like the
        # random walk the constant C_GATE assumes.
        signs = np.random.default_rng([seed, 3]).choice([-1.0, 1.0], a.shape)
        flip = np.where(np.arange(a.shape[1]) % 2 == 0, 1.0, -1.0)[None, :, None]
        out["gates"] = [problem.replace(g=g + PERTURBATION * r * a) for r in (signs, signs * flip)]
    if part in ("reruns", "decay"):
        # Every nonzero gate shifted the same way: a per-token exp(g) with the same relative error each
        # token (exp(0) = 1 exactly in any kernel), the coherent worst case over a long memory.
        out["decay"] = [problem.replace(g=g + PERTURBATION * (g != 0))]
    return out


def condition_part(
    problem: Problem,
    reference: tuple[np.ndarray, np.ndarray],
    part: str,
    scales: Scales | None,
    seed: int = 0,
    oracle: Oracle = numpy_oracle,
    state_dtype=None,
) -> dict:
    """One part of :func:`condition` (a name from :func:`condition_parts`): the fields it measures,
    ``{"state_rounding": ...}``, ``{"rounding": {name: ...}}`` or ``{response: (rms, token, state)}``
    for the reruns' responses ``"inputs"``, ``"gates"`` and ``"decay"``."""
    if part == "state_rounding":
        narrow = narrow_state_dtype(state_dtype)
        assert narrow is not None  # condition_parts names this part for a narrow state dtype only
        rng = np.random.default_rng([seed, 1])
        return {"state_rounding": state_rounding_condition(problem, reference, scales, rng, narrow)}
    if part == "rounding" or part.startswith("rounding:"):
        copies = None
        if part != "rounding":
            name, probe = part.split(":")[1:]
            copies = [(name, int(probe))]
        return {"rounding": rounding_condition(problem, reference, scales, seed, copies)}
    reruns = _reruns(problem, part, seed)
    problems = [x for group in reruns.values() for x in group]
    if oracle is numpy_oracle and token_loop(problem):
        outputs = numpy_oracle_stacked(problems)
    else:
        outputs = [oracle(x) for x in problems]
    responses = iter(
        np.array([getattr(e, name) / PERTURBATION for name in METRICS])
        for e in (measure(*out, reference[0], reference[1], problem, scales) for out in outputs)
    )
    # a response group's larger draw counts (the two gate draws)
    return {
        name: tuple(float(x) for x in np.maximum.reduce([next(responses) for _ in group]))
        for name, group in reruns.items()
    }


def kappa_of(parts: Sequence[dict], scales: Scales | None, state_dtype=None) -> Kappa:
    """The :class:`Kappa` of a problem from its :func:`condition_part` results (all of its parts)."""
    merged: dict = {}
    rounding: dict = {}
    for fields in parts:
        for name, response in fields.get("rounding", {}).items():  # a rounding's larger draw counts
            # np.maximum: a NaN response stays NaN in any order, as in the stacked run
            rounding[name] = tuple(float(x) for x in np.maximum(rounding.get(name, response), response))
        merged.update({k: v for k, v in fields.items() if k != "rounding"})
    rms, token, state = (max(1.0, x) for x in merged["inputs"])
    gated = {"gate": merged["gates"], "decay": merged["decay"]} if "gates" in merged else {}
    return Kappa(
        rms,
        token,
        state,
        **gated,
        rounding=rounding if any("rounding" in fields for fields in parts) else None,
        scales=scales,
        state_dtype=narrow_state_dtype(state_dtype),
        state_rounding=merged.get("state_rounding"),
        state_stored=isinstance(state_dtype, StoredState),
    )


def condition(
    problem: Problem,
    reference: tuple[np.ndarray, np.ndarray],
    seed: int = 0,
    oracle: Oracle = numpy_oracle,
    state_dtype=None,
    norms: np.ndarray | None = None,
) -> Kappa:
    """Estimated relative condition numbers of the three metrics, each at least 1.

    The oracle (default: the NumPy one) is rerun on inputs multiplied
    elementwise by ``1 + PERTURBATION * r`` with random signs ``r``, and the relative change of
    each metric is divided by ``PERTURBATION``. ``Kappa.gate`` is measured the same way with
    each gate shifted by ``PERTURBATION * r * a`` (``a`` from :func:`chunk_gate_sums`), and
    ``Kappa.rounding`` by :func:`rounding_condition` (None for problems too large for NumPy).
    ``state_dtype``: the implementation's declared state dtype (``Implementation.extra
    ["state_dtype"]``); when coarser than float32, ``Kappa.state_rounding`` is measured by
    :func:`state_rounding_condition`.
    ``norms``: the reference run's state norms where the oracle gave them (:func:`natural_scales`).
    With the NumPy oracle in its token-loop regime the reruns go through one stacked token loop.
    Each part (:func:`condition_parts`) draws its own random numbers (seeded by ``seed`` and the
    part), so the parts give the same results run here one by one or side by side elsewhere.
    """
    scales = natural_scales(problem, norms)
    parts = [
        condition_part(problem, reference, part, scales, seed, oracle, state_dtype)
        for part in condition_parts(problem, state_dtype)
    ]
    return kappa_of(parts, scales, state_dtype)


def subnormal_output_rounding(problem: Problem, scales: Scales | None, out_dtype) -> float:
    """The output's own rounding below the smallest normal number of ``out_dtype``, relative to the
    metrics' denominators: there an element is rounded to an absolute ``underflow_unit`` (float16:
    2^-25), not a relative ``u``, so a token's error norm reaches ``underflow_unit sqrt(V)`` whatever
    its size. Divided by the smallest block's RMS natural magnitude (``Scales.token``, which each
    block's denominator is at least); 0 without scales. Seen: float16 queries and keys of norm 4e-5
    with the l2norm in the kernel, outputs near 5e-5, a correct float32 kernel at 1.9x the bound."""
    eta = underflow_unit(out_dtype)
    if scales is None or eta == 0.0:
        return 0.0
    bounds, V = problem.bounds, problem.v.shape[-1]
    rms = [np.sqrt(np.mean(scales.token[a:b] ** 2, axis=0)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    smallest = float(np.min(rms)) if rms else 0.0
    return eta * np.sqrt(V) / smallest if smallest > 0 else 0.0


def tolerance(problem: Problem, kappa: Kappa, output_dtype=None) -> Tolerance:
    """The bound a correct implementation meets on ``problem`` (see the module docstring)."""
    dot_length = max(problem.q.shape[-1], MAX_CHUNK)
    u_in = unit_roundoff(problem.dtype)
    out_dtype = output_dtype if output_dtype is not None else problem.dtype
    u_out = unit_roundoff(out_dtype)
    plain = np.array([kappa.output_rms, kappa.output_token, kappa.state])
    rounded = u_out + subnormal_output_rounding(problem, kappa.scales, out_dtype)
    terms: list[tuple[str, np.ndarray]] = [("output rounding", np.array([rounded, rounded, 0.0]))]
    if kappa.rounding is None:  # too large for the NumPy probes: every rounding answers like the inputs
        responses = {
            name: plain
            for name in ROUNDINGS
            if name != "underflow" and (name != "qk" or problem.use_qk_l2norm_in_kernel)
        }
    else:
        responses = {name: np.array(values) for name, values in kappa.rounding.items()}
    # A response is per unit relative perturbation (times u_in: the rounding's size), or for
    # "underflow" per absolute perturbation of underflow_unit (times 1).
    terms += [
        (ROUNDING_TEXT[name], C_ROUND * (1.0 if name == "underflow" else u_in) * response)
        for name, response in responses.items()
    ]
    if kappa.state_dtype is not None and kappa.state_stored:  # rounded where it is loaded and stored
        # The initial state's rounding reaches the outputs and the final state like the inputs'
        # (plain); the final state's own rounding adds u to the state metric alone.
        stored = unit_roundoff(kappa.state_dtype) * (plain + np.array([0.0, 0.0, 1.0]))
        terms.append((STORED_STATE_TEXT.format(kappa.state_dtype), C_ROUND * stored))
    elif kappa.state_dtype is not None:  # declared: the carried state rounded to it after every token
        if kappa.state_rounding is None:  # too large for the probe: every rounding felt like the inputs', coherently
            state = {"relative": (int(problem.lengths.max(initial=0)) + 1) * plain}
        else:
            state = {kind: np.array(values) for kind, values in kappa.state_rounding.items()}
        response = unit_roundoff(kappa.state_dtype) * state["relative"] + state.get("underflow", 0.0)
        # C_ROUND u kappa to first order; expm1 because the roundings compound: a state retained
        # over T tokens is multiplied by prod (1 + d_t) <= exp(sum |d_t|), which the linear response
        # (sum |d_t|) underestimates once the drift is of order 1 (T u ~ 1: 256 tokens in bfloat16).
        with np.errstate(over="ignore"):  # a drift beyond exp(709): no bound (inf), nothing to claim
            terms.append((STATE_TEXT.format(kappa.state_dtype), np.expm1(C_ROUND * response)))
    terms.append(("float32 arithmetic", C_WORK * np.sqrt(dot_length) * UNIT_ROUNDOFF_FP32 * plain))
    if any(kappa.decay):
        terms.append(("float32 decay factors", C_EXP * UNIT_ROUNDOFF_FP32 * np.array(kappa.decay)))
    gate = C_GATE * UNIT_ROUNDOFF_FP32 * np.array(kappa.gate)
    per_metric = np.array([1.0, TOKEN_FACTOR, 1.0])
    uniform = sum(values for _, values in terms) * per_metric
    extra = gate * per_metric
    if gate.any():
        terms.append(("float32 chunk-local gate cumsum", gate))
    return Tolerance(
        output_rms=float(uniform[0] + extra[0]),
        output_token=float(uniform[1] + extra[1]),
        state=float(uniform[2] + extra[2]),
        kappa_output=float(kappa.output_rms),
        kappa_state=float(kappa.state),
        algorithm=(float(extra[0]), float(extra[1]), float(extra[2])),
        cause=gate_cumsum_cause(problem) if extra.any() else "",
        terms=tuple((name, tuple(float(x) for x in values * per_metric)) for name, values in terms),
        scales=kappa.scales,
    )
