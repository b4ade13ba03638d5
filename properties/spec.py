"""The ``spec_decode_slots`` property: speculative-decoding slot handling against the float64 oracle.

A case is a native :class:`Problem` holding the packed tokens (``B == 1``, ``cu_seqlens``) plus
parameters ``ssm_state_indices``, ``num_accepted_tokens``, ``slots`` and ``pool_seed`` (the
pool is regenerated from the seed, so a saved case replays exactly). Checked:

1. outputs within the tolerance model of the oracle started from the accepted slot
   (on failure, a start column that would explain the outputs is named);
2. every slot ``ssm_state_indices[n, t]``, ``t < L_n``, holds the oracle state after token ``t``;
3. every other slot is bitwise unchanged (the last slot is always a spare, so a ``-1`` index
   used as a Python/C negative offset is caught);
4. padding requests (negative start slot) have exactly zero outputs.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from gdn_verify.core import arrays
from gdn_verify.core import tolerance as tol
from gdn_verify.core.conventions import start_slots
from gdn_verify.core.implementation import SPEC_FORM, Implementation, Result
from gdn_verify.core.oracle import numpy_oracle
from gdn_verify.core.problem import DTYPES, Problem
from gdn_verify.core.verdict import Measurement, Property, Violation, compare
from gdn_verify.properties import strategies as gs
from gdn_verify.properties.strategies import Limits


def make_pool(params: dict, HV: int, K: int, V: int) -> np.ndarray:
    rng = np.random.default_rng(params["pool_seed"])
    return rng.standard_normal((params["slots"], HV, K, V)).astype(np.float32)


@st.composite
def spec_cases(draw, limits: Limits, max_columns: int = 4, max_requests: int = 4):
    """``(problem, params)`` for the speculative-decoding convention; distinct slots, spares included."""
    dtype = limits.dtype
    pool = gs.pool_classes(limits, smallest=True)
    if pool:  # the pool's head counts, sizes, dtype and l2norm (the layout is always varlen with a state)
        c = draw(st.sampled_from(pool))
        H, HV, K, V, dtype = c.H, c.HV, c.K, c.V, c.dtype
    else:
        H, HV = draw(gs.head_counts(limits.replace(max_heads=min(2, limits.max_heads))))
        K, V = draw(gs.head_dims(limits, max_dim=32))
    C = draw(st.integers(1, max_columns))
    N = draw(st.integers(1, max_requests))
    lengths = draw(st.lists(st.integers(1, C), min_size=N, max_size=N))
    accepted = draw(st.lists(st.integers(1, C), min_size=N, max_size=N))
    padding = draw(st.lists(st.booleans(), min_size=N, max_size=N).filter(lambda p: not all(p)))
    spares = draw(st.integers(1, 3))
    slots = N * C + spares
    order = draw(st.permutations(range(slots - 1)))  # the last slot is always a spare
    indices = np.array(order[: N * C], np.int64).reshape(N, C)
    indices[np.array(padding)] = -1
    regime = draw(st.sampled_from(("none", "mild", "moderate", "mixed")))
    l2norm = c.l2norm if pool else draw(st.booleans())
    scale = draw(st.one_of(st.none(), st.just(0.5)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    T = int(sum(lengths))
    k = rng.standard_normal((1, T, H, K))
    problem = Problem(
        q=rng.standard_normal((1, T, H, K)),
        k=k if l2norm else gs.unit_rows(rng, (1, T, H, K)),
        v=rng.standard_normal((1, T, HV, V)),
        g=gs.gate_values(rng, (1, T, HV), regime),
        beta=gs.beta_values(rng, (1, T, HV)),
        scale=scale,
        use_qk_l2norm_in_kernel=l2norm,
        cu_seqlens=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        notes=dict(gate_regime=regime),
    ).astype(DTYPES[dtype or draw(st.sampled_from(("float32", "bfloat16")))])
    params = dict(
        ssm_state_indices=indices.tolist(),
        num_accepted_tokens=accepted,
        slots=slots,
        pool_seed=int(rng.integers(2**31)),
    )
    return problem, params


def run_spec(impl: Implementation, problem: Problem, params: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Call the plug-in; returns ``(o, pool_before, pool_after)`` as NumPy arrays."""
    s = problem.shape
    pool = make_pool(params, s["HV"], s["K"], s["V"])
    kind = impl.array

    def to(x, dtype=None):
        return arrays.to_kind(np.asarray(x, dtype) if dtype is not None else x, kind)

    pool_arg = to(pool.copy())
    o = impl.forms[SPEC_FORM](
        to(problem.q),
        to(problem.k),
        to(problem.v),
        to(problem.g),
        to(problem.beta),
        pool_arg,
        to(problem.cu_seqlens, np.int64),
        to(params["ssm_state_indices"], np.int32),
        to(params["num_accepted_tokens"], np.int32),
        scale=problem.scale,
        use_qk_l2norm_in_kernel=problem.use_qk_l2norm_in_kernel,
    )
    return arrays.to_numpy(o), pool, arrays.to_numpy(pool_arg)


