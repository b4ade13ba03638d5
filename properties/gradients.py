"""The gradient properties: a backward (``Implementation.run_backward``) against the float64 adjoint.

Every check draws a problem and a cotangent seed (``params["cotangent_seed"]``, with
``params["with_dht"]`` saying whether the final state has a cotangent), so a saved case
rebuilds its ``do`` and ``dht`` with ``core.gradients.cotangents``. Tolerances are those of
``core.grad_tolerance``; the exact contracts are stated as such.

1. ``grad_matches_reference``       dq, dk, dv, dg, dbeta, dh0 within tolerance of the oracle.
2. ``grad_varlen_equals_separate``  the gradients of a packed varlen call equal each sequence alone.
3. ``grad_padding_zero``            tokens past ``cu_seqlens[-1]`` get gradients exactly 0 (written,
                                    not left as whatever the buffer held).
4. ``grad_determinism``             two identical calls return bitwise identical gradients; else the
                                    size of the difference is named.
5. ``grad_gate_extremes``           no decay, strong and saturated gates, beta at 0 and 1.
6. ``grad_error_growth``            error vs T within tolerance at each T, growth exponent at most
                                    ``native.GROWTH_BOUND``.
7. ``grad_empty_sequences``         a call with no tokens, or a pack with empty sequences, runs and
                                    gives the oracle's gradients (an empty sequence's dh0 is its dht).

Properties 1-6 draw sequences of at least one token, so that a kernel which fails only on empty
sequences is named by property 7 instead of shrinking every other property to T = 0 (FLA 0.6's
backward on an H100, 2026-11-26). Property 7 runs last: a crash there can take the CUDA context
down with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
from hypothesis import strategies as st

from gdn_verify.core import grad_tolerance as gtol
from gdn_verify.core import tolerance as tol
from gdn_verify.core.error_stats import growth_exponent
from gdn_verify.core.grad_verdict import compare_gradients, run_backward_checked
from gdn_verify.core.gradients import cotangents
from gdn_verify.core.implementation import BACKWARD_FORM, GRADIENTS, Implementation
from gdn_verify.core.problem import Problem
from gdn_verify.core.property import Measurement, Property, Violation
from gdn_verify.properties import strategies as gs
from gdn_verify.properties.native import EXTREME_REGIMES, GROWTH_BOUND, against_alone, strategy_growth
from gdn_verify.properties.strategies import Limits

# Backward problems are shorter than forward ones: the oracle's adjoint costs about four forward
# passes, and a chunked backward compiles more kernels per shape class.
MAX_LEN = 96


def cotangent_params() -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({"cotangent_seed": st.integers(0, 2**31 - 1), "with_dht": st.booleans()})


def _with_cotangents(problems: st.SearchStrategy[Problem]) -> st.SearchStrategy:
    return st.tuples(problems, cotangent_params())


def gradients_of(impl: Implementation, problem: Problem, params: dict):
    """``(do, dht, gradients)`` for the property's drawn cotangents."""
    do, dht = cotangents(problem, params["cotangent_seed"], params["with_dht"])
    return do, dht, run_backward_checked(impl, problem, do, dht)


def _reference(problem: Problem, do: np.ndarray, dht: np.ndarray | None, dtypes: dict, seed: int):
    return gtol.grad_reference_and_tolerance(problem, do, dht, grad_dtypes=dtypes, seed=seed)


def _until_raises(function: Callable[[Any], Any], cases: Sequence[Any]) -> tuple[list, Exception | None]:
    """``function(case)`` of each case in order up to the first that raises: the results, and that
    exception (None: none raised). The checks that compare several problems run every kernel call
    first (here: they may need the GPU), then all the float64 references at once
    (``grad_tolerance.grad_references_and_tolerances``: side by side in worker processes when
    large), then compare in order; they raise a kernel's exception after the comparisons before
    it, as when each problem was compared in turn."""
    results = []
    for case in cases:
        try:
            results.append(function(case))
        except Exception as exc:  # raised again by the caller, after the comparisons before it
            return results, exc
    return results, None


