"""The CuPy recurrent kernel against the float64 NumPy oracle (GPU only; skipped elsewhere).

Tolerances (relative RMS over the whole tensor, ``||x - ref|| / ||ref||``), derived rather than tuned:

- float32 compute: the oracle runs on the same float32-rounded inputs, so only the kernel's own
  rounding counts: each token adds a few roundings of 2^-24 ~ 6e-8 per state element and the K-term
  dot products add ~sqrt(K) of them, accumulating like a random walk over T tokens. For T <= 65,
  K <= 256 that is ~sqrt(T) * sqrt(K) * 6e-8 ~ 1e-5 at the very worst; typical is ~1e-7.
  FP32_TOL = 1e-5.
- bfloat16 / float16 inputs: the output is rounded to the input dtype: at most 2^-9 (bf16) or
  2^-12 (f16) relative per element, so an RMS of at most that. BF16_TOL = 2^-8, F16_TOL = 2^-10.
  The state stays float32: FP32_TOL.
- float64 GPU oracle: double rounding everywhere, agreement to 1e-12.

Every output buffer the launcher allocates starts poisoned (the memory pool is refilled with 0xFF
bytes, NaN in every float format) so an unwritten element shows up as NaN.
"""

from __future__ import annotations

import numpy as np
import pytest

from gdn_verify.core.gating import gates_from_raw
from gdn_verify.core.reference import decode_gated_delta_rule, recurrent_gated_delta_rule
from tests.native_case import random_native_case

pytestmark = pytest.mark.gpu

FP32_TOL = 1e-5
BF16_TOL = 2.0**-8
F16_TOL = 2.0**-10
F64_TOL = 1e-12


@pytest.fixture(scope="module")
def kern(cp):
    from cupy_kernels import recurrent

    return recurrent


@pytest.fixture(scope="module")
def dec(cp):
    from cupy_kernels import decode

    return decode


@pytest.fixture(scope="module")
def torch(cp):
    torch = pytest.importorskip("torch", reason="torch is not installed: bfloat16 / DLPack tests need it")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return torch


def poison(cp, nbytes: int = 64 << 20) -> None:
    """Fill the CuPy pool's free memory with 0xFF bytes (NaN as f16/bf16/f32/f64)."""
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    block = cp.empty(nbytes, cp.uint8)
    block.fill(255)
    cp.cuda.get_current_stream().synchronize()
    del block  # back to the pool: later allocations are carved from it


