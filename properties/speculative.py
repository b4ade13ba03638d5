"""Speculative-decoding slot properties against the float64 oracle, under each kernel's slot rules.

A case is a native :class:`Problem` holding the packed tokens (``B == 1``, ``cu_seqlens``) plus
parameters ``ssm_state_indices``, ``num_accepted_tokens``, ``slots`` and ``pool_seed`` (the
pool is regenerated from the seed, so a saved case replays exactly). The implementation's
:class:`SpecRules` (``Implementation.extra["spec_rules"]``, native by default) say how padding
is marked, which slot is the null slot, what padding output rows hold and the pool layout; the
cases are drawn in that convention. Properties:

- ``spec_decode_slots``: outputs within the tolerance model of the oracle started from the
  accepted slot (a start column that would explain wrong outputs is named); every stored slot
  ``ssm_state_indices[n, t]``, ``t < L_n``, holds the oracle state after token ``t``; every
  other slot, the null slot included, is bitwise unchanged (the last slot is always a spare, so
  a ``-1`` used as an offset is caught); padding output rows as the rules document. When a stored
  slot is wrong and every stored slot is bitwise unchanged, the message says the caller's pool
  was not updated. ``run_spec`` and ``check_slots`` take a pool factory (``place``), which is how
  ``pools.spec_guarded_pool`` hands the kernel a guarded view instead of a fresh pool.
- ``spec_duplicate_slots``: two live requests store a token's state to the same slot; that slot
  holds one writer's state in every element, everything else as above.
- ``spec_accepted_bounds``: ``num_accepted_tokens`` at 1 and at ``C`` behave as above; a count of 0
  or ``C + 1`` (on a request whose neighbouring row keeps the read in bounds) must be rejected
  with an exception, not read a neighbouring row's slot.
- ``spec_draftless_step``: a step of one token per request (no drafts) after a step that
  accepted some drafts starts from the accepted slot and stores to column 0.
- ``spec_poisoned_output``: the form's ``output=`` buffer is filled with NaN first; every output
  element the contract writes is written, padding rows as the rules document.
- ``spec_batch_mix``: decode rows (one token) first, then a speculative row (2 to ``C`` drafts),
  then rows of any length, in one call, judged as ``spec_decode_slots`` judges them; only under
  rules that take mixed lengths (not ``uniform_lengths``, ``min_tokens`` 1). After vLLM PR #51812:
  with one-token rows first, the speculative rows' gates were not re-gathered.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st

from gdn_verify.core import arrays
from gdn_verify.core import tolerance as tol
from gdn_verify.core.conventions import NATIVE_SPEC, SpecRules, spec_rules_of
from gdn_verify.core.implementation import SPEC_FORM, Implementation, Result
from gdn_verify.core.oracle import numpy_oracle
from gdn_verify.core.problem import DTYPES, Problem
from gdn_verify.core.property import Measurement, Property, Violation
from gdn_verify.core.verdict import compare, spec_output, state_dtype_of
from gdn_verify.properties import strategies as gs
from gdn_verify.properties.strategies import Limits

MODES = ("slots", "duplicate", "bounds", "chain", "poison", "mix")


def make_pool(params: dict, HV: int, K: int, V: int, v_first: bool = False) -> np.ndarray:
    """``[slots, HV, K, V]`` float32 from ``pool_seed`` (``[slots, HV, V, K]`` with ``v_first``)."""
    rng = np.random.default_rng(params["pool_seed"])
    pool = rng.standard_normal((params["slots"], HV, K, V)).astype(np.float32)
    return np.ascontiguousarray(pool.swapaxes(-1, -2)) if v_first else pool


def kfirst(pool: np.ndarray, rules: SpecRules) -> np.ndarray:
    """A pool (or slots of it) in the rules' layout as k-first ``[..., HV, K, V]``."""
    return pool.swapaxes(-1, -2) if rules.pool_v_first else pool


