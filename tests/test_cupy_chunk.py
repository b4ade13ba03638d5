"""GPU tests of the CuPy chunked kernel (``cupy_kernels/chunk.py``) against the float64 oracle.

Skipped, with the reason, where CuPy or a CUDA device is missing. Every test runs with the
launcher's debug poisoning on: outputs and scratch start as NaN, so an element no kernel writes
(or scratch read before it is written) fails the finiteness checks. Cases stay small so the file
also runs under ``compute-sanitizer --tool memcheck``.

Bounds: the kernel is FP32 throughout (no TF32), so with fp32 inputs its only error is fp32
rounding of O(K + C) term sums carried through a few dozen chunk steps, about 1e-7 relative RMS;
``FP32_TOL = 1e-5`` leaves two orders of margin while still catching any algebra or masking
slip (those show up at 1e-3 or worse). With bf16 inputs the oracle sees the same rounded inputs,
so the output error is the bf16 rounding of o (about 1.7e-3 RMS) plus the fp32 part; FLA's
chunked kernel sits at 3.4e-3 and the bound is ``BF16_TOL = 4e-3``.

The fused path (the default for bf16 inputs where it applies, see ``chunk_plan.fused_warps``) uses k and q
as exact bf16 MMA operands and splits only fp32 operands (S, X, v_new, T', P'), so its products carry
the same 2^-16 relative error as the split tensor-core path: output within ``BF16_TOL`` (bf16
rounding dominates), final state within ``TC_FP32_TOL``.

The tensor-core path (default for bf16 / fp16 inputs, forced with ``use_tensor_cores=True``)
splits every fp32 operand into two bf16 parts and takes three MMAs per product, about 2^-16
relative error per product: with fp32 inputs it lands near 1e-5 relative RMS, bounded here by
``TC_FP32_TOL = 1e-4`` (an algebra, fragment-layout or masking slip shows up at 1e-2 or worse).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gdn_verify.core.reference import chunk_gated_delta_rule as oracle_chunk
from gdn_verify.core.reference import recurrent_gated_delta_rule as oracle_recurrent

pytestmark = pytest.mark.gpu

FP32_TOL = 1e-5
FP16_TOL = 1e-3  # fp16 output rounding is about 3e-4 RMS
BF16_TOL = 4e-3
TC_FP32_TOL = 1e-4


@pytest.fixture
def chunk(cp, monkeypatch):
    from cupy_kernels import chunk as module

    monkeypatch.setattr(module, "_debug_poison", True)
    return module


def rel_rms(x, ref) -> float:
    ref = np.asarray(ref, np.float64)
    return float(np.linalg.norm(np.asarray(x, np.float64) - ref) / max(np.linalg.norm(ref), 1e-300))


def make_case(
    seed,
    B=1,
    T=64,
    H=1,
    HV=2,
    K=16,
    V=16,
    cu_seqlens=None,
    with_state=False,
    state_v_first=False,
    gate=None,
    dtype=np.float32,
):
    """Inputs in ``dtype`` (NumPy, host): unit-norm keys, g = log U(0.5, 1), beta = U(0, 1)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, H, K))
    k = rng.standard_normal((B, T, H, K))
    k /= np.maximum(np.linalg.norm(k, axis=-1, keepdims=True), 1e-12)
    v = rng.standard_normal((B, T, HV, V))
    g = np.log(rng.uniform(0.5, 1.0, (B, T, HV))) if gate is None else gate(rng, (B, T, HV))
    beta = rng.uniform(0.0, 1.0, (B, T, HV))
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    state = None
    if with_state:
        state = rng.standard_normal((N, HV, V, K) if state_v_first else (N, HV, K, V)).astype(np.float32)
    arrays = {name: x.astype(dtype) for name, x in dict(q=q, k=k, v=v, g=g, beta=beta).items()}
    return dict(**arrays, initial_state=state, cu_seqlens=cu_seqlens, state_v_first=state_v_first)


