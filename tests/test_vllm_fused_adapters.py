"""vLLM 0.33's fused decode entry points on CPU: the adapters' translation, with NumPy stand-ins.

``fused_sigmoid_gating_delta_rule_update`` (raw gates; vLLM's Triton MTP verify and mixed-batch
decode) and ``fused_recurrent_gated_delta_rule_packed_decode`` (packed ``q | k | v`` rows; vLLM's
default non-speculative decode). Each stand-in checks the kernel's documented convention (shapes,
dtypes, 1-D or 2-D indices, ``slot <= 0`` skipped) and computes it with the float64 oracle, so a
translation that hands it the native convention fails. The GPU runs use the real kernels.
"""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from gdn_verify.api import check
from gdn_verify.core import reference
from gdn_verify.core.conventions import VLLM_SPEC
from gdn_verify.core.gating import gates_from_raw
from gdn_verify.core.implementation import SPEC_FORM, Implementation
from gdn_verify.core.problem import DTYPES
from gdn_verify.implementations import flashinfer as fi
from gdn_verify.implementations import vllm
from gdn_verify.implementations.planted_memory import read_as
from gdn_verify.properties import NAMES
from tests.test_flashinfer_adapters import CASES as FLASHINFER_CASES
from tests.test_flashinfer_adapters import make_problem, standin_decode
from tests.test_spec_adapters import standin_vllm_recurrent

SPEC_PROPS = [name for name in NAMES if name.startswith("spec_")]


def _gates(A_log, a, dt_bias, b, softplus_beta, threshold):
    """The kernels' raw-gate keywords back to ``(g, beta)``, checking what the kernels assume."""
    HV = a.shape[-1]
    assert A_log.shape == dt_bias.shape == (HV,), "A_log and dt_bias are [HV]"
    assert a.shape == b.shape and a.dtype == b.dtype, "a, b in the model dtype"
    # A_log, dt_bias: vLLM's own dtypes (float32, the model's) unless optional_dtypes varies them
    halves = a.strides[-1] == b.strides[-1] == a.itemsize and a.strides[0] == 2 * HV * a.itemsize
    assert halves or a.size == 0, "halves of [b | a]"  # (an empty array's strides are 0)
    assert softplus_beta == 1.0 and threshold == 20.0, "softplus beta/threshold left at vLLM's defaults"
    return gates_from_raw(A_log, a, dt_bias, b)


def standin_sigmoid(
    A_log,
    a,
    b,
    dt_bias,
    q,
    k,
    v,
    beta=1.0,
    threshold=20.0,
    scale=None,
    initial_state=None,
    inplace_final_state=True,
    cu_seqlens=None,
    ssm_state_indices=None,
    num_accepted_tokens=None,
    use_qk_l2norm_in_kernel=False,
    is_kda=False,
):
    """``fused_sigmoid_gating_delta_rule_update``: raw gates, then ``fused_recurrent``'s slots."""
    assert np.ndim(beta) == 0, "`beta` is softplus's beta (a float), not the update gate"
    assert not is_kda
    g, gate_beta = _gates(A_log, a, dt_bias, b, beta, threshold)
    return standin_vllm_recurrent(
        q,
        k,
        v,
        g.reshape(v.shape[:3]),  # a, b are read as flat [tokens, HV] rows
        gate_beta.reshape(v.shape[:3]),
        scale=scale,
        initial_state=initial_state,
        inplace_final_state=inplace_final_state,
        cu_seqlens=cu_seqlens,
        ssm_state_indices=ssm_state_indices,
        num_accepted_tokens=num_accepted_tokens,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
    )