@st.composite
def spec_heads(draw, limits: Limits) -> tuple[int, int, int, int, str | None, bool | None]:
    """``(H, HV, K, V, dtype, l2norm)`` of a speculative-decoding case: from the shape pool when
    there is one (its dtype and l2norm too), else small sizes (``dtype`` from ``limits``, l2norm None: drawn later)."""
    pool = gs.pool_classes(limits, smallest=True)
    if pool:  # the pool's head counts, sizes, dtype and l2norm (the layout is always varlen with a state)
        c = draw(st.sampled_from(pool))
        return c.H, c.HV, c.K, c.V, c.dtype, c.l2norm
    H, HV = draw(gs.head_counts(limits.replace(max_heads=min(2, limits.max_heads))))
    K, V = draw(gs.head_dims(limits, max_dim=32))
    return H, HV, K, V, limits.dtype, None


def spec_tokens(draw, heads: tuple, segments: list[int]) -> tuple[Problem, np.random.Generator]:
    """The packed tokens of ``segments`` (lengths, one ``cu_seqlens`` entry each) for ``heads`` from
    :func:`spec_heads`: ``(problem, rng)``, the generator left for the caller's further draws."""
    H, HV, K, V, dtype, l2norm = heads
    regime = draw(st.sampled_from(("none", "mild", "moderate", "mixed")))
    l2norm = draw(st.booleans()) if l2norm is None else l2norm
    scale = draw(st.one_of(st.none(), st.just(0.5)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    T = int(sum(segments))
    k = rng.standard_normal((1, T, H, K))
    problem = Problem(
        q=rng.standard_normal((1, T, H, K)),
        k=k if l2norm else gs.unit_rows(rng, (1, T, H, K)),
        v=rng.standard_normal((1, T, HV, V)),
        g=gs.gate_values(rng, (1, T, HV), regime),
        beta=gs.beta_values(rng, (1, T, HV)),
        scale=scale,
        use_qk_l2norm_in_kernel=l2norm,
        cu_seqlens=np.concatenate([[0], np.cumsum(segments)]).astype(np.int64),
        notes=dict(gate_regime=regime),
    ).astype(DTYPES[dtype or draw(st.sampled_from(("float32", "bfloat16")))])
    return problem, rng


@st.composite
def spec_cases(draw, limits: Limits, rules: SpecRules = NATIVE_SPEC, mode: str = "slots", max_columns: int = 4):
    """``(problem, params)`` in the convention of ``rules``; distinct slots (but for ``duplicate``), spares included."""
    heads = draw(spec_heads(limits))
    low = max(1, rules.min_tokens)
    C = draw(st.integers(max(low, 2 if mode in ("duplicate", "chain") else 1), max(max_columns, low)))
    N = draw(st.integers(3 if mode == "bounds" else (2 if mode == "duplicate" else 1), 4))
    if mode == "mix":  # one-token rows first, then a speculative row, then any (needs mixed lengths)
        C, N = max(C, 2), max(N, 2)
        decode = draw(st.integers(1, N - 1))
        lengths = [1] * decode + [draw(st.integers(2, C))]
        lengths += draw(st.lists(st.integers(1, C), min_size=N - decode - 1, max_size=N - decode - 1))
    elif rules.uniform_lengths:
        lengths = [draw(st.integers(max(low, 2 if mode == "duplicate" else 1), C))] * N
    else:
        lengths = draw(st.lists(st.integers(2 if mode == "duplicate" else low, C), min_size=N, max_size=N))
    if mode == "bounds":
        accepted = draw(st.lists(st.sampled_from((1, C)), min_size=N, max_size=N))
    else:
        accepted = draw(st.lists(st.integers(1, C), min_size=N, max_size=N))
    if mode in ("duplicate", "chain", "bounds"):
        padding = [False] * N
    elif mode == "mix":  # the first speculative row stays live: it is the row the mix is about
        padding = draw(st.lists(st.booleans(), min_size=N, max_size=N))
        padding[decode] = False  # lengths[decode] is the first of two or more tokens
    else:
        padding = draw(st.lists(st.booleans(), min_size=N, max_size=N).filter(lambda p: not all(p)))
    first = rules.first_live_slot
    spares = draw(st.integers(1, 3))
    slots = first + N * C + spares
    order = draw(st.permutations(range(first, slots - 1)))  # the last slot is always a spare
    indices = np.array(order[: N * C], np.int64).reshape(N, C)
    null = -1 if rules.null_slot is None else rules.null_slot
    marker = -1 if rules.padding == "negative" else null
    for n in np.flatnonzero(padding):
        if rules.padding_entries != "spare":
            indices[n] = -1 if rules.padding_entries == "negative" else null
        indices[n, accepted[n] - 1] = marker
    if rules.skip_entries and mode in ("slots", "poison", "mix"):
        # "store nothing" entries in live rows, never in the start column
        for n in np.flatnonzero(~np.array(padding)):
            skip = draw(st.lists(st.booleans(), min_size=C, max_size=C))
            for t in range(C):
                if skip[t] and t != accepted[n] - 1:
                    indices[n, t] = null
    params: dict = dict(mode=mode, rules=rules.name)
    if mode == "duplicate":
        # request b stores one token's state where request a stores one: neither a start slot
        a, b = draw(st.permutations(range(N)))[:2]
        ta, tb = draw(st.integers(0, lengths[a] - 1)), draw(st.integers(0, lengths[b] - 1))
        starts = {int(indices[n, accepted[n] - 1]) for n in range(N)}
        if int(indices[a, ta]) in starts or int(indices[b, tb]) in starts:
            accepted[a] = accepted[b] = C  # move the start slots out of the way
            ta, tb = min(ta, C - 2), min(tb, C - 2)
        indices[b, tb] = indices[a, ta]
        params["duplicate"] = [int(a), int(ta), int(b), int(tb)]
    if mode == "bounds":
        row = draw(st.integers(1, N - 2))
        params["probe"] = [int(row), draw(st.sampled_from((0, C + 1)))]
    tail = N if mode == "chain" else 0
    if mode == "chain":
        params["accepted_after"] = [draw(st.integers(1, lengths[n])) for n in range(N)]
    problem, rng = spec_tokens(draw, heads, lengths + [1] * tail)
    params.update(
        ssm_state_indices=indices.tolist(),
        num_accepted_tokens=list(accepted),
        slots=slots,
        pool_seed=int(rng.integers(2**31)),
    )
    return problem, params


def _to(x, kind: str, dtype=None):
    return arrays.to_kind(np.asarray(x, dtype) if dtype is not None else x, kind)


def call_spec(impl: Implementation, problem: Problem, pool_arg, indices, accepted, output=None):
    """One call of the spec form; ``pool_arg`` is updated in place. Returns ``o`` as NumPy, held to
    its contract (``verdict.spec_output``), or None when ``output`` (the buffer the form writes) is given."""
    kind = impl.array
    kw = dict(scale=problem.scale, use_qk_l2norm_in_kernel=problem.use_qk_l2norm_in_kernel)
    if output is not None:
        kw["output"] = output
    o = impl.forms[SPEC_FORM](
        _to(problem.q, kind),
        _to(problem.k, kind),
        _to(problem.v, kind),
        _to(problem.g, kind),
        _to(problem.beta, kind),
        pool_arg,
        _to(problem.cu_seqlens, kind, np.int64),
        _to(indices, kind, np.int32),
        _to(accepted, kind, np.int32),
        **kw,
    )
    return None if output is not None else spec_output(o, problem)


# A pool factory: ``place(pool, kind) -> (argument, read_back)``. ``pool`` is the NumPy pool in the
# rules' layout; ``argument`` is what the kernel receives; ``read_back()``, called once after the
# call, returns the pool as the caller sees it through ``argument`` (as NumPy).
PoolFactory = Callable[[np.ndarray, str], tuple[Any, Callable[[], np.ndarray]]]


def fresh_pool(pool: np.ndarray, kind: str) -> tuple[Any, Callable[[], np.ndarray]]:
    """The default :data:`PoolFactory`: a contiguous copy of ``pool`` in ``kind``."""
    arg = _to(pool.copy(), kind)
    return arg, lambda: np.array(arrays.to_numpy(arg))


def run_spec(
    impl: Implementation, problem: Problem, params: dict, poison: bool = False, place: PoolFactory = fresh_pool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Call the form on a fresh pool; ``(o, pool_before, pool_after, output_given)`` as NumPy.

    With ``poison``, ``output=`` is a NaN-filled buffer in the input dtype; ``place`` makes the pool
    argument (a guarded view, say) and reads it back.
    """
    rules = spec_rules_of(impl.extra)
    s = problem.shape
    pool = make_pool(params, s["HV"], s["K"], s["V"], rules.pool_v_first)
    pool_arg, read_back = place(pool, impl.array)
    given = np.full(problem.v.shape, np.nan, problem.dtype) if poison else None
    output = None if given is None else _to(given.copy(), impl.array)  # given stays as it was
    o = call_spec(impl, problem, pool_arg, params["ssm_state_indices"], params["num_accepted_tokens"], output)
    if output is not None:
        o = arrays.to_numpy(output)  # what the buffer holds is what the contract is about
    return o, pool, read_back(), given


def _requests(problem: Problem, n_list, initial: np.ndarray, upto: int | None = None) -> Problem:
    """The native problem of requests ``n_list`` (first ``upto + 1`` tokens each) from ``initial`` states."""
    bounds = problem.bounds
    ends = [bounds[n + 1] if upto is None else bounds[n] + upto + 1 for n in n_list]
    pieces = [np.arange(bounds[n], end) for n, end in zip(n_list, ends)]
    take = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    cu = np.concatenate([[0], np.cumsum([len(p) for p in pieces])]).astype(np.int64)
    return problem.take(take, cu, initial)


def _check_padding_rows(rules: SpecRules, o: np.ndarray, pad, bounds, starts, given) -> None:
    for n in pad:
        rows = np.asarray(o[:, bounds[n] : bounds[n + 1]])
        if rules.padding_output == "zeros" and np.any(np.asarray(rows, np.float64) != 0):
            raise Violation(f"padding request {n} (start slot {starts[n]}) has non-zero outputs")
        if rules.padding_output == "kept":
            want = np.zeros_like(rows) if given is None else np.asarray(given[:, bounds[n] : bounds[n + 1]], rows.dtype)
            if rows.tobytes() != want.tobytes():
                raise Violation(
                    f"padding request {n} (start slot {starts[n]}): output rows were written although "
                    f"the contract leaves them as allocated ({'zeros' if given is None else 'the NaN poison'})"
                )


def _check_untouched(before, after, written: set, indices, accepted) -> None:
    for slot in sorted(set(range(len(before))) - written):
        if before[slot].tobytes() != after[slot].tobytes():
            raise Violation(
                f"slot {slot} was written although no request's token maps to it "
                f"(ssm_state_indices={indices.tolist()}, accepted={accepted.tolist()})"
            )


def check_slots(impl: Implementation, problem: Problem, params: dict, place: PoolFactory = fresh_pool) -> Measurement:
    """Run one case and check outputs, stored slots, untouched slots and padding rows.

    ``place``: how the pool is handed to the kernel and read back (see :func:`run_spec`).
    """
    rules = spec_rules_of(impl.extra)
    mode = params.get("mode", "slots")
    indices = np.asarray(params["ssm_state_indices"], np.int64)
    accepted = np.asarray(params["num_accepted_tokens"], np.int64)
    if mode == "bounds":
        _probe_out_of_range(impl, problem, params, rules)
    if mode == "chain":
        return _check_chain(impl, problem, params, rules)
    o, before, after, given = run_spec(impl, problem, params, poison=mode == "poison", place=place)
    bounds, lengths = problem.bounds, problem.lengths
    starts = indices[np.arange(len(accepted)), accepted - 1]
    real = [n for n in range(len(lengths)) if not rules.is_padding_slot(int(starts[n]))]
    pad = [n for n in range(len(lengths)) if rules.is_padding_slot(int(starts[n]))]
    if o is None or tuple(np.shape(o)) != problem.v.shape:
        raise Violation(f"o has shape {None if o is None else np.shape(o)}, expected {problem.v.shape}")
    _check_padding_rows(rules, o, pad, bounds, starts, given)
    stores = [(n, t, int(indices[n, t])) for n in real for t in range(lengths[n]) if rules.stores(int(indices[n, t]))]
    _check_untouched(before, after, {slot for _, _, slot in stores}, indices, accepted)
    if not real:
        return Measurement(0.0, 1.0, "all padding")
    before_k, after_k = kfirst(before, rules), kfirst(after, rules)
    take = np.concatenate([np.arange(bounds[n], bounds[n + 1]) for n in real])
    got_o = np.asarray(o)[:, take]
    if mode == "poison" and np.isnan(np.asarray(got_o, np.float64)).any():
        token = int(take[np.flatnonzero(np.isnan(np.asarray(got_o, np.float64)).any(axis=(0, 2, 3)))[0]])
        raise Violation(f"output row of token {token} (a live request) still holds the NaN poison: never written")
    native = _requests(problem, real, before_k[starts[real]])
    reference = numpy_oracle(native)
    state_dtype = state_dtype_of(impl)
    tolerance = tol.tolerance(native, tol.condition(native, reference, state_dtype=state_dtype))
    try:
        worst = compare(native, Result(got_o, None, None, None), (reference[0], None), tolerance)
    except Violation as exc:
        explain = _explain_start(problem, indices, accepted, o, before_k, real, rules, state_dtype)
        raise Violation(f"outputs: {exc}{explain}", exc.measurement) from None
    # every stored slot holds the state after its token (one writer's state for a shared slot)
    candidates: dict[int, list[tuple[np.ndarray, float, np.ndarray, int, int]]] = {}
    for t in range(int(lengths.max(initial=0))):
        running = [n for n in real if lengths[n] > t]
        if not running:
            continue
        prefix = _requests(problem, running, before_k[starts[running]], upto=t)
        ref_o, ref_state = numpy_oracle(prefix)
        bound = tol.tolerance(prefix, tol.condition(prefix, (ref_o, ref_state), state_dtype=state_dtype)).state
        for i, n in enumerate(running):
            slot = int(indices[n, t])
            if rules.stores(slot):
                candidates.setdefault(slot, []).append((ref_state[i], bound, prefix.initial_state[i], n, t))
    for slot, options in candidates.items():
        got = after_k[slot]
        errs = []
        for ref_state, bound, initial, _, _ in options:
            err, _ = tol.state_errors(got[None], ref_state[None], initial[None])
            errs.append((err / max(bound, 1e-300), err, bound))
        if len(options) > 1:
            # a shared slot: every element must be one writer's value
            diffs = np.stack([np.abs(got.astype(np.float64) - ref) for ref, *_ in options])
            scale = max(np.max(np.abs(ref)) for ref, *_ in options) or 1.0
            err = float(np.max(np.min(diffs, axis=0))) / scale
            bound = max(b for _, b, *_ in options) * 8
            errs = [(err / max(bound, 1e-300), err, bound)]
        ratio, err, bound = min(errs)
        if not ratio <= 1:
            _check_pool_updated(before, after, candidates, params.get("layout", "contiguous"))
            n, t = options[0][3], options[0][4]
            what = "holds a state off" if len(options) == 1 else "is shared by two writers and holds neither's state"
            raise Violation(
                f"slot {slot} (request {n}, token {t}) {what} by {err:.3g} > tolerance {bound:.3g}",
                Measurement(err, bound, "per-token state"),
            )
        if ratio > worst.ratio:
            worst = Measurement(err, bound, "per-token state")
    return worst


def _check_pool_updated(before: np.ndarray, after: np.ndarray, stored, layout: str) -> None:
    """A stored slot is wrong: name the case where no stored slot changed at all (outputs were right)."""
    if all(before[slot].tobytes() == after[slot].tobytes() for slot in stored):
        raise Violation(
            f"the caller's pool was not updated (the kernel updated a copy?): every stored slot "
            f"({', '.join(str(s) for s in sorted(stored))}) is bitwise unchanged in the {layout} pool layout "
            "although the outputs are right"
        )


def _probe_out_of_range(impl: Implementation, problem: Problem, params: dict, rules: SpecRules) -> None:
    """A count of 0 or ``C + 1`` on a middle request must be rejected, not silently read a neighbour's slot."""
    row, count = params["probe"]
    accepted = list(params["num_accepted_tokens"])
    accepted[row] = count
    s = problem.shape
    pool = make_pool(params, s["HV"], s["K"], s["V"], rules.pool_v_first)
    try:
        o = call_spec(impl, problem, _to(pool.copy(), impl.array), params["ssm_state_indices"], accepted)
    except NotImplementedError:
        raise
    except Exception:  # noqa: BLE001 - any rejection is the documented outcome
        return
    indices = np.asarray(params["ssm_state_indices"], np.int64)
    flat = indices.reshape(-1)
    read = flat[row * indices.shape[1] + count - 1]  # what a flat, unchecked index reads
    where = "row {} column {}".format(*divmod(row * indices.shape[1] + count - 1, indices.shape[1]))
    note = ""
    if not rules.is_padding_slot(int(read)):
        alt = _requests(problem, [row], kfirst(pool, rules)[[read]])
        ref = numpy_oracle(alt)
        bounds = problem.bounds
        try:
            compare(
                alt,
                Result(np.asarray(o)[:, bounds[row] : bounds[row + 1]], None, None, None),
                (ref[0], None),
                tol.tolerance(alt, tol.condition(alt, ref, state_dtype=state_dtype_of(impl))),
            )
            note = f"; its outputs match a start from slot {read} ({where} of ssm_state_indices)"
        except Violation:
            pass
    raise Violation(
        f"num_accepted_tokens[{row}] = {count} lies outside 1..{indices.shape[1]} and was accepted "
        f"without an error{note}"
    )


def _check_chain(impl: Implementation, problem: Problem, params: dict, rules: SpecRules) -> Measurement:
    """Step 1 with drafts, then one token per request starting from the accepted slot of step 1."""
    indices = np.asarray(params["ssm_state_indices"], np.int64)
    accepted = np.asarray(params["num_accepted_tokens"], np.int64)
    after_accepted = np.asarray(params["accepted_after"], np.int64)
    N = len(accepted)
    bounds = problem.bounds
    step1 = problem.take(np.arange(bounds[N]), bounds[: N + 1].copy(), None)
    step2 = problem.take(np.arange(bounds[N], bounds[-1]), np.arange(N + 1, dtype=np.int64), None)
    s = problem.shape
    pool = make_pool(params, s["HV"], s["K"], s["V"], rules.pool_v_first)
    pool_arg = _to(pool.copy(), impl.array)
    call_spec(impl, step1, pool_arg, indices, accepted)
    o2 = call_spec(impl, step2, pool_arg, indices, after_accepted)
    after = kfirst(arrays.to_numpy(pool_arg), rules)
    # expected: each request's accepted prefix of step 1, then its step-2 token
    starts = kfirst(pool, rules)[indices[np.arange(N), accepted - 1]]
    lengths1 = step1.lengths
    pieces = [np.concatenate([np.arange(bounds[n], bounds[n] + after_accepted[n]), [bounds[N] + n]]) for n in range(N)]
    cu = np.concatenate([[0], np.cumsum([len(p) for p in pieces])]).astype(np.int64)
    chained = problem.take(np.concatenate(pieces), cu, starts)
    ref_o, ref_state = numpy_oracle(chained)
    tolerance = tol.tolerance(chained, tol.condition(chained, (ref_o, ref_state), state_dtype=state_dtype_of(impl)))
    last = cu[1:] - 1
    got = Result(np.zeros_like(np.asarray(ref_o)), None, None, None)
    got.o[:, last] = np.asarray(o2)[:, :N]
    want = np.zeros_like(np.asarray(ref_o))
    want[:, last] = np.asarray(ref_o)[:, last]
    try:
        worst = compare(chained, got, (want, None), tolerance)
    except Violation as exc:
        raise Violation(
            f"draft-less step after accepted drafts {after_accepted.tolist()} (of lengths {lengths1.tolist()}): "
            f"outputs: {exc}",
            exc.measurement,
        ) from None
    err, where = tol.state_errors(after[indices[:, 0]], ref_state, chained.initial_state)
    if not err <= tolerance.state:
        n = where[0] if where else 0
        raise Violation(
            f"draft-less step: slot {indices[n, 0]} (request {n}, column 0) holds a state off by {err:.3g} > "
            f"tolerance {tolerance.state:.3g} after accepting {after_accepted[n]} of {lengths1[n]} drafts",
            Measurement(err, tolerance.state, "per-token state"),
        )
    return worst


def _explain_start(
    problem: Problem, indices, accepted, o, before_k, real, rules: SpecRules, state_dtype: Any = None
) -> str:
    """Name, per request, a start column whose slot reproduces the outputs (a wrong slot read);
    ``state_dtype``: the implementation's declared state dtype."""
    bounds = problem.bounds
    notes = []
    for n in real:
        native_o = np.asarray(o)[:, bounds[n] : bounds[n + 1]]
        if _fits(_requests(problem, [n], before_k[[indices[n, accepted[n] - 1]]]), native_o, state_dtype):
            continue  # this request's outputs are right: nothing to explain
        for column in range(indices.shape[1]):
            if column == accepted[n] - 1 or rules.is_padding_slot(int(indices[n, column])):
                continue
            alt = _requests(problem, [n], before_k[[indices[n, column]]])
            ref = numpy_oracle(alt)
            try:
                compare(
                    alt,
                    Result(native_o, None, None, None),
                    (ref[0], None),
                    tol.tolerance(alt, tol.condition(alt, ref, state_dtype=state_dtype)),
                )
            except Violation:
                continue
            notes.append(
                f"request {n} read slot {indices[n, column]} (column {column}) instead of the accepted "
                f"slot {indices[n, accepted[n] - 1]} (column {accepted[n] - 1})"
            )
            break
    return ("; " + "; ".join(notes)) if notes else ""


def _fits(native: Problem, o: np.ndarray, state_dtype: Any = None) -> bool:
    """Whether outputs ``o`` are within tolerance of the oracle of ``native``."""
    ref = numpy_oracle(native)
    bound = tol.tolerance(native, tol.condition(native, ref, state_dtype=state_dtype))
    try:
        compare(native, Result(o, None, None, None), (ref[0], None), bound)
    except Violation:
        return False
    return True


# the property check the earlier single-property API exported
check_spec_decode_slots = check_slots


def _needs_spec(impl: Implementation) -> str | None:
    return None if SPEC_FORM in impl.forms else f"{impl.name} has no speculative-decoding form"


def _needs_mixed_lengths(impl: Implementation) -> str | None:
    """``spec_batch_mix``: a spec form whose rules take one-token and several-token requests in one call."""
    reason = _needs_spec(impl)
    rules = spec_rules_of(impl.extra)
    if reason is None and (rules.uniform_lengths or rules.min_tokens > 1):
        reason = f"{impl.name}'s slot rules ({rules.name}) take no one-token request beside a speculative one"
    return reason


def _needs_output(impl: Implementation) -> str | None:
    reason = _needs_spec(impl)
    if reason is not None:
        return reason
    try:
        parameters = inspect.signature(impl.forms[SPEC_FORM]).parameters
    except (TypeError, ValueError):
        return None
    takes = "output" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    return None if takes else f"{impl.name}'s speculative-decoding form takes no output= buffer"


def spec_properties(limits: Limits) -> list[Property]:
    """The properties of the speculative-decoding form (``forms["spec"]``)."""

    def cases(mode: str):
        return lambda impl: spec_cases(limits, spec_rules_of(impl.extra), mode)

    table = (
        (
            "spec_decode_slots",
            "slots",
            "reads the accepted slot, writes each token's slot, nothing else",
            60,
            _needs_spec,
        ),
        ("spec_duplicate_slots", "duplicate", "a slot two requests store to holds one writer's state", 30, _needs_spec),
        ("spec_accepted_bounds", "bounds", "accepted counts 1 and C work, 0 and C + 1 are rejected", 30, _needs_spec),
        (
            "spec_draftless_step",
            "chain",
            "a step without drafts after accepted drafts reads the right slot",
            30,
            _needs_spec,
        ),
        ("spec_poisoned_output", "poison", "every output element the contract writes is written", 30, _needs_output),
        (
            "spec_batch_mix",
            "mix",
            "one-token decode rows before speculative rows in one call: outputs and slots right",
            30,
            _needs_mixed_lengths,
        ),
    )
    return [
        Property(name, summary, cases(mode), check_mix if mode == "mix" else check_slots, n, needs, form=SPEC_FORM)
        for name, mode, summary, n, needs in table
    ]


def check_mix(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    """``check_slots`` on a batch mix; a failure says the mix (the requests' lengths) first."""
    try:
        return check_slots(impl, problem, params)
    except Violation as exc:
        lengths = problem.lengths.tolist()
        decode = next(i for i, n in enumerate(lengths) if n > 1)
        raise Violation(
            f"batch mix of requests of {lengths} tokens ({decode} one-token row{'s' if decode > 1 else ''} "
            f"before the first speculative row): {exc}{_explain_gates(impl, problem, params)}",
            exc.measurement,
        ) from None


def _explain_gates(impl: Implementation, problem: Problem, params: dict) -> str:
    """Name the mix's own mistake where it reproduces the outputs: each speculative row read ``g`` and
    ``beta`` at its token offset less the number of one-token rows before it (its offset in the batch
    without them: gates not gathered again after the split, vLLM PR #51812)."""
    rules = spec_rules_of(impl.extra)
    indices = np.asarray(params["ssm_state_indices"], np.int64)
    accepted = np.asarray(params["num_accepted_tokens"], np.int64)
    starts = indices[np.arange(len(accepted)), accepted - 1]
    lengths, bounds = problem.lengths, problem.bounds
    live = [n for n in range(len(lengths)) if not rules.is_padding_slot(int(starts[n]))]
    spec = [n for n in live if lengths[n] > 1 and np.sum(lengths[:n] == 1)]
    if not spec:
        return ""
    g, beta = np.array(problem.g), np.array(problem.beta)
    for n in spec:
        shift = int(np.sum(lengths[:n] == 1))
        g[:, bounds[n] : bounds[n + 1]] = problem.g[:, bounds[n] - shift : bounds[n + 1] - shift]
        beta[:, bounds[n] : bounds[n + 1]] = problem.beta[:, bounds[n] - shift : bounds[n + 1] - shift]
    o, before, _, _ = run_spec(impl, problem, params)
    before_k = kfirst(before, rules)
    shifted = _requests(problem.replace(g=g, beta=beta), spec, before_k[starts[spec]])
    take = np.concatenate([np.arange(bounds[n], bounds[n + 1]) for n in spec])
    if not _fits(shifted, np.asarray(o)[:, take], state_dtype_of(impl)):
        return ""
    return (
        f"; the speculative rows {spec} match the oracle with g and beta read at their token offsets less the "
        "one-token rows before them: the gates were not gathered again for the speculative rows"
    )
