"""Diagnosis of a failure: where the error first crosses the tolerance, and which chunked stage breaks.

(a) :func:`localise` runs an implementation on a problem and names the first token (in
sequence order), its sequence, position, 64-token chunk and value head where the per-token
output error (``tolerance.output_errors``'s metric) exceeds the ``output_token`` tolerance, or
else the worst final-state block above the ``state`` tolerance.

(b) :func:`diagnose` compares the stages of a chunked (WY/UT, FLA-style) implementation with
float64 stage references. Every stage is fed the *reference* outputs of the stages before it,
so an error is attributed to the stage that introduces it. Stage layout (:class:`StagedImplementation`),
per-sequence padded like ``conventions.pack(pad_to_multiple=C)``, heads expanded to ``HV``,
``q, k`` already l2-normalised when the problem asks:

==============  =====================================  ====================================================
stage           FLA function                            output
==============  =====================================  ====================================================
``cumsum``      ``chunk_local_cumsum``                  ``G [N, L, HV]`` in-chunk cumulative ``g``
``kkt``         ``chunk_scaled_dot_kkt_fwd``            ``A [N, L, HV, C]``: ``beta_i k_i.k_j exp(G_i - G_j)``, j < i
``solve_tril``  ``solve_tril``                          ``Ai [N, L, HV, C]`` = ``(I + A)^-1`` per chunk
``w_u``         ``recompute_w_u_fwd``                   ``W = Ai (beta exp(G) k)``, ``U = Ai (beta v)``
``fwd_h``       ``chunk_gated_delta_rule_fwd_h``        ``h [N, L/C, HV, K, V]`` (state entering each chunk),
                                                        ``v_new = U - W h``, final state ``[N, HV, K, V]``
``fwd_o``       ``chunk_fwd_o``                         ``o = scale (exp(G) q h + (q k^T * Gamma) v_new)``
==============  =====================================  ====================================================

Stage error: ``||x - x_ref||_F / ||M||_F`` (worst sequence and head), where ``M`` is the
magnitude of the terms summed to form ``x`` (``|A| |B|`` for a product ``A B``; for the gates
``exp`` of a difference of rounded cumulative sums, ``(1 + |G_i| + |G_j|)`` times the factor).
A correct implementation in working precision ``u`` keeps it below ``n u`` for sums of ``n``
terms (the classical ``gamma_n`` bound); the per-stage tolerance is ``STAGE_FACTOR * n * u``
with ``n`` the stage's longest sum (``C``, ``K`` or ``K + C``; times the chunk count for the
sequential ``fwd_h``). ``solve_tril`` is judged by its backward error
``||(I + A) Ai - I|| / || |I + A| |Ai| ||``, bounded by ``C u`` for forward substitution whatever
the conditioning of ``I + A``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from gdn_verify.core import tolerance as tol
from gdn_verify.core.conventions import Packed, pack
from gdn_verify.core.implementation import Implementation
from gdn_verify.core.oracle import numpy_oracle
from gdn_verify.core.problem import Problem
from gdn_verify.core.property import Violation
from gdn_verify.core.reference import unit_lower_inverse
from gdn_verify.core.verdict import run_checked

STAGES = ("cumsum", "kkt", "solve_tril", "w_u", "fwd_h", "fwd_o")
STAGE_FACTOR = 4.0  # covers rounding the float64 stage inputs to the working precision too
LOCALISE_CHUNK = 64


# (a) localisation ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Localisation:
    kind: str  # "output", "state", "none" or "contract" (the outputs cannot be compared: ``detail`` says why)
    error: float
    bound: float
    token: int | None = None  # flat B*T index
    sequence: int | None = None
    position: int | None = None  # token index within its sequence
    chunk: int | None = None  # position // 64
    head: int | None = None  # value head
    detail: str = ""

    def describe(self) -> str:
        if self.kind == "contract":
            return f"nothing to localise: {self.detail}"
        if self.kind == "none":
            return f"no token or state crosses the tolerance (worst {self.error:.3g} vs {self.bound:.3g})"
        if self.kind == "state":
            return (
                f"outputs within tolerance; final state of sequence {self.sequence}, value head {self.head} "
                f"off by {self.error:.3g} > {self.bound:.3g}"
            )
        return (
            f"first token over the tolerance: sequence {self.sequence}, token {self.position} (flat {self.token}),"
            f" chunk {self.chunk} ({LOCALISE_CHUNK}-token chunks), value head {self.head}: "
            f"error {self.error:.3g} > {self.bound:.3g}"
        )


def localise(impl: Implementation, problem: Problem) -> Localisation:
    """Where ``impl``'s outputs on ``problem`` first leave the tolerance of the float64 oracle (kind
    ``contract`` when they break the output contract, so that there is nothing to compare)."""
    reference = numpy_oracle(problem)
    tolerance = tol.tolerance(problem, tol.condition(problem, reference))
    try:
        result = run_checked(impl, problem)
    except Violation as exc:
        return Localisation("contract", float("nan"), tolerance.output_token, detail=str(exc))
    errors = tol.token_errors(result.o, reference[0], problem.bounds)
    over = ~(errors <= tolerance.output_token)  # NaN counts as over
    if over.any():
        token, head = (int(x) for x in np.argwhere(over)[0])  # row-major: earliest token, then lowest head
        sequence = int(np.searchsorted(problem.bounds, token, side="right") - 1)
        position = token - int(problem.bounds[sequence])
        return Localisation(
            "output",
            float(errors[token, head]),
            tolerance.output_token,
            token,
            sequence,
            position,
            position // LOCALISE_CHUNK,
            head,
        )
    if problem.output_final_state and result.final_state is not None:
        state = np.asarray(result.final_state, np.float64)
        ref_state = reference[1]
        if problem.state_v_first:
            state, ref_state = state.swapaxes(-1, -2), ref_state.swapaxes(-1, -2)
        err, where = tol.state_errors(state, ref_state, problem.initial_state)
        if not err <= tolerance.state:
            return Localisation("state", err, tolerance.state, sequence=where[0], head=where[1])
    worst = float(np.nanmax(errors, initial=0.0))
    return Localisation("none", worst, tolerance.output_token)


def replay_diagnosis(case: str, impl: Implementation) -> str:
    """``replay --diagnose``: the localisation of a saved case, then, for an implementation that
    exposes its stages (``impl.extra["stages"]``, a :class:`StagedImplementation`), the stage table."""
    problem, _ = Problem.load(case)
    try:
        text = "diagnosis: " + localise(impl, problem).describe()
    except Exception as exc:  # noqa: BLE001 - the kernel's exception is the replay's verdict, already printed
        return f"diagnosis: none, the call raised {type(exc).__name__}: {exc}"
    stages = impl.extra.get("stages")
    if stages is not None:
        try:
            text += "\n" + diagnose(stages, problem).describe()
        except Exception as exc:  # noqa: BLE001 - a broken stage hook must not hide the localisation
            text += f"\nstage comparison failed: {type(exc).__name__}: {exc}"
    return text


# (b) stages ----------------------------------------------------------------------------------------
class StagedImplementation(Protocol):
    """A chunked implementation exposing its stages (layouts in the module docstring)."""

    chunk_size: int
    working_unit_roundoff: float

    def cumsum(self, g: np.ndarray) -> np.ndarray: ...
    def kkt(self, k: np.ndarray, beta: np.ndarray, G: np.ndarray) -> np.ndarray: ...
    def solve_tril(self, A: np.ndarray) -> np.ndarray: ...
    def w_u(self, k, v, beta, Ai, G) -> tuple[np.ndarray, np.ndarray]: ...
    def fwd_h(self, k, W, U, G, initial_state) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
    def fwd_o(self, q, k, v_new, h, G, scale: float) -> np.ndarray: ...


def _chunks(x: np.ndarray, C: int) -> np.ndarray:
    """``[N, L, HV, ...]`` -> ``[N, HV, n, C, ...]`` (chunk-major per head)."""
    N, L, HV = x.shape[:3]
    return np.moveaxis(x.reshape((N, L // C, C, HV) + x.shape[3:]), 3, 1)


def _unchunks(x: np.ndarray) -> np.ndarray:
    """Inverse of :func:`_chunks`."""
    N, HV, n, C = x.shape[:4]
    return np.moveaxis(x, 1, 3).reshape((N, n * C, HV) + x.shape[4:])


class StageAlgebra:
    """The stages written from the oracle's algebra, in any floating dtype (NumPy, no element loops)."""

    def __init__(self, chunk_size: int = 64, dtype=np.float32):
        self.chunk_size = chunk_size
        self.dtype = np.dtype(dtype)
        self.working_unit_roundoff = tol.unit_roundoff(self.dtype)

    def _as(self, *xs):
        return [np.asarray(x, self.dtype) for x in xs]

    def _gamma(self, G):
        """``exp(G_i - G_j)`` on and below the diagonal, 0 above (``G`` chunked ``[N, HV, n, C]``)."""
        C = self.chunk_size
        causal = np.tril(np.ones((C, C), bool))
        with np.errstate(over="ignore", invalid="ignore"):
            return np.where(causal, np.exp(np.where(causal, G[..., :, None] - G[..., None, :], 0.0)), 0.0)

    def cumsum(self, g):
        (g,) = self._as(g)
        return _unchunks(np.cumsum(_chunks(g, self.chunk_size), axis=-1))

    def kkt(self, k, beta, G):
        k, beta, G = self._as(k, beta, G)
        C = self.chunk_size
        kc, bc = _chunks(k, C), _chunks(beta, C)
        A = bc[..., :, None] * (kc @ kc.swapaxes(-1, -2)) * self._gamma(_chunks(G, C))
        return _unchunks(np.tril(A, -1).astype(self.dtype))

    def solve_tril(self, A):
        (A,) = self._as(A)
        return _unchunks(unit_lower_inverse(_chunks(A, self.chunk_size)))

    def w_u(self, k, v, beta, Ai, G):
        k, v, beta, Ai, G = self._as(k, v, beta, Ai, G)
        C = self.chunk_size
        Aic, bc, Gc = _chunks(Ai, C), _chunks(beta, C), _chunks(G, C)
        W = Aic @ ((bc * np.exp(Gc))[..., None] * _chunks(k, C))
        U = Aic @ (bc[..., None] * _chunks(v, C))
        return _unchunks(W), _unchunks(U)

    def fwd_h(self, k, W, U, G, initial_state):
        k, W, U, G, S = self._as(k, W, U, G, initial_state)
        C = self.chunk_size
        kc, Wc, Uc, Gc = (_chunks(x, C) for x in (k, W, U, G))
        N, HV, n = Gc.shape[:3]
        h = np.empty((N, HV, n) + S.shape[-2:], self.dtype)
        v_new = np.empty_like(Uc)
        for c in range(n):  # sequential over chunks only
            h[:, :, c] = S
            v_new[:, :, c] = Uc[:, :, c] - Wc[:, :, c] @ S
            k_to_end = kc[:, :, c] * np.exp(Gc[:, :, c, -1:] - Gc[:, :, c])[..., None]
            S = np.exp(Gc[:, :, c, -1])[..., None, None] * S + k_to_end.swapaxes(-1, -2) @ v_new[:, :, c]
        return np.moveaxis(h, 1, 2), _unchunks(v_new), S

    def fwd_o(self, q, k, v_new, h, G, scale):
        q, k, v_new, h, G = self._as(q, k, v_new, h, G)
        C = self.chunk_size
        qc, kc, vc, Gc = (_chunks(x, C) for x in (q, k, v_new, G))
        hc = np.moveaxis(h, 2, 1)
        o = scale * (np.exp(Gc)[..., None] * (qc @ hc) + ((qc @ kc.swapaxes(-1, -2)) * self._gamma(Gc)) @ vc)
        return _unchunks(o.astype(self.dtype))