# 1. grad_matches_reference ---------------------------------------------------------------------
def check_grad_matches_reference(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    do, dht, grads = gradients_of(impl, problem, params)
    reference, tolerance = _reference(problem, do, dht, grads.dtypes, params["cotangent_seed"])
    return compare_gradients(problem, grads.grads, reference, tolerance)


def strategy_grad_reference(limits: Limits, regimes=gs.GATE_REGIMES) -> st.SearchStrategy:
    return _with_cotangents(gs.problems(limits, max_len=MAX_LEN, gate_regimes=regimes, min_len=1))


# 2. grad_varlen_equals_separate ----------------------------------------------------------------
def _sequence_grads(grads: dict, problem: Problem, n: int) -> dict:
    start, end = problem.bounds[n], problem.bounds[n + 1]
    part = {}
    for name in GRADIENTS:
        x = grads[name]
        if x is None:
            part[name] = None
        elif name == "dh0":
            part[name] = x[n : n + 1]
        else:
            part[name] = np.asarray(x).reshape((1, -1) + x.shape[2:])[:, start:end]
    return part


def check_grad_varlen(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    do, dht, packed = gradients_of(impl, problem, params)
    cases = []  # (n, problem, do, dht) of each sequence with tokens, run alone
    for n, length in enumerate(problem.lengths):
        if length == 0:
            continue
        start, end = problem.bounds[n], problem.bounds[n + 1]
        cases.append((n, problem.sequence(n), do[:, start:end], None if dht is None else dht[n : n + 1]))
    runs, failure = _until_raises(lambda case: run_backward_checked(impl, *case[1:]), cases)
    bounds = gtol.grad_references_and_tolerances(
        [(p, p_do, p_dht, packed.dtypes, None) for (_, p, p_do, p_dht), _ in zip(cases, runs)],
        params["cotangent_seed"],
    )
    worst: Measurement | None = None
    for (n, alone_problem, _, _), alone, (_, tolerance) in zip(cases, runs, bounds):
        against = {k: None if x is None else np.asarray(x, np.float64) for k, x in alone.grads.items()}
        packed_part = _sequence_grads(packed.grads, problem, n)
        m = against_alone(problem, n, partial(compare_gradients, alone_problem, packed_part, against, tolerance))
        worst = m if worst is None or m.ratio > worst.ratio else worst
    if failure is not None:
        raise failure
    return worst or Measurement(0.0, 0.0, "no sequence to compare (every length is 0)")


def strategy_grad_varlen(limits: Limits) -> st.SearchStrategy:
    classes = gs.pool_classes(limits, varlen=True, twins=(gs.batched_twin,))
    return _with_cotangents(gs.problems(limits, max_len=MAX_LEN, varlen=True, classes=classes, min_len=1))


# 3. grad_padding_zero --------------------------------------------------------------------------
def padded(problem: Problem, extra: int, seed: int) -> Problem:
    """``problem`` (varlen) with ``extra`` tokens of random inputs appended after ``cu_seqlens[-1]``:
    the padding of a batch whose buffers are longer than its sequences."""
    rng = np.random.default_rng(seed)
    fields = {}
    for name in ("q", "k", "v", "g", "beta"):
        x = getattr(problem, name)
        tail = rng.standard_normal((1, extra) + x.shape[2:])
        if name == "g":
            tail = -np.abs(tail)
        elif name == "beta":
            tail = np.abs(np.tanh(tail))
        fields[name] = np.concatenate([x, tail.astype(x.dtype)], axis=1)
    return problem.replace(**fields)


def check_grad_padding(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    end = int(problem.bounds[-1])
    _, _, grads = gradients_of(impl, problem, params)
    for name in ("dq", "dk", "dv", "dg", "dbeta"):
        tail = np.asarray(grads.grads[name], np.float64)[:, end:]
        if tail.size and not (tail == 0).all():
            nan = int(np.isnan(tail).sum())
            what = f"{nan} NaN (unwritten: the buffer's poison)" if nan else f"largest {np.nanmax(np.abs(tail)):.3g}"
            raise Violation(
                f"{name} of the {tail.shape[1]} padding tokens after cu_seqlens[-1] = {end} is not zero: "
                f"{int((tail != 0).sum())} of {tail.size} entries nonzero, {what}",
                Measurement(float(np.nanmax(np.abs(np.nan_to_num(tail, nan=np.inf)))), 0.0),
            )
    return Measurement(0.0, 0.0, f"{problem.shape['T'] - end} padding tokens, gradients exactly 0")


@st.composite
def strategy_grad_padding(draw, limits: Limits):
    problem = draw(gs.problems(limits, max_len=MAX_LEN, varlen=True, min_len=1))
    extra = draw(st.sampled_from((1, 7, 64, 65)))
    return padded(problem, extra, draw(st.integers(0, 2**31 - 1))), draw(cotangent_params())


# 4. grad_determinism ---------------------------------------------------------------------------
def check_grad_determinism(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    do, dht, first = gradients_of(impl, problem, params)
    second = run_backward_checked(impl, problem, do, dht)
    for name in GRADIENTS:
        a, b = first.grads[name], second.grads[name]
        if a is None or b is None or np.asarray(a).tobytes() == np.asarray(b).tobytes():
            continue
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        diff = float(np.nanmax(np.abs(a64 - b64)))
        size = float(np.sqrt(np.mean(a64**2))) if a64.size else 0.0
        raise Violation(
            f"two identical calls returned different {name}: {int((a64 != b64).sum())} of {a64.size} entries differ, "
            f"by up to {diff:.3g} ({diff / size if size else float('inf'):.2g} of its RMS {size:.3g}): a summation "
            "whose order changes between calls (atomics, a split-K reduction) or a race",
            Measurement(diff, 0.0),
        )
    return Measurement(0.0, 0.0, "bitwise")


# 6. grad_error_growth --------------------------------------------------------------------------
# The adjoint costs about four forward passes: the longest gradient prefix is shorter than the forward's.
GRAD_GROWTH_MAX = 2048


def check_grad_error_growth(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    """Each prefix ``[0, T)`` at ``params["lengths"]`` within tolerance; then the fitted exponent of
    the worst gradient's error (as ``native.check_error_growth``; the retention regime is judged
    at each length only, its drift being coherent by construction)."""
    lengths = [n for n in params["lengths"] if n <= problem.shape["T"]]
    prefixes = [problem.tokens(0, length) for length in lengths]
    runs, failure = _until_raises(lambda prefix: gradients_of(impl, prefix, params), prefixes)
    references = gtol.grad_references_and_tolerances(
        [(prefix, do, dht, grads.dtypes, None) for prefix, (do, dht, grads) in zip(prefixes, runs)],
        params["cotangent_seed"],
    )
    points = []
    for length, prefix, (_, _, grads), (reference, tolerance) in zip(lengths, prefixes, runs, references):
        try:
            m = compare_gradients(prefix, grads.grads, reference, tolerance)
        except Violation as exc:
            raise Violation(f"at T={length}: {exc}", exc.measurement) from None
        points.append((length, m))
    if failure is not None:
        raise failure
    worst = max((m for _, m in points), key=lambda m: m.ratio, default=Measurement(0.0, GROWTH_BOUND))
    if params.get("regime") == "retention":
        return worst
    table = ", ".join(f"T={n}: {m.error:.3g}" for n, m in points)
    fitted = [(n, m.error) for n, m in points if m.error > 0]
    floor = tol.unit_roundoff(problem.dtype)
    if len(fitted) < 3 or max(e for _, e in fitted) < 2 * floor:
        return Measurement(0.0, GROWTH_BOUND, f"errors at the rounding floor: {table}")
    slope = growth_exponent([n for n, _ in fitted], [e for _, e in fitted])
    m = Measurement(slope, GROWTH_BOUND, f"growth exponent; {table}")
    if slope > GROWTH_BOUND:
        raise Violation(f"gradient error grows like T^{slope:.3g} (bound T^{GROWTH_BOUND}): {table}", m)
    return m


def strategy_grad_growth(limits: Limits) -> st.SearchStrategy:
    capped = limits.replace(max_tokens=min(limits.max_tokens, GRAD_GROWTH_MAX))
    return st.tuples(strategy_growth(capped), cotangent_params()).map(lambda t: (t[0][0], {**t[0][1], **t[1]}))


# 7. grad_empty_sequences -----------------------------------------------------------------------
def with_empty_sequence(problem: Problem, position: int, seed: int) -> Problem:
    """``problem`` (varlen) with an empty sequence inserted before sequence ``position`` (with an
    initial state of its own when the problem has one)."""
    cu = np.asarray(problem.cu_seqlens, np.int64)
    changes: dict = {"cu_seqlens": np.insert(cu, position, cu[position])}
    if problem.initial_state is not None:
        state = problem.initial_state
        row = np.random.default_rng(seed).standard_normal((1,) + state.shape[1:]).astype(state.dtype)
        changes["initial_state"] = np.concatenate([state[:position], row, state[position:]])
    return problem.replace(**changes)


@st.composite
def strategy_grad_empty(draw, limits: Limits):
    if draw(st.booleans()):  # a batched call with T = 0
        problem = draw(gs.problems(limits, max_len=0, varlen=False))
    else:
        problem = draw(gs.problems(limits, max_len=MAX_LEN, varlen=True))
        for _ in range(draw(st.integers(1, 2))):
            problem = with_empty_sequence(
                problem, draw(st.integers(0, problem.num_sequences)), draw(st.integers(0, 2**31 - 1))
            )
    return problem, draw(cotangent_params())


# ---------------------------------------------------------------------------------------------
def _needs_backward(impl: Implementation) -> str | None:
    return None if BACKWARD_FORM in impl.forms else f"{impl.name} has no backward form"


def grad_properties(limits: Limits) -> list[Property]:
    """The gradient properties, drawing within ``limits``."""

    def prop(name, summary, strategy, check, examples):
        return Property(name, summary, lambda impl: strategy, check, examples, _needs_backward, form=BACKWARD_FORM)

    return [
        prop(
            "grad_matches_reference",
            "dq, dk, dv, dg, dbeta, dh0 within tolerance of the float64 adjoint",
            strategy_grad_reference(limits),
            check_grad_matches_reference,
            60,
        ),
        prop(
            "grad_determinism",
            "identical calls return bitwise identical gradients",
            _with_cotangents(gs.problems(limits, max_len=80, min_len=1)),
            check_grad_determinism,
            15,
        ),
        prop(
            "grad_varlen_equals_separate",
            "the gradients of a packed varlen call equal each sequence alone",
            strategy_grad_varlen(limits),
            check_grad_varlen,
            25,
        ),
        prop(
            "grad_padding_zero",
            "tokens past cu_seqlens[-1] get gradients exactly 0, written",
            strategy_grad_padding(limits),
            check_grad_padding,
            20,
        ),
        prop(
            "grad_gate_extremes",
            "no decay, strong and saturated gates, beta at 0 and 1: within tolerance",
            strategy_grad_reference(limits, EXTREME_REGIMES),
            check_grad_matches_reference,
            40,
        ),
        prop(
            "grad_error_growth",
            f"gradient error vs T grows at most like T^{GROWTH_BOUND}",
            strategy_grad_growth(limits),
            check_grad_error_growth,
            3,
        ),
        prop(  # last: see the module docstring
            "grad_empty_sequences",
            "a call without tokens and packs with empty sequences give the oracle's gradients",
            strategy_grad_empty(limits),
            check_grad_matches_reference,
            15,
        ),
    ]


GRAD_NAMES: tuple[str, ...] = tuple(p.name for p in grad_properties(Limits(dtype="float32")))
