"""Decode at scale and DecodeGraph on the GPU.

Every decode variant the product ships over grids larger than one wave (B * HV * V tiles >> 132
SMs x 12 warps), with pool padding, a bad slot and empty varlen sequences. (These cases were
written for the persistent "-pf" variants, which left for cupy_kernels/experimental/.) DecodeGraph
is checked against the float64 oracle over several replays with the inputs rewritten in place
(the serving pattern), for CuPy and torch, and for its deferred slot error. Tolerances as in
test_cupy_recurrent.py (float32 compute: 1e-5 relative RMS).
"""

from __future__ import annotations

import numpy as np
import pytest

from gdn_verify.core.reference import recurrent_gated_delta_rule

pytestmark = pytest.mark.gpu

FP32_TOL = 1e-5
# every decode variant the product ships (cupy_kernels imports no CuPy at import)
VARIANTS = list(__import__("cupy_kernels.recurrent_kernel", fromlist=["VARIANTS"]).VARIANTS)


@pytest.fixture(scope="module")
def dec(cp):
    from cupy_kernels import decode

    return decode


def rel(x, ref) -> float:
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    assert np.isfinite(x).all(), "NaN/Inf in the kernel output (unwritten or overflowed elements)"
    den = np.linalg.norm(ref)
    return float(np.linalg.norm(x - ref) / (den if den > 0 else 1.0))


def step_inputs(rng, B, H, HV, K, V):
    q = rng.standard_normal((B, 1, H, K)).astype(np.float32)
    k = rng.standard_normal((B, 1, H, K)).astype(np.float32)
    v = rng.standard_normal((B, 1, HV, V)).astype(np.float32)
    g = np.log(rng.uniform(0.5, 1.0, (B, 1, HV))).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, (B, 1, HV)).astype(np.float32)
    return dict(q=q, k=k, v=v, g=g, beta=beta)