def poison_torch(torch, nbytes: int = 64 << 20) -> None:
    torch.cuda.empty_cache()
    block = torch.full((nbytes,), 255, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    del block


def rel(x, ref) -> float:
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    assert np.isfinite(x).all(), "NaN/Inf in the kernel output (unwritten or overflowed elements)"
    den = np.linalg.norm(ref)
    return float(np.linalg.norm(x - ref) / (den if den > 0 else 1.0))


def case(seed, B=1, T=6, H=1, HV=1, K=16, V=8, cu=None, with_state=True, gate=None, v_first=False):
    """Random native-convention problem in float64 (unit-norm keys, so runs without l2norm are stable)."""
    return random_native_case(seed, B, T, H, HV, K, V, cu=cu, with_state=with_state, gate=gate, v_first=v_first)


def run_both(cp, kern, c, dtype=np.float32, cu=None, l2norm=False, v_first=False, scale=None, precision="float32"):
    """Our kernel on ``c`` cast to ``dtype`` and the oracle on the same rounded values."""
    rounded = {n: (None if x is None else np.asarray(x, dtype)) for n, x in c.items()}
    if rounded["initial_state"] is not None:
        rounded["initial_state"] = np.asarray(c["initial_state"], np.float32)
    gpu = {n: (None if x is None else cp.asarray(x)) for n, x in rounded.items()}
    cu_gpu = None if cu is None else cp.asarray(np.asarray(cu, np.int64))
    poison(cp)
    o, s = kern.recurrent_gated_delta_rule(
        **gpu,
        scale=scale,
        output_final_state=True,
        use_qk_l2norm_in_kernel=l2norm,
        state_v_first=v_first,
        cu_seqlens=cu_gpu,
        precision=precision,
    )
    ref_o, ref_s = recurrent_gated_delta_rule(
        **rounded,
        scale=scale,
        output_final_state=True,
        use_qk_l2norm_in_kernel=l2norm,
        state_v_first=v_first,
        cu_seqlens=cu,
    )
    return cp.asnumpy(o), cp.asnumpy(s), ref_o, ref_s


@pytest.mark.parametrize("l2norm", [False, True])
def test_varlen_lengths_0_1_63_64_65(cp, kern, l2norm):
    lengths = [0, 1, 63, 64, 65, 0]
    cu = np.concatenate([[0], np.cumsum(lengths)])
    c = case(1, T=int(cu[-1]), H=2, HV=4, K=32, V=24, cu=cu)
    o, s, ref_o, ref_s = run_both(cp, kern, c, cu=cu, l2norm=l2norm)
    assert o.shape == ref_o.shape and s.shape == ref_s.shape
    assert rel(o, ref_o) < FP32_TOL
    assert rel(s, ref_s) < FP32_TOL
    # zero-length sequences hand their initial state back unchanged
    np.testing.assert_array_equal(s[0], np.float32(c["initial_state"][0]))
    np.testing.assert_array_equal(s[5], np.float32(c["initial_state"][5]))


@pytest.mark.parametrize("ratio", [1, 2, 4])
@pytest.mark.parametrize("T", [1, 5])
def test_batched_gva(cp, kern, ratio, T):
    c = case(2 + ratio, B=3, T=T, H=2, HV=2 * ratio, K=32, V=16)
    o, s, ref_o, ref_s = run_both(cp, kern, c, l2norm=True)
    assert rel(o, ref_o) < FP32_TOL and rel(s, ref_s) < FP32_TOL


@pytest.mark.parametrize("v_first", [False, True])
@pytest.mark.parametrize("K,V", [(1, 3), (3, 1), (60, 100), (100, 60), (128, 128), (256, 256), (256, 64)])
def test_head_sizes(cp, kern, K, V, v_first):
    c = case(K * 1000 + V, B=2, T=3, H=1, HV=2, K=K, V=V, v_first=v_first)
    o, s, ref_o, ref_s = run_both(cp, kern, c, l2norm=True, v_first=v_first)
    assert rel(o, ref_o) < FP32_TOL and rel(s, ref_s) < FP32_TOL


@pytest.mark.parametrize("v_first", [False, True])
@pytest.mark.parametrize("B", [1, 5])
def test_decode_shape_k128(cp, kern, B, v_first):
    """The decode configuration (T = 1, GVA 2, K = V = 128, l2norm) in both state layouts."""
    c = case(40 + B, B=B, T=1, H=2, HV=4, K=128, V=128, v_first=v_first)
    o, s, ref_o, ref_s = run_both(cp, kern, c, l2norm=True, v_first=v_first)
    assert rel(o, ref_o) < FP32_TOL and rel(s, ref_s) < FP32_TOL


@pytest.mark.parametrize("l2norm", [False, True])
def test_zero_qk_rows(cp, kern, l2norm):
    c = case(3, T=7, H=1, HV=2, K=16, V=8)
    c["q"][0, 2] = 0.0
    c["k"][0, 4] = 0.0
    c["q"][0, 5] = 0.0
    c["k"][0, 5] = 0.0
    o, s, ref_o, ref_s = run_both(cp, kern, c, l2norm=l2norm)
    assert rel(o, ref_o) < FP32_TOL and rel(s, ref_s) < FP32_TOL
    assert np.all(o[0, 2] == 0) and np.all(o[0, 5] == 0)


@pytest.mark.parametrize("v_first", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
def test_initial_state_layouts(cp, kern, v_first, with_state):
    c = case(4, B=2, T=4, H=1, HV=2, K=12, V=20, with_state=with_state, v_first=v_first)
    o, s, ref_o, ref_s = run_both(cp, kern, c, v_first=v_first, scale=0.3)
    assert s.shape == ((2, 2, 20, 12) if v_first else (2, 2, 12, 20))
    assert rel(o, ref_o) < FP32_TOL and rel(s, ref_s) < FP32_TOL


def test_saturated_gates(cp, kern):
    def gate(rng, shape):
        g = np.log(rng.uniform(0.5, 1.0, shape))
        g.flat[rng.choice(g.size, g.size // 3, replace=False)] = 0.0
        g.flat[rng.choice(g.size, g.size // 4, replace=False)] = -1e4
        g.flat[rng.choice(g.size, 2, replace=False)] = -30.0
        return g

    cu = np.array([0, 9, 9, 20])
    c = case(5, T=20, H=1, HV=3, K=16, V=16, cu=cu, gate=gate)
    c["beta"].flat[::5] = 1.0
    c["beta"].flat[1::7] = 0.0
    o, s, ref_o, ref_s = run_both(cp, kern, c, cu=cu, l2norm=True)
    assert rel(o, ref_o) < FP32_TOL and rel(s, ref_s) < FP32_TOL


def test_float16_inputs(cp, kern):
    c = case(6, B=2, T=5, H=1, HV=2, K=64, V=32)
    o, s, ref_o, ref_s = run_both(cp, kern, c, dtype=np.float16, l2norm=True)
    assert o.dtype == np.float16
    assert rel(o, ref_o) < F16_TOL and rel(s, ref_s) < FP32_TOL


@pytest.mark.parametrize("v_first", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_float64_gpu_oracle(cp, kern, dtype, v_first):
    lengths = [3, 0, 1, 9]
    cu = np.concatenate([[0], np.cumsum(lengths)])
    c = case(7, T=int(cu[-1]), H=2, HV=4, K=24, V=40, cu=cu, v_first=v_first)
    o, s, ref_o, ref_s = run_both(cp, kern, c, dtype=dtype, cu=cu, l2norm=True, v_first=v_first, precision="float64")
    assert o.dtype == np.float64 and s.dtype == np.float64
    assert rel(o, ref_o) < F64_TOL and rel(s, ref_s) < F64_TOL


def test_float64_gpu_oracle_large_heads(cp, kern):
    c = case(8, B=2, T=3, H=1, HV=2, K=256, V=128)
    o, s, ref_o, ref_s = run_both(cp, kern, c, dtype=np.float64, l2norm=True, precision="float64")
    assert rel(o, ref_o) < F64_TOL and rel(s, ref_s) < F64_TOL


def test_strided_inputs(cp, kern):
    """q/k/v as slices of one fused projection (not contiguous, misaligned for vectors)."""
    rng = np.random.default_rng(9)
    B, T, H, HV, K, V = 2, 4, 2, 4, 32, 16
    fused = rng.standard_normal((B, T, 1 + 2 * H * K + HV * V)).astype(np.float32)
    q = fused[..., 1 : 1 + H * K].reshape(B, T, H, K)
    k = fused[..., 1 + H * K : 1 + 2 * H * K].reshape(B, T, H, K)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    fused[..., 1 + H * K : 1 + 2 * H * K] = k.reshape(B, T, H * K)
    v = fused[..., 1 + 2 * H * K :].reshape(B, T, HV, V)
    g = np.log(rng.uniform(0.5, 1.0, (B, T, HV))).astype(np.float32)
    beta = rng.uniform(0, 1, (B, T, HV)).astype(np.float32)
    fg = cp.asarray(fused)
    qg = fg[..., 1 : 1 + H * K].reshape(B, T, H, K)
    kg = fg[..., 1 + H * K : 1 + 2 * H * K].reshape(B, T, H, K)
    vg = fg[..., 1 + 2 * H * K :].reshape(B, T, HV, V)
    assert not qg.flags.c_contiguous and qg.data.ptr == fg.data.ptr + 4  # views, not copies
    for v_first in (False, True):
        poison(cp)
        o, s = kern.recurrent_gated_delta_rule(
            qg, kg, vg, cp.asarray(g), cp.asarray(beta), output_final_state=True, state_v_first=v_first
        )
        ref_o, ref_s = recurrent_gated_delta_rule(q, k, v, g, beta, output_final_state=True, state_v_first=v_first)
        assert rel(cp.asnumpy(o), ref_o) < FP32_TOL and rel(cp.asnumpy(s), ref_s) < FP32_TOL


@pytest.mark.parametrize("use_l2norm", [False, True])
def test_raw_gate_decode(cp, kern, dec, use_l2norm):
    rng = np.random.default_rng(10)
    B, H, HV, K, V = 3, 2, 4, 64, 32
    q = rng.standard_normal((B, 1, H, K)).astype(np.float32)
    k = rng.standard_normal((B, 1, H, K)).astype(np.float32)
    if not use_l2norm:
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((B, 1, HV, V)).astype(np.float32)
    state = rng.standard_normal((B, HV, V, K)).astype(np.float32)
    A_log = rng.uniform(-2, 1, HV).astype(np.float32)
    dt_bias = rng.uniform(-1, 1, HV).astype(np.float32)
    a = rng.standard_normal((B, 1, HV)).astype(np.float32)
    b = rng.standard_normal((B, 1, HV)).astype(np.float32)
    a[0, 0, 0], a[1, 0, 1] = 30.0, -40.0  # softplus identity branch and its tiny tail
    b[0, 0, 1], b[2, 0, 2] = 60.0, -60.0  # saturated sigmoid both ways
    gpu_state = cp.asarray(state)
    ptr = gpu_state.data.ptr
    poison(cp)
    o, new_state = dec.fused_decode_raw_gates(
        cp.asarray(q),
        cp.asarray(k),
        cp.asarray(v),
        gpu_state,
        cp.asarray(A_log),
        cp.asarray(a),
        cp.asarray(dt_bias),
        cp.asarray(b),
        scale=0.0,
        use_qk_l2norm=use_l2norm,
    )
    assert new_state is gpu_state and new_state.data.ptr == ptr  # in place
    ref_o, ref_s = decode_gated_delta_rule(q, k, v, state, A_log, a, dt_bias, b, use_qk_l2norm=use_l2norm)
    assert rel(cp.asnumpy(o), ref_o) < FP32_TOL
    assert rel(cp.asnumpy(new_state), ref_s) < FP32_TOL


def test_raw_gate_decode_fp64_gate_tensors(cp, kern, dec):
    """Gate tensors in another dtype than q (float64 a/b, float16 dt_bias) are read as they are."""
    rng = np.random.default_rng(11)
    B, H, HV, K, V = 2, 1, 2, 16, 16
    q, k = rng.standard_normal((2, B, 1, H, K)).astype(np.float32)
    v = rng.standard_normal((B, 1, HV, V)).astype(np.float32)
    state = rng.standard_normal((B, HV, V, K)).astype(np.float32)
    A_log, dt_bias = rng.uniform(-1, 1, HV).astype(np.float32), rng.uniform(-1, 1, HV).astype(np.float16)
    a, b = rng.standard_normal((2, B, 1, HV))
    gpu_state = cp.asarray(state)
    o, _ = dec.fused_decode_raw_gates(
        cp.asarray(q),
        cp.asarray(k),
        cp.asarray(v),
        gpu_state,
        cp.asarray(A_log),
        cp.asarray(a),
        cp.asarray(dt_bias),
        cp.asarray(b),
    )
    ref_o, ref_s = decode_gated_delta_rule(q, k, v, state, A_log, a, dt_bias, b)
    assert rel(cp.asnumpy(o), ref_o) < FP32_TOL and rel(cp.asnumpy(gpu_state), ref_s) < FP32_TOL
    g, beta = gates_from_raw(A_log, a, dt_bias, b)
    assert np.all(g <= 0) and np.all((beta > 0) & (beta < 1))


@pytest.mark.parametrize("v_first", [False, True])
@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64])
def test_pool_contract(cp, kern, dec, idx_dtype, v_first):
    rng = np.random.default_rng(12)
    slots, B, H, HV, K, V = 7, 5, 1, 2, 32, 32
    c = case(12, B=B, T=1, H=H, HV=HV, K=K, V=V, with_state=False)
    pool = rng.standard_normal((slots, HV) + ((V, K) if v_first else (K, V))).astype(np.float32)
    idx = np.array([5, -1, 0, 3, -7], idx_dtype)  # any negative index is padding (past the pool: an error)
    gpu_pool = cp.asarray(pool)
    inputs = {n: cp.asarray(np.float32(c[n])) for n in ("q", "k", "v", "g", "beta")}
    poison(cp)
    o = cp.asnumpy(
        dec.pooled_decode(
            **inputs,
            state_pool=gpu_pool,
            slot_indices=cp.asarray(idx),
            use_qk_l2norm_in_kernel=True,
            state_v_first=v_first,
        )
    )
    new_pool = cp.asnumpy(gpu_pool)
    for slot in (1, 2, 4, 6):
        np.testing.assert_array_equal(new_pool[slot], pool[slot])  # untouched, bitwise
    assert np.all(o[1] == 0) and np.all(o[4] == 0)  # padding rows are zero
    for row in (0, 2, 3):
        slot = idx[row]
        ref_o, ref_s = recurrent_gated_delta_rule(
            *(np.float32(c[n][row : row + 1]) for n in ("q", "k", "v", "g", "beta")),
            initial_state=pool[slot : slot + 1],
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            state_v_first=v_first,
        )
        assert rel(o[row : row + 1], ref_o) < FP32_TOL
        assert rel(new_pool[slot : slot + 1], ref_s) < FP32_TOL


@pytest.mark.parametrize("v_first", [False, True])
def test_spec_decode_contract(cp, kern, dec, v_first):
    rng = np.random.default_rng(13)
    slots, H, HV, K, V = 16, 1, 2, 16, 24  # S = 3 slots per request
    lengths = [1, 3, 2, 3]
    accepted = np.array([1, 3, 2, 1], np.int32)
    idx = np.array([[2, 9, -1], [4, 5, 6], [10, 11, 12], [-1, 13, 14]], np.int32)
    # request 0: reads 2, writes 2; request 1: reads 6, writes 4, 5, 6; request 2: reads 11, writes 10, 11;
    # request 3: starting slot -1 -> padding, nothing written (its 13/14 must stay untouched)
    cu = np.concatenate([[0], np.cumsum(lengths)])
    T = int(cu[-1])
    c = case(13, T=T, H=H, HV=HV, K=K, V=V, cu=cu, with_state=False)
    pool = rng.standard_normal((slots, HV) + ((V, K) if v_first else (K, V))).astype(np.float32)
    gpu_pool = cp.asarray(pool)
    inputs = {n: cp.asarray(np.float32(c[n])) for n in ("q", "k", "v", "g", "beta")}
    poison(cp)
    o = cp.asnumpy(
        dec.spec_decode(
            **inputs,
            state_pool=gpu_pool,
            cu_seqlens=cp.asarray(cu.astype(np.int32)),
            ssm_state_indices=cp.asarray(idx),
            num_accepted_tokens=cp.asarray(accepted),
            use_qk_l2norm_in_kernel=True,
            state_v_first=v_first,
        )
    )
    new_pool = cp.asnumpy(gpu_pool)
    written = set()
    for n in range(len(lengths)):
        start = idx[n, accepted[n] - 1]
        tokens = slice(cu[n], cu[n + 1])
        if start < 0:
            assert np.all(o[0, tokens] == 0)
            continue
        init = pool[start : start + 1]
        for t in range(lengths[n]):
            part = slice(cu[n], cu[n] + t + 1)
            ref_o, ref_s = recurrent_gated_delta_rule(
                *(np.float32(c[x][:, part]) for x in ("q", "k", "v", "g", "beta")),
                initial_state=init,
                output_final_state=True,
                use_qk_l2norm_in_kernel=True,
                state_v_first=v_first,
            )
            if idx[n, t] >= 0:
                assert rel(new_pool[idx[n, t]][None], ref_s) < FP32_TOL
                written.add(int(idx[n, t]))
        assert rel(o[:, tokens], ref_o) < FP32_TOL
    assert written == {2, 4, 5, 6, 10, 11}
    for slot in sorted(set(range(slots)) - written):
        np.testing.assert_array_equal(new_pool[slot], pool[slot])


def test_the_cupy_implementation_passes_every_spec_property(cp, tmp_path):
    """A rejected ``num_accepted_tokens`` is seen on the call that made it, not the next property's.

    H100, 2026-11-23: ``check --impl cupy`` failed ``spec_accepted_bounds`` (the kernel's deferred
    error was raised one call late) and reported it as an error of ``spec_draftless_step``.
    """
    from gdn_verify.api import check
    from gdn_verify.properties import NAMES

    props = [name for name in NAMES if name.startswith("spec_")]
    result = check("cupy", dtype="float32", properties=props, max_examples=15, seed=3, cases_dir=tmp_path)
    assert [r.name for r in result.results] == props
    status = {r.name: r.status for r in result.results}
    # spec_poisoned_output is unsupported by design: cupy's speculative form takes no output= buffer
    assert set(status.values()) <= {"passed", "unsupported"}, result.as_dict()
    assert status["spec_accepted_bounds"] == status["spec_draftless_step"] == "passed", status


def test_bfloat16_torch(cp, kern, torch):
    c = case(14, B=2, T=9, H=2, HV=4, K=128, V=64)
    dev = "cuda"
    t = {n: torch.tensor(c[n], dtype=torch.float32, device=dev) for n in ("g", "beta")}
    for n in ("q", "k", "v"):
        t[n] = torch.tensor(c[n], device=dev).to(torch.bfloat16)
    s0 = torch.tensor(c["initial_state"], dtype=torch.float32, device=dev)
    poison_torch(torch)
    o, s = kern.recurrent_gated_delta_rule(**t, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    torch.cuda.synchronize()
    assert isinstance(o, torch.Tensor) and o.dtype == torch.bfloat16 and s.dtype == torch.float32
    ref_in = {n: t[n].double().cpu().numpy() for n in t}
    ref_o, ref_s = recurrent_gated_delta_rule(
        **ref_in,
        initial_state=c["initial_state"].astype(np.float32),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    assert rel(o.double().cpu().numpy(), ref_o) < BF16_TOL
    assert rel(s.double().cpu().numpy(), ref_s) < FP32_TOL


def test_torch_inputs_share_memory(cp, kern, dec, torch):
    rng = np.random.default_rng(15)
    B, H, HV, K, V = 2, 1, 2, 32, 32
    q = torch.tensor(rng.standard_normal((B, 1, H, K)), dtype=torch.bfloat16, device="cuda")
    k = torch.tensor(rng.standard_normal((B, 1, H, K)), dtype=torch.bfloat16, device="cuda")
    v = torch.tensor(rng.standard_normal((B, 1, HV, V)), dtype=torch.bfloat16, device="cuda")
    state = torch.tensor(rng.standard_normal((B, HV, V, K)), dtype=torch.float32, device="cuda")
    before = state.clone()
    A_log = torch.zeros(HV, device="cuda")
    dt_bias = torch.zeros(HV, dtype=torch.bfloat16, device="cuda")
    a = torch.zeros((B, 1, HV), dtype=torch.bfloat16, device="cuda")
    b = torch.zeros((B, 1, HV), dtype=torch.bfloat16, device="cuda")
    ptr = state.data_ptr()
    o, out_state = dec.fused_decode_raw_gates(q, k, v, state, A_log, a, dt_bias, b)
    torch.cuda.synchronize()
    assert out_state is state and state.data_ptr() == ptr  # updated in place, no copy
    assert not torch.equal(state, before)
    assert isinstance(o, torch.Tensor) and o.dtype == torch.bfloat16 and o.shape == (B, 1, HV, V)
    ref_o, ref_s = decode_gated_delta_rule(
        q.double().cpu().numpy(),
        k.double().cpu().numpy(),
        v.double().cpu().numpy(),
        before.cpu().numpy(),
        A_log.cpu().numpy(),
        a.double().cpu().numpy(),
        dt_bias.double().cpu().numpy(),
        b.double().cpu().numpy(),
    )
    assert rel(o.double().cpu().numpy(), ref_o) < BF16_TOL
    assert rel(state.cpu().numpy(), ref_s) < FP32_TOL


def test_validation_names_the_argument(cp, kern):
    inputs = case(16, B=2, T=3, K=8, V=8, with_state=False)
    c = {n: cp.asarray(np.float32(x)) for n, x in inputs.items() if x is not None}
    with pytest.raises(ValueError, match="^v:"):
        kern.recurrent_gated_delta_rule(c["q"], c["k"], c["v"][:, :2], c["g"], c["beta"])
    with pytest.raises(ValueError, match="^beta:"):
        kern.recurrent_gated_delta_rule(c["q"], c["k"], c["v"], c["g"], c["beta"][:, :, None])
    with pytest.raises(ValueError, match="^k:"):
        kern.recurrent_gated_delta_rule(c["q"], c["k"].astype(cp.float16), c["v"], c["g"], c["beta"])
    with pytest.raises(ValueError, match="^cu_seqlens:"):
        kern.recurrent_gated_delta_rule(**c, cu_seqlens=cp.asarray([0, 3], np.int64))
    with pytest.raises(ValueError, match="^initial_state:"):
        kern.recurrent_gated_delta_rule(**c, initial_state=cp.zeros((2, 1, 8, 8), cp.float64))
    with pytest.raises(ValueError, match="^precision:"):
        kern.recurrent_gated_delta_rule(**c, precision="float16")
    big = cp.zeros((1, 1, 1, 257), cp.float32)
    with pytest.raises(ValueError, match="^v:"):
        kern.recurrent_gated_delta_rule(big, big, big, cp.zeros((1, 1, 1), cp.float32), cp.zeros((1, 1, 1), cp.float32))


@pytest.mark.parametrize("chunk_form", [False, True])
def test_empty_token_axis(cp, torch, chunk_form):
    """T = 0 (torch gives empty tensors arbitrary strides): no output rows, final state = initial."""
    from cupy_kernels import chunk, recurrent

    fn = chunk.chunk_gated_delta_rule if chunk_form else recurrent.recurrent_gated_delta_rule
    B, H, HV, K, V = 2, 1, 2, 8, 4
    q = torch.empty((B, 0, H, K), device="cuda", dtype=torch.bfloat16)
    v = torch.empty((B, 0, HV, V), device="cuda", dtype=torch.bfloat16)
    g = torch.empty((B, 0, HV), device="cuda", dtype=torch.bfloat16)
    state = torch.randn((B, HV, K, V), device="cuda", dtype=torch.float32)
    o, final = fn(q, q, v, g, g, initial_state=state, output_final_state=True)
    assert tuple(o.shape) == (B, 0, HV, V)
    assert torch.equal(final, state)


# --------------------------------------------------------------------------- decode variants, DecodeStep

# every decode variant the product ships (cupy_kernels imports no CuPy at import)
VARIANTS = list(__import__("cupy_kernels.recurrent_kernel", fromlist=["VARIANTS"]).VARIANTS)


def use_default_variant(monkeypatch, variant):
    """Make ``variant`` the default decode tiling (and drop cached plans made with another one)."""
    from cupy_kernels import recurrent_kernel

    monkeypatch.setattr(recurrent_kernel, "DEFAULT_VARIANT", variant)
    recurrent_kernel._PLANS.clear()
    monkeypatch.setattr(recurrent_kernel, "_PLANS", {})


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("v_first", [False, True])
@pytest.mark.parametrize("K,V", [(128, 128), (60, 100), (256, 64)])
def test_decode_variants(cp, kern, monkeypatch, variant, v_first, K, V):
    """Every decode variant (tiling / cache hints / register cap) computes the same step."""
    use_default_variant(monkeypatch, variant)
    c = case(50 + K + V, B=3, T=1, H=1, HV=2, K=K, V=V, v_first=v_first)
    o, s, ref_o, ref_s = run_both(cp, kern, c, l2norm=True, v_first=v_first)
    assert rel(o, ref_o) < FP32_TOL and rel(s, ref_s) < FP32_TOL


def test_decode_variant_unknown(cp, kern, dec):
    c = {n: cp.asarray(np.float32(x)) for n, x in case(51, T=1, K=8, V=8, with_state=False).items() if x is not None}
    with pytest.raises(ValueError, match="^decode_variant:"):
        dec.DecodeStep(**c, state=cp.zeros((1, 1, 8, 8), cp.float32), decode_variant="bogus")


@pytest.mark.parametrize("variant", VARIANTS)
def test_pool_contract_variants(cp, kern, dec, monkeypatch, variant):
    use_default_variant(monkeypatch, variant)
    test_pool_contract(cp, kern, dec, np.int32, False)


def _step_inputs(cp, seed, B, H, HV, K, V, v_first=False, slots=None):
    c = case(seed, B=B, T=1, H=H, HV=HV, K=K, V=V, v_first=v_first, with_state=False)
    inputs = {n: cp.asarray(np.float32(c[n])) for n in ("q", "k", "v", "g", "beta")}
    rng = np.random.default_rng(seed + 1)
    rows = B if slots is None else slots
    state = rng.standard_normal((rows, HV) + ((V, K) if v_first else (K, V))).astype(np.float32)
    return c, inputs, state


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("v_first", [False, True])
def test_decode_step_matches_oracle(cp, kern, dec, variant, v_first):
    """DecodeStep: prepared once, called with fresh tensors of the same signature, state in place."""
    B, H, HV, K, V = 2, 1, 2, 128, 128
    c0, inputs0, state0 = _step_inputs(cp, 60, B, H, HV, K, V, v_first)
    step = dec.DecodeStep(
        **inputs0, state=cp.asarray(state0), use_qk_l2norm_in_kernel=True, state_v_first=v_first, decode_variant=variant
    )
    for seed in (61, 62):  # new tensors each call: only the pointers change
        c, inputs, state = _step_inputs(cp, seed, B, H, HV, K, V, v_first)
        gpu_state = cp.asarray(state)
        o = step(**inputs, state=gpu_state)
        ref_o, ref_s = recurrent_gated_delta_rule(
            *(np.float32(c[n]) for n in ("q", "k", "v", "g", "beta")),
            initial_state=state,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            state_v_first=v_first,
        )
        assert rel(cp.asnumpy(o), ref_o) < FP32_TOL
        assert rel(cp.asnumpy(gpu_state), ref_s) < FP32_TOL


def test_decode_step_outputs(cp, kern, dec):
    """reuse_output returns one buffer every call; out= is written and returned; checked() agrees."""
    B, H, HV, K, V = 2, 2, 4, 32, 16
    c, inputs, state = _step_inputs(cp, 70, B, H, HV, K, V)
    ref_o, ref_s = recurrent_gated_delta_rule(
        *(np.float32(c[n]) for n in ("q", "k", "v", "g", "beta")),
        initial_state=state,
        output_final_state=True,
    )
    step = dec.DecodeStep(**inputs, state=cp.asarray(state), reuse_output=True, stream=0)
    s1, s2 = cp.asarray(state), cp.asarray(state)
    o1 = step(**inputs, state=s1)
    o1_host = cp.asnumpy(o1)
    o2 = step(**inputs, state=s2)
    assert o1 is o2  # the documented reuse
    assert rel(o1_host, ref_o) < FP32_TOL and rel(cp.asnumpy(s1), ref_s) < FP32_TOL
    out = cp.empty((B, 1, HV, V), cp.float32)
    s3 = cp.asarray(state)
    assert step(**inputs, state=s3, out=out) is out
    assert rel(cp.asnumpy(out), ref_o) < FP32_TOL and rel(cp.asnumpy(s3), ref_s) < FP32_TOL
    s4 = cp.asarray(state)
    o4 = step.checked(**inputs, state=s4)
    assert rel(cp.asnumpy(o4), ref_o) < FP32_TOL and rel(cp.asnumpy(s4), ref_s) < FP32_TOL


def test_decode_step_pool(cp, kern, dec):
    """DecodeStep over a state pool: padding rows zero, untouched slots bitwise unchanged."""
    slots, B, H, HV, K, V = 6, 4, 1, 2, 32, 32
    c, inputs, pool = _step_inputs(cp, 80, B, H, HV, K, V, slots=slots)
    idx = cp.asarray(np.array([4, -1, 0, 2], np.int32))
    gpu_pool = cp.asarray(pool)
    step = dec.DecodeStep(**inputs, state=gpu_pool, slot_indices=idx, use_qk_l2norm_in_kernel=True)
    o = cp.asnumpy(step(**inputs, state=gpu_pool, slot_indices=idx))
    new_pool = cp.asnumpy(gpu_pool)
    assert np.all(o[1] == 0)
    for slot in (1, 3, 5):
        np.testing.assert_array_equal(new_pool[slot], pool[slot])
    for row, slot in ((0, 4), (2, 0), (3, 2)):
        ref_o, ref_s = recurrent_gated_delta_rule(
            *(np.float32(c[n][row : row + 1]) for n in ("q", "k", "v", "g", "beta")),
            initial_state=pool[slot : slot + 1],
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        assert rel(o[row : row + 1], ref_o) < FP32_TOL and rel(new_pool[slot : slot + 1], ref_s) < FP32_TOL


def test_decode_step_rejects(cp, kern, dec):
    c, inputs, state = _step_inputs(cp, 90, 1, 1, 1, 16, 16)
    with pytest.raises(ValueError, match="^q:"):
        bad = dict(inputs, q=cp.asarray(np.concatenate([np.float32(c["q"])] * 2, axis=1)))
        dec.DecodeStep(**bad, state=cp.asarray(state))
    step = dec.DecodeStep(**inputs, state=cp.asarray(state))
    raw = cp.zeros(16 * 16 + 1, cp.float32)
    misaligned = raw[1:].reshape(1, 1, 16, 16)  # 4-byte aligned only: no 16-byte state vectors
    with pytest.raises(ValueError, match="aligned"):
        step(**inputs, state=misaligned)