def standin_packed_decode(
    mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices, use_qk_l2norm_in_kernel=False
):
    """``fused_recurrent_gated_delta_rule_packed_decode``: one token per row, pool updated in place."""
    assert mixed_qkv.ndim == 2 and a.ndim == b.ndim == 2 and ssm_state_indices.ndim == 1
    assert isinstance(scale, float), "scale is required (no default)"
    assert ssm_state_indices.dtype == np.int32
    rows = mixed_qkv.shape[0]
    HV, V, K = initial_state.shape[-3:]
    assert out.shape == (rows, 1, HV, V) and a.shape == (rows, HV)
    H = (mixed_qkv.shape[1] - HV * V) // (2 * K)  # the kernel infers H from the packed width
    g, beta = _gates(A_log, a, dt_bias, b, 1.0, 20.0)
    q = mixed_qkv[:, : H * K].reshape(rows, 1, H, K)
    k = mixed_qkv[:, H * K : 2 * H * K].reshape(rows, 1, H, K)
    v = mixed_qkv[:, 2 * H * K :].reshape(rows, 1, HV, V)
    for n, slot in enumerate(ssm_state_indices.tolist()):
        if slot <= 0:  # vLLM's null block and padding: zeros out, state untouched
            out[n] = 0
            continue
        o, state = reference.recurrent_gated_delta_rule(
            q[n : n + 1],
            k[n : n + 1],
            v[n : n + 1],
            g[n : n + 1, None],
            beta[n : n + 1, None],
            scale=scale,
            initial_state=initial_state[slot : slot + 1],
            output_final_state=True,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            state_v_first=True,
        )
        assert state is not None  # output_final_state=True
        out[n] = o[0]
        initial_state[slot] = state[0]
    return out, initial_state


# FlashInfer's cases but the last, which here also takes V != K (FlashInfer's state is square).
CASES = [*FLASHINFER_CASES[:-1], dict(seed=3, regime="moderate", H=4, HV=4, K=8, V=4)]


def assert_close(got, want, rtol):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    assert np.max(np.abs(got - want), initial=0.0) <= rtol * max(1.0, np.max(np.abs(want), initial=0.0))


def _native(adapter, problem):
    o, state = adapter(**problem.kwargs())
    want_o, want_state = reference.recurrent_gated_delta_rule(**problem.kwargs())
    return (o, want_o), (state, want_state)


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
def test_packed_decode_translation_matches_the_oracle(case):
    # the pool is float32, as vLLM's kernel keeps it here: float32-state accuracy, not 1e-12
    problem = make_problem(**case)
    (o, want_o), (state, want_state) = _native(vllm.packed_decode_adapter(standin_packed_decode), problem)
    assert_close(o, want_o, 1e-5)
    assert_close(state, want_state, 1e-5)
    o2, none = vllm.packed_decode_adapter(standin_packed_decode)(**problem.replace(output_final_state=False).kwargs())
    assert none is None and np.array_equal(o2, o)


