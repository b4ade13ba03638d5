"""How far from the float64 oracle a correct implementation may land: metrics and tolerance model.

Metrics (all relative, all maxima so that one bad sequence, head or token is not averaged away):

- ``output_rms``: over (sequence, value head) blocks, ``||o - o_ref||_F / ||o_ref||_F``;
- ``output_token``: over (token, value head), ``||o_t - o_ref_t||_2`` divided by the RMS token norm
  of its block (a token's own norm can be ~0, e.g. a zero query row);
- ``state``: over (sequence, value head), ``||S - S_ref||_F / ||S_ref||_F``.
Denominators are floored at 1e-3 of the problem-wide typical magnitude so an all-zero block
(zero queries, a sequence of length 0) is compared absolutely rather than divided by zero.

Tolerance model. Inputs are exact (the oracle sees the same rounded inputs), so error comes
from (1) rounding the output to its dtype, at most ``u_out`` per element, and (2) arithmetic
in working precision: the convention's state is float32, so ``u_work = 2^-24`` whatever the
input dtype, plus rounding of intermediates to the input dtype (``u_in``), which kernels such
as FLA's chunked path do. Arithmetic error reaches the output through the problem's
sensitivity, estimated by the condition number ``kappa``: the relative change of the oracle's
outputs under a random relative perturbation of every input by ``eps`` (so cancellation,
long undamped memory and large cumulative gates raise it). Per-step state rounding adds up
like a random walk over the memory length, which the perturbation of every token's inputs
already exercises, and a dot product of length n contributes ``sqrt(n)`` units; the longest
run over the key dimension ``K`` (state products) or over a chunk of up to ``MAX_CHUNK``
tokens (the WY/UT form), so ``n = max(K, MAX_CHUNK)``::

    output_rms   <= u_out + (C_IN * u_in + C_WORK * sqrt(n) * u_work) * kappa_rms
    output_token <= TOKEN_FACTOR * (u_out + (same) * kappa_token)
    state        <=          (C_IN * u_in + C_WORK * sqrt(n) * u_work) * kappa_state

Each metric has its own condition estimate; ``TOKEN_FACTOR`` covers the maximum of many
per-token errors against their RMS (about sqrt(2 ln n) for n tokens, 4.4 at n = 4096).

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

``C_IN``, ``C_WORK`` and ``TOKEN_FACTOR`` were set once from the model above and checked on
the correct float32 NumPy implementations (token loop, chunk 16 and 64; all gate regimes;
float32, float16 and bfloat16 inputs; K from 4 to 128; large initial states):
``benchmarks/calibrate_tolerance.py`` prints the largest error / bound seen, 0.07 (float32) and
0.12 (16-bit inputs, where output rounding dominates), while a kernel rounding its state to
bfloat16 every token lands 870 to 1250 times over the bound with float32 inputs and 7 to 15
times with float16 inputs. The calibration also runs the FLA-style chunked models
(``numpy-chunk-fla`` etc., float32 chunk-local cumsum) and the TF32 one, which must land
above the bound. ``tests/test_properties.py`` and ``tests/test_tolerance.py`` assert both
sides. The constants are not adjusted per test.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import ml_dtypes
import numpy as np

from gdn_verify.core.oracle import Oracle, numpy_oracle
from gdn_verify.core.problem import Problem

C_IN = 2.0
C_WORK = 16.0
TOKEN_FACTOR = 8.0
MAX_CHUNK = 64
C_GATE = float(max(np.sqrt(MAX_CHUNK), 2 * np.log2(MAX_CHUNK)))  # 12: see the module docstring
PERTURBATION = 2.0**-30
FLOOR = 1e-3
UNIT_ROUNDOFF_FP32 = 2.0**-24


def unit_roundoff(dtype) -> float:
    """Half the machine epsilon: float64 2^-53, float32 2^-24, float16 2^-11, bfloat16 2^-8."""
    return float(ml_dtypes.finfo(np.dtype(dtype)).eps) / 2


@dataclass(frozen=True)
class Errors:
    output_rms: float
    output_token: float
    state: float
    worst_token: tuple[int, int] | None = None  # (flat token index, value head) of the worst token
    worst_sequence: tuple[int, int] | None = None  # (sequence, value head) of the worst state block

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Kappa:
    """Condition numbers of ``output_rms``, ``output_token`` and ``state`` (see :func:`condition`)."""

    output_rms: float
    output_token: float
    state: float
    # Sensitivity to the float32 chunk-local gate cumsum's rounding (0 without gates).
    gate: tuple[float, ...] = (0.0, 0.0, 0.0)


METRICS = ("output_rms", "output_token", "state")
ABOVE_UNIFORM = "within the algorithm-aware bound but above the uniform one"


@dataclass(frozen=True)
class Tolerance:
    """Bounds per metric: ``output_rms``, ``output_token`` and ``state`` are what the checks
    enforce, the uniform model plus ``algorithm``, the algorithm-aware part (float32 chunk-local
    gate cumsum), whose cause ``cause`` names in one line."""

    output_rms: float
    output_token: float
    state: float
    kappa_output: float
    kappa_state: float
    algorithm: tuple[float, ...] = (0.0, 0.0, 0.0)
    cause: str = ""

    def uniform(self, name: str) -> float:
        """The uniform model's bound for metric ``name`` (without the algorithm-aware part)."""
        return getattr(self, name) - self.algorithm[METRICS.index(name)]

    def scaled(self, factor: float) -> Tolerance:
        return Tolerance(
            self.output_rms * factor,
            self.output_token * factor,
            self.state * factor,
            self.kappa_output,
            self.kappa_state,
            tuple(x * factor for x in self.algorithm),
            self.cause,
        )

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


