"""Process properties: what one call leaves behind for the next call in the same process.

A kernel library keeps state between calls: compiled kernels cached by a key, autotuned launch
configurations, heuristics computed once. A key that misses something the kernel depends on makes
a later call run what an earlier call compiled. These properties make several calls in a row, each
judged against the oracle, in an order that exposes such a cache (native form):

- ``optional_dtypes``: three calls that differ only in the dtype of one optional argument, in the
  order A, B, A. The argument is one the implementation declares (``extra["optional_dtypes"]``:
  ``{name: (dtype, dtype)}``, a dtype ``"half"`` meaning the input dtype where it has 16 bits and
  bfloat16 otherwise) or, undeclared, ``initial_state`` in float32 and ``"half"``. ``A_log`` and
  ``dt_bias`` are passed with ``use_gate_in_kernel`` (FLA 0.6's in-kernel gate). The argument's
  values are exact in both dtypes, so all three calls have one oracle. A call that raises
  ``TypeError``, ``ValueError`` or ``RuntimeError`` naming the dtype is a documented refusal (a
  note). After FlashInfer PR #4219: a compile cache keyed without the dtype of ``A_log`` ran the
  first call's kernel on the second call's float32 bytes.
- ``shape_class_return``: a call of shape class X, one of another class Y (another path: one
  token per sequence against a prefill of 17 or more, or other head counts and sizes), then X again
  with X's inputs: every call within tolerance of the oracle, the third bitwise equal to the first
  (a heuristic or launch configuration computed on one call and kept for the next).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from gdn_verify.core import arrays, gating
from gdn_verify.core.implementation import Implementation, Result
from gdn_verify.core.problem import DTYPES, Problem
from gdn_verify.core.property import Measurement, Property, Violation
from gdn_verify.core.verdict import compare, first_difference, oracle_and_tolerance, run_checked, state_dtype_of
from gdn_verify.properties import strategies as gs
from gdn_verify.properties.native import OPTION_CLASSES, _needs, _needs_native, strategy_in_kernel_gate
from gdn_verify.properties.strategies import Limits

OPTIONAL = ("initial_state", "A_log", "dt_bias")
DEFAULT_OPTIONAL = {"initial_state": ("float32", "half")}
REJECTIONS = (TypeError, ValueError, RuntimeError)
DTYPE_WORDS = ("dtype", "float", "bf16", "fp16", "half", "type")


def half_of(dtype: str) -> str:
    """The 16-bit dtype a ``dtype``-input kernel would take an optional argument in: the input dtype
    itself when it has 16 bits, else bfloat16."""
    return dtype if DTYPES[dtype].itemsize == 2 else "bfloat16"


def optional_dtypes_of(impl: Implementation, dtype: str) -> dict[str, tuple[str, str]]:
    """The optional arguments ``impl`` takes in two dtypes, each with its pair (``"half"`` resolved
    for ``dtype`` inputs); pairs of one dtype are dropped (nothing to tell apart)."""
    declared = impl.extra.get("optional_dtypes", DEFAULT_OPTIONAL)
    out = {}
    for name, pair in declared.items():
        if name not in OPTIONAL:
            raise ValueError(f'extra["optional_dtypes"]: {name!r} is none of {", ".join(OPTIONAL)}')
        a, b = (half_of(dtype) if d == "half" else d for d in pair)
        if a != b:
            out[name] = (a, b)
    return out


def read_as_exact(values: np.ndarray, dtype: str) -> np.ndarray:
    """``values`` (float32) stored in ``dtype`` and read back as float32."""
    return values.astype(DTYPES[dtype]).astype(np.float32)


def _exact_in(values: np.ndarray, dtypes: tuple[str, str]) -> np.ndarray:
    """``values`` (float32) rounded through each dtype in turn: exact in both (and in float32, as
    two roundings each to a coarser or finer grid of the same base land on the coarsest grid)."""
    for d in dtypes:
        values = read_as_exact(values, d)
    return values


# optional_dtypes --------------------------------------------------------------------------------
@st.composite
def optional_dtype_cases(draw, limits: Limits, impl: Implementation):
    """``(problem, params)``: ``params["argument"]`` (one of the optional arguments ``impl`` declares),
    ``params["dtypes"]`` (A, B) and, for ``A_log``/``dt_bias``, the in-kernel gate's values
    (``native.strategy_in_kernel_gate``)."""
    dtype = limits.dtype if limits.dtype is not None else draw(st.sampled_from(tuple(DTYPES)))
    limits = limits.replace(dtype=dtype)
    declared = optional_dtypes_of(impl, dtype)
    if not declared:  # every declared pair is one dtype on these inputs: nothing to tell apart
        return draw(gs.problems(limits, max_len=8)), {"argument": None, "dtypes": []}
    name = draw(st.sampled_from(sorted(declared)))
    pair = declared[name]
    if name == "initial_state":
        classes = gs.pool_classes(limits, initial_state=True, first=OPTION_CLASSES)
        problem = draw(gs.problems(limits, max_len=40, classes=classes))
        state = problem.initial_state
        if state is None:  # drawn freely (no shape pool): the argument must be passed
            rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
            state = rng.standard_normal(problem.state_shape())
        state = _exact_in(np.asarray(state, np.float32), pair)
        return problem.replace(initial_state=state), {"argument": name, "dtypes": list(pair)}
    problem, params = draw(strategy_in_kernel_gate(limits))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if params["dt_bias"] is None:  # dt_bias is the argument: draw one (softplus^-1 of dt in [1e-3, 0.1])
        HV = problem.v.shape[2]
        params["dt_bias"] = np.log(np.expm1(np.exp(rng.uniform(np.log(1e-3), np.log(0.1), HV)))).tolist()
    for key in ("A_log", "dt_bias"):
        params[key] = _exact_in(np.asarray(params[key], np.float32), pair).tolist()
    return problem, {**params, "argument": name, "dtypes": list(pair)}


def _as_passed(problem: Problem, params: dict, dtype: str) -> tuple[dict, dict]:
    """The call's ``(options, arguments)`` with the optional argument in ``dtype``."""
    name = params["argument"]
    options = gating.options_from_params(params)
    value = problem.initial_state if name == "initial_state" else options[name]
    cast = np.asarray(value, np.float32).astype(DTYPES[dtype])
    if name == "initial_state":
        return options, {"initial_state": cast}
    return {**options, name: cast}, {}