def run_gpu(chunk, cp, case, chunk_size=64, l2norm=False, tc=None):
    """Our kernel on CuPy copies of a host case; returns host ``(o, final_state)``."""
    dev = {n: cp.asarray(case[n]) for n in ("q", "k", "v", "g", "beta")}
    state = None if case["initial_state"] is None else cp.asarray(case["initial_state"])
    o, s = chunk.chunk_gated_delta_rule(
        **dev,
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=l2norm,
        state_v_first=case["state_v_first"],
        cu_seqlens=case["cu_seqlens"],
        chunk_size=chunk_size,
        use_tensor_cores=tc,
    )
    o, s = cp.asnumpy(o), cp.asnumpy(s)
    assert np.isfinite(o).all(), "o has NaN/Inf: an element was not written or the kernel overflowed"
    assert np.isfinite(s).all(), "final state has NaN/Inf"
    return o, s


def run_oracle(case, l2norm=False, oracle=oracle_chunk):
    return oracle(
        case["q"],
        case["k"],
        case["v"],
        case["g"],
        case["beta"],
        initial_state=case["initial_state"],
        output_final_state=True,
        use_qk_l2norm_in_kernel=l2norm,
        state_v_first=case["state_v_first"],
        cu_seqlens=case["cu_seqlens"],
    )


def check(chunk, cp, case, chunk_size=64, l2norm=False, tol=FP32_TOL, tc=None, state_tol=None):
    o, s = run_gpu(chunk, cp, case, chunk_size, l2norm, tc)
    o_ref, s_ref = run_oracle(case, l2norm)
    assert o.shape == o_ref.shape and s.shape == s_ref.shape
    assert rel_rms(o, o_ref) < tol, f"o rel RMS {rel_rms(o, o_ref):.2e}"
    state_tol = tol if state_tol is None else state_tol
    assert rel_rms(s, s_ref) < state_tol, f"state rel RMS {rel_rms(s, s_ref):.2e}"
    return o, s


RAGGED = [0, 1, 64, 128, 193, 193, 200]  # lengths 1, 63, 64, 65, 0, 7