class NumpyStaged(StageAlgebra):
    """The float32 NumPy staged implementation (``StageAlgebra`` in float32)."""

    def __init__(self, chunk_size: int = 64):
        super().__init__(chunk_size, np.float32)


# float64 references with magnitudes ------------------------------------------------------------------
@dataclass(frozen=True)
class StageReport:
    stage: str
    error: float
    bound: float

    @property
    def diverges(self) -> bool:
        return not self.error <= self.bound


@dataclass(frozen=True)
class Diagnosis:
    stages: list[StageReport]

    @property
    def first_divergent(self) -> str | None:
        return next((s.stage for s in self.stages if s.diverges), None)

    def describe(self) -> str:
        lines = [
            f"  {s.stage:<11} error {s.error:.3g}  bound {s.bound:.3g}  {'DIVERGES' if s.diverges else 'ok'}"
            for s in self.stages
        ]
        head = f"first divergent stage: {self.first_divergent}" if self.first_divergent else "all stages within bound"
        return "\n".join([head] + lines)


def _block_error(x, ref, mag, head_axis: int = 2) -> float:
    """Worst (sequence, head) ``||x - ref|| / ||mag||``; ``head_axis`` is HV's axis (NaN -> inf)."""
    diff = np.moveaxis(np.asarray(x, np.float64) - ref, head_axis, 1)
    mag = np.moveaxis(np.asarray(mag, np.float64), head_axis, 1)
    axes = tuple(range(2, diff.ndim))
    num = np.sqrt(np.sum(diff**2, axis=axes))
    den = np.sqrt(np.sum(mag**2, axis=axes))
    den = np.maximum(den, max(tol.FLOOR * float(np.sqrt(np.mean(den**2))), 1e-300))
    rel = num / den
    return float("inf") if np.isnan(rel).any() else float(rel.max(initial=0.0))