def token_errors(o: np.ndarray, ref: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """``[B*T, HV]``: ``||o_t - ref_t||`` over the RMS token norm of its (sequence, value head) block.

    The denominator is floored at ``FLOOR`` times the problem-wide RMS token norm, so an all-zero
    block is compared absolutely. NaN in ``o`` stays NaN.
    """
    HV, V = ref.shape[2], ref.shape[3]
    o = np.asarray(o, np.float64).reshape(-1, HV, V)
    ref = np.asarray(ref, np.float64).reshape(-1, HV, V)
    diff = np.linalg.norm(o - ref, axis=-1)
    norm = np.linalg.norm(ref, axis=-1)
    typical = np.sqrt(np.mean(norm**2)) if norm.size else 0.0
    out = np.zeros_like(diff)
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end > start:
            block = np.sqrt(np.mean(norm[start:end] ** 2, axis=0))
            out[start:end] = _safe_ratio(diff[start:end], np.maximum(block, FLOOR * typical))
    return out


def output_errors(o: np.ndarray, ref: np.ndarray, bounds: np.ndarray) -> tuple[float, float, tuple[int, int] | None]:
    """``(output_rms, output_token, worst (token, head))`` for ``o, ref`` ``[B, T, HV, V]``."""
    tok = token_errors(o, ref, bounds)
    if tok.size == 0:
        return 0.0, 0.0, None
    if np.isnan(tok).any():
        t, h = np.argwhere(np.isnan(tok))[0]
        return float("nan"), float("nan"), (int(t), int(h))
    # Within a block the denominator is constant, so the block's relative RMS error is the
    # RMS of its per-token errors.
    rms = max(
        (float(np.max(np.sqrt(np.mean(tok[a:b] ** 2, axis=0)))) for a, b in zip(bounds[:-1], bounds[1:]) if b > a),
        default=0.0,
    )
    t, h = np.unravel_index(np.argmax(tok), tok.shape)
    return rms, float(tok[t, h]), (int(t), int(h))


def state_errors(state: np.ndarray, ref: np.ndarray, initial_state=None) -> tuple[float, tuple[int, int] | None]:
    """Worst relative Frobenius error over (sequence, value head) blocks of ``[N, HV, *, *]``.

    Relative to the larger of the final and the initial state: the delta rule can erase a
    large initial state, and every correct algorithm carries error of the size of the
    state it started from (the chunked form computes ``S0 - K^T W S0`` by cancellation).
    """
    state = np.asarray(state, np.float64)
    ref = np.asarray(ref, np.float64)
    if ref.size == 0:
        return 0.0, None
    diff = np.linalg.norm(state - ref, axis=(-2, -1))
    norm = np.linalg.norm(ref, axis=(-2, -1))
    if initial_state is not None:
        norm = np.maximum(norm, np.linalg.norm(np.asarray(initial_state, np.float64), axis=(-2, -1)))
    den = np.maximum(norm, FLOOR * np.sqrt(np.mean(norm**2)))
    rel = _safe_ratio(diff, den)
    if np.isnan(rel).any():
        n, h = np.argwhere(np.isnan(rel))[0]
        return float("nan"), (int(n), int(h))
    n, h = np.unravel_index(np.argmax(rel), rel.shape)
    return float(rel[n, h]), (int(n), int(h))


def measure(o, final_state, ref_o, ref_state, problem: Problem) -> Errors:
    """Errors of an implementation's outputs against the oracle's, both as NumPy arrays."""
    rms, token, where = output_errors(o, ref_o, problem.bounds)
    if ref_state is None or final_state is None:
        state, seq = 0.0, None
    else:
        state, seq = state_errors(final_state, ref_state, problem.initial_state)
    return Errors(rms, token, state, where, seq)


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


def condition(
    problem: Problem, reference: tuple[np.ndarray, np.ndarray], seed: int = 0, oracle: Oracle = numpy_oracle
) -> Kappa:
    """Estimated relative condition numbers of the three metrics, each at least 1.

    The oracle (default: the NumPy one) is rerun on inputs multiplied
    elementwise by ``1 + PERTURBATION * r`` with random signs ``r``, and the relative change of
    each metric is divided by ``PERTURBATION``. ``Kappa.gate`` is measured the same way with
    each gate shifted by ``PERTURBATION * r * a`` (``a`` from :func:`chunk_gate_sums`).
    """
    rng = np.random.default_rng(seed)

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
    o2, s2 = oracle(nudged)
    errors = measure(o2, s2, reference[0], reference[1], problem)
    rms, token, state = (max(1.0, getattr(errors, name) / PERTURBATION) for name in METRICS)
    a = chunk_gate_sums(problem)
    if not a.size or a.max() == 0:
        return Kappa(rms, token, state)
    # Two draws, the second with every other token's sign flipped: a gate factor spanning two
    # tokens sees r_i a_i + r_j a_j, which one random draw cancels half the time (seen: a -1e4
    # spike followed by two gates); the flipped draw then adds them. Longer spans add like the
    # random walk the constant C_GATE assumes.
    signs = rng.choice([-1.0, 1.0], a.shape)
    flip = np.where(np.arange(a.shape[1]) % 2 == 0, 1.0, -1.0)[None, :, None]
    gate = np.zeros(len(METRICS))
    for r in (signs, signs * flip):
        shifted = problem.replace(g=np.asarray(problem.g, np.float64) + PERTURBATION * r * a)
        errors = measure(*oracle(shifted), reference[0], reference[1], problem)
        gate = np.maximum(gate, [getattr(errors, name) / PERTURBATION for name in METRICS])
    return Kappa(rms, token, state, gate=tuple(float(x) for x in gate))


def tolerance(problem: Problem, kappa: Kappa, output_dtype=None) -> Tolerance:
    """The bound a correct implementation meets on ``problem`` (see the module docstring)."""
    dot_length = max(problem.q.shape[-1], MAX_CHUNK)
    u_in = unit_roundoff(problem.dtype)
    u_out = unit_roundoff(output_dtype if output_dtype is not None else problem.dtype)
    arithmetic = C_IN * u_in + C_WORK * np.sqrt(dot_length) * UNIT_ROUNDOFF_FP32
    uniform = (
        u_out + arithmetic * kappa.output_rms,
        TOKEN_FACTOR * (u_out + arithmetic * kappa.output_token),
        arithmetic * kappa.state,
    )
    gate = C_GATE * UNIT_ROUNDOFF_FP32
    extra = (gate * kappa.gate[0], TOKEN_FACTOR * gate * kappa.gate[1], gate * kappa.gate[2])
    return Tolerance(
        output_rms=float(uniform[0] + extra[0]),
        output_token=float(uniform[1] + extra[1]),
        state=float(uniform[2] + extra[2]),
        kappa_output=float(kappa.output_rms),
        kappa_state=float(kappa.state),
        algorithm=(float(extra[0]), float(extra[1]), float(extra[2])),
        cause=gate_cumsum_cause(problem) if any(extra) else "",
    )
