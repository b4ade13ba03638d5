"""Our chunked prefill kernels under Nsight Compute (GPU only): one bf16 call at 1 x 16384 (H = 16,
HV = 32, K = V = 128, final state written) with the wgmma state kernel, then one with the mma.sync
one, each twice. Launches 0-3 warm both paths up; launches 4-7 are prep, state (wgmma), prep, state
(mma.sync), so profile those:

    ncu --kernel-name regex:gdn_ --launch-skip 4 --launch-count 4 --section SpeedOfLight \\
        --section Occupancy ... python3 scripts/profile_prefill_ncu.py
    bash scripts/gpu-machine/gpu_session.sh ncu_prefill          (the same, with the sections used on 2026-11-23)

Per-kernel times measured this way: reports/2026-11-23-chunk-prefill/.
"""

from __future__ import annotations


def main() -> int:
    import torch

    from cupy_kernels.chunk import chunk_gated_delta_rule
    from gdn_verify.bench.prefill import _inputs

    x = _inputs(torch, 1, 16384, 16, 32, 128, 128, 0, torch.bfloat16)
    for wgmma in (True, False, True, False):
        chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], output_final_state=True, wgmma=wgmma)
    torch.cuda.synchronize()
    print("prefill launches done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