def _packed(problem: Problem, C: int) -> Packed:
    return pack(
        problem.q,
        problem.k,
        problem.v,
        problem.g,
        problem.beta,
        problem.scale,
        problem.initial_state,
        problem.use_qk_l2norm_in_kernel,
        problem.state_v_first,
        problem.cu_seqlens,
        pad_to_multiple=C,
    )


def _stage(stage: str, got, *want: np.ndarray):
    """A stage hook's return held to its layout: as many arrays as the reference's, each of its
    shape (one array alone when ``want`` has one); a ``ValueError`` naming the stage and both
    shapes otherwise, rather than a broadcasting error deep in the comparison."""
    parts = (got,) if len(want) == 1 else got
    if len(want) > 1 and (not isinstance(got, (tuple, list)) or len(got) != len(want)):
        raise ValueError(f"stage {stage} returned {type(got).__name__}, expected {len(want)} arrays")
    for x, ref in zip(parts, want):
        if np.shape(x) != ref.shape:
            raise ValueError(f"stage {stage} returned shape {np.shape(x)}, expected {ref.shape}")
    return got


def diagnose(staged: StagedImplementation, problem: Problem) -> Diagnosis:
    """Compare each stage of ``staged`` on ``problem`` with the float64 references (see module doc)."""
    C, u = staged.chunk_size, staged.working_unit_roundoff
    p = _packed(problem, C)
    K = p.q.shape[-1]
    ref = StageAlgebra(C, np.float64)
    n_chunks = p.q.shape[1] // C
    bound = {"cumsum": C, "kkt": K, "solve_tril": C, "w_u": C, "fwd_h": (K + C) * n_chunks, "fwd_o": K + C}
    reports = []

    def report(stage, err):
        reports.append(StageReport(stage, err, STAGE_FACTOR * bound[stage] * u))

    absk, absq, absv = np.abs(p.k), np.abs(p.q), np.abs(p.v)

    G = ref.cumsum(p.g)
    report("cumsum", _block_error(_stage("cumsum", staged.cumsum(p.g), G), G, ref.cumsum(np.abs(p.g))))

    A = ref.kkt(p.k, p.beta, G)
    Gc = _chunks(np.abs(G), C)
    gate_slack = _unchunks(1.0 + Gc[..., :, None] + Gc[..., None, :])  # exp of a difference of rounded sums
    report("kkt", _block_error(_stage("kkt", staged.kkt(p.k, p.beta, G), A), A, ref.kkt(absk, p.beta, G) * gate_slack))

    Ai = ref.solve_tril(A)
    Ai_got = _chunks(np.asarray(_stage("solve_tril", staged.solve_tril(A), A), np.float64), C)
    eye = np.eye(C)
    lhs = eye + _chunks(A, C)
    residual = lhs @ Ai_got - eye
    report("solve_tril", _block_error(_unchunks(residual), 0.0, _unchunks(np.abs(lhs) @ np.abs(Ai_got))))

    W, U = ref.w_u(p.k, p.v, p.beta, Ai, G)
    W_got, U_got = _stage("w_u", staged.w_u(p.k, p.v, p.beta, Ai, G), W, U)
    W_mag, U_mag = ref.w_u(absk * (1.0 + np.abs(G))[..., None], absv, p.beta, np.abs(Ai), G)
    report("w_u", max(_block_error(W_got, W, W_mag), _block_error(U_got, U, U_mag)))

    h, v_new, final = ref.fwd_h(p.k, W, U, G, p.initial_state)
    h_got, v_new_got, final_got = _stage("fwd_h", staged.fwd_h(p.k, W, U, G, p.initial_state), h, v_new, final)
    h_mag, v_mag, final_mag = _fwd_h_magnitudes(ref, absk, np.abs(W), np.abs(U), G, np.abs(p.initial_state))
    report(
        "fwd_h",
        max(
            _block_error(h_got, h, h_mag),
            _block_error(v_new_got, v_new, v_mag),
            _block_error(final_got, final, final_mag, head_axis=1),
        ),
    )

    o = ref.fwd_o(p.q, p.k, v_new, h, G, p.scale)
    o_mag = ref.fwd_o(absq * (1.0 + np.abs(G))[..., None], absk, np.abs(v_new), np.abs(h), G, abs(p.scale))
    report(
        "fwd_o",
        _block_error(
            _stage("fwd_o", staged.fwd_o(p.q, p.k, v_new, h, G, p.scale), o),
            o,
            o_mag * gate_slack.max(axis=-1, keepdims=True),
        ),
    )
    return Diagnosis(reports)


