"""FLA's in-kernel gate options on our kernels (GPU only; skipped elsewhere).

``use_gate_in_kernel`` (raw g, A_log, optional dt_bias), ``use_beta_sigmoid_in_kernel`` and
``allow_neg_eigval`` on the recurrent kernel (general launcher, pool, DecodeStep) and the chunked
kernel, against the float64 oracle run on the native gates ``gating.in_kernel_gates`` defines.
Raw gates include +-30 spikes (past softplus's threshold 20) and saturated logits. Tolerances as
in test_cupy_recurrent.py / test_cupy_chunk.py: the gate transform adds a few float32 roundings
per token, inside the same 1e-5 (fp32) bound; the tensor-core chunk path keeps its 1e-4.
"""

from __future__ import annotations

import numpy as np
import pytest

from gdn_verify.core.gating import in_kernel_gates
from gdn_verify.core.reference import recurrent_gated_delta_rule as oracle

pytestmark = pytest.mark.gpu

FP32_TOL = 1e-5
TC_FP32_TOL = 1e-4

OPTIONS = {
    "gate": dict(use_gate_in_kernel=True, dt_bias=True),
    "gate_no_dt_bias": dict(use_gate_in_kernel=True, dt_bias=False),
    "beta_sigmoid": dict(use_beta_sigmoid_in_kernel=True),
    "neg_eigval": dict(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True),
    "all": dict(use_gate_in_kernel=True, dt_bias=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True),
}


def rel(x, ref) -> float:
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    assert np.isfinite(x).all(), "NaN/Inf in the kernel output"
    return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-300))


