"""The float64 gradient oracle (``gdn_verify.core.gradients``) against three independent derivatives.

(a) reverse-mode autograd (HIPS ``autograd``) of a plain float64 token loop, to ~1e-12;
(b) central finite differences of the project's forward oracle ``reference.recurrent_gated_delta_rule``;
(c) a 50-digit mpmath directional derivative on a 2-token case.
The comparisons are shared with tests that plant a wrong gradient, so each of them can fail.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import mpmath
import numpy as np
import pytest

from gdn_verify.core import gradients
from gdn_verify.core.gating import in_kernel_gates
from gdn_verify.core.gradients import recurrent_gated_delta_rule_backward
from gdn_verify.core.reference import recurrent_gated_delta_rule

# a test-only dependency (the README's install line has it); a bare GPU image may not, and
# `pytest -m gpu tests/` must still collect this module
anp = pytest.importorskip("autograd.numpy")
grad = pytest.importorskip("autograd").grad

AUTOGRAD_RTOL = 1e-12
FD_RTOL = 1e-8
MP_RTOL = 1e-12
# Cotangent key of the backward -> name of the input it belongs to.
INPUT_OF = {
    "dq": "q",
    "dk": "k",
    "dv": "v",
    "dg": "g",
    "dbeta": "beta",
    "dh0": "h0",
    "dA_log": "A_log",
    "ddt_bias": "dt_bias",
}


@dataclass(frozen=True)
class Case:
    B: int = 1
    T: int = 5
    H: int = 1
    HV: int = 1
    K: int = 3
    V: int = 2
    lengths: tuple[int, ...] | None = None  # varlen (B == 1) when given
    h0: bool = False
    dht: bool = False
    l2norm: bool = False
    gate: bool = False  # use_gate_in_kernel
    bias: bool = True  # pass dt_bias (with gate)
    sigmoid: bool = False  # use_beta_sigmoid_in_kernel
    neg_eigval: bool = False
    scale: float | None = None
    state_v_first: bool = False
    checkpoint_every: int | None = None
    saturated: bool = False  # some raw gates above softplus's threshold

    @property
    def bounds(self) -> list[int]:
        if self.lengths is not None:
            return list(np.cumsum((0,) + self.lengths))
        return [b * self.T for b in range(self.B + 1)]

    @property
    def N(self) -> int:
        return len(self.bounds) - 1


CASES = {
    "plain": Case(B=2, T=4, H=2, HV=2),
    "batched_everything": Case(
        B=2,
        T=5,
        H=1,
        HV=2,
        K=3,
        V=4,
        h0=True,
        dht=True,
        l2norm=True,
        gate=True,
        sigmoid=True,
        scale=0.7,
        checkpoint_every=2,
    ),  # fmt: skip
    "varlen_empty_gva": Case(
        T=7, H=2, HV=4, K=4, V=3, lengths=(3, 0, 4), h0=True, dht=True, l2norm=True, checkpoint_every=3
    ),  # fmt: skip
    "varlen_gate_no_bias": Case(
        T=7,
        H=1,
        HV=2,
        K=2,
        V=3,
        lengths=(0, 5, 2),
        dht=True,
        gate=True,
        bias=False,
        sigmoid=True,
        neg_eigval=True,
        scale=1.3,
        saturated=True,
    ),  # fmt: skip
    "h0_only_v_first": Case(T=6, H=1, HV=2, K=2, V=3, h0=True, state_v_first=True, checkpoint_every=1),
    "dht_only_l2norm": Case(B=3, T=3, H=2, HV=4, K=3, V=3, dht=True, l2norm=True, scale=0.5),
}


def make_inputs(case: Case, seed: int = 0) -> dict[str, np.ndarray]:
    """Float64 inputs (and the cotangents ``do``, ``dht``) for ``case``, in the native layout."""
    rng = np.random.default_rng(seed)
    B, T, H, HV, K, V, N = case.B, case.T, case.H, case.HV, case.K, case.V, case.N
    x = dict(
        q=rng.normal(size=(B, T, H, K)),
        k=rng.normal(size=(B, T, H, K)),
        v=rng.normal(size=(B, T, HV, V)),
        do=rng.normal(size=(B, T, HV, V)),
    )
    if case.gate:
        x["g"] = rng.normal(size=(B, T, HV))  # the raw gate a
        x["A_log"] = rng.normal(-1.0, 0.3, size=HV)
        if case.saturated:
            # Just above SOFTPLUS_THRESHOLD = 20, where softplus' is 1, not sigmoid(x) = 1 - 1.2e-9 (a
            # difference the 1e-12 comparison sees), yet far from the kink for finite differences;
            # a small A_log keeps the decay there mild, so these tokens' dg is not negligible.
            x["g"].flat[::5] = 20.5
            x["A_log"] -= 3.0
        if case.bias:
            x["dt_bias"] = rng.normal(0.0, 0.5, size=HV)
    else:
        x["g"] = -rng.uniform(0.05, 1.0, size=(B, T, HV))
    x["beta"] = rng.normal(0.0, 1.5, size=(B, T, HV)) if case.sigmoid else rng.uniform(0.1, 1.0, size=(B, T, HV))
    state_shape = (N, HV, V, K) if case.state_v_first else (N, HV, K, V)
    if case.h0:
        x["h0"] = rng.normal(size=state_shape)
    if case.dht:
        x["dht"] = rng.normal(size=state_shape)
    return x


def backward(case: Case, x: dict[str, np.ndarray]) -> dict:
    return recurrent_gated_delta_rule_backward(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        case.scale,
        x.get("h0"),
        case.l2norm,
        None if case.lengths is None else np.array(case.bounds),
        do=x["do"],
        dht=x.get("dht"),
        state_v_first=case.state_v_first,
        use_gate_in_kernel=case.gate,
        A_log=x.get("A_log"),
        dt_bias=x.get("dt_bias"),
        use_beta_sigmoid_in_kernel=case.sigmoid,
        allow_neg_eigval=case.neg_eigval,
        checkpoint_every=case.checkpoint_every,
    )


def differentiable(case: Case, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inputs the loss depends on (``dt_bias`` and ``h0`` only when given)."""
    names = ["q", "k", "v", "g", "beta", "h0", "A_log", "dt_bias"]
    return {n: x[n] for n in names if n in x}