def _requests(problem: Problem, n_list, initial: np.ndarray, upto: int | None = None) -> Problem:
    """The native problem of requests ``n_list`` (first ``upto + 1`` tokens each) from ``initial`` states."""
    bounds = problem.bounds
    ends = [bounds[n + 1] if upto is None else bounds[n] + upto + 1 for n in n_list]
    pieces = [np.arange(bounds[n], end) for n, end in zip(n_list, ends)]
    take = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    cu = np.concatenate([[0], np.cumsum([len(p) for p in pieces])]).astype(np.int64)
    return problem.take(take, cu, initial)


def check_spec_decode_slots(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    indices = np.asarray(params["ssm_state_indices"], np.int64)
    accepted = np.asarray(params["num_accepted_tokens"], np.int64)
    o, before, after = run_spec(impl, problem, params)
    bounds, lengths = problem.bounds, problem.lengths
    starts = start_slots(indices, accepted)
    real = [n for n in range(len(lengths)) if starts[n] >= 0]
    pad = [n for n in range(len(lengths)) if starts[n] < 0]
    if o is None or tuple(np.shape(o)) != problem.v.shape:
        raise Violation(f"o has shape {None if o is None else np.shape(o)}, expected {problem.v.shape}")

    # 4. padding requests: zero outputs
    for n in pad:
        if np.any(np.asarray(o[:, bounds[n] : bounds[n + 1]], np.float64) != 0):
            raise Violation(f"padding request {n} (start slot {starts[n]}) has non-zero outputs")
    # 3. slots nobody should write: bitwise unchanged
    written = {int(indices[n, t]) for n in real for t in range(lengths[n])}
    for slot in sorted(set(range(len(before))) - written):
        if before[slot].tobytes() != after[slot].tobytes():
            raise Violation(
                f"slot {slot} was written although no request's token maps to it "
                f"(ssm_state_indices={indices.tolist()}, accepted={accepted.tolist()})"
            )
    # 1. outputs from the accepted slot
    native = _requests(problem, real, before[starts[real]])
    take = np.concatenate([np.arange(bounds[n], bounds[n + 1]) for n in real])
    got = Result(np.asarray(o)[:, take], None, None, None)
    reference = numpy_oracle(native)
    tolerance = tol.tolerance(native, tol.condition(native, reference))
    try:
        worst = compare(native, got, (reference[0], None), tolerance)
    except Violation as exc:
        raise Violation(f"outputs: {exc}{_explain_start(problem, params, o, before, real)}", exc.measurement) from None
    # 2. per-token slots hold the state after that token
    for t in range(int(lengths.max(initial=0))):
        running = [n for n in real if lengths[n] > t]
        if not running:
            continue
        prefix = _requests(problem, running, before[starts[running]], upto=t)
        ref_o, ref_state = numpy_oracle(prefix)
        bound = tol.tolerance(prefix, tol.condition(prefix, (ref_o, ref_state))).state
        state_got = after[indices[running, t]]
        err, where = tol.state_errors(state_got, ref_state, prefix.initial_state)
        if not err <= bound:
            n = running[where[0]] if where else running[0]
            raise Violation(
                f"slot {indices[n, t]} (request {n}, token {t}) holds a state off by {err:.3g} > tolerance {bound:.3g}",
                Measurement(err, bound, "per-token state"),
            )
        if err / max(bound, 1e-300) > worst.ratio:
            worst = Measurement(err, bound, "per-token state")
    return worst


def _explain_start(problem: Problem, params: dict, o, before, real) -> str:
    """Name, per request, a start column whose slot reproduces the outputs (a wrong slot read)."""
    indices = np.asarray(params["ssm_state_indices"], np.int64)
    accepted = np.asarray(params["num_accepted_tokens"], np.int64)
    bounds = problem.bounds
    notes = []
    for n in real:
        native_o = np.asarray(o)[:, bounds[n] : bounds[n + 1]]
        for column in range(indices.shape[1]):
            if column == accepted[n] - 1 or indices[n, column] < 0:
                continue
            alt = _requests(problem, [n], before[[indices[n, column]]])
            ref = numpy_oracle(alt)
            try:
                compare(
                    alt, Result(native_o, None, None, None), (ref[0], None), tol.tolerance(alt, tol.condition(alt, ref))
                )
            except Violation:
                continue
            notes.append(
                f"request {n} read slot {indices[n, column]} (column {column}) instead of the accepted "
                f"slot {indices[n, accepted[n] - 1]} (column {accepted[n] - 1})"
            )
            break
    return ("; " + "; ".join(notes)) if notes else ""


def _needs_spec(impl: Implementation) -> str | None:
    return None if SPEC_FORM in impl.forms else f"{impl.name} has no speculative-decoding form"


def spec_properties(limits: Limits) -> list[Property]:
    """The properties of the speculative-decoding form (``forms["spec"]``)."""
    return [
        Property(
            "spec_decode_slots",
            "speculative decoding reads the accepted slot, writes each token's slot, nothing else",
            lambda impl: spec_cases(limits),
            check_spec_decode_slots,
            60,
            _needs_spec,
            form=SPEC_FORM,
        )
    ]
