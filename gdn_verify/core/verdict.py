"""The verdict engine: the output contract and the comparison against a reference.

A property's check (``gdn_verify.core.property``) returns a :class:`Measurement` or raises
:class:`Violation`; :func:`compare` holds an implementation's outputs to the
tolerance model of ``gdn_verify.core.tolerance`` against the float64 oracle (or against another
run of the same implementation, with a factor).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from gdn_verify.core import processes, timing
from gdn_verify.core import tolerance as tol
from gdn_verify.core.implementation import ContractError, Implementation, Result, host_array
from gdn_verify.core.oracle import Oracle, numpy_oracle, numpy_oracle_with_norms, problem_digest, token_loop
from gdn_verify.core.problem import Problem
from gdn_verify.core.property import Measurement, Violation


def floating(x: Any) -> bool:
    """Whether ``x`` (a NumPy array) holds real floating-point numbers, bfloat16 included: what the
    comparisons can read (an integer, complex, boolean or object array cannot be judged numerically)."""
    dtype = np.asarray(x).dtype
    return dtype.kind == "f" or dtype.name == "bfloat16"


def output_contract_violations(
    result: Result, problem: Problem, shapes_only: bool = False, state_dtype: Any = None
) -> list[str]:
    """Shape and dtype contract of ``(o, final_state)`` for ``problem``, each problem naming what
    came back and what was expected. ``shapes_only``: shapes, and of the dtypes only what a
    comparison needs (real floating point), as every property's calls are held to; otherwise the
    dtypes exactly (``output_contract``): ``o`` in the input dtype, the final state float32 unless
    the implementation declares a narrower ``state_dtype``."""
    want_dtype = tol.narrow_state_dtype(state_dtype) or "float32"
    s = problem.shape
    problems = []
    want_o = (s["B"], s["T"], s["HV"], s["V"])
    if result.o is None or tuple(np.shape(result.o)) != want_o:
        problems.append(f"o has shape {None if result.o is None else tuple(np.shape(result.o))}, expected {want_o}")
    elif not floating(result.o):
        problems.append(f"o has dtype {result.o_dtype}, expected a floating-point dtype (the input dtype)")
    elif result.o_dtype != np.dtype(problem.dtype).name and not shapes_only:
        problems.append(f"o has dtype {result.o_dtype}, expected the input dtype {np.dtype(problem.dtype).name}")
    if problem.output_final_state:
        want_s = problem.state_shape()
        if result.final_state is None:
            problems.append(f"final_state is None although output_final_state=True (expected shape {want_s})")
        elif tuple(np.shape(result.final_state)) != want_s:
            problems.append(f"final_state has shape {tuple(np.shape(result.final_state))}, expected {want_s}")
        elif not floating(result.final_state):
            problems.append(f"final_state has dtype {result.state_dtype}, expected {want_dtype}")
        elif result.state_dtype != want_dtype and not shapes_only:
            problems.append(f"final_state has dtype {result.state_dtype}, expected {want_dtype}")
    elif result.final_state is not None:
        problems.append("final_state returned although output_final_state=False")
    return problems


def spec_output(o: Any, problem: Problem) -> np.ndarray:
    """The ``o`` a speculative-decoding form returned, as NumPy, held to its contract: one array of
    ``v``'s shape ``[1, T, HV, V]``, floating point. Anything else is a :class:`Violation`
    (``output contract: ...``) naming what came back, not a crash in the checks that read it."""
    if isinstance(o, tuple):  # the native form's pair, say
        raise Violation(f"output contract: expected o alone, got a tuple of {len(o)}")
    try:
        x = host_array(o, "o")
    except ContractError as exc:
        raise Violation(f"output contract: {exc}") from None
    want = tuple(problem.v.shape)
    if x is None or x.shape != want:
        raise Violation(f"output contract: o has shape {None if x is None else x.shape}, expected {want}")
    if not floating(x):
        raise Violation(f"output contract: o has dtype {x.dtype}, expected a floating-point dtype (the input dtype)")
    return x


def run_checked(
    impl: Implementation,
    problem: Problem,
    form: str | None = None,
    options: dict | None = None,
    arguments: dict | None = None,
) -> Result:
    """Run ``impl`` (``arguments``: see :meth:`Implementation.run`); a wrong output shape or type
    is a :class:`Violation`, not a crash."""
    try:
        result = impl.run(problem, form, options, arguments)
    except ContractError as exc:
        raise Violation(f"output contract: {exc}") from None
    shape_problems = output_contract_violations(result, problem, shapes_only=True)
    if shape_problems:
        raise Violation("output contract: " + "; ".join(shape_problems))
    return result


def as64(x: Any) -> np.ndarray | None:
    """``x`` as float64 NumPy (None stays None)."""
    return None if x is None else np.asarray(x, np.float64)


def _state_kfirst(state: Any, problem: Problem) -> Any:
    return None if state is None else (state.swapaxes(-1, -2) if problem.state_v_first else state)


def compare(
    problem: Problem,
    result: Result,
    reference: tuple,
    tolerance: tol.Tolerance,
    factor: float = 1.0,
    what: str = "oracle",
) -> Measurement:
    """Errors of ``result`` against ``reference`` (NumPy ``(o, final_state)``) within ``factor * tolerance``."""
    if result.o is None or not np.all(np.isfinite(np.asarray(result.o, np.float64))):
        raise Violation(f"non-finite output values (NaN/Inf) where the {what} is finite")
    if result.final_state is not None and not np.all(np.isfinite(np.asarray(result.final_state, np.float64))):
        raise Violation(f"non-finite final state values where the {what} is finite")
    errors = tol.measure(
        result.o,
        _state_kfirst(as64(result.final_state), problem),
        reference[0],
        _state_kfirst(as64(reference[1]), problem),
        problem,
        tol.scales_for(problem, tolerance),
    )
    bound = tolerance.scaled(factor)
    bad = bound.violations(errors)
    ratios = [
        errors.output_rms / bound.output_rms,
        errors.output_token / bound.output_token,
        errors.state / bound.state if bound.state else 0.0,
    ]
    worst = int(np.argmax(ratios))
    name = tol.METRICS[worst]
    m = Measurement(
        getattr(errors, name), getattr(bound, name), f"{name} vs {what}", bound.uniform(name), bound.note(errors)
    )
    if bad:
        raise Violation(_violation_text(errors, bound, tolerance, name, what), m)
    return m


def _violation_text(errors: tol.Errors, bound: tol.Tolerance, tolerance: tol.Tolerance, worst: str, what: str) -> str:
    """A failed comparison as lines: the worst metric against its bound alone on the first (short
    enough for one terminal line), then where it is worst, the other metrics over their bounds,
    how each bound is made up where it has an algorithm-aware part, and the condition numbers."""
    over = [n for n in tol.METRICS if not getattr(errors, n) <= getattr(bound, n)]
    lead = worst if worst in over else over[0]

    def metric(n: str) -> str:
        return f"{n} error {getattr(errors, n):.3g} > tolerance {getattr(bound, n):.3g}"

    lines = [f"{metric(lead)} (against the {what})"]
    if errors.worst_token is not None and lead != "state":
        lines.append(f"worst token {errors.worst_token[0]} (flat B*T index), value head {errors.worst_token[1]}")
    if errors.worst_sequence is not None and lead == "state":
        lines.append(f"worst final state: sequence {errors.worst_sequence[0]}, value head {errors.worst_sequence[1]}")
    others = [metric(n) for n in over if n != lead]
    if others:
        lines.append("also over: " + "; ".join(others))
    extras = [(n, bound.algorithm[tol.METRICS.index(n)]) for n in over]
    split = [f"{n} {bound.uniform(n):.3g} + {extra:.3g}" for n, extra in extras if extra]
    if split:  # one cause for every metric: said once
        lines.append(f"bounds, uniform + the {bound.cause}: {'; '.join(split)}")
    lines.append(f"kappa_o={tolerance.kappa_output:.3g}, kappa_s={tolerance.kappa_state:.3g}")
    return "\n".join(lines)


def state_dtype_of(impl: Implementation) -> Any:
    """The dtype ``impl`` declares it carries its state in (``extra["state_dtype"]``); None: float32,
    the default contract. A declared dtype coarser than float32 adds a term to the bound
    (``tolerance.narrow_state_dtype``, docs/precision.md): for a state rounded after every token,
    or, where ``extra["state_rounding"] == "stored"``, only as it is loaded and stored
    (``tolerance.StoredState``)."""
    declared = impl.extra.get("state_dtype")
    if declared is not None and impl.extra.get("state_rounding") == "stored":
        return tol.StoredState(tol.narrow_state_dtype(declared) or declared)
    return declared


class OracleMemo:
    """:func:`oracle_and_tolerance`'s NumPy-oracle results by problem (``oracle.problem_digest``) and
    declared state dtype, the least recently used dropped past ``budget`` bytes of arrays. The
    reference arrays it hands out are read-only: every caller shares them."""

    def __init__(self, budget: int):
        self.budget, self.size, self.hits = budget, 0, 0
        self._items: collections.OrderedDict[tuple[str, str], tuple[tuple, tol.Tolerance, int]] = (
            collections.OrderedDict()
        )

    @staticmethod
    def key(problem: Problem, state_dtype: Any) -> tuple[str, str]:
        return problem_digest(problem), repr(state_dtype)

    def get(self, key: tuple[str, str]) -> tuple[tuple, tol.Tolerance] | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return item[0], item[1]

    def put(self, key: tuple[str, str], reference: tuple, bound: tol.Tolerance) -> None:
        arrays = [x for x in reference if x is not None]
        for x in arrays:
            x.flags.writeable = False
        scales = [] if bound.scales is None else [bound.scales.token, bound.scales.state]
        size = sum(x.nbytes for x in arrays + scales)
        self._items[key] = (reference, bound, size)
        self.size += size
        while self.size > self.budget and len(self._items) > 1:
            self.size -= self._items.popitem(last=False)[1][2]


# What a selftest's memo may hold: a default float32 check's references and scales come to about 210 MiB.
MEMO_BYTES = 256 << 20
_memo: OracleMemo | None = None


@contextlib.contextmanager
def remembered_oracles(budget: int = MEMO_BYTES) -> Iterator[OracleMemo]:
    """Within it :func:`oracle_and_tolerance` remembers its results with the NumPy oracle
    (:class:`OracleMemo`), for a run that meets the same problems again: a selftest's properties draw
    the same examples for every planted bug until one fails, and Hypothesis replays examples. Outside
    it nothing is kept, since a result also depends on module settings (``tolerance.SCALE_BUDGET``)
    that a caller may change between calls. Nested, the outer memo serves."""
    global _memo
    if _memo is not None:
        yield _memo
        return
    _memo = OracleMemo(budget)
    try:
        yield _memo
    finally:
        _memo = None


def oracle_and_tolerance(
    problem: Problem, oracle: Oracle = numpy_oracle, state_dtype: Any = None
) -> tuple[tuple, tol.Tolerance]:
    """The oracle's ``(o, final_state or None)`` and the tolerance a correct implementation meets
    (``state_dtype``: the implementation's declared state dtype, :func:`state_dtype_of`); within
    :func:`remembered_oracles`, a problem met before is not computed again."""
    with timing.timed(timing.ORACLE):
        memo = _memo if oracle is numpy_oracle else None
        key = None if memo is None else memo.key(problem, state_dtype)
        kept = None if memo is None or key is None else memo.get(key)
        if kept is not None:
            return kept[0], kept[1].for_problem(problem)
        norms = None
        if oracle is numpy_oracle:  # the same outputs, plus the state norms the scales need, in one run
            reference, norms = numpy_oracle_with_norms(problem)
        else:
            reference = oracle(problem)
        ref_state = reference[1] if problem.output_final_state else None
        kappa = tol.condition(problem, reference, oracle=oracle, state_dtype=state_dtype, norms=norms)
        result = (reference[0], ref_state), tol.tolerance(problem, kappa)
        if memo is not None and key is not None:
            memo.put(key, *result)
        return result


# Below this many tokens in all, oracles run here: a spawned process costs about a second to start.
PARALLEL_ORACLE_TOKENS = 16384


def _split(problem: Problem) -> bool:
    """Whether a problem's reference and condition parts run as separate tasks in the workers (past
    the token loop, where ``tolerance.condition_parts`` splits the roundings and the reruns)."""
    return not token_loop(problem)


def _part(problem: Problem, reference: tuple, part: str, scales: Any, state_dtype: Any) -> dict:
    return tol.condition_part(problem, reference, part, scales, state_dtype=state_dtype)


def oracles_and_tolerances(
    problems: Sequence[Problem], state_dtype: Any = None, workers: int | None = None
) -> list[tuple[tuple, tol.Tolerance]]:
    """:func:`oracle_and_tolerance` (NumPy oracle) of each problem, in worker processes when they
    are long (``workers``: default the CPUs, 1: all here), in the check's shared pool
    (``core.processes``: started once, on first use). The same results as one by one: each
    problem's runs are independent and seeded alike. A problem past the token loop runs its
    reference first, then its condition parts (``tolerance.condition_parts``: each rounding draw,
    the reruns) side by side. ``error_growth``'s prefixes (64 to 65536 tokens) cost twice their
    longest this way; on an H100 machine (16 cores, 2026-11-26) they were half of a warm fla-chunk
    check's oracle time, one by one; the longest (65536 tokens) alone took 9 s on the CPU before its
    parts ran side by side."""
    tokens = sum(int(p.q.shape[0] * p.q.shape[1]) for p in problems)
    names = {i: tol.condition_parts(p, state_dtype) for i, p in enumerate(problems) if _split(p)}
    tasks = len(problems) - len(names) + sum(len(x) for x in names.values())
    n = processes.workers_for([tokens], PARALLEL_ORACLE_TOKENS, workers)  # the pool's size, kept between calls
    if min(n, tasks) <= 1:
        return [oracle_and_tolerance(p, state_dtype=state_dtype) for p in problems]
    # the children's time is this process's wait; an error or Ctrl-C cancels the queued tasks (Tasks)
    with timing.timed(timing.ORACLE), processes.Tasks(n) as pool:
        # longest first: it bounds the wall-clock time
        order = sorted(range(len(problems)), key=lambda i: -problems[i].q.shape[1])
        references = {pool.submit(numpy_oracle_with_norms, problems[i]): i for i in order if i in names}
        whole = {
            i: pool.submit(oracle_and_tolerance, problems[i], state_dtype=state_dtype) for i in order if i not in names
        }
        parts = {}
        for future in concurrent.futures.as_completed(references):  # each one's parts once it is back
            i = references[future]
            reference, norms = future.result()
            scales = tol.natural_scales(problems[i], norms)
            futures = [pool.submit(_part, problems[i], reference, x, scales, state_dtype) for x in names[i]]
            parts[i] = (reference, scales, futures)
        results = []
        for i, p in enumerate(problems):
            if i not in names:
                results.append(whole[i].result())
                continue
            reference, scales, futures = parts[i]
            kappa = tol.kappa_of([f.result() for f in futures], scales, state_dtype)
            ref_state = reference[1] if p.output_final_state else None
            results.append(((reference[0], ref_state), tol.tolerance(p, kappa)))
    # a worker's scales name its copy of the problem (Scales.of is an id()): name ours, or every
    # comparison would run the recurrence again for them (13 s of a 64k-token prefix, in this process)
    return [(reference, bound.for_problem(p)) for p, (reference, bound) in zip(problems, results)]


def bitwise_equal(a: Result, b: Result) -> bool:
    """Outputs and final states are bitwise identical (both None counts as equal)."""
    return all(
        (x is None and y is None)
        or (x is not None and y is not None and np.asarray(x).tobytes() == np.asarray(y).tobytes())
        for x, y in ((a.o, b.o), (a.final_state, b.final_state))
    )


def first_difference(a: Result, b: Result) -> tuple[str, float, bool] | None:
    """The first of ``o`` and ``final_state`` that is not bitwise identical in two results of the same
    inputs: its name, the largest difference (NaN where one of them is None) and whether NaN stands in
    one where the other holds a number; None when both are bitwise identical."""
    for name in ("o", "final_state"):
        x, y = getattr(a, name), getattr(b, name)
        if bitwise_equal(Result(x, None, None, None), Result(y, None, None, None)):
            continue
        if x is None or y is None:
            return name, float("nan"), False
        x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
        return name, float(np.nanmax(np.abs(x64 - y64))), not np.array_equal(np.isnan(x64), np.isnan(y64))
    return None


def sequence_part(r: Result, problem: Problem, n: int) -> Result:
    """The outputs and final state of sequence ``n`` of ``problem`` within the result ``r``."""
    start, end = problem.bounds[n], problem.bounds[n + 1]
    o = np.asarray(r.o).reshape((1, -1) + r.o.shape[2:])[:, start:end]
    state = None if r.final_state is None else r.final_state[n : n + 1]
    return Result(o, state, r.o_dtype, r.state_dtype)
