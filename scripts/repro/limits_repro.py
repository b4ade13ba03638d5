"""Direct reproductions, outside gdn-verify's properties, of what the scale tier and the guarded
runs found in vLLM's and FlashInfer's GDN kernels (H100, 2026-11-26).

Each case calls the library's own function on plain torch tensors, in a child process of its own
(an illegal address kills the CUDA context), and judges it against a second path of the same
library: the same kernel on a small call where every offset and grid dimension is small, or a
sibling kernel. gdn-verify's only part is ``implementations.vllm.load_ops``, which imports vLLM's
kernel files under a private package name with stand-ins for vLLM's utility modules (set
``GDN_VERIFY_VLLM_OPS``); FlashInfer is imported as installed.

    PYTHONPATH=.:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages GDN_VERIFY_VLLM_OPS=... \
        python3 scripts/repro/limits_repro.py [CASE ...]
"""

from __future__ import annotations

import subprocess
import sys

import torch

H16, K = 16, 128


def randn(*shape, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=gen, device="cuda", dtype=dtype)


def gdn_inputs(B: int, T: int, H: int, HV: int, seed: int = 0) -> dict:
    q, k = randn(B, T, H, K, seed=seed), randn(B, T, H, K, seed=seed + 1)
    return dict(
        q=q,
        k=torch.nn.functional.normalize(k.float(), dim=-1).to(k.dtype),
        v=randn(B, T, HV, K, seed=seed + 2),
        g=-0.05 * torch.rand((B, T, HV), device="cuda"),
        beta=torch.rand((B, T, HV), device="cuda").to(torch.bfloat16),
    )


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def vllm():
    from gdn_verify.implementations.vllm import load_ops

    return load_ops()


# ---- vLLM 0.33's FLA fork ----------------------------------------------------------------------
def vllm_chunk_dense(B: int) -> str:
    """Dense batch, B * HV value-head blocks: the last rows against the same kernel on them alone."""
    ops, HV = vllm(), 16
    kw = gdn_inputs(B, 64, 4, HV)
    o, _ = ops.chunk_gated_delta_rule(**kw, output_final_state=True)
    torch.cuda.synchronize()
    alone, _ = ops.chunk_gated_delta_rule(**{n: x[-2:] for n, x in kw.items()}, output_final_state=True)
    return f"ok, last 2 rows vs the same rows alone: relative difference {rel(o[-2:], alone):.2e}"


def vllm_chunk_varlen(N: int) -> str:
    """N sequences of 64 tokens packed with cu_seqlens, HV = 16: the last against itself alone."""
    ops, HV, T = vllm(), 16, 64
    kw = {n: x.reshape(1, N * T, *x.shape[2:]) for n, x in gdn_inputs(N, T, 4, HV).items()}
    cu = torch.arange(N + 1, device="cuda", dtype=torch.long) * T
    o, _ = ops.chunk_gated_delta_rule(**kw, output_final_state=True, cu_seqlens=cu)
    torch.cuda.synchronize()
    last = {n: x[:, -T:] for n, x in kw.items()}
    alone, _ = ops.chunk_gated_delta_rule(**last, output_final_state=True)
    return f"ok, last sequence vs itself alone: relative difference {rel(o[:, -T:], alone):.2e}"


def vllm_chunk_long(chunks: int) -> str:
    """One sequence of chunks x 64 tokens, one head: its second half against the half alone
    (from the first half's final state)."""
    ops = vllm()
    kw = gdn_inputs(1, chunks * 64, 1, 1)
    o, _ = ops.chunk_gated_delta_rule(**kw, output_final_state=True)
    torch.cuda.synchronize()
    half = chunks // 2 * 64
    _, mid = ops.chunk_gated_delta_rule(**{n: x[:, :half] for n, x in kw.items()}, output_final_state=True)
    o2, _ = ops.chunk_gated_delta_rule(**{n: x[:, half:] for n, x in kw.items()}, initial_state=mid)
    return f"ok, second half vs the halves run apart: relative difference {rel(o[:, half:], o2):.2e}"


