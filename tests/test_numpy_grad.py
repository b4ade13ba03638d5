"""The NumPy backwards (``implementations/numpy_grad.py``) and the planted gradient bugs.

(1) The engine in float64 is the oracle's adjoint (both ``dg`` forms), in float32 it lands within
float32 accuracy of it, padding gradients are exactly zero; (2) the correct models pass the
gradient tolerance in every input dtype; (3) every planted bug fails it on a problem of its
regime, by at least the benchmark's goal, and ``nondeterministic_dk`` differs between two calls.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest

from gdn_verify.core import grad_tolerance as gtol
from gdn_verify.core.gradients import cotangents, problem_gradients
from gdn_verify.core.implementation import GRADIENTS, ConfigurationError
from gdn_verify.core.problem import Problem
from gdn_verify.implementations import numpy_grad, planted_grad
from gdn_verify.implementations.numpy_grad import backward, numpy_grad_implementation
from gdn_verify.properties.strategies import beta_values, gate_values, unit_rows

DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
ALL_DTYPES = {**DTYPES, "float64": np.float64}
PLANTED_GOAL = 3.0  # benchmarks/grad_precision.py
ALLOWED_GOAL = 0.5


def make(
    B=2,
    T=40,
    H=1,
    HV=2,
    K=8,
    V=8,
    lengths=None,
    tail=0,
    gates="mild",
    l2norm=False,
    h0=True,
    seed=0,
    dtype="float32",
) -> Problem:
    rng = np.random.default_rng(seed)
    cu = None
    if lengths is not None:
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        B, T = 1, int(cu[-1]) + tail
    N = B if cu is None else len(cu) - 1
    problem = Problem(
        q=rng.standard_normal((B, T, H, K)),
        k=rng.standard_normal((B, T, H, K)) if l2norm else unit_rows(rng, (B, T, H, K)),
        v=rng.standard_normal((B, T, HV, V)),
        g=gate_values(rng, (B, T, HV), gates),
        beta=beta_values(rng, (B, T, HV)),
        initial_state=rng.standard_normal((N, HV, K, V)).astype(np.float32) if h0 else None,
        use_qk_l2norm_in_kernel=l2norm,
        cu_seqlens=cu,
    )
    return problem.astype(ALL_DTYPES[dtype])


def oracle(problem: Problem, do, dht) -> dict:
    """The float64 gradients, zero on the tokens after cu_seqlens[-1] (which the oracle refuses)."""
    end = int(problem.bounds[-1]) if problem.cu_seqlens is not None else problem.shape["T"]
    trimmed = problem.tokens(0, end).replace(cu_seqlens=problem.cu_seqlens)
    out = problem_gradients(trimmed, do[:, :end], dht)
    for name in GRADIENTS[:5]:
        x = out[name]
        out[name] = np.concatenate([x, np.zeros((x.shape[0], problem.shape["T"] - end) + x.shape[2:])], axis=1)
    return out


def call(problem: Problem, do, dht, **options):
    kw = problem.kwargs()
    kw.pop("output_final_state")
    return dict(zip(GRADIENTS, backward(**kw, do=do, dht=dht, **options)))


SHAPES = {
    "batched": dict(),
    "varlen_padded": dict(lengths=(0, 23, 70), tail=5),
    "gva_l2norm": dict(H=2, HV=4, l2norm=True, gates="moderate"),
    "no_state": dict(h0=False, gates="moderate"),
    "long": dict(B=1, T=150, gates="mild"),
}


@pytest.mark.parametrize("with_dht", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_float64_engine_is_the_oracle(shape, with_dht):
    problem = make(**SHAPES[shape], dtype="float64")
    do, dht = cotangents(problem, 1, with_dht)
    ref = oracle(problem, do, dht)
    end = int(problem.bounds[-1])
    for dg_form in ("direct", "cumsum"):
        out = call(problem, do, dht, work=np.float64, dg_form=dg_form)
        for name in GRADIENTS:
            if ref[name] is None:
                assert out[name] is None
                continue
            x, want = np.asarray(out[name], np.float64), ref[name]
            if name == "dh0":  # returned in the state's float32
                assert np.allclose(x, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
                continue
            assert np.linalg.norm(x - want) <= 1e-12 * np.linalg.norm(want), (name, dg_form)
            assert (x.reshape((-1,) + x.shape[2:])[end:] == 0).all()


@pytest.mark.parametrize("shape", SHAPES)
def test_float32_within_float32_accuracy(shape):
    problem = make(**SHAPES[shape], seed=3)
    do, dht = cotangents(problem, 2, True)
    ref = oracle(problem, do, dht)
    for dg_form in ("direct", "cumsum"):
        out = call(problem, do, dht, dg_form=dg_form)
        for name in GRADIENTS:
            if ref[name] is None:
                continue
            assert out[name].dtype == np.float32
            err = np.linalg.norm(np.asarray(out[name], np.float64) - ref[name]) / np.linalg.norm(ref[name])
            assert err < 2e-5, (name, dg_form, err)


@pytest.mark.parametrize("name", ["numpy-grad", "numpy-grad16"])
def test_padding_gradients_exactly_zero_and_dtypes(name):
    problem = make(lengths=(5, 0, 17), tail=11, dtype="bfloat16")
    do, dht = cotangents(problem, 0, True)
    grads = numpy_grad_implementation(name).run_backward(problem, do, dht)
    end = int(problem.bounds[-1])
    for g in ("dq", "dk", "dv", "dg", "dbeta"):
        assert grads.dtypes[g] == "bfloat16"
        assert (np.asarray(grads.grads[g], np.float64)[:, end:] == 0).all()
    assert grads.dtypes["dh0"] == "float32"
    no_state = make(h0=False)
    do, dht = cotangents(no_state, 0, False)
    assert numpy_grad_implementation(name).run_backward(no_state, do, dht).grads["dh0"] is None


def test_bad_arguments_name_themselves():
    problem = make()
    do, dht = cotangents(problem, 0, True)
    with pytest.raises(ValueError, match="^do:"):
        call(problem, do[:, :-1], dht)
    with pytest.raises(ValueError, match="^dht:"):
        call(problem, do, dht[:, :1])
    with pytest.raises(ValueError, match="^bug:"):
        call(problem, do, dht, bug="no_such_bug")
    with pytest.raises(ValueError, match="^name:"):
        numpy_grad_implementation("numpy-grad32")
    with pytest.raises(ConfigurationError, match="planted-grad:nope"):
        planted_grad.implementation("nope")


def test_factories_and_forms():
    for name in numpy_grad.MODELS:
        impl = numpy_grad_implementation(name)
        assert impl.name == name and set(impl.forms) == {"chunk", "backward"}
        impl.check_signatures()
    for bug in planted_grad.BUGS:
        impl = planted_grad.implementation(bug)
        assert impl.name == f"planted-grad:{bug}"
        impl.check_signatures()
    assert set(planted_grad.RIGHT_CAUSES) == set(planted_grad.BUGS) == set(planted_grad.REGIMES)
    assert set(planted_grad.BUGS) <= set(numpy_grad.KNOWN_BUGS)


@functools.cache
def judged(spec: tuple, dtype: str, seed: int = 0):
    """``spec`` as ``make``'s keywords and ``dht`` (a final-state cotangent given; default True)."""
    keywords = dict(spec)
    with_dht = keywords.pop("dht", True)
    problem = make(**keywords, dtype=dtype, seed=seed)
    do, dht = cotangents(problem, seed, with_dht)
    reference, tolerance = gtol.grad_reference_and_tolerance(problem, do, dht, seed=seed)
    return problem, do, dht, reference, tolerance


