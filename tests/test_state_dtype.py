"""A declared state dtype (``Implementation.extra["state_dtype"]``) and its term in the bound.

A kernel that documents a bfloat16 state (FlashInfer's bf16-state decode) rounds its carried state
after every token; declared, the bound has a derived term for that rounding (docs/precision.md,
``tolerance.state_rounding_condition``), so the NumPy model of such a kernel passes. Undeclared,
the same rounding stays forbidden; a state rounded more coarsely than declared, or to float16 where
float16's range ends, still fails; without a declaration the bound is what it was, bit for bit.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings

from gdn_verify.core import tolerance
from gdn_verify.core.oracle import numpy_oracle
from gdn_verify.core.problem import Problem
from gdn_verify.core.property import Violation
from gdn_verify.core.verdict import oracle_and_tolerance, state_dtype_of
from gdn_verify.implementations import from_callable
from gdn_verify.implementations.precision import BY_NAME, stored_state
from gdn_verify.properties import Limits, catalogue
from gdn_verify.properties import strategies as gs
from gdn_verify.properties.native import check_error_growth, check_matches_reference
from tests.test_precision_contract import make

BF16_STATE = stored_state("bfloat16")


def model(run, state_dtype=None, name="stored_state"):
    impl = from_callable(run, "numpy", name=name)
    return dataclasses.replace(impl, extra={**impl.extra, "state_dtype": state_dtype}) if state_dtype else impl


def ratio(impl, problem: Problem) -> float:
    try:
        return check_matches_reference(impl, problem, {}).ratio
    except Violation as exc:
        return np.inf if exc.measurement is None else exc.measurement.ratio


def tiny(problem: Problem, factor: float) -> Problem:
    """The same problem with v and the initial state scaled by ``factor`` (states of that size)."""
    state = problem.initial_state
    return problem.replace(
        v=(np.asarray(problem.v, np.float64) * factor).astype(problem.dtype),
        initial_state=None if state is None else (state * factor).astype(np.float32),
    )


def test_narrow_state_dtype():
    assert tolerance.narrow_state_dtype(None) is None
    for default in ("float32", np.float32, "float64"):
        assert tolerance.narrow_state_dtype(default) is None
    for name in ("bfloat16", ml_dtypes.bfloat16, "torch.bfloat16"):
        assert tolerance.narrow_state_dtype(name) == "bfloat16"
    assert tolerance.narrow_state_dtype(np.float16) == "float16"
    assert state_dtype_of(model(BF16_STATE)) is None
    assert state_dtype_of(model(BF16_STATE, "bfloat16")) == "bfloat16"


@pytest.mark.parametrize("kind", ["plain", "state", "retention", "spike"])
def test_the_default_path_is_unchanged(kind):
    # No declaration, None or float32: no state term, no extra draws, the same numbers bit for bit.
    p = make(kind, "bfloat16")
    reference = numpy_oracle(p)
    base = tolerance.tolerance(p, tolerance.condition(p, reference))
    assert not any(name.startswith("carried state") for name, _ in base.terms)
    for declared in (None, "float32"):
        other = tolerance.tolerance(p, tolerance.condition(p, reference, state_dtype=declared))
        for field in ("output_rms", "output_token", "state", "kappa_output", "kappa_state", "algorithm", "terms"):
            assert getattr(other, field) == getattr(base, field), field
    declared = oracle_and_tolerance(p, state_dtype="bfloat16")[1]
    assert dict(declared.terms)["carried state stored in the declared bfloat16"][2] > 0
    # the declared bound is the default one plus its term: the other terms are the same numbers
    assert {n: v for n, v in declared.terms if not n.startswith("carried state")} == dict(base.terms)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_declared_bfloat16_state_passes_and_undeclared_fails(dtype):
    declared, undeclared = model(BF16_STATE, "bfloat16"), model(BF16_STATE)
    worst = max(ratio(declared, make(kind, dtype)) for kind in ("plain", "state", "retention", "tiny_rows", "spike"))
    assert worst < 0.6, f"declared bfloat16 state: {worst:.3g} of its bound"
    # undeclared: a float32 initial state rounds at once, and a retained memory stops decaying
    assert ratio(undeclared, make("state", dtype)) > 3.0
    assert ratio(undeclared, make("retention", dtype)) > 3.0
    assert ratio(model(BY_NAME["state16_token"].run), make("retention", dtype)) > 3.0  # forbidden as before


@pytest.mark.parametrize("rounded", ["every token", "once per call"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "prop", ["matches_reference", "gate_extremes", "state_continuation", "error_growth", "head_mapping"]
)
def test_the_declared_model_passes_the_properties(prop, dtype, rounded):
    # stored() and BF16_ONCE are defined below, with the once-per-call tests
    impl = model(BF16_STATE, "bfloat16") if rounded == "every token" else stored(BF16_ONCE)
    limits = Limits(dtype=dtype, max_tokens=512, head_dims=(1, 3, 8, 32, 60))  # 128 costs the probes seconds
    check = catalogue(limits)[prop]

    @seed(7)
    @settings(
        max_examples=8 if prop == "error_growth" else 20,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(check.strategy(impl))
    def run(case):
        problem, params = case
        check.check(impl, problem, params)  # a Violation fails the test with its message

    run()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_declared_bfloat16_state_stalls_within_its_bound_on_long_retention(dtype):
    # error_growth's retention regime: written in the first chunk, then 1024 tokens of decays below
    # half a bfloat16 ulp, which a bfloat16 state cannot make (it rounds back every token). The
    # drift is the whole point of the coherent draw and of expm1; undeclared, it is far off.
    rng = np.random.default_rng(3)
    T, K, V = 1024, 16, 16
    k = gs.unit_rows(rng, (1, T, 1, K))
    beta = rng.uniform(0, 1, (1, T, 2))
    beta[:, 64:] = 0.0
    p = Problem(
        rng.standard_normal((1, T, 1, K)), k, rng.standard_normal((1, T, 2, V)),
        gs.gate_values(rng, (1, T, 2), "retention"), beta,
    ).astype(np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.float32)  # fmt: skip
    params = {"lengths": [64, 256, 1024], "regime": "retention"}
    assert check_error_growth(model(BF16_STATE, "bfloat16"), p, params).ratio < 0.6
    with pytest.raises(Violation):
        check_error_growth(model(BF16_STATE), p, params)


def test_a_coarser_state_declared_as_bfloat16_fails():
    # 3 mantissa bits: bfloat16 rounded 16 times as coarsely. The term is not a blanket.
    coarse = model(stored_state(mantissa_bits=3), "bfloat16")
    assert ratio(coarse, make("state", "float32")) > 3.0
    assert ratio(coarse, make("plain", "float32")) > 3.0
    assert ratio(coarse, make("plain", "bfloat16")) > 1.0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_float16_state_declared_as_bfloat16_fails_outside_float16_range(dtype):
    # float16 has finer digits than bfloat16 but not its range: states of 1e-7 are subnormal or
    # flushed to 0 in float16, exact to bfloat16's precision in bfloat16.
    p = tiny(make("plain", dtype), 1e-7)
    assert ratio(model(stored_state("float16"), "bfloat16"), p) > 3.0
    assert ratio(model(BF16_STATE, "bfloat16"), p) < 0.5
    # declared as what it is, float16, its underflow is in the bound
    assert ratio(model(stored_state("float16"), "float16"), p) < 0.5


def test_the_output_contract_expects_the_declared_state_dtype():
    from gdn_verify.core.implementation import Result
    from gdn_verify.core.verdict import output_contract_violations

    p = Problem(
        q=np.ones((1, 2, 1, 2)), k=np.ones((1, 2, 1, 2)), v=np.ones((1, 2, 1, 2)), g=np.zeros((1, 2, 1)),
        beta=np.ones((1, 2, 1)), output_final_state=True,
    ).astype(np.float32)  # fmt: skip
    o, state = np.zeros((1, 2, 1, 2), np.float32), np.zeros((1, 1, 2, 2))
    bf16 = Result(o, state.astype(ml_dtypes.bfloat16), "float32", "bfloat16")
    fp32 = Result(o, state.astype(np.float32), "float32", "float32")
    assert output_contract_violations(bf16, p, state_dtype="bfloat16") == []
    assert output_contract_violations(fp32, p) == []
    assert output_contract_violations(bf16, p) == ["final_state has dtype bfloat16, expected float32"]
    assert output_contract_violations(fp32, p, state_dtype="bfloat16") == [
        "final_state has dtype float32, expected bfloat16"
    ]


def stored(run):
    """``run`` declared as a bfloat16 state rounded once per call, where it is loaded and stored."""
    impl = model(run, "bfloat16", name="stored_once")
    return dataclasses.replace(impl, extra={**impl.extra, "state_rounding": "stored"})


BF16_ONCE = stored_state("bfloat16", every_token=False)


def test_a_state_rounded_once_per_call_is_declared_as_such():
    declared = state_dtype_of(stored(BF16_ONCE))
    assert isinstance(declared, tolerance.StoredState) and declared == "bfloat16"
    assert tolerance.narrow_state_dtype(declared) == "bfloat16"
    p = make("state", "bfloat16")
    bound = oracle_and_tolerance(p, state_dtype=declared)[1]
    terms = dict(bound.terms)
    assert "state loaded from and stored to the declared bfloat16 once per call" in terms
    assert not any(name.startswith("carried state") for name in terms)
    assert "state_rounding" not in tolerance.condition_parts(p, declared)  # no per-token probe


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_state_rounded_once_per_call_passes_and_one_rounded_every_token_fails(dtype):
    # MAX's recurrence on a bfloat16 pool: the state column stays in float32 registers over the
    # sequence and is rounded where it is read and written back. Declared so, its model passes; a
    # kernel rounding the carried state after every token under the same declaration fails where
    # the rounding drifts (retention), which the per-token declaration would have allowed.
    worst = max(ratio(stored(BF16_ONCE), make(kind, dtype)) for kind in ("plain", "state", "retention", "spike"))
    assert worst < 0.6, f"once-per-call model: {worst:.3g} of its bound"
    assert ratio(stored(BF16_STATE), make("retention", dtype)) > 1.5  # 2.1x (bfloat16 inputs), 2026-11-28
    assert ratio(model(BF16_STATE, "bfloat16"), make("retention", dtype)) < 0.6  # declared per token: allowed


def test_the_once_per_call_bound_stays_tight_on_long_sequences():
    # Past the probe's reach the per-token declaration assumes T coherent roundings: expm1 of
    # C u (T + 1) kappa, which on 65536 bfloat16 tokens allows any state. Once per call, the term
    # is two roundings whatever T is.
    rng = np.random.default_rng(5)
    T, K, V = 65536, 8, 8
    p = Problem(
        rng.standard_normal((1, T, 1, K)), gs.unit_rows(rng, (1, T, 1, K)), rng.standard_normal((1, T, 1, V)),
        np.log(rng.uniform(0.9, 1.0, (1, T, 1))), rng.uniform(0, 1, (1, T, 1)),
        initial_state=rng.standard_normal((1, 1, K, V)).astype(np.float32),
    ).astype(np.dtype(ml_dtypes.bfloat16))  # fmt: skip
    kappa = tolerance.Kappa(1.0, 1.0, 1.0, state_dtype="bfloat16")
    per_token = tolerance.tolerance(p, kappa)
    once = tolerance.tolerance(p, dataclasses.replace(kappa, state_stored=True))
    assert per_token.state > 1e3
    assert once.state < 0.05
