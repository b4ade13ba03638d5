"""The property suite against correct implementations (must pass) and planted bugs (must fail)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gdn_verify.api import check
from gdn_verify.core import gating, tolerance
from gdn_verify.core.oracle import numpy_oracle
from gdn_verify.core.problem import DTYPES, Problem
from gdn_verify.core.property import Violation
from gdn_verify.implementations import numpy_impl, planted, resolve
from gdn_verify.properties import NAMES, catalogue
from gdn_verify.properties.native import check_matches_reference
from gdn_verify.properties.strategies import Limits, head_dims, problems

# A fresh seed each run (printed on failure): correct implementations must pass under any seed.
SEED = random.randrange(2**31)


@pytest.mark.parametrize("impl_name", ["numpy", "numpy-chunk16", "numpy-recurrent", "oracle"])
@pytest.mark.parametrize("prop", NAMES)
def test_correct_implementations_pass(impl_name, prop, tmp_path):
    result = check(
        impl_name,
        dtype="float32",
        properties=[prop],
        max_examples=15 if prop != "error_growth" else 2,
        seed=SEED,
        cases_dir=tmp_path,
        max_tokens=1024,
    )[prop]
    if prop.startswith("spec_") and impl_name != "numpy":  # only numpy has the speculative-decoding form
        assert result.status == "unsupported"
        return
    if prop == "chunk_equals_recurrent" and impl_name not in ("numpy", "oracle"):
        assert result.status == "unsupported"
        return
    if prop.startswith("in_kernel_") and impl_name == "oracle":  # the oracle takes native gates only
        assert result.status == "unsupported"
        return
    if prop == "output_contract" and impl_name == "oracle":  # float64 outputs whatever the input dtype
        assert result.status == "failed" and "dtype" in result.failure.message
        return
    if prop == "inputs_read_exactly":  # 16-bit inputs only: below
        assert result.status == "unsupported" and "16-bit inputs" in result.note
        return
    assert result.status == "passed", f"seed {SEED}: {result.failure and result.failure.message}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("impl_name", ["numpy", "numpy-chunk16", "numpy-recurrent", "oracle"])
def test_correct_implementations_read_16_bit_inputs_exactly(impl_name, dtype, tmp_path):
    result = check(impl_name, dtype=dtype, properties=["inputs_read_exactly"], seed=SEED, cases_dir=tmp_path)
    status = result["inputs_read_exactly"]
    assert status.status == "passed" and status.examples == 20, f"seed {SEED}: {status.as_dict()}"


def test_a_kernel_reading_float16_as_bfloat16_fails_the_exact_contract_at_any_seed(tmp_path):
    result = check("planted:inputs_read_as_bf16", dtype="float16", properties=["inputs_read_exactly"], seed=SEED,
                   cases_dir=tmp_path)["inputs_read_exactly"]  # fmt: skip
    assert result.status == "failed", f"seed {SEED}"
    assert "it is bitwise the exact result of v read as bfloat16" in result.failure.message, f"seed {SEED}"


def test_an_output_stored_through_bfloat16_is_told_from_inputs_read_as_bfloat16(tmp_path):
    """FlashInfer 0.7.2.post1's k-major decode writes its output in bfloat16 and casts it to float16
    (H100, 2026-12-05): o is then what v read as bfloat16 would give too, but the state is exact."""

    def output_through_bf16(**kw):
        o, state = numpy_impl.chunk_gated_delta_rule(**kw)
        return np.asarray(o, np.float32).astype(DTYPES["bfloat16"]).astype(np.asarray(kw["v"]).dtype), state

    result = check(output_through_bf16, dtype="float16", properties=["inputs_read_exactly"], seed=SEED,
                   cases_dir=tmp_path)["inputs_read_exactly"]  # fmt: skip
    assert result.status == "failed", f"seed {SEED}"
    assert "the output went through bfloat16" in result.failure.message, result.failure.message
    assert "v read as bfloat16" not in result.failure.message


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("impl_name", ["numpy", "numpy-chunk16", "numpy-recurrent"])
def test_tolerance_calibration_holds_for_every_dtype(impl_name, dtype, tmp_path):
    """The calibrated tolerance passes correct float32 implementations with every input dtype."""
    result = check(
        impl_name, dtype=dtype, properties=["matches_reference"], max_examples=60, seed=SEED, cases_dir=tmp_path
    )["matches_reference"]
    assert result.status == "passed", f"seed {SEED}: {result.failure and result.failure.message}"
    assert result.worst.ratio < 1.0


def long_problem(T=512, dtype=np.float32, K=32, seed=0):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((1, T, 1, K))
    return Problem(
        q=rng.standard_normal((1, T, 1, K)),
        k=k / np.linalg.norm(k, axis=-1, keepdims=True),
        v=rng.standard_normal((1, T, 2, K)),
        g=np.log(rng.uniform(0.95, 1.0, (1, T, 2))),
        beta=rng.uniform(0, 1, (1, T, 2)),
    ).astype(dtype)


def test_bf16_state_rounding_fails_by_a_wide_margin():
    # Issue requirement: a kernel that rounds its state to bfloat16 every token must fail, not
    # scrape by: its error is far above the tolerance while the correct one is far below.
    problem = long_problem()
    with pytest.raises(Violation) as info:
        check_matches_reference(planted.implementation("bf16_state"), problem, {})
    assert info.value.measurement.ratio > 30
    assert check_matches_reference(resolve("numpy-recurrent"), problem, {}).ratio < 0.3


def test_cancellation_is_judged_on_the_scale_of_the_block():
    # o = scale * S0^T q with q almost in the null space of S0^T: a near-total cancellation. On its
    # own norm a relative perturbation of the inputs moved it by 1e4 times as much; on the scale
    # the inputs could produce (|q| ||S0|| / sqrt(K)) it is an ordinary problem.
    rng = np.random.default_rng(1)
    K, V, T = 8, 2, 4
    S0 = rng.standard_normal((1, 1, K, V))
    null = np.linalg.svd(S0[0, 0].T)[2][-1]  # a K-vector with S0^T null = 0
    q = np.broadcast_to(null + 1e-6 * rng.standard_normal(K), (1, T, 1, K)).copy()
    k = np.eye(K)[None, :T, None, :]
    problem = Problem(
        q=q,
        k=k,
        v=rng.standard_normal((1, T, 1, V)),
        g=np.zeros((1, T, 1)),
        beta=np.zeros((1, T, 1)),
        initial_state=S0.astype(np.float32),
    )
    kappa = tolerance.condition(problem, numpy_oracle(problem))
    assert kappa.output_rms < 10
    reference = numpy_oracle(problem)
    own = tolerance.measure(reference[0] * 1.5, None, reference[0], None, problem)
    natural = tolerance.measure(reference[0] * 1.5, None, reference[0], None, problem, kappa.scales)
    assert own.output_rms == pytest.approx(0.5) and natural.output_rms < 1e-4  # an error of the output's size


@pytest.mark.parametrize("bug", list(planted.BUGS))
def test_every_planted_bug_is_caught_and_named_rightly(bug, tmp_path):
    """Caught by some property; a bug with a numeric model (planted.RIGHT_CAUSES) is named by it,
    the others (exact contracts, speculative slots) are named nothing wrong. SEED is drawn anew
    each run and printed in every message."""
    for name in NAMES:
        result = check(f"planted:{bug}", dtype="float32", properties=[name], seed=SEED, cases_dir=tmp_path)[name]
        if result.status == "failed":
            f = result.failure
            assert f.case_path.exists()
            right = planted.RIGHT_CAUSES[bug]
            wrong = f"{bug} (seed {SEED}): wrong cause {f.cause_model}: {f.cause}"
            # a cause named with its exact look-alikes on this example (scale^2 is V^-0.5 where V = K^2)
            # is right when one of them is
            assert not f.named_causes or set(f.named_causes) & set(right), wrong
            if right:  # bugs with a numeric cause to name get it (the exact and spec ones have none)
                assert set(f.named_causes) & set(right), f"{bug} (seed {SEED}): no cause named ({f.message})"
            return
    pytest.fail(f"planted bug {bug} not caught (seed {SEED})")


# Bugs in the options themselves, a bug that changes between calls, and the other conventions' forms.
OPTION_BUGS = (
    "gate_bias_ignored",
    "neg_eigval_ignored",
    "nondeterministic",
    "spec_reads_first_slot",
    "spec_gates_not_regathered",
)


@pytest.mark.parametrize("bug", [b for b in planted.BUGS if b not in OPTION_BUGS and not b.startswith("max_")])
def test_a_planted_bug_takes_the_in_kernel_gate_options_like_a_correct_kernel(bug):
    """Raw gates with FLA's options give what the float32 native gates give: a planted kernel
    differs from a correct one by its bug alone, also under the in_kernel_* properties."""
    rng = np.random.default_rng(3)
    B, T, H, HV, K, V = 1, 70, 1, 2, 8, 8
    a, b = rng.standard_normal((B, T, HV)).astype(np.float32), rng.standard_normal((B, T, HV)).astype(np.float32)
    options = dict(
        use_gate_in_kernel=True,
        A_log=np.array([-1.0, 0.5], np.float32),
        dt_bias=np.array([0.3, -0.2], np.float32),
        use_beta_sigmoid_in_kernel=True,
    )
    g, beta = gating.float32_gates(a, b, **options)
    common = dict(
        q=rng.standard_normal((B, T, H, K)).astype(np.float32),
        k=rng.standard_normal((B, T, H, K)).astype(np.float32),
        v=rng.standard_normal((B, T, HV, V)).astype(np.float32),
        initial_state=rng.standard_normal((B, HV, K, V)).astype(np.float32),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    fn = planted.BUGS[bug][1]
    raw, native = fn(**common, g=a, beta=b, **options), fn(**common, g=g, beta=beta)
    for x, y in zip(raw, native):
        np.testing.assert_array_equal(x, y)


def test_a_bug_that_is_no_bug_on_the_inputs_dtype_is_listed_not_run(tmp_path):
    from types import SimpleNamespace

    from gdn_verify.runners.check import RunSettings
    from gdn_verify.runners.selftest import run_selftest

    assert set(planted.not_applicable("bfloat16")) == {"beta_rounded_bf16", "inputs_read_as_bf16"}
    assert set(planted.not_applicable("float16")) == {"beta_rounded_bf16"}  # a float16 input does change
    assert planted.not_applicable("float32") == {}

    def implementation(bug):
        assert bug != "identity_here", "a bug not applicable on the dtype must not run"
        return planted.implementation(bug)

    bugs = SimpleNamespace(
        BUGS={"gate_without_exp": planted.BUGS["gate_without_exp"], "identity_here": ("the identity here", None)},
        RIGHT_CAUSES={"gate_without_exp": ("gate_without_exp",)},
        implementation=implementation,
    )
    props = [p for name, p in catalogue(Limits(dtype="float32")).items() if name == "matches_reference"]
    seen = []
    rows = run_selftest(
        props, RunSettings(max_examples=10, seed=1, cases_dir=tmp_path), seen.append, bugs, {"identity_here": "why"}
    )
    assert [r.bug for r in seen] == ["gate_without_exp", "identity_here"]
    assert rows[0].caught_by is not None and rows[0].cause_verdict == "right"
    assert rows[1].caught_by is None and rows[1].not_applicable == "why" and rows[1].cause_verdict == "n/a"


def test_every_planted_bug_has_its_right_causes_listed():
    from gdn_verify.runners.causes import MODELS

    assert set(planted.RIGHT_CAUSES) == set(planted.BUGS)
    names = {m.name for m in MODELS}
    assert all(set(models) <= names for models in planted.RIGHT_CAUSES.values())
    assert len(planted.BUGS) >= 29


def test_strategies_make_well_posed_problems():
    from hypothesis import given, settings

    @settings(max_examples=40, deadline=None)
    @given(problems(Limits()))
    def run(problem):
        o, s = numpy_oracle(problem)
        assert np.all(np.isfinite(o)) and np.all(np.isfinite(s))
        assert o.shape == (problem.q.shape[0], problem.q.shape[1], problem.v.shape[2], problem.v.shape[3])
        beta = np.asarray(problem.beta, np.float64)
        assert np.all((beta >= 0) & (beta <= 1))
        if not problem.use_qk_l2norm_in_kernel and problem.k.size:
            norms = np.linalg.norm(np.asarray(problem.k, np.float64), axis=-1)
            assert np.allclose(norms, 1.0, atol=0.05)

    run()


def test_problem_save_and_load_round_trip(tmp_path):
    from hypothesis import given, settings

    @settings(max_examples=20, deadline=None)
    @given(problems(Limits(), state_layouts=True))
    def run(problem):
        path = problem.save(tmp_path / "case.npz", property="x", params={"seed": 3})
        loaded, meta = Problem.load(path)
        assert meta == {"property": "x", "params": {"seed": 3}}
        assert loaded.dtype == problem.dtype and loaded.describe() == problem.describe()
        for name in ("q", "k", "v", "g", "beta"):
            assert getattr(loaded, name).tobytes() == getattr(problem, name).tobytes()

    run()


def test_head_dims_restriction_applies_to_every_draw():
    from hypothesis import given, settings

    seen = set()

    limits = Limits(head_dims=(3, 100))

    @settings(max_examples=30, deadline=None)
    @given(problems(limits), head_dims(limits, max_dim=32))
    def run(problem, small):
        seen.update((problem.q.shape[-1], problem.v.shape[-1]))
        assert small == (3, 3)  # nothing in (3, 100) fits 32 but 3

    run()
    assert seen <= {3, 100}


def test_in_kernel_gates_follow_fla_and_reject_incomplete_options():
    from gdn_verify.core.gating import in_kernel_gates

    a, b = np.zeros((1, 2, 1)), np.zeros((1, 2, 1))
    g, beta = in_kernel_gates(
        a,
        b,
        use_gate_in_kernel=True,
        A_log=np.log([2.0]),
        dt_bias=np.array([0.0]),
        use_beta_sigmoid_in_kernel=True,
        allow_neg_eigval=True,
    )
    assert np.allclose(g, -2.0 * np.log(2.0)) and np.allclose(beta, 1.0)  # -A softplus(0); 2 sigmoid(0)
    with pytest.raises(ValueError, match="A_log"):
        in_kernel_gates(a, b, use_gate_in_kernel=True)
    with pytest.raises(ValueError, match="allow_neg_eigval"):
        in_kernel_gates(a, b, allow_neg_eigval=True)


def test_an_option_the_implementation_does_not_take_is_unsupported():
    problem = long_problem(T=4)
    with pytest.raises(NotImplementedError, match="use_gate_in_kernel"):
        resolve("oracle").run(problem, options={"use_gate_in_kernel": True, "A_log": np.zeros(2, np.float32)})


# Honest details (issue 13): no contradictory table cells, numbers to 3 significant digits ----------
def test_varlen_detail_names_the_comparison_even_when_bitwise_equal():
    from gdn_verify.properties.native import check_varlen_equals_separate

    rng = np.random.default_rng(0)
    T, cu = 30, np.array([0, 10, 10, 30])
    p = Problem(
        q=rng.standard_normal((1, T, 1, 4)).astype(np.float32),
        k=rng.standard_normal((1, T, 1, 4)).astype(np.float32) / 2,
        v=rng.standard_normal((1, T, 1, 4)).astype(np.float32),
        g=np.full((1, T, 1), -0.1, np.float32),
        beta=np.full((1, T, 1), 0.5, np.float32),
        cu_seqlens=cu,
    )
    m = check_varlen_equals_separate(resolve("numpy-recurrent"), p, {})
    assert "no sequence to compare" not in m.detail and "run alone" in m.detail
    empty = p.replace(cu_seqlens=np.array([0, 0, 30]), **{n: getattr(p, n) for n in ("q", "k", "v", "g", "beta")})
    assert "run alone" in check_varlen_equals_separate(resolve("numpy-recurrent"), empty, {}).detail


def test_continuation_detail_for_an_empty_call():
    from gdn_verify.properties.native import check_state_continuation

    p = Problem(
        q=np.zeros((1, 0, 1, 4), np.float32),
        k=np.zeros((1, 0, 1, 4), np.float32),
        v=np.zeros((1, 0, 1, 4), np.float32),
        g=np.zeros((1, 0, 1), np.float32),
        beta=np.zeros((1, 0, 1), np.float32),
        initial_state=np.ones((1, 1, 4, 4), np.float32),
    )
    detail = check_state_continuation(resolve("numpy"), p, {"split": 0}).detail
    assert "all 0 tokens" not in detail and "no tokens" in detail


def raises_on_long(q, k, v, g, beta, **kw):
    """Correct on short problems, raises on longer ones: a failure without a measurement."""
    if np.shape(q)[1] > 3:
        raise RuntimeError("kernel launch failed")
    return resolve("numpy-recurrent").forms["recurrent"](q=q, k=k, v=v, g=g, beta=beta, **kw)


def test_a_failed_property_does_not_show_a_passing_examples_worst(tmp_path):
    r = check(raises_on_long, properties=["varlen_equals_separate"], max_examples=30, seed=1, cases_dir=tmp_path)
    result = r["varlen_equals_separate"]
    assert result.status == "error" and result.failure.measurement is None  # the kernel raised
    assert result.worst is None  # not "worst 0.00e+00 ... no sequence to compare" beside the failure


def test_error_growth_details_print_three_significant_digits():
    import re

    from gdn_verify.properties.native import check_error_growth

    rng = np.random.default_rng(0)
    T = 256
    k = rng.standard_normal((1, T, 1, 4))
    p = Problem(
        q=rng.standard_normal((1, T, 1, 4)),
        k=k / np.linalg.norm(k, axis=-1, keepdims=True),
        v=rng.standard_normal((1, T, 2, 4)),
        g=np.full((1, T, 2), -0.05),
        beta=np.full((1, T, 2), 0.5),
    ).astype(np.float32)
    detail = check_error_growth(resolve("oracle"), p, {"lengths": [64, 128, 256]}).detail
    assert detail.startswith("errors at the rounding floor")
    digits = [len(re.sub(r"[^0-9]", "", m.split("e")[0]).lstrip("0")) for m in re.findall(r": ([-0-9.e+]+)", detail)]
    assert digits and max(digits) <= 3, detail


def test_determinism_names_a_nan_that_comes_and_goes():
    """Uninitialised memory read as NaN on one call and not the other: the message says so (FLA
    0.4.2's chunk on an H200 read 'max difference 0' there, the NaN being left out of the max)."""
    from gdn_verify.core.implementation import Implementation
    from gdn_verify.implementations import numpy_impl
    from gdn_verify.properties.native import check_determinism

    calls = []

    def flaky(**kw):
        o, s = numpy_impl.chunk_gated_delta_rule(**kw)
        calls.append(1)
        if len(calls) % 2 == 0:
            o = o.copy()
            o.reshape(-1)[0] = np.nan
        return o, s

    ones = np.ones((1, 4, 1, 2), np.float32)
    problem = Problem(ones, ones, ones, np.zeros((1, 4, 1), np.float32), np.full((1, 4, 1), 0.5, np.float32))
    with pytest.raises(Violation, match=r"different o \(max difference 0; NaN in one where the other is a number\)"):
        check_determinism(Implementation("flaky", {"chunk": flaky}), problem, {})