# --- (a) autograd of a plain token loop -----------------------------------------------------------


def autograd_loss(params: dict, case: Case, do: np.ndarray, dht: np.ndarray | None):
    """``sum(do * o) + sum(dht * S_final)``, one sequence, value head and token at a time."""
    q, k, v, g, beta = (params[n] for n in ("q", "k", "v", "g", "beta"))
    B, T, H, K = q.shape
    HV = v.shape[2]
    if case.l2norm:
        q = q / anp.sqrt(anp.sum(q * q, axis=-1, keepdims=True) + 1e-6)
        k = k / anp.sqrt(anp.sum(k * k, axis=-1, keepdims=True) + 1e-6)
    if case.gate:
        x = g + params["dt_bias"] if case.bias else g
        softplus = anp.where(x > 20.0, x, anp.log1p(anp.exp(anp.minimum(x, 20.0))))
        g = -anp.exp(params["A_log"]) * softplus
    if case.sigmoid:
        beta = (2.0 if case.neg_eigval else 1.0) / (1.0 + anp.exp(-beta))
    scale = K**-0.5 if case.scale is None else case.scale

    def flat(a):
        return anp.reshape(a, (B * T,) + a.shape[2:])

    qf, kf, vf, gf, bf, dof = flat(q), flat(k), flat(v), flat(g), flat(beta), flat(do)
    bounds = case.bounds
    loss = 0.0
    for n in range(case.N):
        for h in range(HV):
            j = h // (HV // H)
            S = anp.zeros((K, v.shape[3]))
            if "h0" in params:
                S = params["h0"][n, h].T if case.state_v_first else params["h0"][n, h]
            for t in range(bounds[n], bounds[n + 1]):
                S = anp.exp(gf[t, h]) * S
                u = bf[t, h] * (vf[t, h] - anp.dot(kf[t, j], S))
                S = S + anp.outer(kf[t, j], u)
                loss = loss + scale * anp.dot(anp.dot(qf[t, j], S), dof[t, h])
            if dht is not None:
                loss = loss + anp.sum((dht[n, h].T if case.state_v_first else dht[n, h]) * S)
    return loss


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """``max |got - want| / max |want|`` (absolute where ``want`` is all zero)."""
    scale = float(np.max(np.abs(want), initial=0.0)) or 1.0
    return float(np.max(np.abs(np.asarray(got) - want), initial=0.0)) / scale