def worst_ratio(impl, spec: dict, dtype: str, seed: int = 0) -> float:
    problem, do, dht, reference, tolerance = judged(tuple(sorted(spec.items())), dtype, seed)
    grads = impl.run_backward(problem, do, dht)
    errors = gtol.grad_errors(problem, grads.grads, reference, tolerance)
    return max(np.inf if np.isnan(e) else e / tolerance.bounds[n] for n, e in errors.items())


CORRECT_SPECS = [
    dict(gates="mild"),
    dict(gates="strong", B=1, T=100),
    dict(H=2, HV=4, l2norm=True, gates="moderate", lengths=(30, 0, 45), tail=3),
    # one token under a strong gate: dg ~ 1e-15, below float16's subnormals (the output underflow term)
    dict(B=2, T=1, H=1, HV=4, gates="strong", l2norm=True),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["numpy-grad", "numpy-grad16"])
def test_correct_models_within_tolerance(name, dtype):
    impl = numpy_grad_implementation(name)
    ratios = [worst_ratio(impl, spec, dtype, seed) for seed, spec in enumerate(CORRECT_SPECS)]
    assert max(ratios) <= ALLOWED_GOAL, ratios


# A problem of each bug's regime (planted_grad.REGIMES) and the dtype it is judged in.
BUG_PROBLEMS = {
    "dht_ignored": (dict(gates="mild"), "bfloat16"),
    "dh0_dropped": (dict(gates="mild"), "bfloat16"),
    "dv_missing_beta": (dict(gates="mild"), "bfloat16"),
    "dbeta_uses_v": (dict(gates="mild"), "bfloat16"),
    "dg_wrt_decay": (dict(gates="moderate"), "bfloat16"),
    "chunk_boundary_decay_missing": (dict(B=2, T=130, gates="strong"), "bfloat16"),
    "dh0_undecayed": (dict(gates="moderate"), "bfloat16"),
    "dg_chunk_end_missing": (dict(gates="mild"), "bfloat16"),
    "dg_cumsum16": (dict(gates="mild"), "float32"),
    "l2norm_backward_skipped": (dict(l2norm=True), "bfloat16"),
    "gva_first_head_only": (dict(H=1, HV=3), "bfloat16"),
    "dk_doubled": (dict(gates="mild"), "bfloat16"),
    "varlen_tail_unwritten": (dict(lengths=(20, 13), tail=4), "bfloat16"),
    "dh0_unwritten_without_dht": (dict(gates="mild", dht=False), "bfloat16"),
}


@pytest.mark.parametrize("bug", BUG_PROBLEMS)
def test_planted_bug_outside_tolerance(bug):
    spec, dtype = BUG_PROBLEMS[bug]
    assert worst_ratio(planted_grad.implementation(bug), spec, dtype) >= PLANTED_GOAL


def test_dh0_unwritten_without_dht_is_right_when_dht_is_given():
    impl = planted_grad.implementation("dh0_unwritten_without_dht")
    assert worst_ratio(impl, dict(gates="mild", dht=True), "bfloat16") <= ALLOWED_GOAL


def test_every_bug_has_a_problem_or_is_determinism():
    assert set(BUG_PROBLEMS) | {"nondeterministic_dk"} == set(planted_grad.BUGS)


def test_nondeterministic_dk_differs_between_calls_within_tolerance():
    impl = planted_grad.implementation("nondeterministic_dk")
    spec = dict(H=1, HV=3, V=32)
    problem, do, dht, _, _ = judged(tuple(sorted(spec.items())), "float32")
    first, second = (impl.run_backward(problem, do, dht).grads for _ in range(2))
    assert first["dk"].tobytes() != second["dk"].tobytes()
    assert all(first[n].tobytes() == second[n].tobytes() for n in ("dq", "dv", "dg", "dbeta"))
    assert worst_ratio(impl, spec, "float32") <= ALLOWED_GOAL