def check_optional_dtypes(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    """Calls A, B, A (the optional argument's dtype), each within tolerance of the one oracle."""
    if params["argument"] is None:
        return Measurement(0.0, 0.0, "one dtype", note="the declared optional dtypes coincide on these inputs")
    name, (first, second) = params["argument"], params["dtypes"]
    options = gating.options_from_params(params)
    native = problem
    if options:
        g, beta = gating.in_kernel_gates(problem.g, problem.beta, **options)
        native = problem.replace(g=g, beta=beta)
    reference, tolerance = oracle_and_tolerance(native, state_dtype=state_dtype_of(impl))
    worst = Measurement(0.0, 0.0)
    order = (first, second, first)
    for i, dtype in enumerate(order):
        opts, arguments = _as_passed(problem, params, dtype)
        if "initial_state" in arguments:
            arguments = {"initial_state": arrays.to_kind(arguments["initial_state"], impl.array)}
        try:
            result = run_checked(impl, problem, options=opts or None, arguments=arguments or None)
        except NotImplementedError:
            raise
        except REJECTIONS as exc:
            if i == 1 and any(w in str(exc).lower() for w in DTYPE_WORDS):
                return Measurement(0.0, 1.0, f"{name} in {dtype} rejected", note=f"{name} in {dtype}: {exc}")
            raise
        try:
            m = compare(native, result, reference, tolerance)
        except Violation as exc:
            raise Violation(_describe(i, name, order, str(exc)), exc.measurement) from None
        worst = max(worst, m, key=lambda x: x.ratio)
    return worst


def _describe(i: int, name: str, order: tuple[str, str, str], message: str) -> str:
    """Which call of A, B, A failed, and what that order says of the cause."""
    first, second = order[0], order[1]
    if i == 0:
        return f"call 1 of 3 ({name} in {first}): {message}"
    if i == 1:
        return (
            f"call 2 of 3 ({name} in {second}, after a call with it in {first} that met the oracle, the same "
            f"values): {message}; the result depends on the dtype of {name}: a cache keyed without that dtype "
            f"(this call ran the first call's kernel) does this, as does a kernel that mishandles {name} in "
            f"{second} in any order (a fresh process calling it first tells them apart)"
        )
    return (
        f"call 3 of 3 ({name} back in {first}, which met the oracle on call 1, after a call with it in "
        f"{second}): {message}; a cache keyed without the dtype of {name} (this call ran the second call's kernel)"
    )


# shape_class_return -----------------------------------------------------------------------------
def shape_class(problem: Problem) -> tuple:
    """What a kernel library keys a path or launch configuration on: one token per sequence or
    more, head counts and sizes, and the flags (varlen, initial state, l2norm, state layout)."""
    s = problem.shape
    decode = bool(problem.lengths.size) and int(problem.lengths.max()) <= 1
    flags = (problem.cu_seqlens is not None, problem.initial_state is not None, problem.use_qk_l2norm_in_kernel)
    return (decode, s["H"], s["HV"], s["K"], s["V"], *flags, problem.state_v_first)


def describe_class(problem: Problem) -> str:
    s = problem.shape
    path = (
        "decode (T = 1 per sequence)"
        if shape_class(problem)[0]
        else f"prefill (T up to {int(problem.lengths.max(initial=0))})"
    )
    return f"{path}, H={s['H']}, HV={s['HV']}, K={s['K']}, V={s['V']}"


def other_problem(recipe: dict, dtype: str) -> Problem:
    """The problem of class Y that ``recipe`` (JSON-ready: ``B``, ``T``, ``cu_seqlens`` (a list or
    None), ``H``, ``HV``, ``K``, ``V``, ``initial_state``, ``l2norm``, ``seed``) describes, in ``dtype``:
    unit-norm keys (raw keys under l2norm), mild gates, a random initial state where asked."""
    r = recipe
    rng = np.random.default_rng(r["seed"])
    B, T, H, HV, K, V = (r[n] for n in ("B", "T", "H", "HV", "K", "V"))
    k = rng.standard_normal((B, T, H, K)) if r["l2norm"] else gs.unit_rows(rng, (B, T, H, K))
    cu = None if r["cu_seqlens"] is None else np.asarray(r["cu_seqlens"], np.int64)
    N = B if cu is None else len(cu) - 1
    state = rng.standard_normal((N, HV, K, V)).astype(np.float32) if r["initial_state"] else None
    problem = Problem(
        rng.standard_normal((B, T, H, K)),
        k,
        rng.standard_normal((B, T, HV, V)),
        gs.gate_values(rng, (B, T, HV), "mild"),
        gs.beta_values(rng, (B, T, HV)),
        initial_state=state,
        cu_seqlens=cu,
        use_qk_l2norm_in_kernel=r["l2norm"],
    )
    return problem.astype(DTYPES[dtype])


@st.composite
def shape_return_cases(draw, limits: Limits):
    """``(X, {"other": recipe of Y})``: X as ``gs.problems`` draws it; Y a decode (one token per
    sequence) or a prefill (17 to 80 tokens), of the path X is not on where the head counts and
    sizes drawn for Y equal X's (so that the classes always differ)."""
    x = draw(gs.problems(limits, max_len=40))
    pool = gs.pool_classes(limits)
    if pool:  # a kernel compiled per class: Y is one of the classes it has
        c = draw(st.sampled_from(tuple(pool)))
        H, HV, K, V, varlen, state, l2norm = c.H, c.HV, c.K, c.V, c.varlen, c.initial_state, c.l2norm
    else:
        H, HV = draw(gs.head_counts(limits))
        K, V = draw(gs.head_dims(limits))
        varlen, state, l2norm = draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
    decode = draw(st.booleans())
    if (H, HV, K, V) == (x.shape["H"], x.shape["HV"], x.shape["K"], x.shape["V"]):
        decode = not shape_class(x)[0]
    B, T, cu = draw(
        gs.layouts(
            max_batch=limits.max_batch,
            max_sequences=limits.max_sequences,
            max_len=1 if decode else 80,
            min_len=1 if decode else 17,
            varlen=varlen,
        )
    )
    recipe = dict(
        B=B,
        T=T,
        cu_seqlens=None if cu is None else cu.tolist(),
        H=H,
        HV=HV,
        K=K,
        V=V,
        initial_state=state,
        l2norm=l2norm,
        seed=draw(st.integers(0, 2**32 - 1)),
    )
    return x, {"other": recipe}


WHERE = (
    "call 1 of 3 (class X",
    "call 2 of 3 (class Y, after a call of class X",
    "call 3 of 3 (class X again, after a call of class Y",
)


def _passes_again(impl: Implementation, problem: Problem, reference: tuple, tolerance) -> bool:
    """Whether ``problem`` called again at once (after itself) meets the oracle."""
    try:
        compare(problem, run_checked(impl, problem), reference, tolerance)
    except Violation:
        return False
    return True


def check_shape_class_return(impl: Implementation, problem: Problem, params: dict) -> Measurement:
    """X, Y, X: each within tolerance of its oracle; the second X bitwise the first."""
    other = other_problem(params["other"], problem.dtype.name)
    state_dtype = state_dtype_of(impl)
    calls = [problem, other, problem]
    results: list[Result] = []
    worst = Measurement(0.0, 0.0)
    for i, p in enumerate(calls):
        result = run_checked(impl, p)
        reference, tolerance = oracle_and_tolerance(p, state_dtype=state_dtype)
        try:
            m = compare(p, result, reference, tolerance)
        except Violation as exc:
            where = WHERE[i]
            if i == 0 and _passes_again(impl, p, reference, tolerance):
                where = "call 1 of 3 (class X, after the calls of the previous example; the same call made again met it"
                i = 1
            named = "; a heuristic or launch configuration kept from the previous call of another shape class?"
            raise Violation(f"{where}: {describe_class(p)}): {exc}" + (named if i else ""), exc.measurement) from None
        results.append(result)
        worst = max(worst, m, key=lambda x: x.ratio)
    differs = first_difference(results[0], results[2])
    if differs is not None:
        name, diff, _ = differs
        raise Violation(
            f"call 3 of 3 (class X again after class Y: {describe_class(other)}) returned a {name} that differs "
            f"from call 1's with the same inputs by up to {diff:.3g}, both within tolerance: the path or launch "
            "configuration depends on the previous call",
            Measurement(diff, 0.0),
        )
    return worst


def _needs_optional(impl: Implementation) -> str | None:
    """Native, and the in-kernel gate's keywords where ``A_log`` or ``dt_bias`` is declared."""
    declared = impl.extra.get("optional_dtypes", DEFAULT_OPTIONAL)
    if {"A_log", "dt_bias"} & set(declared):
        return _needs("use_gate_in_kernel", "A_log", "dt_bias")(impl)
    return _needs_native(impl)


def process_properties(limits: Limits) -> list[Property]:
    """``optional_dtypes`` and ``shape_class_return``, drawing within ``limits``."""

    return [
        Property(
            "optional_dtypes",
            "calls differing only in an optional argument's dtype (A, B, A) each meet the oracle",
            lambda impl: optional_dtype_cases(gs.supported(limits, impl), impl),
            check_optional_dtypes,
            20,
            _needs_optional,
        ),
        Property(
            "shape_class_return",
            "a call of class X, one of class Y, X again: each meets the oracle, the two X calls bitwise equal",
            lambda impl: shape_return_cases(gs.supported(limits, impl)),
            check_shape_class_return,
            20,
            _needs_native,
        ),
    ]