def oracle(x, state, l2norm=True):
    return recurrent_gated_delta_rule(
        *(x[n] for n in ("q", "k", "v", "g", "beta")),
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=l2norm,
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_pool_many_items(cp, dec, variant):
    """B = 512 requests over a 600-slot pool (16384+ warps: several waves), with padding."""
    rng = np.random.default_rng(3)
    B, H, HV, K, V, slots = 512, 2, 8, 32, 32, 600
    x = step_inputs(rng, B, H, HV, K, V)
    pool = rng.standard_normal((slots, HV, K, V)).astype(np.float32)
    idx = rng.permutation(slots)[:B].astype(np.int32)
    idx[::7] = -1  # padding rows
    gpu_pool = cp.asarray(pool)
    o = dec.pooled_decode(
        **{n: cp.asarray(a) for n, a in x.items()},
        state_pool=gpu_pool,
        slot_indices=cp.asarray(idx),
        use_qk_l2norm_in_kernel=True,
        decode_variant=variant,
        checked=True,
    )
    o, new_pool = cp.asnumpy(o), cp.asnumpy(gpu_pool)
    live = idx >= 0
    assert np.all(o[~live] == 0)
    untouched = np.setdiff1d(np.arange(slots), idx[live])
    np.testing.assert_array_equal(new_pool[untouched], pool[untouched])
    ref_o, ref_s = oracle({n: a[live] for n, a in x.items()}, pool[idx[live]])
    assert rel(o[live], ref_o) < FP32_TOL
    assert rel(new_pool[idx[live]], ref_s) < FP32_TOL


@pytest.mark.parametrize("variant", VARIANTS)
def test_bad_slot_is_skipped_and_reported(cp, dec, variant):
    rng = np.random.default_rng(4)
    B, H, HV, K, V, slots = 256, 1, 8, 32, 32, 300
    x = {n: cp.asarray(a) for n, a in step_inputs(rng, B, H, HV, K, V).items()}
    pool = rng.standard_normal((slots, HV, K, V)).astype(np.float32)
    idx = np.arange(B, dtype=np.int64)
    idx[100] = slots + 5  # one past the pool
    gpu_pool = cp.asarray(pool)
    with pytest.raises(ValueError, match="^slot_indices:"):
        dec.pooled_decode(**x, state_pool=gpu_pool, slot_indices=cp.asarray(idx), decode_variant=variant, checked=True)
    np.testing.assert_array_equal(cp.asnumpy(gpu_pool)[B:], pool[B:])  # nothing past the requests written


@pytest.mark.parametrize("variant", VARIANTS)
def test_varlen_decode_with_empty_sequences(cp, monkeypatch, variant):
    """T = 1 split over N = 3 sequences by cu_seqlens (two empty): their state comes back unchanged."""
    from cupy_kernels import recurrent_kernel
    from cupy_kernels.recurrent import recurrent_gated_delta_rule as ours

    monkeypatch.setattr(recurrent_kernel, "DEFAULT_VARIANT", variant)
    monkeypatch.setattr(recurrent_kernel, "_PLANS", {})
    rng = np.random.default_rng(5)
    H, HV, K, V = 1, 4, 128, 128
    x = step_inputs(rng, 1, H, HV, K, V)
    s0 = rng.standard_normal((3, HV, K, V)).astype(np.float32)
    cu = np.array([0, 0, 1, 1], np.int64)
    o, s = ours(
        **{n: cp.asarray(a) for n, a in x.items()},
        initial_state=cp.asarray(s0),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=cp.asarray(cu),
        checked=True,
    )
    ref_o, ref_s = recurrent_gated_delta_rule(
        *(x[n] for n in ("q", "k", "v", "g", "beta")),
        initial_state=s0,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=cu,
    )
    assert rel(cp.asnumpy(o), ref_o) < FP32_TOL and rel(cp.asnumpy(s), ref_s) < FP32_TOL
    np.testing.assert_array_equal(cp.asnumpy(s)[[0, 2]], s0[[0, 2]])


@pytest.mark.parametrize("variant", [None, "wide"])
def test_decode_graph_serving_loop(cp, dec, variant):
    """Fixed buffers, inputs rewritten before each replay, state evolving in place: 3 steps."""
    rng = np.random.default_rng(6)
    B, H, HV, K, V = 4, 2, 4, 128, 128
    first = step_inputs(rng, B, H, HV, K, V)
    bufs = {n: cp.asarray(a) for n, a in first.items()}
    state = rng.standard_normal((B, HV, K, V)).astype(np.float32)
    gpu_state = cp.asarray(state)
    step = dec.DecodeStep(**bufs, state=gpu_state, use_qk_l2norm_in_kernel=True, decode_variant=variant)
    graph = step.capture(**bufs, state=gpu_state)
    np.testing.assert_array_equal(cp.asnumpy(gpu_state), state)  # capturing runs nothing
    ref_state = state
    for i in range(3):
        x = first if i == 0 else step_inputs(rng, B, H, HV, K, V)
        for n, a in x.items():
            bufs[n][...] = cp.asarray(a)  # same stream as the replay: ordered before it
        graph.out.fill(np.nan)
        o = graph()
        assert o is graph.out
        ref_o, ref_state = oracle(x, ref_state)
        assert rel(cp.asnumpy(o), ref_o) < FP32_TOL
        assert rel(cp.asnumpy(gpu_state), ref_state) < 4 * FP32_TOL
    graph.verify()


def test_decode_graph_pool_deferred_error(cp, dec):
    rng = np.random.default_rng(7)
    B, H, HV, K, V, slots = 3, 1, 2, 32, 32, 5
    bufs = {n: cp.asarray(a) for n, a in step_inputs(rng, B, H, HV, K, V).items()}
    pool = cp.asarray(rng.standard_normal((slots, HV, K, V)).astype(np.float32))
    idx = cp.asarray(np.array([0, -1, 4], np.int32))
    step = dec.DecodeStep(**bufs, state=pool, slot_indices=idx)
    graph = step.capture(**bufs, state=pool, slot_indices=idx)
    graph()
    cp.cuda.get_current_stream().synchronize()
    assert np.all(cp.asnumpy(graph.out)[1] == 0)
    idx[2] = slots  # past the pool: the kernel skips the row and reports
    graph()
    cp.cuda.get_current_stream().synchronize()
    with pytest.raises(ValueError, match="^slot_indices: .*DecodeGraph"):
        graph()


def test_decode_graph_torch(cp, dec):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    rng = np.random.default_rng(8)
    B, H, HV, K, V = 2, 1, 2, 64, 64
    x = step_inputs(rng, B, H, HV, K, V)
    bufs = {n: torch.from_numpy(a).cuda().to(torch.bfloat16 if n in "qkv" else torch.float32) for n, a in x.items()}
    state = rng.standard_normal((B, HV, K, V)).astype(np.float32)
    s_graph, s_step = torch.from_numpy(state).cuda(), torch.from_numpy(state).cuda()
    step = dec.DecodeStep(**bufs, state=s_step, use_qk_l2norm_in_kernel=True)
    graph = step.capture(**bufs, state=s_graph)
    o_step = step(**bufs, state=s_step)
    o_graph = graph()
    torch.cuda.synchronize()
    assert torch.equal(o_step, o_graph) and torch.equal(s_step, s_graph)  # same kernel, same bits
    s_graph.resize_(s_graph.numel() * 2)  # storage reallocated: the graph must refuse
    with pytest.raises(ValueError, match="reallocated"):
        graph()
