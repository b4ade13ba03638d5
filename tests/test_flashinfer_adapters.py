"""The FlashInfer adapters' translation, with the float64 oracle standing in for FlashInfer.

The stand-ins take FlashInfer's own convention (packed ``[T, H, D]`` tokens, int64 ``cu_seqlens``,
linear-space float32 ``alpha``, float32 ``beta``, k-last state; decode: raw gates, one token,
state updated in place) and check it, so a translation that hands them the native convention
fails. Problems are float64 with ``beta`` and ``exp(g)`` exactly representable in float32, so
a correct translation loses nothing and must match the native oracle to 1e-12.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gdn_verify.api import check
from gdn_verify.core import reference
from gdn_verify.core.problem import Problem
from gdn_verify.implementations import ConfigurationError, Implementation
from gdn_verify.implementations import flashinfer as fi
from gdn_verify.properties.strategies import beta_values, gate_values, unit_rows


def standin_prefill(
    q,
    k,
    v,
    g=None,
    beta=None,
    scale=None,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
    use_qk_l2norm_in_kernel=False,
):
    """FlashInfer's ``chunk_gated_delta_rule`` convention, computed by the float64 oracle."""
    assert q.ndim == 3 and k.shape == q.shape and v.ndim == 3, "packed [T, H, D] tokens"
    assert cu_seqlens is not None and cu_seqlens.dtype == np.int64 and cu_seqlens[-1] == q.shape[0]
    assert g.dtype == np.float32 and beta.dtype == np.float32, "gates are float32"
    assert np.all((g >= 0) & (g <= 1)), "alpha is a decay in linear space, in [0, 1]"
    N, HV, D = len(cu_seqlens) - 1, v.shape[1], q.shape[2]
    if initial_state is not None:
        assert initial_state.shape == (N, HV, D, D)
    with np.errstate(divide="ignore"):
        log_alpha = np.maximum(np.log(g.astype(np.float64)), -1e4)  # alpha == 0: saturated decay
    o, state = reference.chunk_gated_delta_rule(
        q[None],
        k[None],
        v[None],
        log_alpha[None],
        beta[None],
        scale=scale or None,
        initial_state=initial_state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        state_v_first=True,
        cu_seqlens=cu_seqlens,
    )
    return (o[0], state) if output_final_state else o[0]


def standin_decode(q, k, v, state, A_log, a, dt_bias, b, scale=None, use_qk_l2norm=True):
    """FlashInfer's decode convention (raw gates, k-last state updated in place), by the oracle."""
    B, one, H, K = q.shape
    assert one == 1 and state.shape == (B, v.shape[2], v.shape[3], K)
    assert A_log.shape == dt_bias.shape == (v.shape[2],)  # float32 but where optional_dtypes varies it
    o, new_state = reference.decode_gated_delta_rule(
        q, k, v, state, A_log, a, dt_bias, b, scale=scale, use_qk_l2norm=use_qk_l2norm
    )
    state[...] = new_state
    return o, state


def float32_exact(problem: Problem) -> Problem:
    """The problem with ``beta`` and ``exp(g)`` exactly representable in float32 (g kept where exp underflows)."""
    alpha = np.exp(problem.g).astype(np.float32)
    with np.errstate(divide="ignore"):
        g = np.where(alpha > 0, np.log(alpha.astype(np.float64)), problem.g)
    return problem.replace(g=g, beta=problem.beta.astype(np.float32).astype(np.float64))


def make_problem(
    seed=0,
    varlen=True,
    H=2,
    HV=4,
    K=8,
    V=8,
    regime="mixed",
    state="random",
    v_first=False,
    l2norm=False,
    lengths=(5, 0, 70),
    batch=2,
    T=33,
) -> Problem:
    rng = np.random.default_rng(seed)
    if varlen:
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        B, T, N = 1, int(cu[-1]), len(lengths)
    else:
        cu, B, N = None, batch, batch
    k = rng.standard_normal((B, T, H, K)) if l2norm else unit_rows(rng, (B, T, H, K))
    S0 = None if state is None else rng.standard_normal((N, HV, K, V))
    if S0 is not None and v_first:
        S0 = np.ascontiguousarray(S0.swapaxes(-1, -2))
    problem = Problem(
        q=rng.standard_normal((B, T, H, K)),
        k=k,
        v=rng.standard_normal((B, T, HV, V)),
        g=gate_values(rng, (B, T, HV), regime),
        beta=beta_values(rng, (B, T, HV)),
        initial_state=S0,
        cu_seqlens=cu,
        use_qk_l2norm_in_kernel=l2norm,
        state_v_first=v_first,
        scale=0.5 if seed else None,
    )
    return float32_exact(problem)


CASES = [
    dict(),
    dict(varlen=False),
    dict(v_first=True, regime="spikes"),
    dict(l2norm=True, regime="strong_run", H=1, HV=1),
    dict(state=None, varlen=False, regime="none", K=16, V=16),
    dict(seed=3, regime="moderate", H=4, HV=4),
]