@pytest.mark.parametrize("case", CASES[:4], ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
def test_sigmoid_recurrent_translation_matches_the_oracle(case):
    problem = make_problem(**case)
    (o, want_o), (state, want_state) = _native(vllm.recurrent_adapter(standin_sigmoid, np, raw=True), problem)
    assert_close(o, want_o, 1e-5)
    assert_close(state, want_state, 1e-5)


def test_packed_decode_leaves_the_callers_state_alone_and_writes_no_null_slot():
    problem = make_problem(lengths=(3, 0, 1))
    assert problem.initial_state is not None
    before = problem.initial_state.copy()
    pools = []

    def watch(**kw):
        pools.append(kw["initial_state"])
        return standin_packed_decode(**kw)

    vllm.packed_decode_adapter(watch)(**problem.kwargs())
    assert np.array_equal(problem.initial_state, before)
    assert len(pools) == 3 and all(p is pools[0] for p in pools), "one pool, updated in place across steps"
    assert not np.any(pools[0][0]), "slot 0 is vLLM's null block"


def test_a_wrong_packing_order_is_caught():
    def k_before_q(**kw):  # a kernel reading [k | q | v]: what a translation packing k first looks like
        m = kw["mixed_qkv"].copy()
        HK = (m.shape[1] - np.prod(kw["initial_state"].shape[-3:-1])) // 2
        kw["mixed_qkv"] = np.concatenate([m[:, HK : 2 * HK], m[:, :HK], m[:, 2 * HK :]], axis=1)
        return standin_packed_decode(**kw)

    (o, want_o), _ = _native(vllm.packed_decode_adapter(k_before_q), make_problem(regime="mild"))
    assert np.max(np.abs(o - want_o)) > 1e-2


def test_float32_problems_pass_the_property_suite_through_the_packed_decode(tmp_path):
    impl = Implementation("standin-packed-decode", {"recurrent": vllm.packed_decode_adapter(standin_packed_decode)})
    result = check(
        impl, dtype="float32", properties=["matches_reference"], max_examples=15, seed=5, cases_dir=tmp_path
    )["matches_reference"]
    assert result.status == "passed", result.failure and result.failure.message


def test_sigmoid_spec_adapter_passes_the_slot_properties_but_bounds(tmp_path):
    impl = Implementation(
        "standin-vllm-sigmoid-spec",
        {SPEC_FORM: vllm.spec_adapter(standin_sigmoid, gates=vllm.raw_gate_kwargs(vllm.NumpyOps()))},
        extra={"spec_rules": VLLM_SPEC},
    )
    result = check(impl, dtype="float32", properties=SPEC_PROPS, max_examples=12, seed=3, cases_dir=tmp_path)
    statuses = {r.name: r.status for r in result.results}
    # the same unchecked num_accepted_tokens - 1 read as fused_recurrent's (tests/test_spec_adapters.py)
    assert statuses.pop("spec_accepted_bounds") == "failed"
    assert set(statuses.values()) == {"passed"}, result.as_dict()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_raw_gates_go_over_in_the_model_dtype_with_zero_bias(dtype):
    # vLLM's Qwen GDN layer: a, b in the model dtype (strided halves of the ba projection),
    # A_log a float32 parameter, dt_bias one in the model dtype; the round trip within
    # flashinfer.raw_gates' bounds for that dtype's unit roundoff u
    g = np.array([[0.0, -1e-6, -0.7, -60.0], [-3.0, -1e-3, -20.0, -0.1]], dtype)
    beta = np.array([[0.0, 0.3, 0.999, 1.0], [0.5, 0.01, 0.75, 0.9]], dtype)
    kw = vllm.raw_gate_kwargs(vllm.NumpyOps())(g, beta)
    assert set(kw) == {"A_log", "a", "b", "dt_bias"}
    assert kw["a"].dtype == kw["b"].dtype == kw["dt_bias"].dtype == dtype and kw["A_log"].dtype == np.float32
    assert not kw["A_log"].any() and not kw["dt_bias"].any()
    assert kw["a"].strides == kw["b"].strides == (8 * kw["a"].itemsize, kw["a"].itemsize), "halves of [b | a]"
    assert kw["a"].base is kw["b"].base
    u = float(np.finfo(dtype).eps) / 2
    g2, beta2 = gates_from_raw(kw["A_log"], kw["a"], kw["dt_bias"], kw["b"])
    g64, beta64 = g.astype(np.float64), beta.astype(np.float64)
    assert np.all(np.abs(np.exp(g2) - np.exp(g64)) <= u / np.e) and np.all(np.abs(beta2 - beta64) <= 0.224 * u)


def test_a_folder_without_the_fused_kernels_is_a_configuration_error(tmp_path):
    from types import SimpleNamespace

    from gdn_verify.implementations import ConfigurationError, vllm_releases

    ops = SimpleNamespace(root=tmp_path, fused_sigmoid_gating_delta_rule_update=None, packed_decode=None)
    release = vllm_releases.Release(vllm_releases.TABLE[0], "test")
    for name in ("fused_sigmoid_gating_delta_rule_update", "packed_decode"):
        with pytest.raises(ConfigurationError, match="has no .*0.10.2..0.15.1"):
            vllm._need(ops, release, name, name)  # noqa: SLF001 - the factories' check, without a GPU


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_oracle_sees_the_gates_a_raw_gate_kernel_computes(dtype):
    # The raw gates go over rounded to the model dtype, so a kernel computing its gates exactly from
    # them (here in float64) meets the oracle of impl.as_called(problem) to its float32 pool, and
    # the drawn problem's oracle only to the rounding of a and b (an H200 run of 2026-12-05 failed
    # vLLM 0.20's sigmoid kernel on exactly that, 1.07x its bound, before the declaration).
    problem = make_problem(seed=4, regime="moderate")
    problem = problem.replace(**{n: getattr(problem, n).astype(DTYPES[dtype]) for n in ("q", "k", "v", "g", "beta")})
    impl = Implementation("standin", {"recurrent": vllm.recurrent_adapter(standin_sigmoid, np, raw=True)})
    _, state = impl.forms["recurrent"](**problem.kwargs())
    seen = impl.as_called(problem)
    assert seen is problem, "undeclared: the drawn gates"
    seen = Implementation("declared", impl.forms, extra={"raw_gates": True}).as_called(problem)
    assert seen.g.dtype == seen.beta.dtype == np.float32 and not np.array_equal(seen.g, problem.g.astype(np.float32))
    _, want_state = reference.recurrent_gated_delta_rule(**seen.kwargs())
    _, drawn_state = reference.recurrent_gated_delta_rule(**problem.kwargs())
    exact = np.max(np.abs(np.asarray(state, np.float64) - want_state))
    drawn = np.max(np.abs(np.asarray(state, np.float64) - drawn_state))
    assert exact <= 1e-5 * np.max(np.abs(want_state)) < drawn  # both sides of the declaration


# FLA's in-kernel gate options through the raw-gate adapters (vLLM's fused kernels, FlashInfer's decode)
SEED = random.randrange(2**31)  # correct adapters pass under any seed (printed on failure)
RAW_GATE_ADAPTERS = {
    "vllm-sigmoid-recurrent": (lambda k: vllm.recurrent_adapter(k, np, raw=True), standin_sigmoid),
    "vllm-packed-decode": (vllm.packed_decode_adapter, standin_packed_decode),
    "flashinfer-decode": (lambda k: fi.decode_adapter(k, fi.NumpyOps()), standin_decode),
}
DECLARED = {
    "vllm-sigmoid-recurrent": vllm.RAW_GATE_OPTIONAL_DTYPES,
    "vllm-packed-decode": vllm.RAW_GATE_OPTIONAL_DTYPES,
    "flashinfer-decode": fi.DECODE_OPTIONAL_DTYPES,
}
OPTION_PROPS = ["in_kernel_gate", "in_kernel_beta_sigmoid", "optional_dtypes"]


class CachedWithoutGateDtypes:
    """A raw-gate kernel compiled on first use and cached by its input shapes and dtype, not by the
    dtypes of ``A_log`` and ``dt_bias`` (FlashInfer PR #4219): a later call of those shapes reads
    their bytes as the first call's dtypes."""

    def __init__(self, kernel):
        self.kernel, self.compiled = kernel, {}

    def __call__(self, **kw):
        inputs = kw.get("q", kw.get("mixed_qkv"))
        shapes = (np.shape(inputs), np.asarray(inputs).dtype.str, np.shape(kw.get("initial_state", kw.get("state"))))
        for name in ("A_log", "dt_bias"):
            x = np.asarray(kw[name])
            kw[name] = read_as(x, self.compiled.setdefault((*shapes, name), x.dtype))
        return self.kernel(**kw)


def raw_gate_impl(name: str, wrap=None) -> Implementation:
    adapter, kernel = RAW_GATE_ADAPTERS[name]
    return Implementation(
        name, {"recurrent": adapter(wrap(kernel) if wrap else kernel)},
        extra={"raw_gates": True, "optional_dtypes": DECLARED[name]},
    )  # fmt: skip


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", RAW_GATE_ADAPTERS)
def test_the_in_kernel_gate_options_reach_the_raw_gate_kernels(name, dtype, tmp_path):
    # g as the raw a with the caller's A_log and dt_bias, beta as the logits b: what vLLM's Qwen GDN
    # layer hands these kernels; the oracle sees g and the logits rounded to the input dtype only
    result = check(raw_gate_impl(name), dtype=dtype, properties=OPTION_PROPS, max_examples=10, seed=SEED,
                   cases_dir=tmp_path)  # fmt: skip
    assert {r.name: r.status for r in result.results} == dict.fromkeys(OPTION_PROPS, "passed"), (
        f"seed {SEED}: {result.as_dict()}"
    )
    beta_sigmoid = result["in_kernel_beta_sigmoid"]
    assert beta_sigmoid.unsupported and "no allow_neg_eigval" in beta_sigmoid.note  # 2 sigmoid(b): no raw form


@pytest.mark.parametrize("name", RAW_GATE_ADAPTERS)
def test_a_raw_gate_kernel_cached_without_the_dtype_of_its_gate_parameters_is_caught(name, tmp_path):
    result = check(raw_gate_impl(name, CachedWithoutGateDtypes), dtype="bfloat16", properties=["optional_dtypes"],
                   max_examples=10, seed=1, cases_dir=tmp_path)["optional_dtypes"]  # fmt: skip
    assert result.status == "failed"
    names = "|".join(DECLARED[name])
    assert re.match(
        rf"call 2 of 3 \(({names}) in \w+, after a call with it in \w+ that met the oracle", result.failure.message
    )


def test_the_callers_raw_gate_inputs_go_over_as_they_are():
    problem = make_problem(seed=2, regime="moderate")
    HV = problem.v.shape[2]
    a = np.random.default_rng(0).normal(0.0, 2.0, problem.g.shape).astype(np.float32)
    logits = np.random.default_rng(1).normal(0.0, 2.0, problem.beta.shape).astype(np.float32)
    A_log, dt_bias = np.linspace(0.0, 2.0, HV, dtype=np.float32), np.linspace(-1.0, 1.0, HV).astype(DTYPES["bfloat16"])
    seen = {}

    def spy(**kw):
        seen.update(kw)
        return standin_sigmoid(**kw)

    call = vllm.recurrent_adapter(spy, np, raw=True)
    call(**{**problem.kwargs(), "g": a, "beta": logits}, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
         use_beta_sigmoid_in_kernel=True)  # fmt: skip
    assert np.array_equal(seen["a"], a.reshape(-1, HV)) and np.array_equal(seen["b"], logits.reshape(-1, HV))
    assert seen["A_log"] is A_log and seen["dt_bias"] is dt_bias
    with pytest.raises(NotImplementedError, match="allow_neg_eigval"):
        call(**problem.kwargs(), use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_as_called_rounds_the_callers_raw_inputs_and_encodes_the_rest(dtype):
    problem = make_problem(seed=4, regime="moderate")
    problem = problem.replace(**{n: getattr(problem, n).astype(DTYPES[dtype]) for n in ("q", "k", "v", "g", "beta")})
    impl = Implementation("declared", {}, extra={"raw_gates": True})
    encoded = impl.as_called(problem)
    raw_g = impl.as_called(problem, {"A_log": [0.0] * problem.v.shape[2]})
    assert np.array_equal(raw_g.g, problem.g.astype(np.float32)), "g is the caller's a: only rounded"
    assert np.array_equal(raw_g.beta, encoded.beta) and not np.array_equal(encoded.g, raw_g.g)
    raw_beta = impl.as_called(problem, {"beta_logits": True})
    assert np.array_equal(raw_beta.beta, problem.beta.astype(np.float32)) and np.array_equal(raw_beta.g, encoded.g)