def autograd_errors(case: Case, result: dict, x: dict[str, np.ndarray]) -> dict[str, float]:
    want = grad(autograd_loss)(differentiable(case, x), case, x["do"], x.get("dht"))
    errors = {}
    for key, name in INPUT_OF.items():
        if name in want:
            assert result[key] is not None and result[key].shape == want[name].shape, key
            errors[key] = relative_error(result[key], want[name])
        else:
            assert result.get(key) is None, key
    return errors


@pytest.mark.parametrize("name", list(CASES))
def test_matches_autograd(name):
    case = CASES[name]
    x = make_inputs(case)
    result = backward(case, x)
    assert all(r is None or r.dtype == np.float64 for r in result.values())
    errors = autograd_errors(case, result, x)
    assert set(errors) >= {"dq", "dk", "dv", "dg", "dbeta"}
    assert max(errors.values()) < AUTOGRAD_RTOL, errors


def test_checkpoint_interval_changes_nothing():
    case = replace(CASES["varlen_empty_gva"], checkpoint_every=None)
    x = make_inputs(case, seed=3)
    want = backward(case, x)
    for every in (1, 2, 5, 100):
        got = backward(replace(case, checkpoint_every=every), x)
        for key, value in want.items():
            assert value is None or relative_error(got[key], value) < 1e-14, (every, key)


# --- (b) finite differences of the project's forward oracle ---------------------------------------


def oracle_loss(case: Case, x: dict[str, np.ndarray]) -> float:
    g, beta = in_kernel_gates(
        x["g"], x["beta"], case.gate, x.get("A_log"), x.get("dt_bias"), case.sigmoid, case.neg_eigval
    )
    o, S = recurrent_gated_delta_rule(
        x["q"],
        x["k"],
        x["v"],
        g,
        beta,
        case.scale,
        x.get("h0"),
        output_final_state=True,
        use_qk_l2norm_in_kernel=case.l2norm,
        state_v_first=case.state_v_first,
        cu_seqlens=None if case.lengths is None else np.array(case.bounds),
    )
    assert S is not None
    loss = float(np.sum(x["do"] * o))
    return loss + float(np.sum(x["dht"] * S)) if "dht" in x else loss


def finite_difference_errors(
    case: Case, result: dict, x: dict[str, np.ndarray], directions: int = 2, eps: float = 1e-5
) -> dict[str, float]:
    """Per input, the worst ``|fd - <grad, d>| / (|grad| |d|)`` over random directions ``d``.

    Central differences have error ``O(eps^2)`` (truncation) plus ``O(u / eps)`` (rounding), about
    1e-10 here; normalizing by ``|grad| |d|`` keeps a direction nearly orthogonal to the gradient
    from turning that absolute error into a large relative one.
    """
    rng = np.random.default_rng(1)
    errors = {}
    for key, name in INPUT_OF.items():
        if name not in x:
            continue
        worst = 0.0
        for _ in range(directions):
            d = rng.normal(size=x[name].shape)
            plus, minus = dict(x), dict(x)
            plus[name], minus[name] = x[name] + eps * d, x[name] - eps * d
            fd = (oracle_loss(case, plus) - oracle_loss(case, minus)) / (2 * eps)
            norm = float(np.linalg.norm(result[key]) * np.linalg.norm(d)) or 1.0
            worst = max(worst, abs(fd - float(np.sum(result[key] * d))) / norm)
        errors[key] = worst
    return errors


@pytest.mark.parametrize("name", ["batched_everything", "varlen_empty_gva", "varlen_gate_no_bias", "h0_only_v_first"])
def test_matches_finite_differences_of_the_oracle(name):
    case = CASES[name]
    x = make_inputs(case, seed=7)
    errors = finite_difference_errors(case, backward(case, x), x)
    assert max(errors.values()) < FD_RTOL, errors