def native(problem: Problem, adapter) -> tuple:
    return adapter(**problem.kwargs())


def assert_close(got, want, tol=1e-12):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    assert np.max(np.abs(got - want), initial=0.0) <= tol * max(1.0, np.max(np.abs(want), initial=0.0))


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
def test_prefill_translation_matches_the_oracle(case):
    problem = make_problem(**case)
    o, state = native(problem, fi.prefill_adapter(standin_prefill))
    want_o, want_state = reference.recurrent_gated_delta_rule(**problem.kwargs())
    assert_close(o, want_o)
    assert_close(state, want_state)
    o2, none = native(problem.replace(output_final_state=False), fi.prefill_adapter(standin_prefill))
    assert none is None and np.array_equal(o2, o)


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
def test_decode_translation_matches_the_oracle(case):
    # Decode steps one token at a time; a float64 initial state keeps the carried state exact.
    problem = make_problem(**case)
    if problem.initial_state is None:
        problem = problem.replace(initial_state=np.zeros((problem.num_sequences, 4, 16, 16)))
    o, state = native(problem, fi.decode_adapter(standin_decode))
    want_o, want_state = reference.recurrent_gated_delta_rule(**problem.kwargs())
    assert_close(o, want_o)
    assert_close(state, want_state)


def test_decode_leaves_the_callers_state_alone():
    problem = make_problem(lengths=(3, 1))
    assert problem.initial_state is not None
    before = problem.initial_state.copy()
    native(problem, fi.decode_adapter(standin_decode))
    assert np.array_equal(problem.initial_state, before)


def test_raw_gates_round_trip_including_the_unrepresentable_extremes():
    g = np.array([0.0, -1e-12, -1e-6, -0.3, -5.0, -60.0, -1e4])
    beta = np.array([0.0, 1e-9, 0.25, 0.5, 0.999, 1.0, 1.0])
    a, b = fi.raw_gates(fi.NumpyOps(), g, beta)
    assert np.all(np.isfinite(a)) and np.all(np.isfinite(b))
    from gdn_verify.core.gating import gates_from_raw

    g2, beta2 = gates_from_raw(np.zeros(7), a, np.zeros(7), b)
    assert np.all(np.abs(np.exp(g2) - np.exp(g)) <= 1e-15)
    assert np.all(np.abs(beta2 - beta) <= 5e-17 + 1e-15 * beta)


def test_exact_gates_stay_exact_in_a_float32_kernel():
    """``g = 0`` and ``beta`` of exactly 0 or 1 as a float32 kernel reads them (vLLM's and
    FlashInfer's softplus and sigmoid): exact, so a ``beta = 0`` token writes nothing. With the clamp
    at 40, ``sigmoid(-40) = 4.2e-18`` leaked into a state that ``error_growth``'s retention regime
    lets decay by ``e^-100`` over 65536 tokens (1e9 times its tolerance, vllm-sigmoid-recurrent)."""
    a, b = fi.raw_gates(fi.NumpyOps(), np.array([0.0, -0.5]), np.array([0.0, 1.0]))
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    with np.errstate(over="ignore"):
        sigmoid32 = np.float32(1) / (np.float32(1) + np.exp(-b32))
    softplus32 = np.log1p(np.exp(a32))
    assert sigmoid32.dtype == softplus32.dtype == np.float32
    assert sigmoid32[0] == 0.0 and sigmoid32[1] == 1.0
    assert softplus32[0] == 0.0 and np.exp(-softplus32[0]) == 1.0
    assert abs(softplus32[1] - 0.5) <= 2.0**-23


def test_float32_problems_pass_the_property_suite_through_both_adapters(tmp_path):
    for name, adapter in (
        ("prefill", fi.prefill_adapter(standin_prefill)),
        ("decode", fi.decode_adapter(standin_decode)),
    ):
        impl = Implementation(f"standin-{name}", {"default": adapter})
        result = check(
            impl, dtype="float32", properties=["matches_reference"], max_examples=25, seed=5, cases_dir=tmp_path
        )["matches_reference"]
        # K != V is unsupported by FlashInfer's prefill; everything else must pass.
        assert result.status == "passed", result.failure and result.failure.message


def test_unsupported_conventions_are_reported_as_such():
    with pytest.raises(NotImplementedError, match="head_size"):
        native(make_problem(K=8, V=4), fi.prefill_adapter(standin_prefill))
    for adapter in (fi.prefill_adapter(standin_prefill), fi.decode_adapter(standin_decode)):
        with pytest.raises(NotImplementedError, match="scale=0"):
            native(make_problem().replace(scale=0.0), adapter)


def test_log_gate_passed_as_alpha_is_caught():
    def log_space_alpha(**kw):  # what an adapter forgetting exp(g) would hand FlashInfer
        return standin_prefill(**{**kw, "g": np.log(kw["g"].astype(np.float64)).astype(np.float32)})

    with pytest.raises(AssertionError, match="linear space"), np.errstate(divide="ignore"):
        native(make_problem(regime="mild"), fi.prefill_adapter(log_space_alpha))