CASES = {
    "ragged_c64": dict(T=200, cu_seqlens=RAGGED, with_state=True),
    "ragged_c32": dict(T=200, cu_seqlens=RAGGED, with_state=True, chunk_size=32),
    "ragged_c16": dict(T=200, cu_seqlens=RAGGED, with_state=True, chunk_size=16),
    "batched": dict(B=3, T=70, H=2, HV=4, chunk_size=32),
    "gva1": dict(T=100, H=2, HV=2),
    "gva4": dict(T=100, H=2, HV=8, l2norm=True),
    "k1_v3": dict(T=90, K=1, V=3),
    "k3_v100": dict(T=90, K=3, V=100, with_state=True, chunk_size=16),
    "k60_v128": dict(T=90, K=60, V=128, l2norm=True),
    "k100_v60": dict(T=90, K=100, V=60, with_state=True, state_v_first=True),
    "k128_v1": dict(T=90, K=128, V=1, cu_seqlens=[0, 30, 90]),
    "k128_v128": dict(T=130, K=128, V=128, with_state=True, l2norm=True),
    "state_v_first": dict(T=150, cu_seqlens=[0, 0, 65, 150], with_state=True, state_v_first=True, chunk_size=32),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_oracle(chunk, cp, name):
    spec = dict(CASES[name])
    chunk_size, l2norm = spec.pop("chunk_size", 64), spec.pop("l2norm", False)
    check(chunk, cp, make_case(sum(map(ord, name)), **spec), chunk_size, l2norm)


@pytest.mark.parametrize("name", sorted(CASES))
def test_tensor_cores_match_oracle(chunk, cp, name):
    spec = dict(CASES[name])
    chunk_size, l2norm = spec.pop("chunk_size", 64), spec.pop("l2norm", False)
    check(chunk, cp, make_case(sum(map(ord, name)), **spec), chunk_size, l2norm, tol=TC_FP32_TOL, tc=True)


@pytest.mark.parametrize("chunk_size", [16, 32, 64])
def test_tensor_cores_fp16_inputs(chunk, cp, chunk_size):
    """fp16 inputs take the tensor-core path by default; fp16 values are exact in bf16 hi + lo."""
    case = make_case(
        12, T=150, H=2, HV=4, K=64, V=48, cu_seqlens=[0, 1, 63, 64, 65, 150], with_state=True, dtype=np.float16
    )
    o, s = check(chunk, cp, case, chunk_size, l2norm=True, tol=FP16_TOL, state_tol=TC_FP32_TOL)
    assert o.dtype == np.float16
    o_tc, s_tc = run_gpu(chunk, cp, case, chunk_size, True, tc=True)
    assert np.array_equal(o_tc, o) and np.array_equal(s_tc, s), "fp16 inputs did not default to tensor cores"
    o_ref, _ = run_oracle(case, l2norm=True)
    rounding = rel_rms(o_ref.astype(np.float16), o_ref)  # the error of a perfect kernel
    assert rel_rms(o, o_ref) < 1.5 * rounding, f"o rel RMS {rel_rms(o, o_ref):.2e} vs rounding {rounding:.2e}"


def test_fp32_inputs_default_to_fp32_path(chunk, cp):
    case = make_case(13, T=70, K=16, V=16, with_state=True)
    o, s = run_gpu(chunk, cp, case)
    o32, s32 = run_gpu(chunk, cp, case, tc=False)
    assert np.array_equal(o, o32) and np.array_equal(s, s32)


def test_matches_recurrent_oracle(chunk, cp):
    case = make_case(1, T=300, H=2, HV=4, K=32, V=48, cu_seqlens=[0, 100, 101, 300], with_state=True)
    o, s = run_gpu(chunk, cp, case, 64, True)
    o_ref, s_ref = run_oracle(case, True, oracle_recurrent)
    assert rel_rms(o, o_ref) < FP32_TOL and rel_rms(s, s_ref) < FP32_TOL


@pytest.mark.parametrize("tc", [False, True])
@pytest.mark.parametrize("chunk_size", [16, 64])
def test_many_sequences(chunk, cp, chunk_size, tc):
    rng = np.random.default_rng(7)
    lengths = rng.integers(0, 140, 40)
    lengths[:6] = [0, 1, 63, 64, 65, 0]
    cu = np.concatenate([[0], np.cumsum(lengths)])
    check(
        chunk,
        cp,
        make_case(8, T=int(cu[-1]), H=1, HV=2, K=24, V=20, cu_seqlens=cu, with_state=True),
        chunk_size,
        l2norm=True,
        tol=TC_FP32_TOL if tc else FP32_TOL,
        tc=tc,
    )


def test_empty_sequences_keep_initial_state(chunk, cp):
    case = make_case(3, T=70, cu_seqlens=[0, 0, 70, 70], with_state=True)
    _, s = check(chunk, cp, case)
    assert np.array_equal(s[[0, 2]], case["initial_state"][[0, 2]])


def test_no_tokens_at_all(chunk, cp):
    case = make_case(4, T=0, cu_seqlens=[0, 0, 0], with_state=True)
    o, s = run_gpu(chunk, cp, case)
    assert o.shape == (1, 0, 2, 16)
    assert np.array_equal(s, case["initial_state"])


def test_l2norm_all_zero_rows(chunk, cp):
    case = make_case(5, T=100, HV=2, K=32, V=32, cu_seqlens=[0, 40, 100])
    case["q"][0, 3:9] = 0.0
    case["k"][0, 5:12] = 0.0
    case["k"][0, 60:64] = 0.0
    check(chunk, cp, case, 64, l2norm=True)


def spikes(rng, shape):
    g = np.log(rng.uniform(0.5, 1.0, shape))
    g.flat[rng.choice(g.size, g.size // 6, replace=False)] = -1e4
    return g


def runs(rng, shape):
    g = np.log(rng.uniform(0.5, 1.0, shape))
    g[:, 10:40] = -30.0  # a run of strong decay inside the first chunk
    g[:, 70:75] = -30.0
    return g


@pytest.mark.parametrize("tc", [False, True])
@pytest.mark.parametrize("gate", ["zero", "spikes", "runs"])
@pytest.mark.parametrize("chunk_size", [32, 64])
def test_saturated_gates(chunk, cp, gate, chunk_size, tc):
    gates = {"zero": lambda rng, shape: np.zeros(shape), "spikes": spikes, "runs": runs}
    case = make_case(6, T=160, H=1, HV=2, K=32, V=32, cu_seqlens=[0, 17, 160], with_state=True, gate=gates[gate])
    check(chunk, cp, case, chunk_size, l2norm=True, tol=TC_FP32_TOL if tc else FP32_TOL, tc=tc)


@pytest.mark.parametrize("tc", [False, True])
def test_no_cross_sequence_leak(chunk, cp, tc):
    cu = [0, 50, 64, 129, 200]
    case = make_case(9, T=200, H=1, HV=2, K=32, V=32, cu_seqlens=cu, with_state=True)
    o, s = run_gpu(chunk, cp, case, tc=tc)
    bumped = {**case, **{n: case[n].copy() for n in ("q", "k", "v", "g", "beta")}}
    lo, hi = cu[2], cu[3]  # perturb every input of the third sequence
    for name in ("q", "k", "v"):
        bumped[name][0, lo:hi] *= -1.5
    bumped["g"][0, lo:hi] = -1e4
    bumped["beta"][0, lo:hi] = 1.0
    bumped["initial_state"] = case["initial_state"].copy()
    bumped["initial_state"][2] += 1.0
    o2, s2 = run_gpu(chunk, cp, bumped, tc=tc)
    others = np.r_[0:lo, hi:200]
    assert np.array_equal(o2[0, others], o[0, others]), "another sequence's output changed"
    assert np.array_equal(s2[[0, 1, 3]], s[[0, 1, 3]]), "another sequence's final state changed"
    assert not np.array_equal(o2[0, lo:hi], o[0, lo:hi])


def test_fp16_inputs(chunk, cp):
    case = make_case(10, T=150, H=2, HV=4, K=64, V=64, cu_seqlens=[0, 70, 150], dtype=np.float16)
    o, _ = check(chunk, cp, case, 64, l2norm=True, tol=FP16_TOL)
    assert o.dtype == np.float16


@pytest.mark.parametrize("tc", [None, False])
def test_bf16_torch(chunk, tc):
    case = make_case(11, T=512, H=2, HV=4, K=128, V=128, cu_seqlens=[0, 100, 512], with_state=True)
    torch, dev, host = torch_bf16(case)  # g stays fp32, as models feed it
    state = torch.from_numpy(case["initial_state"]).cuda()
    cu = torch.tensor(case["cu_seqlens"], dtype=torch.int64, device="cuda")
    o, s = chunk.chunk_gated_delta_rule(
        **dev,
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=cu,
        use_tensor_cores=tc,
    )
    assert isinstance(o, torch.Tensor) and o.dtype == torch.bfloat16 and o.shape == (1, 512, 4, 128)
    assert s.dtype == torch.float32
    o_ref, s_ref = run_oracle(host, l2norm=True)  # the oracle sees the rounded inputs
    o, s = o.float().cpu().numpy(), s.cpu().numpy()
    assert np.isfinite(o).all() and np.isfinite(s).all()
    assert rel_rms(o, o_ref) < BF16_TOL, f"o rel RMS {rel_rms(o, o_ref):.2e}"
    state_tol = FP32_TOL if tc is False else TC_FP32_TOL  # fp32 all the way, or split-bf16 tensor cores
    assert rel_rms(s, s_ref) < state_tol, f"state rel RMS {rel_rms(s, s_ref):.2e}"


def torch_bf16(case, device="cuda"):
    """torch copies of a host case: q, k, v, beta in bf16, g in fp32 (as models feed it), and the
    host case the oracle must see (the bf16-rounded values)."""
    torch = pytest.importorskip("torch", reason="bf16 goes through torch, which is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    dev = {
        n: torch.from_numpy(np.ascontiguousarray(case[n], np.float32)).to(device) for n in ("q", "k", "v", "g", "beta")
    }
    for n in ("q", "k", "v", "beta"):
        dev[n] = dev[n].to(torch.bfloat16)
    host = {**case, **{n: dev[n].float().cpu().numpy() for n in dev}}
    return torch, dev, host


def bf16_case(name, spec):
    """torch bf16 inputs of a named case, the host copy the oracle sees, l2norm, and the launcher's
    keyword arguments (initial state, cu_seqlens, state layout, final state written)."""
    spec = dict(spec)
    l2norm = spec.pop("l2norm", False)
    case = make_case(sum(map(ord, name)), **spec)
    torch, dev, host = torch_bf16(case)
    state = None if case["initial_state"] is None else torch.from_numpy(case["initial_state"]).cuda()
    cu = None if case["cu_seqlens"] is None else torch.tensor(case["cu_seqlens"], dtype=torch.int64, device="cuda")
    kw = dict(
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=l2norm,
        state_v_first=case["state_v_first"],
        cu_seqlens=cu,
    )
    return dev, host, l2norm, kw


def assert_fused_matches_oracle(result, host, l2norm):
    """The fused path's ``(o, final_state)`` (torch) against the float64 oracle on the inputs it saw:
    every element written and finite, output within BF16_TOL, state within TC_FP32_TOL. Returns both
    as NumPy arrays."""
    o, s = result[0].float().cpu().numpy(), result[1].cpu().numpy()
    assert np.isfinite(o).all() and np.isfinite(s).all(), "an element was not written (NaN poison) or overflowed"
    o_ref, s_ref = run_oracle(host, l2norm)
    assert rel_rms(o, o_ref) < BF16_TOL, f"o rel RMS {rel_rms(o, o_ref):.2e}"
    assert rel_rms(s, s_ref) < TC_FP32_TOL, f"state rel RMS {rel_rms(s, s_ref):.2e}"
    return o, s


FUSED_CASES = {
    "ragged_k128": dict(T=200, H=2, HV=4, K=128, V=128, cu_seqlens=RAGGED, with_state=True, l2norm=True),
    "ragged_v16": dict(T=200, H=1, HV=2, K=64, V=16, cu_seqlens=RAGGED, with_state=True),
    "v48_gva4": dict(T=130, H=1, HV=4, K=32, V=48, with_state=True, state_v_first=True, l2norm=True),
    "k16_v64_batched": dict(B=3, T=70, H=2, HV=2, K=16, V=64),
    "k64_v96": dict(T=300, H=2, HV=2, K=64, V=96, cu_seqlens=[0, 65, 300], with_state=True),
    "k96_v64_vfirst": dict(T=200, H=1, HV=2, K=96, V=64, cu_seqlens=RAGGED, with_state=True, state_v_first=True),
}
# k_split = 2 (two warps share a slab's state rows) needs K % 32 == 0 and V % 32 == 0
SPLIT_CASES = [name for name, c in sorted(FUSED_CASES.items()) if c["K"] % 32 == 0 and c["V"] % 32 == 0]


@pytest.mark.parametrize("name, k_split", [(n, 1) for n in sorted(FUSED_CASES)] + [(n, 2) for n in SPLIT_CASES])
def test_fused_bf16_matches_oracle(chunk, name, k_split):
    dev, host, l2norm, kw = bf16_case(name, FUSED_CASES[name])
    _, s = assert_fused_matches_oracle(
        chunk.chunk_gated_delta_rule(**dev, fused=True, k_split=k_split, **kw), host, l2norm
    )
    # the three-kernel tensor-core path on the same inputs agrees with it to its own accuracy
    _, s3 = chunk.chunk_gated_delta_rule(**dev, fused=False, **kw)
    assert rel_rms(s, s3.cpu().numpy()) < 2 * TC_FP32_TOL


# The sm_90a wgmma state kernel (K 64 or 128, V a multiple of 64): the fused cases it takes, and
# two of its own (a K = 64 tile with the v-first state layout; three 64-column tiles with GVA).
WGMMA_CASES = {
    **{name: c for name, c in FUSED_CASES.items() if c["K"] in (64, 128) and c["V"] % 64 == 0},
    "k64_v64_vfirst": dict(T=200, H=1, HV=2, K=64, V=64, cu_seqlens=RAGGED, with_state=True, state_v_first=True),
    "k128_v192_gva2": dict(T=150, H=1, HV=2, K=128, V=192, cu_seqlens=[0, 3, 150], l2norm=True),
}


def needs_sm90(chunk, cp):
    if chunk.ts.compute_capability(cp.cuda.runtime.getDevice()) != (9, 0):
        pytest.skip("the wgmma state kernel needs an sm_90 device (H100, H200)")


WGMMA_PROBE = Path(__file__).resolve().parent / "cuda" / "wgmma_probe.cu"


def test_wgmma_layouts_match_numpy(chunk, cp):
    """gdn_wgmma_probe (tests/cuda/wgmma_probe.cu): the two wgmma B layouts the state kernel uses
    (K-major for K^T, T'^T, P'^T; MN-major for K) from one core-matrix tile, with the kernel's
    descriptor offsets."""
    needs_sm90(chunk, cp)
    from cupy_kernels import sources

    probe = sources.sm90a_module(WGMMA_PROBE).get_function("gdn_wgmma_probe")
    rng = np.random.default_rng(3)
    a = rng.integers(-8, 8, (64, 16)).astype(np.float32)  # small integers: every product exact in fp32
    tile = rng.integers(-8, 8, (64, 128)).astype(np.float32)

    def bf16(x):
        return cp.asarray((x.view(np.uint32) >> 16).astype(np.uint16))  # exact: small integers

    d1, d2 = cp.full((64, 64), np.nan, cp.float32), cp.full((64, 128), np.nan, cp.float32)
    # 128-byte swizzle: 1 KiB between 8-row groups; MN-major steps 8 KiB between 64-column blocks
    probe((1,), (128,), (bf16(a), bf16(tile), d1, d2, np.int32(16), np.int32(1024), np.int32(8192), np.int32(1024)))
    np.testing.assert_array_equal(d1.get(), a @ tile[:, 80:96].T, err_msg="K-major B (Y_k, v_new, o)")
    np.testing.assert_array_equal(d2.get(), a @ tile[16:32, :], err_msg="MN-major B (the state update)")


@pytest.mark.parametrize("name", sorted(WGMMA_CASES))
def test_wgmma_state_matches_oracle(chunk, cp, name):
    needs_sm90(chunk, cp)
    dev, host, l2norm, kw = bf16_case(name, WGMMA_CASES[name])
    o, s = assert_fused_matches_oracle(chunk.chunk_gated_delta_rule(**dev, wgmma=True, **kw), host, l2norm)
    # the mma.sync state kernel computes the same products from the same split operands
    o2, s2 = chunk.chunk_gated_delta_rule(**dev, wgmma=False, **kw)
    assert rel_rms(s, s2.cpu().numpy()) < 2 * TC_FP32_TOL
    assert rel_rms(o, o2.float().cpu().numpy()) < BF16_TOL


def test_wgmma_refused_where_it_does_not_apply(chunk, cp):
    case = make_case(4, T=70, H=1, HV=2, K=96, V=64)
    _, dev, _ = torch_bf16(case)
    with pytest.raises(ValueError, match="^wgmma:"):
        chunk.chunk_gated_delta_rule(**dev, wgmma=True)
    with pytest.raises(ValueError, match="^wgmma:"):
        chunk.chunk_gated_delta_rule(**dev, wgmma="yes")


# The context-parallel form (context_parallel.py): the fused cases on both state kernels, split
# into 3 segments per sequence (more than some sequences have chunks: empty segments) and into
# as many as ``True`` picks (segments of one chunk and up).
CP_CASES = [(n, w) for n in sorted(FUSED_CASES) for w in (False, None)] + [(n, None) for n in sorted(WGMMA_CASES)]


@pytest.mark.parametrize("name, wgmma", CP_CASES)
@pytest.mark.parametrize("segments", [3, True])
def test_context_parallel_matches_oracle_and_the_plain_call(chunk, cp, name, wgmma, segments):
    spec = {**FUSED_CASES, **WGMMA_CASES}[name]
    if wgmma is None and not (spec["K"] in (64, 128) and spec["V"] % 64 == 0):
        wgmma = False
    dev, host, l2norm, kw = bf16_case(name, spec)
    o, s = assert_fused_matches_oracle(
        chunk.chunk_gated_delta_rule(**dev, wgmma=wgmma, context_parallel=segments, **kw), host, l2norm
    )
    assert "context-parallel x " in chunk.last_kernels
    if segments == 3:
        assert chunk.last_kernels.endswith("x 3")
    o1, s1 = chunk.chunk_gated_delta_rule(**dev, wgmma=wgmma, context_parallel=False, **kw)
    assert "context-parallel" not in chunk.last_kernels
    assert rel_rms(s, s1.cpu().numpy()) < 2 * TC_FP32_TOL
    assert rel_rms(o, o1.float().cpu().numpy()) < BF16_TOL


def test_context_parallel_by_default_at_few_heads(chunk, cp):
    """One long sequence on two value heads (four state CTAs on the whole device): the default
    splits it, and stays as accurate as the plain call against the float64 oracle. 49152 tokens:
    the fitted cost model (chunk_plan, H100 2026-11-27) keeps one pass up to 32768 tokens, where
    the measured split lost; the first 8192 tokens show that side."""
    case = make_case(41, T=49152, H=1, HV=2, K=128, V=128, with_state=True)
    torch, dev, host = torch_bf16(case)
    state = torch.from_numpy(case["initial_state"]).cuda()
    head = {name: x[:, :8192] for name, x in dev.items()}
    chunk.chunk_gated_delta_rule(**head, initial_state=state, output_final_state=True)
    assert "context-parallel" not in chunk.last_kernels, chunk.last_kernels
    got = chunk.chunk_gated_delta_rule(**dev, initial_state=state, output_final_state=True)
    assert "context-parallel" in chunk.last_kernels, chunk.last_kernels
    o, s = assert_fused_matches_oracle(got, host, False)
    o_ref, s_ref = run_oracle(host)
    plain = chunk.chunk_gated_delta_rule(**dev, initial_state=state, output_final_state=True, context_parallel=False)
    o1, s1 = plain[0].float().cpu().numpy(), plain[1].cpu().numpy()
    # the scan adds a few float64 products and one fp32 rounding of each start state
    assert rel_rms(s, s_ref) < 2 * rel_rms(s1, s_ref) + 1e-6
    assert rel_rms(o, o_ref) < 1.1 * rel_rms(o1, o_ref)


def test_fused_bf16_gate_options(chunk):
    from gdn_verify.core.gating import in_kernel_gates

    case = make_case(21, T=150, H=1, HV=2, K=32, V=32, cu_seqlens=[0, 17, 64, 150], with_state=True)
    rng = np.random.default_rng(5)
    case["g"] = rng.normal(0.0, 2.0, case["g"].shape).astype(np.float32)
    case["beta"] = rng.normal(0.0, 3.0, case["beta"].shape).astype(np.float32)
    torch, dev, host = torch_bf16(case)
    a_log = np.log(rng.uniform(1.0, 16.0, 2)).astype(np.float32)
    dt_bias = rng.uniform(-1, 1, 2).astype(np.float32)
    opts = dict(use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    o, s = chunk.chunk_gated_delta_rule(
        **dev,
        initial_state=torch.from_numpy(case["initial_state"]).cuda(),
        output_final_state=True,
        cu_seqlens=torch.tensor(case["cu_seqlens"], dtype=torch.int64, device="cuda"),
        A_log=torch.from_numpy(a_log).cuda(),
        dt_bias=torch.from_numpy(dt_bias).cuda(),
        fused=True,
        **opts,
    )
    g, beta = in_kernel_gates(host["g"], host["beta"], A_log=a_log, dt_bias=dt_bias, **opts)
    o_ref, s_ref = run_oracle({**host, "g": g, "beta": beta})
    assert rel_rms(o.float().cpu().numpy(), o_ref) < BF16_TOL
    assert rel_rms(s.cpu().numpy(), s_ref) < TC_FP32_TOL


def test_k_split_needs_whole_halves(chunk):
    """k_split=2 gives each warp K / 2 state rows in 16-row blocks: K = 48 cannot be split."""
    case = make_case(23, T=70, H=1, HV=2, K=48, V=64)
    torch, dev, host = torch_bf16(case)
    with pytest.raises(ValueError, match="^k_split:"):
        chunk.chunk_gated_delta_rule(**dev, k_split=2)


@pytest.mark.parametrize("K, V", [(100, 64), (256, 64), (64, 100)])
def test_fused_refused_where_it_does_not_apply(chunk, K, V):
    """Head sizes the fused path cannot take go to the three-kernel path by default (and stay
    correct); fused=True says why it cannot."""
    case = make_case(22, T=70, H=1, HV=2, K=K, V=V, with_state=True)
    torch, dev, host = torch_bf16(case)
    state = torch.from_numpy(case["initial_state"]).cuda()
    with pytest.raises(ValueError, match="^fused:"):
        chunk.chunk_gated_delta_rule(**dev, initial_state=state, fused=True)
    o, s = chunk.chunk_gated_delta_rule(**dev, initial_state=state, output_final_state=True)
    o_ref, s_ref = run_oracle(host)
    assert rel_rms(o.float().cpu().numpy(), o_ref) < BF16_TOL
    assert rel_rms(s.cpu().numpy(), s_ref) < TC_FP32_TOL


@pytest.mark.parametrize(
    "change, name",
    [
        (dict(chunk_size=48), "chunk_size"),
        (dict(q=np.zeros((1, 8, 1), np.float32)), "q"),
        (dict(k=np.zeros((1, 8, 1, 4), np.float32)), "k"),
        (dict(v=np.zeros((1, 7, 2, 4), np.float32)), "v"),
        (dict(v=np.zeros((1, 8, 2, 4), np.float16)), "v"),
        (dict(g=np.zeros((1, 8, 3), np.float32)), "g"),
        (dict(beta=np.zeros((1, 8, 2), np.float64)), "beta"),
        (dict(initial_state=np.zeros((1, 2, 4, 5), np.float32)), "initial_state"),
        (dict(cu_seqlens=[0, 3, 9]), "cu_seqlens"),
        (dict(scale=float("inf")), "scale"),
        (dict(use_tensor_cores="yes"), "use_tensor_cores"),
        (dict(fused=1), "fused"),
        (dict(fused=True), "fused"),  # fp32 inputs: the fused path is bf16 only
        (dict(k_split=3), "k_split"),
        (dict(k_split=1), "k_split"),  # fp32 inputs: no fused path to split
        (dict(context_parallel=1), "context_parallel"),
        (dict(context_parallel="yes"), "context_parallel"),
        (dict(context_parallel=True), "context_parallel"),  # fp32 inputs: no fused path
        (dict(context_parallel=4), "context_parallel"),
    ],
)
def test_bad_arguments(chunk, cp, change, name):
    args = dict(
        q=np.zeros((1, 8, 1, 16), np.float32),
        k=np.zeros((1, 8, 1, 16), np.float32),
        v=np.zeros((1, 8, 2, 4), np.float32),
        g=np.zeros((1, 8, 2), np.float32),
        beta=np.zeros((1, 8, 2), np.float32),
    )
    args.update(change)
    args = {n: cp.asarray(x) if isinstance(x, np.ndarray) else x for n, x in args.items()}
    with pytest.raises(ValueError, match=f"^{name}:"):
        chunk.chunk_gated_delta_rule(**args)


def test_chunk_tables_cached_by_content_on_any_stream(chunk, cp):
    """The launcher keeps the chunk tables of each cu_seqlens content on the device: calls that
    alternate two offsets of one T, on two streams, each match the oracle (a table reused for the
    wrong offsets, or read before its upload finished, would not)."""
    cases = [make_case(31, T=150, H=1, HV=2, cu_seqlens=cu, with_state=True) for cu in ([0, 17, 64, 150], [0, 80, 150])]
    refs = [run_oracle(case) for case in cases]
    for stream in (cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)):
        with stream:
            for case, (o_ref, s_ref) in zip(cases * 2, refs * 2):
                o, s = run_gpu(chunk, cp, case)
                assert rel_rms(o, o_ref) < FP32_TOL, f"o rel RMS {rel_rms(o, o_ref):.2e}"
                assert rel_rms(s, s_ref) < FP32_TOL, f"state rel RMS {rel_rms(s, s_ref):.2e}"