# --- (c) a 50-digit directional derivative --------------------------------------------------------


CASES_MP = Case(T=2, K=2, V=2, h0=True, dht=True, l2norm=True, gate=True, sigmoid=True)


def mp_loss(x: dict[str, np.ndarray], do: np.ndarray, dht: np.ndarray):
    """The loss of one sequence and head (B = H = HV = 1) in mpmath, l2norm, gate and sigmoid on."""
    q, k, v, a, b = x["q"][0, :, 0], x["k"][0, :, 0], x["v"][0, :, 0], x["g"][0, :, 0], x["beta"][0, :, 0]
    A_log, dt_bias = x["A_log"][0], x["dt_bias"][0]
    scale = mpmath.mpf(q.shape[-1]) ** mpmath.mpf(-0.5)
    S = x["h0"][0, 0].copy()
    loss = mpmath.mpf(0)
    for t in range(q.shape[0]):
        qt = q[t] / mpmath.sqrt(np.dot(q[t], q[t]) + mpmath.mpf("1e-6"))
        kt = k[t] / mpmath.sqrt(np.dot(k[t], k[t]) + mpmath.mpf("1e-6"))
        g = -mpmath.exp(A_log) * mpmath.log1p(mpmath.exp(a[t] + dt_bias))
        beta = 1 / (1 + mpmath.exp(-b[t]))
        S = mpmath.exp(g) * S
        S = S + np.outer(kt, beta * (v[t] - np.dot(kt, S)))
        loss += scale * np.dot(np.dot(qt, S), do[0, t, 0])
    return loss + np.sum(dht[0, 0] * S)


def mp_directional_error(result: dict, x: dict[str, np.ndarray], seed: int = 5) -> float:
    rng = np.random.default_rng(seed)
    names = differentiable(CASES_MP, x)
    d = {n: rng.normal(size=x[n].shape) for n in names}
    with mpmath.workdps(50):
        mp = lambda a: np.vectorize(lambda e: mpmath.mpf(float(e)), otypes=[object])(a)  # noqa: E731
        base, step = {n: mp(x[n]) for n in names}, {n: mp(d[n]) for n in names}
        do, dht = mp(x["do"]), mp(x["dht"])
        exact = mpmath.diff(lambda s: mp_loss({n: base[n] + s * step[n] for n in names}, do, dht), 0)
        # <grad, d> from our float64 gradient, summed exactly so that only the gradient's error shows
        ours = mpmath.fsum(
            e for key, name in INPUT_OF.items() if name in names for e in (mp(result[key]) * step[name]).ravel()
        )
        return float(abs(ours - exact) / abs(exact))


def test_matches_mpmath_directional_derivative():
    x = make_inputs(CASES_MP, seed=11)
    error = mp_directional_error(backward(CASES_MP, x), x)
    assert error < MP_RTOL, error


# --- the comparisons catch wrong gradients --------------------------------------------------------


def test_a_gate_gradient_without_the_decay_factor_is_caught():
    # dg_t = <dD_t, exp(g_t) S_{t-1}>; dropping exp(g_t) is <dD_t, S_{t-1}> = dg_t / exp(g_t).
    case = CASES["varlen_empty_gva"]
    x = make_inputs(case)
    wrong = dict(backward(case, x))
    wrong["dg"] = wrong["dg"] * np.exp(-x["g"])
    assert autograd_errors(case, wrong, x)["dg"] > 1e3 * AUTOGRAD_RTOL
    assert finite_difference_errors(case, wrong, x)["dg"] > 1e3 * FD_RTOL
    x_mp = make_inputs(CASES_MP, seed=11)
    assert mp_directional_error(_with_wrong_dg(x_mp), x_mp) > 1e3 * MP_RTOL


def _with_wrong_dg(x: dict[str, np.ndarray]) -> dict:
    result = dict(backward(CASES_MP, x))
    g_native, _ = in_kernel_gates(x["g"], x["beta"], True, x["A_log"], x["dt_bias"])
    result["dg"] = result["dg"] * np.exp(-g_native)
    return result