@pytest.mark.parametrize("which", ["prefill", "decode"])
def test_forgotten_state_transpose_is_caught(which, tmp_path):
    def transposed(kernel, key):
        def call(**kw):
            kw[key] = np.ascontiguousarray(kw[key].swapaxes(-1, -2))  # k-first handed over as k-last
            return kernel(**kw)

        return call

    adapter = (
        fi.prefill_adapter(transposed(standin_prefill, "initial_state"))
        if which == "prefill"
        else fi.decode_adapter(transposed(standin_decode, "state"))
    )
    problem = make_problem(regime="mild")
    o, _ = native(problem, adapter)
    want_o, _ = reference.recurrent_gated_delta_rule(**problem.kwargs())
    assert np.max(np.abs(o - want_o)) > 1e-2
    impl = Implementation("wrong", {"default": adapter})
    result = check(
        impl, dtype="float32", properties=["matches_reference"], max_examples=40, seed=1, cases_dir=tmp_path
    )["matches_reference"]
    assert result.status in ("failed", "error"), result.note  # K != V: the kernel raises on the transposed state


def test_missing_flashinfer_is_a_configuration_error():
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        for factory in (fi.flashinfer_prefill, fi.flashinfer_decode):
            with pytest.raises(ConfigurationError, match="FlashInfer is not installed"):
                factory()
    else:
        pytest.skip("FlashInfer is installed here")


def test_cp_prefill_is_given_the_longest_sequence_as_max_seqlen():
    seen = []

    def standin_cp(max_seqlen=None, **kw):  # chunk_gated_delta_rule(use_cp=True) sizes its grids by it
        seen.append(max_seqlen)
        return standin_prefill(**kw)

    for problem, want in ((make_problem(lengths=(5, 0, 70)), 70), (make_problem(varlen=False), 33)):
        o, state = native(problem, fi.prefill_adapter(standin_cp, max_seqlen=True))
        want_o, want_state = reference.recurrent_gated_delta_rule(**problem.kwargs())
        assert_close(o, want_o)
        assert_close(state, want_state)
        assert seen.pop() == want
    with pytest.raises(NotImplementedError, match="no tokens"):  # FlashInfer refuses it (H100, 2026-11-26)
        native(make_problem(lengths=(0, 0)), fi.prefill_adapter(standin_cp, max_seqlen=True))
    assert seen == [], "an empty call never reaches the kernel"


BF16 = ml_dtypes.bfloat16


def standin_decode_bf16(q, k, v, state, A_log, a, dt_bias, b, scale=None, use_qk_l2norm=True):
    """FlashInfer's bf16-state decode: the oracle's step, the state stored back in bfloat16."""
    assert state.dtype == BF16, "a bfloat16 state selects the bf16-state kernels"
    o, new_state = reference.decode_gated_delta_rule(
        q, k, v, state.astype(np.float64), A_log, a, dt_bias, b, scale=scale, use_qk_l2norm=use_qk_l2norm
    )
    state[...] = new_state.astype(BF16)
    return o, state


def test_bf16_state_decode_hands_over_the_state_in_bfloat16():
    problem = make_problem(lengths=(4, 0, 3), regime="mild")
    assert problem.initial_state is not None
    before = problem.initial_state.copy()
    first: list[np.ndarray] = []

    def watch(**kw):
        if not first:
            first.append(kw["state"].copy())
        return standin_decode_bf16(**kw)

    o, state = native(problem, fi.decode_adapter(watch, state_dtype=BF16))
    assert np.array_equal(problem.initial_state, before), "the caller's state is not rounded in place"
    want_first = before.swapaxes(-1, -2)[[0, 2]].astype(BF16)  # k-last, the sequences running at step 0
    assert first[0].dtype == BF16 and np.array_equal(first[0], want_first)
    assert state.dtype == BF16 and state.shape == before.shape
    want_o, want_state = reference.recurrent_gated_delta_rule(**problem.kwargs())
    # a bfloat16 state (2^-9 relative per store): close to the oracle, but at bfloat16's level only
    assert_close(o, want_o, tol=2e-2)
    assert_close(state, want_state, tol=2e-2)
    _, zero_start = native(
        problem.replace(initial_state=None), fi.decode_adapter(standin_decode_bf16, state_dtype=BF16)
    )
    assert zero_start.dtype == BF16


def test_bf16_state_decode_limits_are_reported_as_unsupported():
    problem = make_problem(K=8, V=8)
    half = problem.replace(q=problem.q.astype(np.float16))
    adapter = fi.decode_adapter(fi._bf16_state_limits(standin_decode_bf16), state_dtype=BF16)  # noqa: SLF001
    with pytest.raises(NotImplementedError, match="K = V = 128"):
        native(half, adapter)
