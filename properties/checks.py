"""The named GDN properties. Each takes an implementation, a problem and drawn parameters.

A check returns a :class:`Measurement` (the worst error it saw and the bound it held it to)
or raises :class:`Violation`. ``NotImplementedError`` from the implementation propagates and
means "unsupported". Properties compare against the float64 oracle with the tolerance model
of ``gdn_verify.tolerance`` unless they state an exact (bitwise) contract.

1.  ``matches_reference``       outputs and final state within tolerance of the oracle.
2.  ``varlen_equals_separate``  a packed varlen call equals calling each sequence alone.
3.  ``no_cross_sequence_leak``  changing one sequence leaves the others bitwise unchanged.
4.  ``state_continuation``      [0, t) then [t, T) from the first final state equals one call.
5.  ``gate_extremes``           no decay, strong, saturated (-1e4) gates: finite, within tolerance.
6.  ``head_mapping``            with HV > H, value head h uses q/k head h // (HV // H).
7.  ``determinism``             two identical calls return bitwise identical results.
8.  ``error_growth``            error vs T: fitted growth exponent at most GROWTH_BOUND.
9.  ``linearity``               jointly linear in (v, initial_state); o(2q) = 2 o(q).
10. ``output_contract``         documented shapes and dtypes; final state exactly when asked.
11. ``chunk_equals_recurrent``  an implementation's chunked and recurrent forms agree.
12. ``in_kernel_gate``          ``use_gate_in_kernel``: raw ``g`` with ``A_log``/``dt_bias`` (FLA 0.6).
13. ``in_kernel_beta_sigmoid``  ``use_beta_sigmoid_in_kernel``, with and without ``allow_neg_eigval``.
14. ``state_layout``            ``state_v_first`` gives the k-first results with the state transposed.

12 to 14 exercise FLA 0.6 options; an implementation without them reports them unsupported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from gdn_verify import gating
from gdn_verify import tolerance as tol
from gdn_verify.implementations import ContractError, Implementation, Result
from gdn_verify.problem import DTYPES, Problem
from properties import strategies as gs

# Rounding error that adds up like a random walk grows as T^0.5; a fitted exponent above
# 0.75 means errors add coherently (a biased rounding, a gate or beta rounded the same way
# every token) and will dominate at long context.
GROWTH_BOUND = 0.75
GROWTH_LENGTHS = tuple(2**n for n in range(6, 17))  # 64 .. 65536, capped by --max-tokens


@dataclass(frozen=True)
class Measurement:
    """The worst error and the bound it was held to. ``uniform``: the uniform model's part of
    ``bound`` (``bound`` adds the algorithm-aware term); ``note``: one line when an error lies
    between the two, naming the rounding that puts it there."""

    error: float
    bound: float
    detail: str = ""
    uniform: float | None = None
    note: str = ""

    @property
    def ratio(self) -> float:
        return self.error / self.bound if self.bound > 0 else (0.0 if self.error == 0 else float("inf"))

    @property
    def uniform_ratio(self) -> float:
        """Error over the uniform bound (``ratio`` where there is no algorithm-aware term)."""
        if self.uniform is None:
            return self.ratio
        return self.error / self.uniform if self.uniform > 0 else (0.0 if self.error == 0 else float("inf"))


class Violation(AssertionError):
    def __init__(self, message: str, measurement: Measurement | None = None):
        super().__init__(message)
        self.measurement = measurement


@dataclass(frozen=True)
class Property:
    name: str
    summary: str
    strategy: Callable[[Implementation, str], st.SearchStrategy]  # -> (problem, params)
    check: Callable[[Implementation, Problem, dict], Measurement]
    max_examples: int = 40
    unsupported_by: Callable[[Implementation], str | None] = lambda impl: None  # reason, or None when it applies


def output_contract_violations(result: Result, problem: Problem) -> list[str]:
    """Shape and dtype contract of ``(o, final_state)`` for ``problem``."""
    s = problem.shape
    problems = []
    want_o = (s["B"], s["T"], s["HV"], s["V"])
    if result.o is None or tuple(np.shape(result.o)) != want_o:
        problems.append(f"o has shape {None if result.o is None else tuple(np.shape(result.o))}, expected {want_o}")
    if result.o_dtype != np.dtype(problem.dtype).name:
        problems.append(f"o has dtype {result.o_dtype}, expected the input dtype {np.dtype(problem.dtype).name}")
    if problem.output_final_state:
        want_s = (s["N"], s["HV"], s["V"], s["K"]) if problem.state_v_first else (s["N"], s["HV"], s["K"], s["V"])
        if result.final_state is None:
            problems.append("final_state is None although output_final_state=True")
        elif tuple(np.shape(result.final_state)) != want_s:
            problems.append(f"final_state has shape {tuple(np.shape(result.final_state))}, expected {want_s}")
        elif result.state_dtype != "float32":
            problems.append(f"final_state has dtype {result.state_dtype}, expected float32")
    elif result.final_state is not None:
        problems.append("final_state returned although output_final_state=False")
    return problems


def run_checked(impl: Implementation, problem: Problem, form: str | None = None, options: dict | None = None
                ) -> Result:
    """Run ``impl``; a wrong output shape or type is a :class:`Violation`, not a crash."""
    try:
        result = impl.run(problem, form, options)
    except ContractError as exc:
        raise Violation(f"output contract: {exc}") from None
    shape_problems = [p for p in output_contract_violations(result, problem) if "dtype" not in p]
    if shape_problems:
        raise Violation("output contract: " + "; ".join(shape_problems))
    return result


def _as64(x):
    return None if x is None else np.asarray(x, np.float64)


def _state_kfirst(state, problem: Problem):
    return None if state is None else (state.swapaxes(-1, -2) if problem.state_v_first else state)


def compare(problem: Problem, result: Result, reference: tuple, tolerance: tol.Tolerance, factor: float = 1.0,
            what: str = "oracle") -> Measurement:
    """Errors of ``result`` against ``reference`` (NumPy ``(o, final_state)``) within ``factor * tolerance``."""
    if not np.all(np.isfinite(_as64(result.o))):
        raise Violation(f"non-finite output values (NaN/Inf) where the {what} is finite")
    if result.final_state is not None and not np.all(np.isfinite(_as64(result.final_state))):
        raise Violation(f"non-finite final state values where the {what} is finite")
    errors = tol.measure(result.o, _state_kfirst(_as64(result.final_state), problem), reference[0],
                         _state_kfirst(_as64(reference[1]), problem), problem)
    bound = tolerance.scaled(factor)
    bad = bound.violations(errors)
    ratios = [errors.output_rms / bound.output_rms, errors.output_token / bound.output_token,
              errors.state / bound.state if bound.state else 0.0]
    worst = int(np.argmax(ratios))
    name = tol.METRICS[worst]
    note = bound.note(errors)
    m = Measurement(getattr(errors, name), getattr(bound, name), f"{name} vs {what}", bound.uniform(name), note)
    if bad:
        where = []
        if errors.worst_token is not None and worst < 2:
            where.append(f"worst token {errors.worst_token[0]} (flat B*T index), value head {errors.worst_token[1]}")
        if errors.worst_sequence is not None and worst == 2:
            where.append(f"worst final state: sequence {errors.worst_sequence[0]}, value head "
                         f"{errors.worst_sequence[1]}")
        raise Violation(f"{'; '.join(bad)} (against the {what}; kappa_o={tolerance.kappa_output:.3g}, "
                        f"kappa_s={tolerance.kappa_state:.3g}){'; ' + '; '.join(where) if where else ''}", m)
    return m


def oracle_and_tolerance(problem: Problem) -> tuple[tuple, tol.Tolerance]:
    reference = tol.oracle(problem)
    ref_state = reference[1] if problem.output_final_state else None
    return (reference[0], ref_state), tol.tolerance(problem, tol.condition(problem, reference))


def _no_params(problem_strategy: st.SearchStrategy) -> st.SearchStrategy:
    return problem_strategy.map(lambda p: (p, {}))


# 1. matches_reference -------------------------------------------------------------------------
def check_matches_reference(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    reference, tolerance = oracle_and_tolerance(problem)
    return compare(problem, run_checked(impl, problem), reference, tolerance)


def strategy_matches_reference(impl: Implementation, dtype: str) -> st.SearchStrategy:
    return _no_params(gs.problems(dtype=dtype, state_layouts=True))


# 2. varlen_equals_separate --------------------------------------------------------------------
def sequence_alone(problem: Problem, n: int) -> Problem:
    """Sequence ``n`` of a varlen pack as a call of its own (``cu_seqlens = [0, L]``)."""
    start, end = problem.bounds[n], problem.bounds[n + 1]

    def part(x):
        return x[:, start:end]

    state = None if problem.initial_state is None else problem.initial_state[n : n + 1]
    return problem.replace(q=part(problem.q), k=part(problem.k), v=part(problem.v), g=part(problem.g),
                           beta=part(problem.beta), initial_state=state,
                           cu_seqlens=np.array([0, end - start], np.int64))


def check_varlen_equals_separate(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    _, tolerance = oracle_and_tolerance(problem)
    packed = run_checked(impl, problem)
    worst = Measurement(0.0, tolerance.output_rms, "no sequence to compare")
    for n, length in enumerate(problem.lengths):
        if length == 0:
            continue
        alone_problem = sequence_alone(problem, n)
        alone = run_checked(impl, alone_problem)
        packed_part = _sequence_part(packed, problem, n)
        try:
            m = compare(alone_problem, packed_part, (_as64(alone.o), _as64(alone.final_state)), tolerance,
                        factor=2.0, what=f"same sequence ({n}) run alone")
        except Violation as exc:
            raise Violation(f"sequence {n} of {problem.num_sequences}: {exc}", exc.measurement) from None
        worst = max(worst, m, key=lambda x: x.ratio)
    return worst


def strategy_varlen(impl: Implementation, dtype: str) -> st.SearchStrategy:
    return _no_params(gs.problems(dtype=dtype, varlen=True))


# 3. no_cross_sequence_leak --------------------------------------------------------------------
def perturb_sequence(problem: Problem, n: int, seed: int) -> Problem:
    """New random inputs (and initial state) for sequence ``n`` only, same dtype and regime."""
    rng = np.random.default_rng(seed)
    start, end = problem.bounds[n], problem.bounds[n + 1]
    flat = {name: np.asarray(getattr(problem, name)).reshape((-1,) + getattr(problem, name).shape[2:]).copy()
            for name in ("q", "k", "v", "g", "beta")}
    length = end - start
    dtype = problem.dtype
    shape = flat["v"].shape[1:]
    flat["q"][start:end] = rng.standard_normal((length,) + flat["q"].shape[1:]).astype(dtype)
    flat["k"][start:end] = gs.unit_rows(rng, (length,) + flat["k"].shape[1:]).astype(dtype)
    flat["v"][start:end] = rng.standard_normal((length,) + shape).astype(dtype)
    flat["g"][start:end] = np.log(rng.uniform(0.5, 1.0, (length, shape[0]))).astype(dtype)
    flat["beta"][start:end] = rng.uniform(0, 1, (length, shape[0])).astype(dtype)
    changes = {name: x.reshape(getattr(problem, name).shape) for name, x in flat.items()}
    if problem.initial_state is not None:
        state = problem.initial_state.copy()
        state[n] = rng.standard_normal(state.shape[1:]).astype(np.float32)
        changes["initial_state"] = state
    return problem.replace(**changes)


def check_no_cross_sequence_leak(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    """Bitwise for deterministic implementations; within tolerance when repeated calls differ
    (that is ``determinism``'s finding, not a leak)."""
    n = params["victim"] % problem.num_sequences
    before = run_checked(impl, problem)
    exact = _same(before, run_checked(impl, problem))
    after = run_checked(impl, perturb_sequence(problem, n, params["seed"]))
    tolerance = None if exact else oracle_and_tolerance(problem)[1]
    worst = Measurement(0.0, 0.0, "bitwise") if exact else Measurement(0.0, tolerance.output_rms, "within tolerance")
    for m in range(problem.num_sequences):
        if m == n or (problem.lengths[m] == 0 and before.final_state is None):
            continue
        alone = sequence_alone(problem, m)
        parts = [_sequence_part(r, problem, m) for r in (before, after)]
        if exact:
            if not _same(*parts):
                diff = max(np.nanmax(np.abs(_as64(a) - _as64(b)), initial=0.0) for a, b in
                           ((parts[0].o, parts[1].o), (parts[0].final_state, parts[1].final_state)) if a is not None)
                raise Violation(f"changing sequence {n} changed the outputs or final state of sequence {m} "
                                f"(max change {diff:.3g})", Measurement(float(diff), 0.0))
            continue
        try:
            got = compare(alone, parts[1], (_as64(parts[0].o), _as64(parts[0].final_state)), tolerance, factor=2.0,
                          what=f"sequence {m} before sequence {n} was changed")
        except Violation as exc:
            raise Violation(f"changing sequence {n} changed sequence {m}: {exc}", exc.measurement) from None
        worst = max(worst, got, key=lambda x: x.ratio)
    return worst


def _same(a: Result, b: Result) -> bool:
    return all((x is None and y is None) or (x is not None and y is not None and
                                             np.asarray(x).tobytes() == np.asarray(y).tobytes())
               for x, y in ((a.o, b.o), (a.final_state, b.final_state)))


def _sequence_part(r: Result, problem: Problem, n: int) -> Result:
    start, end = problem.bounds[n], problem.bounds[n + 1]
    o = np.asarray(r.o).reshape((1, -1) + r.o.shape[2:])[:, start:end]
    state = None if r.final_state is None else r.final_state[n : n + 1]
    return Result(o, state, r.o_dtype, r.state_dtype)


def strategy_leak(impl: Implementation, dtype: str) -> st.SearchStrategy:
    return st.tuples(gs.problems(dtype=dtype, varlen=True),
                     st.fixed_dictionaries({"victim": st.integers(0, 7), "seed": st.integers(0, 2**31)}))


# 4. state_continuation ------------------------------------------------------------------------
def split_tokens(problem: Problem, start: int, end: int, initial_state) -> Problem:
    def part(x):
        return x[:, start:end]

    return problem.replace(q=part(problem.q), k=part(problem.k), v=part(problem.v), g=part(problem.g),
                           beta=part(problem.beta), initial_state=initial_state, output_final_state=True)


def check_state_continuation(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    T = problem.q.shape[1]
    t = min(params["split"], T)
    _, tolerance = oracle_and_tolerance(problem)
    whole = run_checked(impl, problem)
    first = run_checked(impl, split_tokens(problem, 0, t, problem.initial_state))
    if first.final_state is None:
        raise Violation("no final state returned for the first part although output_final_state=True")
    second = run_checked(impl, split_tokens(problem, t, T, np.asarray(first.final_state, np.float32)))
    o = np.concatenate([_as64(first.o), _as64(second.o)], axis=1).astype(np.float64)
    joined = Result(o, second.final_state, whole.o_dtype, second.state_dtype)
    try:
        return compare(problem, joined, (_as64(whole.o), _as64(whole.final_state)), tolerance, factor=2.0,
                       what=f"one call over all {T} tokens")
    except Violation as exc:
        raise Violation(f"split at token {t}: {exc}", exc.measurement) from None


@st.composite
def _continuation_case(draw, dtype: str):
    problem = draw(gs.problems(dtype=dtype, varlen=False, max_len=200, state_layouts=True))
    C = draw(st.sampled_from(gs.CHUNK_SIZES))
    T = problem.q.shape[1]
    split = draw(st.one_of(st.sampled_from([C, C - 1, C + 1, 2 * C]), st.integers(0, max(T, 0))))
    return problem.replace(output_final_state=True), {"split": split}


def strategy_continuation(impl: Implementation, dtype: str) -> st.SearchStrategy:
    return _continuation_case(dtype)


# 5. gate_extremes -----------------------------------------------------------------------------
def strategy_gate_extremes(impl: Implementation, dtype: str) -> st.SearchStrategy:
    return _no_params(gs.problems(dtype=dtype, gate_regimes=("none", "strong", "spikes", "strong_run", "mixed")))


# 6. head_mapping ------------------------------------------------------------------------------
def expand_heads(problem: Problem) -> Problem:
    """The same problem with q/k repeated so that ``H == HV`` (the documented GVA mapping)."""
    s = problem.shape
    heads = np.arange(s["HV"]) // (s["HV"] // s["H"])
    return problem.replace(q=problem.q[:, :, heads], k=problem.k[:, :, heads])


def check_head_mapping(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    reference, tolerance = oracle_and_tolerance(problem)
    gva = run_checked(impl, problem)
    expanded = run_checked(impl, expand_heads(problem))
    try:
        compare(problem, gva, (_as64(expanded.o), _as64(expanded.final_state)), tolerance, factor=2.0,
                what="same implementation with q/k heads expanded to HV by h // (HV // H)")
    except Violation as exc:
        s = problem.shape
        raise Violation(f"H={s['H']}, HV={s['HV']}: {exc}", exc.measurement) from None
    return compare(problem, gva, reference, tolerance)


def strategy_head_mapping(impl: Implementation, dtype: str) -> st.SearchStrategy:
    heads = st.tuples(st.integers(2, 4), st.sampled_from((2, 4))).map(lambda t: (t[0], t[0] * t[1]))
    return _no_params(gs.problems(dtype=dtype, heads=heads, max_len=80))


# 7. determinism -------------------------------------------------------------------------------
def check_determinism(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    first, second = run_checked(impl, problem), run_checked(impl, problem)
    for name in ("o", "final_state"):
        a, b = getattr(first, name), getattr(second, name)
        if not _same(Result(a, None, None, None), Result(b, None, None, None)):
            diff = np.nanmax(np.abs(_as64(a) - _as64(b))) if a is not None and b is not None else float("nan")
            raise Violation(f"two identical calls returned different {name} (max difference {diff:.3g})",
                            Measurement(float(diff), 0.0))
    return Measurement(0.0, 0.0, "bitwise")


# 8. error_growth ------------------------------------------------------------------------------
def prefix(problem: Problem, T: int) -> Problem:
    return split_tokens(problem, 0, T, problem.initial_state)


def check_error_growth(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    lengths = [T for T in params["lengths"] if T <= problem.q.shape[1]]
    errors = []
    for T in lengths:
        part = prefix(problem, T)
        reference, tolerance = oracle_and_tolerance(part)
        result = run_checked(impl, part)
        try:
            compare(part, result, reference, tolerance)
        except Violation as exc:
            raise Violation(f"at T={T}: {exc}", exc.measurement) from None
        errors.append(tol.measure(result.o, None, reference[0], None, part).output_rms)
    floor = tol.unit_roundoff(problem.dtype)  # rounding the exact output alone costs up to this
    points = [(T, e) for T, e in zip(lengths, errors) if e > 0]
    if len(points) < 3 or max(errors) < 2 * floor:  # at the output rounding floor: nothing to fit
        return Measurement(0.0, GROWTH_BOUND, f"errors at the rounding floor: {errors}")
    slope = float(np.polyfit(np.log([p[0] for p in points]), np.log([p[1] for p in points]), 1)[0])
    table = ", ".join(f"T={T}: {e:.2e}" for T, e in zip(lengths, errors))
    m = Measurement(slope, GROWTH_BOUND, f"growth exponent; {table}")
    if slope > GROWTH_BOUND:
        raise Violation(f"error grows like T^{slope:.2f} (bound T^{GROWTH_BOUND}): {table}", m)
    return m


@st.composite
def _growth_case(draw, dtype: str, max_tokens: int):
    lengths = tuple(T for T in GROWTH_LENGTHS if T <= max_tokens) or (max_tokens,)
    problem = draw(gs.problems(dtype=dtype, varlen=False, max_len=1, max_dim=32,
                               heads=st.just((1, 2)), gate_regimes=("none", "mild")))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    T, (K, V) = lengths[-1], (problem.q.shape[-1], problem.v.shape[-1])
    k = rng.standard_normal((1, T, 1, K))
    k = k if problem.use_qk_l2norm_in_kernel else k / np.linalg.norm(k, axis=-1, keepdims=True)
    regime = draw(st.sampled_from(("none", "mild")))
    long = problem.replace(
        q=rng.standard_normal((1, T, 1, K)), k=k, v=rng.standard_normal((1, T, 2, V)),
        g=gs.gate_values(rng, (1, T, 2), regime), beta=rng.uniform(0, 1, (1, T, 2)),
        initial_state=None if problem.initial_state is None else problem.initial_state[:1],
        cu_seqlens=None, notes=dict(gate_regime=regime),
    )
    return long.astype(problem.dtype), {"lengths": list(lengths)}


def strategy_growth(impl: Implementation, dtype: str, max_tokens: int = 2048) -> st.SearchStrategy:
    return _growth_case(dtype, max_tokens)


# 9. linearity ---------------------------------------------------------------------------------
def check_linearity(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    rng = np.random.default_rng(params["seed"])
    dtype = problem.dtype
    v2 = rng.standard_normal(problem.v.shape).astype(dtype)
    s1 = problem.initial_state if problem.initial_state is not None else None
    s2 = None if s1 is None else rng.standard_normal(s1.shape).astype(np.float32)
    p2 = problem.replace(v=v2, initial_state=s2)
    v3 = (_as64(problem.v) + _as64(v2)).astype(dtype)
    p3 = problem.replace(v=v3, initial_state=None if s1 is None else (s1 + s2).astype(np.float32))
    r1, r2, r3 = run_checked(impl, problem), run_checked(impl, p2), run_checked(impl, p3)
    _, tolerance = oracle_and_tolerance(p3)
    expected_state = None if r1.final_state is None else _as64(r1.final_state) + _as64(r2.final_state)
    try:
        m = compare(p3, r3, (_as64(r1.o) + _as64(r2.o), expected_state), tolerance, factor=3.0,
                    what="sum of the outputs for (v1, S1) and (v2, S2)")
    except Violation as exc:
        raise Violation(f"not linear in (v, initial_state): {exc}", exc.measurement) from None
    if not problem.use_qk_l2norm_in_kernel:
        doubled = run_checked(impl, problem.replace(q=(_as64(problem.q) * 2).astype(dtype)))
        try:
            compare(problem, Result(_as64(doubled.o) / 2, r1.final_state, r1.o_dtype, r1.state_dtype),
                    (_as64(r1.o), _as64(r1.final_state)), tolerance, factor=3.0, what="output for q (halved 2q)")
        except Violation as exc:
            raise Violation(f"scaling q by 2 does not scale o by 2: {exc}", exc.measurement) from None
    return m


def strategy_linearity(impl: Implementation, dtype: str) -> st.SearchStrategy:
    return st.tuples(gs.problems(dtype=dtype, max_len=80), st.fixed_dictionaries({"seed": st.integers(0, 2**31)}))


# 10. output_contract --------------------------------------------------------------------------
def check_output_contract(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    try:
        result = impl.run(problem)
    except ContractError as exc:
        raise Violation(f"output contract: {exc}") from None
    bad = output_contract_violations(result, problem)
    if bad:
        raise Violation("output contract: " + "; ".join(bad))
    return Measurement(0.0, 0.0, "shapes and dtypes")


@st.composite
def _contract_case(draw, dtype: str):
    problem = draw(gs.problems(dtype=dtype, max_len=70, state_layouts=True))
    return problem.replace(output_final_state=draw(st.booleans())), {}


def strategy_contract(impl: Implementation, dtype: str) -> st.SearchStrategy:
    return _contract_case(dtype)


# 11. chunk_equals_recurrent -------------------------------------------------------------------
def check_chunk_equals_recurrent(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    if not {"chunk", "recurrent"} <= set(impl.forms):
        raise NotImplementedError(f"{impl.name} has no chunk and recurrent forms to compare")
    _, tolerance = oracle_and_tolerance(problem)
    chunk, recurrent = run_checked(impl, problem, "chunk"), run_checked(impl, problem, "recurrent")
    return compare(problem, chunk, (_as64(recurrent.o), _as64(recurrent.final_state)), tolerance, factor=2.0,
                   what="recurrent form of the same implementation")


# 12. in_kernel_gate ---------------------------------------------------------------------------
def raw_gate_inputs(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Raw gate projections ``a``: mostly N(0, 2), with +-30 spikes past softplus's threshold (20)."""
    a = rng.normal(0.0, 2.0, shape)
    pick = rng.uniform(size=shape)
    return np.where(pick < 0.05, -30.0, np.where(pick > 0.95, 30.0, a))


@st.composite
def _in_kernel_gate_case(draw, dtype: str):
    problem = draw(gs.problems(dtype=dtype, gate_regimes=("none",)))
    HV = problem.v.shape[2]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # Like Qwen3-Next's initialisation: A = exp(A_log) in [1, 16], dt_bias = softplus^-1(dt), dt in [1e-3, 0.1].
    A_log = np.log(rng.uniform(1.0, 16.0, HV)).astype(np.float32)
    dt = np.exp(rng.uniform(np.log(1e-3), np.log(0.1), HV))
    dt_bias = np.log(np.expm1(dt)).astype(np.float32) if draw(st.booleans()) else None
    a = raw_gate_inputs(rng, problem.g.shape).astype(problem.dtype)
    params = {"A_log": A_log.tolist(), "dt_bias": None if dt_bias is None else dt_bias.tolist()}
    return problem.replace(g=a), params


def gate_options(params: dict) -> dict:
    """Keyword arguments of the in-kernel option call from a case's JSON-ready ``params``."""
    options = {name: np.asarray(params[name], np.float32) for name in ("A_log", "dt_bias")
               if params.get(name) is not None}
    if "A_log" in options:
        options["use_gate_in_kernel"] = True
    if params.get("beta_logits"):
        options["use_beta_sigmoid_in_kernel"] = True
        if params.get("allow_neg_eigval"):
            options["allow_neg_eigval"] = True
    return options


def check_in_kernel_options(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    """The raw-input call against the oracle run on the native gates those inputs define."""
    options = gate_options(params)
    result = run_checked(impl, problem, options=options)
    g, beta = gating.in_kernel_gates(problem.g, problem.beta, **options)
    native = problem.replace(g=g, beta=beta)
    reference, tolerance = oracle_and_tolerance(native)
    flags = ", ".join(name for name, value in options.items() if value is True)
    return compare(native, result, reference, tolerance, what=f"oracle on the gates that {flags} define")


# 13. in_kernel_beta_sigmoid -------------------------------------------------------------------
@st.composite
def _beta_sigmoid_case(draw, dtype: str):
    problem = draw(gs.problems(dtype=dtype))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    logits = raw_gate_inputs(rng, problem.beta.shape).astype(problem.dtype)
    return problem.replace(beta=logits), {"beta_logits": True, "allow_neg_eigval": draw(st.booleans())}


# 14. state_layout -----------------------------------------------------------------------------
def check_state_layout(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    k_first = problem.replace(state_v_first=False)
    v_first = problem.replace(state_v_first=True, initial_state=np.ascontiguousarray(
        problem.initial_state.swapaxes(-1, -2)))
    transposed = run_checked(impl, v_first)  # first: an implementation without the layout stops here
    plain = run_checked(impl, k_first)
    reference, tolerance = oracle_and_tolerance(k_first)
    try:
        compare(v_first, transposed, (_as64(plain.o), _as64(plain.final_state).swapaxes(-1, -2)), tolerance,
                factor=2.0, what="same call with the k-first state layout")
    except Violation as exc:
        raise Violation(f"state_v_first=True: {exc}", exc.measurement) from None
    return compare(v_first, transposed, (reference[0], reference[1].swapaxes(-1, -2)), tolerance)


@st.composite
def _state_layout_case(draw, dtype: str):
    problem = draw(gs.problems(dtype=dtype, state_layouts=False))
    s = problem.shape
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    state = rng.standard_normal((s["N"], s["HV"], s["K"], s["V"])).astype(np.float32)
    return problem.replace(initial_state=state, output_final_state=True), {}


PROPERTIES: dict[str, Property] = {
    p.name: p
    for p in (
        Property("matches_reference", "outputs and final state within tolerance of the float64 oracle",
                 strategy_matches_reference, check_matches_reference, 100),
        Property("determinism", "identical calls return bitwise identical results",
                 lambda impl, dtype: _no_params(gs.problems(dtype=dtype, max_len=80)), check_determinism, 20),
        Property("varlen_equals_separate", "a packed varlen call equals each sequence alone",
                 strategy_varlen, check_varlen_equals_separate, 40),
        Property("no_cross_sequence_leak", "changing one sequence leaves the others bitwise unchanged",
                 strategy_leak, check_no_cross_sequence_leak, 40),
        Property("state_continuation", "[0,t) then [t,T) from its final state equals one call",
                 strategy_continuation, check_state_continuation, 50),
        Property("gate_extremes", "no decay, strong and saturated gates: finite and within tolerance",
                 strategy_gate_extremes, check_matches_reference, 60),
        Property("head_mapping", "value head h uses q/k head h // (HV // H)",
                 strategy_head_mapping, check_head_mapping, 30),
        Property("error_growth", f"error vs T grows at most like T^{GROWTH_BOUND}",
                 strategy_growth, check_error_growth, 4),
        Property("linearity", "jointly linear in (v, initial_state); o(2q) = 2 o(q)",
                 strategy_linearity, check_linearity, 30),
        Property("output_contract", "documented shapes and dtypes, final state exactly when asked",
                 strategy_contract, check_output_contract, 40),
        Property("chunk_equals_recurrent", "chunked and recurrent forms agree",
                 lambda impl, dtype: _no_params(gs.problems(dtype=dtype)), check_chunk_equals_recurrent, 30,
                 lambda impl: None if {"chunk", "recurrent"} <= set(impl.forms)
                 else f"{impl.name} has no chunk and recurrent forms to compare"),
        Property("in_kernel_gate", "use_gate_in_kernel: g = -exp(A_log) softplus(g + dt_bias) inside the kernel",
                 lambda impl, dtype: _in_kernel_gate_case(dtype), check_in_kernel_options, 40),
        Property("in_kernel_beta_sigmoid", "use_beta_sigmoid_in_kernel: beta = sigmoid(beta), x2 with allow_neg_eigval",
                 lambda impl, dtype: _beta_sigmoid_case(dtype), check_in_kernel_options, 40),
        Property("state_layout", "state_v_first: k-first results with the state transposed",
                 lambda impl, dtype: _state_layout_case(dtype), check_state_layout, 30),
    )
}

__all__ = ["PROPERTIES", "DTYPES", "Measurement", "Property", "Violation"]