def test_an_l2norm_backward_without_the_projection_is_caught(monkeypatch):
    def scaled_only(x, dy):  # forgets the -y (y . dy) term of the Jacobian
        return dy / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)

    monkeypatch.setattr(gradients, "l2norm_backward", scaled_only)
    case = CASES["dht_only_l2norm"]
    x = make_inputs(case)
    result = backward(case, x)
    errors = autograd_errors(case, result, x)
    assert min(errors["dq"], errors["dk"]) > 1e3 * AUTOGRAD_RTOL
    assert max(errors["dv"], errors["dg"], errors["dbeta"]) < AUTOGRAD_RTOL  # only q and k are hit
    assert finite_difference_errors(case, result, x)["dq"] > 1e3 * FD_RTOL


# --- arguments ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(do=np.zeros((1, 6, 2, 2))), "do"),
        (dict(dht=np.zeros((1, 2, 3, 2))), "dht"),
        (dict(do=np.full((1, 6, 2, 3), np.nan)), "do"),
        (dict(A_log=np.zeros(3)), "A_log"),
        (dict(checkpoint_every=0), "checkpoint_every"),
    ],
)
def test_bad_arguments_name_the_argument(change, field):
    case = Case(T=6, H=1, HV=2, K=2, V=3, dht=True, gate=True)
    x = make_inputs(case)
    kwargs: dict[str, Any] = dict(
        do=x["do"], dht=x["dht"], use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"]
    )
    kwargs.update(change)
    with pytest.raises(ValueError, match=f"^{field}:"):
        recurrent_gated_delta_rule_backward(x["q"], x["k"], x["v"], x["g"], x["beta"], **kwargs)


# --- (d) throughput -------------------------------------------------------------------------------


def test_long_sequence_throughput_and_linearity():
    """T = 4096, HV = 4, K = V = 64: prints the time (captured: shown with ``-s`` or beside a
    failure, never among ``pytest -q``'s dots), and checks dv and dh0 exactly.

    The loss is linear in (v, h0) jointly (every state is), so a central difference with any step
    is exact up to rounding: a check that costs two forward passes, whatever T.
    """
    rng = np.random.default_rng(0)
    B, T, H, HV, K, V = 1, 4096, 2, 4, 64, 64
    q, k = rng.normal(size=(B, T, H, K)), rng.normal(size=(B, T, H, K))
    v, do = rng.normal(size=(B, T, HV, V)), rng.normal(size=(B, T, HV, V))
    g, beta = -rng.uniform(0.0, 0.1, size=(B, T, HV)), rng.uniform(0.0, 1.0, size=(B, T, HV))
    h0, dht = rng.normal(size=(1, HV, K, V)), rng.normal(size=(1, HV, K, V))

    def loss(v_, h0_):
        o, S = recurrent_gated_delta_rule(q, k, v_, g, beta, None, h0_, True, True)
        assert S is not None
        return float(np.sum(o * do) + np.sum(S * dht))

    start = time.perf_counter()
    loss(v, h0)
    forward_s = time.perf_counter() - start
    start = time.perf_counter()
    result = recurrent_gated_delta_rule_backward(q, k, v, g, beta, None, h0, True, do=do, dht=dht)
    backward_s = time.perf_counter() - start
    print(
        f"[gradients] T={T} H={H} HV={HV} K={K} V={V}: forward oracle {forward_s:.2f} s, "
        f"backward {backward_s:.2f} s ({T / backward_s:.0f} tokens/s)"
    )
    dv_dir, dh_dir = rng.normal(size=v.shape), rng.normal(size=h0.shape)
    fd = (loss(v + dv_dir, h0 + dh_dir) - loss(v - dv_dir, h0 - dh_dir)) / 2
    dv, dh0 = result["dv"], result["dh0"]
    assert dv is not None and dh0 is not None
    predicted = float(np.sum(dv * dv_dir) + np.sum(dh0 * dh_dir))
    bound = np.linalg.norm(dv) * np.linalg.norm(dv_dir) + np.linalg.norm(dh0) * np.linalg.norm(dh_dir)
    assert abs(fd - predicted) / bound < 1e-10, (fd, predicted)
    assert all(np.isfinite(r).all() for r in result.values() if r is not None)