def raw_case(seed, option, B=1, T=40, H=1, HV=2, K=32, V=16):
    """float32 host inputs with raw gates / beta logits as the option asks, and the option kwargs."""
    rng = np.random.default_rng(seed)
    spec = dict(OPTIONS[option])
    q = rng.standard_normal((B, T, H, K)).astype(np.float32)
    k = rng.standard_normal((B, T, H, K)).astype(np.float32)
    v = rng.standard_normal((B, T, HV, V)).astype(np.float32)
    if spec.get("use_gate_in_kernel"):
        g = rng.normal(0.0, 2.0, (B, T, HV))
        g.flat[:: max(1, g.size // 5)] = 30.0
        g.flat[1 :: max(1, g.size // 5)] = -30.0
    else:
        g = np.log(rng.uniform(0.5, 1.0, (B, T, HV)))
    if spec.get("use_beta_sigmoid_in_kernel"):
        beta = rng.normal(0.0, 3.0, (B, T, HV))
        beta.flat[:: max(1, beta.size // 4)] = 60.0
        beta.flat[2 :: max(1, beta.size // 4)] = -60.0
    else:
        beta = rng.uniform(0.0, 1.0, (B, T, HV))
    kw = {}
    if spec.pop("use_gate_in_kernel", False):
        kw["use_gate_in_kernel"] = True
        kw["A_log"] = np.log(rng.uniform(1.0, 16.0, HV)).astype(np.float32)
        if spec.pop("dt_bias"):
            kw["dt_bias"] = np.log(np.expm1(np.exp(rng.uniform(np.log(1e-3), np.log(0.1), HV)))).astype(np.float32)
    spec.pop("dt_bias", None)
    kw.update(spec)
    state = rng.standard_normal((B, HV, K, V)).astype(np.float32)
    data = dict(q=q, k=k, v=v, g=g.astype(np.float32), beta=beta.astype(np.float32))
    return data, state, kw


def native(data, kw):
    g, beta = in_kernel_gates(data["g"], data["beta"], **kw)
    return dict(data, g=g, beta=beta)


def on_gpu(cp, kw):
    return {n: cp.asarray(x) if isinstance(x, np.ndarray) else x for n, x in kw.items()}


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_recurrent_options(cp, option):
    from cupy_kernels.recurrent import recurrent_gated_delta_rule

    data, state, kw = raw_case(1, option, B=2, T=9, H=2, HV=4)
    o, s = recurrent_gated_delta_rule(
        **{n: cp.asarray(x) for n, x in data.items()},
        initial_state=cp.asarray(state),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        **on_gpu(cp, kw),
    )
    ref_o, ref_s = oracle(
        **native(data, kw), initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    assert rel(cp.asnumpy(o), ref_o) < FP32_TOL and rel(cp.asnumpy(s), ref_s) < FP32_TOL


@pytest.mark.parametrize("option", ["all", "neg_eigval"])
def test_recurrent_options_float64_oracle(cp, option):
    from cupy_kernels.recurrent import recurrent_gated_delta_rule

    data, state, kw = raw_case(2, option, T=12)
    o, s = recurrent_gated_delta_rule(
        **{n: cp.asarray(x) for n, x in data.items()},
        initial_state=cp.asarray(state),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        precision="float64",
        **on_gpu(cp, kw),
    )
    ref_o, ref_s = oracle(
        **native(data, kw), initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    assert rel(cp.asnumpy(o), ref_o) < 1e-12 and rel(cp.asnumpy(s), ref_s) < 1e-12


@pytest.mark.parametrize("tc", [False, True])
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_chunk_options(cp, option, tc):
    from cupy_kernels.chunk import chunk_gated_delta_rule

    data, state, kw = raw_case(3, option, T=150, H=1, HV=2, K=32, V=32)
    cu = [0, 17, 64, 150]
    state = np.random.default_rng(4).standard_normal((3, 2, 32, 32)).astype(np.float32)
    o, s = chunk_gated_delta_rule(
        **{n: cp.asarray(x) for n, x in data.items()},
        initial_state=cp.asarray(state),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=cu,
        use_tensor_cores=tc,
        **on_gpu(cp, kw),
    )
    ref_o, ref_s = oracle(
        **native(data, kw),
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=np.array(cu),
    )
    tol = TC_FP32_TOL if tc else FP32_TOL
    assert rel(cp.asnumpy(o), ref_o) < tol and rel(cp.asnumpy(s), ref_s) < tol


def test_pool_and_decode_step_options(cp):
    from cupy_kernels.decode import DecodeStep, pooled_decode

    data, _, kw = raw_case(5, "all", B=3, T=1, H=1, HV=2, K=64, V=32)
    pool = np.random.default_rng(6).standard_normal((5, 2, 64, 32)).astype(np.float32)
    idx = np.array([4, -1, 1], np.int32)
    ref = {}
    nat = native(data, kw)
    for row in (0, 2):
        part = {n: x[row : row + 1] for n, x in nat.items()}
        ref[row] = oracle(
            **part, initial_state=pool[idx[row]][None], output_final_state=True, use_qk_l2norm_in_kernel=True
        )
    dev = {n: cp.asarray(x) for n, x in data.items()}
    gpu_pool = cp.asarray(pool)
    o1 = cp.asnumpy(
        pooled_decode(
            **dev, state_pool=gpu_pool, slot_indices=cp.asarray(idx), use_qk_l2norm_in_kernel=True, **on_gpu(cp, kw)
        )
    )
    pool1 = cp.asnumpy(gpu_pool)
    gpu_pool2 = cp.asarray(pool)
    step = DecodeStep(
        **dev, state=gpu_pool2, slot_indices=cp.asarray(idx), use_qk_l2norm_in_kernel=True, **on_gpu(cp, kw)
    )
    o2 = cp.asnumpy(step(**dev, state=gpu_pool2, slot_indices=cp.asarray(idx)))
    for o, p in ((o1, pool1), (o2, cp.asnumpy(gpu_pool2))):
        assert np.all(o[1] == 0)
        for row in (0, 2):
            assert rel(o[row : row + 1], ref[row][0]) < FP32_TOL
            assert rel(p[idx[row]][None], ref[row][1]) < FP32_TOL


@pytest.mark.parametrize("form", ["recurrent", "chunk"])
def test_option_rules(cp, form):
    from cupy_kernels.chunk import chunk_gated_delta_rule
    from cupy_kernels.recurrent import recurrent_gated_delta_rule

    fn = chunk_gated_delta_rule if form == "chunk" else recurrent_gated_delta_rule
    data, _, _ = raw_case(7, "beta_sigmoid", T=4)
    dev = {n: cp.asarray(x) for n, x in data.items()}
    with pytest.raises(ValueError, match="^A_log:"):
        fn(**dev, use_gate_in_kernel=True)
    with pytest.raises(ValueError, match="^A_log:"):
        fn(**dev, A_log=cp.zeros(2, cp.float32))
    with pytest.raises(ValueError, match="^allow_neg_eigval:"):
        fn(**dev, allow_neg_eigval=True)
    with pytest.raises(ValueError, match="^A_log:"):
        fn(**dev, use_gate_in_kernel=True, A_log=cp.zeros(3, cp.float32))
    with pytest.raises(ValueError, match="^dt_bias:"):
        fn(**dev, use_gate_in_kernel=True, A_log=cp.zeros(2, cp.float32), dt_bias=cp.zeros((1, 2), cp.float32))