def vllm_chunk_offset(B: int) -> str:
    """B samples of T = 16400 tokens x 16 heads x K = 128: sample B-1 starts past 2^31 elements
    once B = 64 (63 x 16400 x 16 x 128 = 2.12e9). The last sample against itself alone."""
    ops, T = vllm(), 16400
    kw = gdn_inputs(B, T, H16, H16)
    print(f"  last sample starts at element {(B - 1) * T * H16 * K:,} of q (2^31 = {2**31:,})", flush=True)
    o, _ = ops.chunk_gated_delta_rule(**kw, output_final_state=True)
    torch.cuda.synchronize()
    alone, _ = ops.chunk_gated_delta_rule(**{n: x[-1:] for n, x in kw.items()}, output_final_state=True)
    return f"ok, last sample vs itself alone: relative difference {rel(o[-1:], alone):.2e}"


def vllm_recurrent_decode(N: int) -> str:
    """One decode step for N requests x HV = 16 heads through fused_recurrent_gated_delta_rule as
    vLLM's decode calls it (a state pool [N + 1, HV, V, K] with slot 0 null, ssm_state_indices
    [N, 1]): the last requests against the same kernel on them alone."""
    ops, HV = vllm(), 16
    kw = gdn_inputs(N, 1, 4, HV)
    pool = randn(N + 1, HV, K, K, dtype=torch.float32)
    before = pool.clone()
    slots = torch.arange(1, N + 1, device="cuda", dtype=torch.int32)[:, None]
    o, _ = ops.fused_recurrent_gated_delta_rule(
        **kw, initial_state=pool, inplace_final_state=True, ssm_state_indices=slots
    )
    torch.cuda.synchronize()
    small = torch.cat([before[:1], before[-2:]])
    two = torch.arange(1, 3, device="cuda", dtype=torch.int32)[:, None]
    alone, _ = ops.fused_recurrent_gated_delta_rule(
        **{n: x[-2:] for n, x in kw.items()}, initial_state=small, inplace_final_state=True, ssm_state_indices=two
    )
    return f"ok, last 2 requests vs them alone: relative difference {rel(o[-2:], alone):.2e}"


# ---- FlashInfer 0.7.2.post1 ----------------------------------------------------------------------
def flashinfer_decode_saturated(a_value: float) -> str:
    """One decode step with the raw gate a = a_value (decay exp(-softplus(a)) = 0 for large a),
    zero initial state, through the float32-state and the bfloat16-state pretranspose kernels."""
    import flashinfer.gdn_decode as d

    B, H, HV = 1, 2, 4
    q, k, v = randn(B, 1, H, K), randn(B, 1, H, K, seed=1), randn(B, 1, HV, K, seed=2)
    a = torch.full((B, 1, HV), a_value, device="cuda", dtype=torch.bfloat16)
    b = torch.zeros((B, 1, HV), device="cuda", dtype=torch.bfloat16)
    zeros = torch.zeros(HV, device="cuda", dtype=torch.float32)
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        state = torch.zeros((B, HV, K, K), device="cuda", dtype=dtype)
        o, state = d.gated_delta_rule_decode_pretranspose(
            q=q, k=k, v=v, state=state, A_log=zeros, a=a, dt_bias=zeros, b=b, use_qk_l2norm=True
        )
        torch.cuda.synchronize()
        out.append((o, state))
    (o32, s32), (o16, s16) = out
    finite = [bool(torch.isfinite(x).all()) for x in (o32, s32, o16, s16)]
    return (
        f"float32 state: o finite {finite[0]}, state finite {finite[1]}; bfloat16 state: o finite {finite[2]}, "
        f"state finite {finite[3]}; o difference {rel(o16.nan_to_num(1e30), o32):.2e}"
    )


