"""One small launch of each kernel, for compute-sanitizer racecheck / synccheck (GPU only).

The recurrent kernel uses no shared memory (warp-local, shuffles only); the chunked kernels share
tiles between warps on both the FP32 and the tensor-core (cp.async pipeline) paths, at every
chunk size, so each path runs once with a ragged last chunk and an empty sequence; the fused
bf16 paths (mma.sync at V = 48, wgmma at V = 64) also run with context parallelism forced to three
segments, whose segment passes and scan share the same tiles:

    compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 9 python3 scripts/sanitize_launches.py
    compute-sanitizer --tool synccheck --error-exitcode 9 python3 scripts/sanitize_launches.py
    bash scripts/gpu-machine/gpu_session.sh racecheck
"""

from __future__ import annotations

import numpy as np


def main() -> int:
    import cupy as cp

    from cupy_kernels import chunk as chunk_module
    from cupy_kernels.chunk import chunk_gated_delta_rule
    from cupy_kernels.decode import pooled_decode
    from cupy_kernels.recurrent import recurrent_gated_delta_rule

    rng = np.random.default_rng(0)
    T, H, HV, K, V = 150, 1, 2, 64, 48

    def arr(*shape):
        return cp.asarray(rng.standard_normal(shape).astype(np.float32))

    q, k, v = arr(1, T, H, K), arr(1, T, H, K), arr(1, T, HV, V)
    g = cp.asarray(np.log(rng.uniform(0.5, 1.0, (1, T, HV))).astype(np.float32))
    beta = cp.asarray(rng.uniform(0, 1, (1, T, HV)).astype(np.float32))
    cu = [0, 70, 70, 150]
    state = arr(3, HV, K, V)
    recurrent_gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=cp.asarray(cu),
        checked=True,
    )
    pooled_decode(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1], state, cp.asarray([2]), checked=True)
    for tc in (False, True):
        for C in (16, 32, 64):
            chunk_gated_delta_rule(
                q,
                k,
                v,
                g,
                beta,
                initial_state=state,
                output_final_state=True,
                use_qk_l2norm_in_kernel=True,
                cu_seqlens=cu,
                chunk_size=C,
                use_tensor_cores=tc,
            )
    # The fused paths take bf16 inputs, which go through torch (CuPy has no bfloat16).
    import torch

    def bf16(x):
        return torch.as_tensor(x, device="cuda").to(torch.bfloat16)

    cu_t = torch.tensor(cu, dtype=torch.int64, device="cuda")
    for V_cp, wgmma in ((48, False), (64, None)):
        v_cp = arr(1, T, HV, V_cp)
        state_cp = torch.as_tensor(arr(3, HV, K, V_cp), device="cuda")
        chunk_gated_delta_rule(
            bf16(q),
            bf16(k),
            bf16(v_cp),
            torch.as_tensor(g, device="cuda"),
            bf16(beta),
            initial_state=state_cp,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            cu_seqlens=cu_t,
            wgmma=wgmma,
            context_parallel=3,
        )
        # the launch under the sanitizer must be the split one (two chunks per sequence: one run empty)
        assert chunk_module.last_kernels.endswith("context-parallel x 3"), chunk_module.last_kernels
    torch.cuda.synchronize()
    cp.cuda.runtime.deviceSynchronize()
    print("racecheck launches done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