def _fwd_h_magnitudes(ref: StageAlgebra, absk, absW, absU, G, absS):
    """Magnitudes of the state recurrence: the same recurrence with |.| inputs and ``U + W h`` for ``v_new``.

    The gate factors ``exp(G_C - G_j)`` carry the slack ``1 + |G_C| + |G_j|`` of exponentiating a
    difference of rounded cumulative sums (FLA's form; large after a saturated gate).
    """
    C = ref.chunk_size
    kc, Wc, Uc, Gc = (_chunks(x, C) for x in (absk, absW, absU, G))
    slack = 1.0 + np.abs(Gc[..., -1:]) + np.abs(Gc)  # [N, HV, n, C]
    N, HV, n = Gc.shape[:3]
    h = np.empty((N, HV, n) + absS.shape[-2:])
    v_new = np.empty_like(Uc)
    S = absS.astype(np.float64)
    for c in range(n):
        h[:, :, c] = S
        v_new[:, :, c] = Uc[:, :, c] + Wc[:, :, c] @ S
        k_to_end = kc[:, :, c] * (np.exp(Gc[:, :, c, -1:] - Gc[:, :, c]) * slack[:, :, c])[..., None]
        decay = np.exp(Gc[:, :, c, -1]) * slack[:, :, c, -1]
        S = decay[..., None, None] * S + k_to_end.swapaxes(-1, -2) @ v_new[:, :, c]
    return np.moveaxis(h, 1, 2), _unchunks(v_new), S
