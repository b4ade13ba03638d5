"""The float64 oracle against mpmath, its two forms against each other, and its input checks."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gdn_verify.core.gating import gates_from_raw, sigmoid, softplus
from gdn_verify.core.reference import chunk_gated_delta_rule, decode_gated_delta_rule, recurrent_gated_delta_rule
from tests.mp_reference import mp_gated_delta_rule
from tests.native_case import random_native_case

ORACLES = {
    "recurrent": recurrent_gated_delta_rule,
    "chunk64": lambda *a, **kw: chunk_gated_delta_rule(*a, **kw),
    "chunk4": lambda *a, **kw: chunk_gated_delta_rule(*a, chunk_size=4, **kw),
}


def tiny_case(seed, B=1, T=9, H=1, HV=1, K=3, V=2, cu_seqlens=None, gate=None, with_state=False):
    inputs = random_native_case(seed, B, T, H, HV, K, V, cu=cu_seqlens, with_state=with_state, gate=gate)
    return dict(inputs, cu_seqlens=cu_seqlens)


def saturated(rng, shape):
    g = np.log(rng.uniform(0.5, 1.0, shape))
    g.flat[rng.choice(g.size, g.size // 3, replace=False)] = -700.0
    g.flat[rng.choice(g.size, g.size // 3, replace=False)] = 0.0
    return g


MP_CASES = {
    "plain": dict(),
    "batched": dict(B=2, T=5),
    "varlen": dict(T=11, cu_seqlens=np.array([0, 3, 3, 4, 11]), with_state=True),
    "gva": dict(H=2, HV=4),
    "k_ne_v": dict(K=4, V=1),
    "initial_state": dict(with_state=True),
    "saturated": dict(T=12, gate=saturated, with_state=True),
    "no_decay": dict(gate=lambda rng, shape: np.zeros(shape)),
}


def rel_err(x, ref):
    return np.linalg.norm(x - ref) / np.linalg.norm(ref)


@pytest.mark.parametrize("oracle", sorted(ORACLES))
@pytest.mark.parametrize("l2norm", [False, True])
@pytest.mark.parametrize("case", sorted(MP_CASES))
def test_oracle_matches_mpmath(case, l2norm, oracle):
    inputs = tiny_case(sum(map(ord, case)), **MP_CASES[case])
    if not l2norm:
        inputs["q"] = inputs["q"] / np.linalg.norm(inputs["q"], axis=-1, keepdims=True)
    o_mp, s_mp = mp_gated_delta_rule(**inputs, use_qk_l2norm_in_kernel=l2norm)
    o, s = ORACLES[oracle](**inputs, use_qk_l2norm_in_kernel=l2norm, output_final_state=True)
    assert o.dtype == np.float64 and s.dtype == np.float64
    assert rel_err(o, o_mp) < 1e-13
    assert rel_err(s, s_mp) < 1e-13


def test_mpmath_reference_is_not_trivially_equal():
    # Guard for the comparison above: a wrong gate (no exp) must be far outside 1e-13.
    inputs = tiny_case(1)
    o_mp, _ = mp_gated_delta_rule(**inputs)
    o_bad, _ = recurrent_gated_delta_rule(**{**inputs, "g": np.exp(inputs["g"]) - 1.0})
    assert rel_err(o_bad, o_mp) > 1e-3


def test_scale_and_state_layout():
    inputs = tiny_case(3, K=4, V=3, with_state=True)
    o_default, s_kfirst = recurrent_gated_delta_rule(**inputs, output_final_state=True)
    o_scaled, _ = recurrent_gated_delta_rule(**inputs, scale=1.0)
    np.testing.assert_allclose(o_scaled * 4**-0.5, o_default, rtol=1e-14)
    vfirst = {**inputs, "initial_state": inputs["initial_state"].swapaxes(-1, -2)}
    for oracle in ORACLES.values():
        o, s_vfirst = oracle(**vfirst, output_final_state=True, state_v_first=True)
        assert s_vfirst.shape == (1, 1, 3, 4)
        np.testing.assert_allclose(s_vfirst.swapaxes(-1, -2), s_kfirst, rtol=1e-13)
        np.testing.assert_allclose(o, o_default, rtol=1e-13)


def test_final_state_only_when_asked():
    inputs = tiny_case(4)
    for oracle in ORACLES.values():
        assert oracle(**inputs)[1] is None
        assert oracle(**inputs, output_final_state=True)[1].shape == (1, 1, 3, 2)


def test_any_input_dtype_is_promoted():
    inputs = tiny_case(5, with_state=True)
    low = {name: (x.astype(ml_dtypes.bfloat16) if isinstance(x, np.ndarray) else x) for name, x in inputs.items()}
    promoted = {name: (x.astype(np.float64) if isinstance(x, np.ndarray) else x) for name, x in low.items()}
    for oracle in ORACLES.values():
        o_low, s_low = oracle(**low, output_final_state=True)
        o_ref, s_ref = oracle(**promoted, output_final_state=True)
        assert o_low.dtype == np.float64
        np.testing.assert_array_equal(o_low, o_ref)
        np.testing.assert_array_equal(s_low, s_ref)


def test_zero_length_sequences_keep_their_initial_state():
    inputs = tiny_case(6, T=4, cu_seqlens=np.array([0, 0, 4, 4]), with_state=True)
    for oracle in ORACLES.values():
        _, s = oracle(**inputs, output_final_state=True)
        np.testing.assert_array_equal(s[0], inputs["initial_state"][0])
        np.testing.assert_array_equal(s[2], inputs["initial_state"][2])


def test_chunk_form_equals_recurrent_at_size():
    inputs = tiny_case(
        7,
        B=1,
        T=300,
        H=2,
        HV=4,
        K=16,
        V=8,
        cu_seqlens=np.array([0, 1, 63, 64, 65, 200, 200, 300]),
        gate=saturated,
        with_state=True,
    )
    o_r, s_r = recurrent_gated_delta_rule(**inputs, output_final_state=True)
    for chunk_size in (16, 32, 64):
        o_c, s_c = chunk_gated_delta_rule(**inputs, output_final_state=True, chunk_size=chunk_size)
        assert rel_err(o_c, o_r) < 1e-13
        assert rel_err(s_c, s_r) < 1e-13


def test_gating_helpers():
    x = np.array([-1000.0, -50.0, -1.0, 0.0, 1.0, 19.9, 20.0, 20.5, 1000.0])
    sp = softplus(x)
    assert np.all(np.isfinite(sp))
    np.testing.assert_allclose(sp[:7], np.log1p(np.exp(x[:7])), rtol=1e-15)  # exact below the threshold
    assert sp[7] == 20.5 and sp[8] == 1000.0  # identity above it, like torch
    assert sp[1] == pytest.approx(np.exp(-50.0), rel=1e-15)  # not rounded to 0
    sg = sigmoid(np.array([-1000.0, -40.0, 0.0, 40.0, 1000.0]))
    assert np.all(np.isfinite(sg)) and sg[0] == 0.0 and sg[2] == 0.5 and sg[4] == 1.0
    assert sg[1] == pytest.approx(np.exp(-40.0), rel=1e-15)
    g, beta = gates_from_raw(np.log([0.5, 2.0]), np.array([[0.3, -2.0]]), np.array([0.1, 0.2]), np.array([[0.0, 3.0]]))
    np.testing.assert_allclose(g, [[-0.5 * np.log1p(np.exp(0.4)), -2.0 * np.log1p(np.exp(-1.8))]], rtol=1e-15)
    np.testing.assert_allclose(beta, [[0.5, 1 / (1 + np.exp(-3.0))]], rtol=1e-15)


def test_decode_form_matches_native():
    rng = np.random.default_rng(8)
    B, H, HV, K, V = 3, 2, 4, 8, 6
    q, k = rng.standard_normal((2, B, 1, H, K))
    v = rng.standard_normal((B, 1, HV, V))
    state = rng.standard_normal((B, HV, V, K))
    A_log, dt_bias = rng.standard_normal((2, HV))
    a, b = rng.standard_normal((2, B, 1, HV))
    o, new_state = decode_gated_delta_rule(q, k, v, state, A_log, a, dt_bias, b, scale=0.0)
    assert o.shape == (B, 1, HV, V) and new_state.shape == (B, HV, V, K)
    g, beta = gates_from_raw(A_log, a, dt_bias, b)
    o_mp, s_mp = mp_gated_delta_rule(
        q, k, v, g, beta, initial_state=state.swapaxes(-1, -2), use_qk_l2norm_in_kernel=True
    )
    assert rel_err(o, o_mp) < 1e-13
    assert rel_err(new_state.swapaxes(-1, -2), s_mp) < 1e-13


def good_inputs():
    return tiny_case(9, B=1, T=6, H=2, HV=4, K=3, V=2, with_state=True)


def with_(**changes):
    return {**good_inputs(), **changes}


BAD_INPUTS = {
    "q rank": (lambda: with_(q=np.zeros((6, 2, 3))), "q"),
    "k shape": (lambda: with_(k=np.zeros((1, 6, 2, 4))), "k"),
    "v tokens": (lambda: with_(v=np.zeros((1, 5, 4, 2))), "v"),
    "HV not multiple": (
        lambda: with_(v=np.zeros((1, 6, 3, 2)), g=np.zeros((1, 6, 3)), beta=np.zeros((1, 6, 3)), initial_state=None),
        "v",
    ),
    "g heads": (lambda: with_(g=np.zeros((1, 6, 2))), "g"),
    "beta heads": (lambda: with_(beta=np.zeros((1, 6, 2))), "beta"),
    "g rank": (lambda: with_(g=np.zeros((1, 6, 4, 1))), "g"),
    "cu_seqlens start": (lambda: with_(cu_seqlens=np.array([1, 6]), initial_state=None), "cu_seqlens"),
    "cu_seqlens decreasing": (lambda: with_(cu_seqlens=np.array([0, 4, 2, 6]), initial_state=None), "cu_seqlens"),
    "cu_seqlens end": (lambda: with_(cu_seqlens=np.array([0, 2, 5]), initial_state=None), "cu_seqlens"),
    "cu_seqlens float": (lambda: with_(cu_seqlens=np.array([0.0, 6.0]), initial_state=None), "cu_seqlens"),
    "cu_seqlens batch": (lambda: {**tiny_case(9, B=2, T=3), "cu_seqlens": np.array([0, 3])}, "cu_seqlens"),
    "initial_state N": (lambda: with_(cu_seqlens=np.array([0, 2, 6])), "initial_state"),
    "initial_state shape": (lambda: with_(initial_state=np.zeros((1, 4, 2, 3))), "initial_state"),
    "nan in v": (lambda: with_(v=np.full((1, 6, 4, 2), np.nan)), "v"),
    "inf in g": (lambda: with_(g=np.full((1, 6, 4), -np.inf)), "g"),
    "inf in state": (lambda: with_(initial_state=np.full((1, 4, 3, 2), np.inf)), "initial_state"),
    "complex q": (lambda: with_(q=np.zeros((1, 6, 2, 3), complex)), "q"),
}


@pytest.mark.parametrize("oracle", sorted(ORACLES))
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_names_the_argument(case, oracle):
    make, argument = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        ORACLES[oracle](**make())


def test_bad_scale_and_chunk_size():
    with pytest.raises(ValueError, match="^scale:"):
        recurrent_gated_delta_rule(**good_inputs(), scale=float("nan"))
    with pytest.raises(ValueError, match="^chunk_size:"):
        chunk_gated_delta_rule(**good_inputs(), chunk_size=0)