def flashinfer_prefill_states(N: int) -> str:
    """N sequences of one token x HV = 16 heads with initial states ([N, 16, 128, 128] float32:
    past 2^31 elements once N > 8192): the last sequences against the same kernel on them alone."""
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    HV, H = 16, 4
    kw = {n: x[0] for n, x in gdn_inputs(1, N, H, HV).items()}  # packed tokens [N, heads, ...]
    kw["g"] = torch.exp(kw["g"])  # FlashInfer's g is the linear decay alpha
    kw["beta"] = kw["beta"].float()
    h0 = randn(N, HV, K, K, dtype=torch.float32)
    print(f"  last state starts at element {(N - 1) * HV * K * K:,} (2^31 = {2**31:,})", flush=True)
    cu = torch.arange(N + 1, device="cuda", dtype=torch.long)
    o, ht = chunk_gated_delta_rule(**kw, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    torch.cuda.synchronize()
    last = {n: x[-2:] for n, x in kw.items()}
    two = torch.arange(3, device="cuda", dtype=torch.long)
    o2, ht2 = chunk_gated_delta_rule(**last, initial_state=h0[-2:].clone(), output_final_state=True, cu_seqlens=two)
    return f"ok, last 2 sequences vs them alone: o {rel(o[-2:], o2):.2e}, final state {rel(ht[-2:], ht2):.2e}"


def flashinfer_prefill_empty(_: int) -> str:
    """A call with no tokens (cu_seqlens [0, 0]) and an initial state: the final state must be the
    initial state. The allocator is first left holding NaN blocks of the state's size."""
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    HV, H = 4, 2
    h0 = randn(1, HV, K, K, dtype=torch.float32)
    poison = [torch.full_like(h0, float("nan")) for _ in range(3)]
    del poison
    empty = dict(
        q=torch.empty((0, H, K), device="cuda", dtype=torch.bfloat16),
        k=torch.empty((0, H, K), device="cuda", dtype=torch.bfloat16),
        v=torch.empty((0, HV, K), device="cuda", dtype=torch.bfloat16),
        g=torch.empty((0, HV), device="cuda", dtype=torch.float32),
        beta=torch.empty((0, HV), device="cuda", dtype=torch.float32),
    )
    cu = torch.zeros(2, device="cuda", dtype=torch.long)
    o, ht = chunk_gated_delta_rule(**empty, initial_state=h0.clone(), output_final_state=True, cu_seqlens=cu)
    torch.cuda.synchronize()
    return (
        f"final state finite: {bool(torch.isfinite(ht).all())}, equals the initial state: {bool(torch.equal(ht, h0))}, "
        f"max |ht - h0| {float((ht - h0).abs().nan_to_num(float('inf')).max()):.3g}"
    )


def flashinfer_decode_kmajor(N: int) -> str:
    """One decode step for N requests x HV = 16 heads through ``gated_delta_rule_decode`` (the
    k-major state [N, 16, 128, 128] float32: past the 65535 grid limit once N * 16 > 65535, its last
    state past 2^31 elements once N > 8192): the last requests against the same kernel on them alone."""
    import flashinfer.gdn_decode as d

    H, HV = 4, 16
    q, k = randn(N, 1, H, K), randn(N, 1, H, K, seed=1)
    v = randn(N, 1, HV, K, seed=2)
    a, b = randn(N, 1, HV, seed=3), randn(N, 1, HV, seed=4)
    zeros = torch.zeros(HV, device="cuda", dtype=torch.float32)
    state = randn(N, HV, K, K, dtype=torch.float32, seed=5)
    last = state[-2:].clone()
    print(f"  last state starts at element {(N - 1) * HV * K * K:,} (2^31 = {2**31:,})", flush=True)
    kw = dict(A_log=zeros, dt_bias=zeros, use_qk_l2norm=True, backend="flashinfer")
    o, state = d.gated_delta_rule_decode(q=q, k=k, v=v, state=state, a=a, b=b, **kw)
    torch.cuda.synchronize()
    o2, last = d.gated_delta_rule_decode(q=q[-2:], k=k[-2:], v=v[-2:], state=last, a=a[-2:], b=b[-2:], **kw)
    return f"ok, last 2 requests vs them alone: o {rel(o[-2:], o2):.2e}, state {rel(state[-2:], last):.2e}"


def flashinfer_decode_one_head(B: int) -> str:
    """One decode step with a single head (H = HV = 1), B requests, plain contiguous tensors, through
    the pretranspose (v-major state) and the k-major kernels: the tier's many_chunks case (one head)
    got CuTe DSL's "Can't deduce the leading dimension" through our adapter (F3e)."""
    import flashinfer.gdn_decode as d

    q, k, v = randn(B, 1, 1, K), randn(B, 1, 1, K, seed=1), randn(B, 1, 1, K, seed=2)
    a, b = randn(B, 1, 1, seed=3), randn(B, 1, 1, seed=4)
    zeros = torch.zeros(1, device="cuda", dtype=torch.float32)
    kw = dict(A_log=zeros, dt_bias=zeros, use_qk_l2norm=True, backend="flashinfer")
    out = []
    for name, fn in (("pretranspose", d.gated_delta_rule_decode_pretranspose), ("k-major", d.gated_delta_rule_decode)):
        try:
            o, _ = fn(q=q, k=k, v=v, state=randn(B, 1, K, K, dtype=torch.float32, seed=5), a=a, b=b, **kw)
            torch.cuda.synchronize()
            out.append(f"{name}: ok, o finite {bool(o.isfinite().all())}")
        except Exception as exc:  # noqa: BLE001 - the kernel's exception is what this script reports
            out.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return "; ".join(out)


CASES = {
    "vllm-chunk-dense": (vllm_chunk_dense, (65535 // 16, 65535 // 16 + 1)),
    "vllm-chunk-varlen": (vllm_chunk_varlen, (65535 // 16, 65535 // 16 + 1)),
    "vllm-chunk-long": (vllm_chunk_long, (65534, 65537)),
    "vllm-chunk-offset": (vllm_chunk_offset, (2, 64)),
    "vllm-recurrent-decode": (vllm_recurrent_decode, (65535 // 16, 65535 // 16 + 1)),
    "flashinfer-decode-saturated": (flashinfer_decode_saturated, (20, 80, 100, 1000, 9984)),
    "flashinfer-prefill-empty": (flashinfer_prefill_empty, (0,)),
    "flashinfer-prefill-states": (flashinfer_prefill_states, (8190, 8194)),
    "flashinfer-decode-kmajor": (flashinfer_decode_kmajor, (4095, 4097, 8190, 8194)),
    "flashinfer-decode-one-head": (flashinfer_decode_one_head, (1, 4)),
}


def child(name: str, arg: int) -> None:
    fn, _ = CASES[name]
    try:
        print(f"{name}({arg}): {fn(arg)}", flush=True)
    except Exception as exc:  # noqa: BLE001 - the kernel's exception is what this script reports
        print(f"{name}({arg}): {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
        sys.exit(0)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    for name in sys.argv[1:] or list(CASES):
        for arg in CASES[name][1]:
            run = subprocess.run(
                [sys.executable, __file__, "--child", name, str(arg)], capture_output=True, text=True, timeout=600
            )
            # the child's own lines (stdout); the end of its stderr (library logs, a traceback) only
            # when it printed no result line (it died)
            lines = [x for x in run.stdout.splitlines() if x.strip()]
            if not any(x.startswith(f"{name}({arg})") for x in lines):
                lines += [x for x in run.stderr.splitlines() if x.strip()][-3:]
            print("\n".join(lines) if lines else f"{name}({arg}): child exited {run.returncode}", flush=True)
