"""Guarded memory and multi-step decode: what a kernel does to memory it was lent, and over many steps.

Every argument here lives in a larger buffer of the implementation's array kind (NumPy, torch or
CuPy; built in NumPy, moved with ``arrays.to_kind``, then cut with slices and reshapes, which are
views in all three), with **canary** bands around it: a fixed, unusual, finite pattern
(:data:`CANARY`, exact in every float dtype) that no correct kernel writes. Canaries and inputs
are judged bitwise against what was read back before the call. Properties:

- ``spec_guarded_pool`` (speculative-decoding form): the state pool is a view in the layout drawn
  among ``contiguous``, ``padded`` (slot stride larger than a slot: ``buf[:, :slot]``, not
  contiguous) and ``strided`` (every other slot of a buffer: ``buf[::2]``), canaries before slot
  0, after the last slot and, in the last two layouts, between slots. After the call every canary
  is intact (the message names the band: before slot 0, after the last slot, between slots s and
  s + 1), and the slots are judged as ``spec_decode_slots`` judges them, through the caller's view:
  untouched slots bitwise unchanged, stored slots the oracle's state (a pool left bitwise
  unchanged while the outputs are right: "the caller's pool was not updated (the kernel updated
  a copy?)"). A kernel that rejects a non-contiguous pool with ``ValueError``, ``TypeError`` or
  ``RuntimeError`` naming contiguity, strides or the layout passes with a note; one that accepts
  it and leaves the caller's pool stale fails.
- ``guarded_inputs`` (native form): ``q, k, v, g, beta`` and ``initial_state`` are views into
  guarded buffers; after the call every input and every canary is bitwise unchanged (the message
  names the input and what changed) and the outputs are within the tolerance model.
- ``output_isolation`` (native form): a call's outputs, read again after a second call of the same
  shapes and dtypes (``v`` and the initial state negated, so every output differs), are bitwise
  what they were: an implementation that hands out an output buffer it reuses across calls (one
  cached per shape, say) loses a caller's earlier result. Its check keeps the implementation's own
  arrays (``Implementation.call``), which every other property copies at once.
- ``spec_decode_stream`` (speculative-decoding form): ``S`` (up to 48) decode steps of a few
  requests through one pool, one token per request or, where the rules allow, 2-4 drafts with
  an accepted count feeding the next step. Each step's outputs are held to the normal output
  tolerance against the oracle started from the state the kernel read; at the end each request's
  final slot is held to the float64 oracle of its whole accepted token stream at the tolerance of
  a float32 state (16-bit inputs cast up to float32, exactly: a carried state gets no 16-bit
  allowance). A state that fails while every output passes is reported as "state drift".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st

from gdn_verify.core import arrays
from gdn_verify.core import tolerance as tol
from gdn_verify.core.conventions import SpecRules, spec_rules_of
from gdn_verify.core.implementation import SPEC_FORM, Implementation, Result, result_of
from gdn_verify.core.oracle import numpy_oracle
from gdn_verify.core.problem import Problem
from gdn_verify.core.property import Measurement, Property, Violation
from gdn_verify.core.verdict import (
    compare,
    oracle_and_tolerance,
    run_checked,
    state_dtype_of,
)
from gdn_verify.properties import strategies as gs
from gdn_verify.properties.native import _needs_native
from gdn_verify.properties.speculative import (
    _needs_spec,
    _to,
    call_spec,
    check_slots,
    kfirst,
    make_pool,
    spec_cases,
    spec_heads,
    spec_tokens,
)
from gdn_verify.properties.strategies import Limits

# Canary values: large, small and odd, exactly representable in float16, bfloat16, float32 and
# float64 (so the pattern survives every dtype conversion bit for bit); never 0, 1 or NaN, the
# values a stray write most often leaves.
CANARY = np.array([-24576.0, 40960.0, -0.01171875, 1.220703125e-04, -3328.0, 0.828125])
LAYOUTS = ("contiguous", "padded", "strided")
BAND = 16  # canary elements before and after an input (a pool's bands hold two slots more)
INPUTS = ("q", "k", "v", "g", "beta", "initial_state")
MAX_STEPS = 48
# Exceptions by which a kernel may refuse a non-contiguous pool, and words that must name why.
REJECTIONS = (ValueError, TypeError, RuntimeError)
LAYOUT_WORDS = ("contiguous", "stride", "layout", "dense")


def _reshape_view(x: Any, shape: tuple[int, ...]) -> Any:
    """``x`` reshaped without a copy (torch's ``view`` raises where a copy would be needed)."""
    if type(x).__module__.startswith("torch"):
        return x.view(shape)
    return x.reshape(shape)


def _bits(x: np.ndarray) -> np.ndarray:
    """Elements as unsigned integers of their size: bitwise comparison (NaN and -0.0 included)."""
    return np.ascontiguousarray(x).view(f"u{x.dtype.itemsize}")


@dataclass
class Guarded:
    """One array handed to a kernel as a view into a larger buffer with canaries around it.

    ``buffer``: the flat buffer in the implementation's kind; ``view``: the argument (the array's
    shape, rows laid out by ``layout``); ``offsets``: the buffer offset of every element of the
    view (the array's shape, int64); ``before``: the buffer as read back before the call; ``labels``:
    ``(band, edge)`` names of the bands before and after the array (``("before slot 0", "slot 0")``).
    """

    name: str
    layout: str
    buffer: Any
    view: Any
    offsets: np.ndarray
    before: np.ndarray
    labels: tuple[tuple[str, str], tuple[str, str]]
    start: int = 0  # buffer offset where the array's region begins
    read_back: bool = field(default=False)

    def read(self) -> np.ndarray:
        """The buffer after the call: raise :class:`Violation` for any canary changed; return the
        array as the caller sees it through ``view`` (NumPy)."""
        self.read_back = True
        after = np.array(arrays.to_numpy(self.buffer))
        outside = np.ones(after.size, bool)
        outside[self.offsets.reshape(-1)] = False
        changed = np.flatnonzero(outside & (_bits(after) != _bits(self.before)))
        if changed.size:
            raise Violation(
                f"memory around the {self.name} was written: {self._describe(changed, after)} ({self.layout} layout)"
            )
        return after[self.offsets]

    def _describe(self, changed: np.ndarray, after: np.ndarray) -> str:
        """Per band: which band, how many elements, how near the nearest is and what it now holds."""
        (before_band, first_edge), (after_band, last_edge) = self.labels
        if self.offsets.size:
            first, last = int(self.offsets.min()), int(self.offsets.max())
            ends = self.offsets.reshape(self.offsets.shape[0], -1).max(axis=1)
        else:  # an empty array (no tokens): its two bands meet
            first, last = self.start, self.start - 1
            ends = np.zeros(0, np.int64)
        bands: dict[str, list] = {}
        for offset in changed.tolist():
            if offset < first:
                band, edge, distance = before_band, first_edge, first - offset
            elif offset > last:
                band, edge, distance = after_band, last_edge, offset - last
            else:
                s = int(np.searchsorted(ends, offset)) - 1  # the slot whose end precedes the offset
                band, edge, distance = f"between slots {s} and {s + 1}", f"slot {s}", offset - int(ends[s])
            entry = bands.setdefault(band, [0, distance, offset, edge])
            entry[0] += 1
            if distance < entry[1]:
                entry[1:3] = [distance, offset]
        parts = []
        for band, (count, distance, offset, edge) in bands.items():
            parts.append(
                f"{count} canary element{'s' if count > 1 else ''} {band} overwritten (the nearest "
                f"{distance} element{'s' if distance > 1 else ''} from {edge}: "
                f"{float(self.before[offset]):.7g} -> {float(after[offset]):.7g})"
            )
        return "; ".join(parts)


def guard(
    x: np.ndarray,
    kind: str,
    layout: str = "contiguous",
    gap: int = 1,
    name: str = "pool",
    labels: tuple[tuple[str, str], tuple[str, str]] = (
        ("before slot 0", "slot 0"),
        ("after the last slot", "the last slot"),
    ),
    band: int | None = None,
) -> Guarded:
    """``x`` (NumPy, ``[rows, ...]``) as a view into a canary-guarded buffer of ``kind``.

    Rows (slots, ``E`` elements each) are laid out ``contiguous``, ``padded`` (``gap`` canary
    elements after each row: ``buf[:, :E]``) or ``strided`` (a canary row between rows:
    ``buf[::2]``); ``band`` canary elements guard each end (default ``BAND + 2 E``: a store one
    slot past the end, at the strided layout's stride too, still lands in them).
    """
    rows = x.shape[0] if x.ndim else 1
    E = int(np.prod(x.shape[1:], dtype=np.int64)) if x.ndim else 1
    band = BAND + 2 * E if band is None else band
    if layout == "contiguous":
        region = rows * E

        def pick(b: Any) -> Any:
            return b.reshape(rows, E)
    elif layout == "padded":
        region = rows * (E + gap)

        def pick(b: Any) -> Any:
            return b.reshape(rows, E + gap)[:, :E]
    elif layout == "strided":
        region = max(2 * rows - 1, 0) * E

        def pick(b: Any) -> Any:
            return b.reshape(max(2 * rows - 1, 0), E)[::2]
    else:
        raise ValueError(f"layout: one of {', '.join(LAYOUTS)}, got {layout!r}")
    total = band + region + band

    def carve(b: Any) -> Any:
        return _reshape_view(pick(b[band : band + region]), x.shape)

    offsets = carve(np.arange(total, dtype=np.int64))
    host = np.resize(CANARY.astype(x.dtype), total)
    host[offsets] = x
    buffer = arrays.to_kind(host, kind)
    view = carve(buffer)
    before = np.array(arrays.to_numpy(buffer))  # what the call starts from, as read back
    return Guarded(name, layout, buffer, view, offsets, before, labels, band)


# spec_guarded_pool ------------------------------------------------------------------------------
@st.composite
def guarded_pool_cases(draw, limits: Limits, rules: SpecRules):
    """``spec_decode_slots`` cases plus the pool's ``layout`` and ``gap`` (canaries after each padded slot)."""
    problem, params = draw(spec_cases(limits, rules, "slots"))
    params["layout"] = draw(st.sampled_from(LAYOUTS))
    params["gap"] = draw(st.integers(1, 8))
    return problem, params


def check_guarded_pool(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    """``check_slots`` on a guarded pool view; canaries checked first, when the pool is read back."""
    layout = params["layout"]
    made: list[Guarded] = []

    def place(pool: np.ndarray, kind: str) -> tuple[Any, Callable[[], np.ndarray]]:
        made.append(guard(pool, kind, layout, params["gap"]))
        return made[-1].view, made[-1].read

    try:
        return check_slots(impl, problem, params, place)
    except NotImplementedError:
        raise
    except REJECTIONS as exc:
        # raised by the call itself (the pool was handed out, never read back), naming why
        called = bool(made) and not made[-1].read_back
        if layout != "contiguous" and called and any(w in str(exc).lower() for w in LAYOUT_WORDS):
            return Measurement(
                0.0,
                1.0,
                f"{layout} pool rejected",
                note=f"rejected a non-contiguous pool ({layout}: {type(exc).__name__}: {exc})",
            )
        raise


# output_isolation -------------------------------------------------------------------------------
def check_output_isolation(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    """A first call's outputs, read again after a second call of the same shapes, bitwise unchanged."""
    first = impl.call(problem)  # the implementation's own arrays, not copies
    taken = result_of(*first)
    negated = problem.initial_state if problem.initial_state is None else -problem.initial_state
    impl.call(problem.replace(v=-problem.v, initial_state=negated))  # every output differs from the first
    again = result_of(*first)
    for name in ("o", "final_state"):
        before, after = getattr(taken, name), getattr(again, name)
        if before is None or after is None:
            continue
        changed = np.flatnonzero(_bits(after).reshape(-1) != _bits(before).reshape(-1))
        if changed.size:
            diff = float(np.nanmax(np.abs(after.astype(np.float64) - before.astype(np.float64))))
            raise Violation(
                f"the {name} a call returned changed when the next call ran: {changed.size} of {before.size} "
                f"elements, by up to {diff:.3g} (the implementation reuses one output buffer across calls; a "
                "caller keeping a result loses it)",
                Measurement(diff, 0.0),
            )
    return Measurement(0.0, 0.0, "bitwise")


# guarded_inputs ---------------------------------------------------------------------------------
def check_guarded_inputs(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    """Inputs as guarded views: inputs and canaries bitwise unchanged, outputs within tolerance."""
    guards = {
        name: guard(
            np.asarray(getattr(problem, name)),
            impl.array,
            name=f"input {name}",
            labels=((f"before {name}", name), (f"after {name}", name)),
            band=BAND,
        )
        for name in INPUTS
        if getattr(problem, name) is not None
    }
    result = run_checked(impl, problem, arguments={name: g.view for name, g in guards.items()})
    for name, g in guards.items():
        after = g.read()
        before = g.before[g.offsets]
        changed = np.flatnonzero(_bits(after).reshape(-1) != _bits(before).reshape(-1))
        if changed.size:
            at = tuple(int(i) for i in np.unravel_index(changed[0], before.shape))
            raise Violation(
                f"input {name} was written by the kernel: {changed.size} of {before.size} elements changed "
                f"(the first at index {at}: {float(before[at]):.7g} -> {float(after[at]):.7g})"
            )
    reference, tolerance = oracle_and_tolerance(problem, state_dtype=state_dtype_of(impl))
    return compare(problem, result, reference, tolerance)


# spec_decode_stream -----------------------------------------------------------------------------
@st.composite
def stream_cases(draw, limits: Limits, rules: SpecRules, max_steps: int = MAX_STEPS):
    """``(problem, params)``: ``S`` steps of ``N`` requests through one pool.

    The problem packs every step's tokens, one ``cu_seqlens`` segment per (step, request), step by
    step. ``params``: ``ssm_state_indices [N, C]`` (each request's own slots, reused every step, as
    vLLM does), ``lengths [S][N]`` tokens per step, ``accepted [S][N]`` (step 0: the start column
    in the initial pool; step s > 0: how many of step s - 1's tokens were accepted, at most its
    length), ``slots`` and ``pool_seed``.
    """
    heads = draw(spec_heads(limits))
    low = max(1, rules.min_tokens)
    drafts = low > 1 or draw(st.booleans())  # speculative steps, or one token per request per step
    C = draw(st.integers(max(2, low), 4)) if drafts else low
    N = draw(st.integers(1, 3))
    if rules.uniform_lengths:
        step_lengths = st.integers(low, C).map(lambda length: [length] * N)
    else:
        step_lengths = st.lists(st.integers(low, C), min_size=N, max_size=N)
    step = st.tuples(step_lengths, st.lists(st.integers(1, C), min_size=N, max_size=N))
    # Steps as one list, which Hypothesis shrinks by deleting steps; half the draws are long streams.
    steps = draw(
        st.one_of(
            st.lists(step, min_size=1, max_size=max_steps),
            st.lists(step, min_size=max(1, 2 * max_steps // 3), max_size=max_steps),
        )
    )
    lengths = [list(length) for length, _ in steps]
    # accepted at step s counts tokens of step s - 1: at most its length (step 0: any start column)
    accepted = [list(steps[0][1])] + [
        [min(a, lengths[s - 1][n]) for n, a in enumerate(steps[s][1])] for s in range(1, len(steps))
    ]
    first = rules.first_live_slot
    slots = first + N * C + draw(st.integers(1, 2))
    order = draw(st.permutations(range(first, slots)))
    indices = np.array(order[: N * C], np.int64).reshape(N, C)
    problem, rng = spec_tokens(draw, heads, [length for step in lengths for length in step])
    params = dict(
        mode="stream",
        rules=rules.name,
        ssm_state_indices=indices.tolist(),
        lengths=lengths,
        accepted=accepted,
        slots=slots,
        pool_seed=int(rng.integers(2**31)),
    )
    return problem, params


def _stream_problem(problem: Problem, lengths, accepted, starts: np.ndarray) -> Problem:
    """Each request's whole token stream (the accepted tokens of every step, all of the last) from ``starts``."""
    S, N = lengths.shape
    bounds = problem.bounds
    pieces = []
    for n in range(N):
        take = [accepted[s + 1, n] if s + 1 < S else lengths[s, n] for s in range(S)]
        pieces.append(np.concatenate([np.arange(bounds[s * N + n], bounds[s * N + n] + take[s]) for s in range(S)]))
    cu = np.concatenate([[0], np.cumsum([len(p) for p in pieces])]).astype(np.int64)
    return problem.take(np.concatenate(pieces), cu, starts)


def check_stream(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    """Run the steps on one pool; each step's outputs, then each request's final slot (state drift)."""
    rules = spec_rules_of(impl.extra)
    indices = np.asarray(params["ssm_state_indices"], np.int64)
    lengths = np.asarray(params["lengths"], np.int64)
    accepted = np.asarray(params["accepted"], np.int64)
    S, N = lengths.shape
    rows = np.arange(N)
    sh = problem.shape
    pool = make_pool(params, sh["HV"], sh["K"], sh["V"], rules.pool_v_first)
    pool_arg = _to(pool.copy(), impl.array)
    bounds = problem.bounds
    current, starts, outputs = pool, [], []
    for s in range(S):
        first, last = bounds[s * N], bounds[(s + 1) * N]
        step = problem.take(np.arange(first, last), bounds[s * N : (s + 1) * N + 1] - first, None)
        # the state each request starts from, as the kernel left it: outputs are judged per step
        starts.append(kfirst(current, rules)[indices[rows, accepted[s] - 1]])
        o = call_spec(impl, step, pool_arg, indices, accepted[s])
        if o is None or tuple(np.shape(o)) != step.v.shape:
            raise Violation(f"step {s + 1}: o has shape {None if o is None else np.shape(o)}, expected {step.v.shape}")
        outputs.append(np.asarray(o))
        current = np.asarray(arrays.to_numpy(pool_arg))
    # each step's outputs from the state the kernel read, at the normal output tolerance (first:
    # a kernel that fails them needs no drift estimate, and shrinking such a failure stays cheap)
    segments = problem.replace(initial_state=np.concatenate(starts).astype(np.float32), output_final_state=True)
    reference, bound = oracle_and_tolerance(segments, state_dtype=state_dtype_of(impl))
    got = Result(np.concatenate(outputs, axis=1), None, None, None)
    try:
        out_m = compare(segments, got, (reference[0], None), bound)
    except Violation as exc:
        errors = tol.measure(got.o, None, reference[0], None, segments, tol.scales_for(segments, bound))
        where = ""
        if errors.worst_token is not None:
            segment = int(np.searchsorted(bounds, errors.worst_token[0], side="right")) - 1
            where = f"step {segment // N + 1} of {S}, request {segment % N}: "
        raise Violation(f"{where}outputs: {exc}", exc.measurement) from None
    # every final slot against the whole accepted stream, at a float32 state's tolerance
    stream = _stream_problem(problem, lengths, accepted, kfirst(pool, rules)[indices[rows, accepted[0] - 1]])
    ref_o, ref_state = numpy_oracle(stream)
    wide = stream if stream.dtype.itemsize >= 4 else stream.astype(np.float32)  # exact: same values
    state_bound = tol.tolerance(wide, tol.condition(wide, (ref_o, ref_state), state_dtype=state_dtype_of(impl)))
    final = kfirst(current, rules)[indices[rows, lengths[-1] - 1]]
    try:
        state_m = compare(
            wide, Result(ref_o, final, None, None), (ref_o, ref_state), state_bound, what="oracle of the whole stream"
        )
    except Violation as exc:
        m = exc.measurement
        ratio = f"{m.ratio:.3g} times" if m is not None else "non-finite, not within"
        raise Violation(
            f"state drift after {S} step{'s' if S > 1 else ''} ({stream.lengths.tolist()} tokens per request; "
            f"every step's outputs within tolerance): the final slots {indices[rows, lengths[-1] - 1].tolist()} "
            f"are {ratio} the {tol.narrow_state_dtype(state_dtype_of(impl)) or 'float32'}-state bound off the "
            f"float64 oracle of the whole stream ({exc})",
            m,
        ) from None
    return max(out_m, state_m, key=lambda x: x.ratio)


def pool_properties(limits: Limits) -> list[Property]:
    """``spec_guarded_pool``, ``guarded_inputs``, ``output_isolation`` and ``spec_decode_stream``, drawing
    within ``limits``."""
    inputs: st.SearchStrategy = gs.problems(limits, max_len=40).map(lambda p: (p, {}))
    return [
        Property(
            "spec_guarded_pool",
            "a pool view (contiguous, padded, strided) is updated in place, canaries around it intact",
            lambda impl: guarded_pool_cases(limits, spec_rules_of(impl.extra)),
            check_guarded_pool,
            40,
            _needs_spec,
            form=SPEC_FORM,
        ),
        Property(
            "guarded_inputs",
            "inputs in guarded buffers: inputs and canaries bitwise unchanged, outputs within tolerance",
            lambda impl: inputs,
            check_guarded_inputs,
            30,
            _needs_native,
        ),
        Property(
            "output_isolation",
            "a call's outputs stay bitwise intact when the next call runs (no shared output buffer)",
            lambda impl: inputs,
            check_output_isolation,
            20,
            _needs_native,
        ),
        Property(
            "spec_decode_stream",
            f"up to {MAX_STEPS} decode steps through one pool: each step's outputs, no state drift",
            lambda impl: stream_cases(limits, spec_rules_of(impl.extra)),
            check_stream,
            20,
            _needs_spec,
            form=SPEC_FORM,
        ),
    ]
