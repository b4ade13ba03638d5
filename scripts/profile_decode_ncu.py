"""Decode kernels under Nsight Compute (GPU only): one launch each of the decode variants named on
the command line (default wide and wide-cs) and of the bench's SM copy kernel, at B = 64 and
1024 (T = 1, H = 16, HV = 32, K = V = 128, fp32 state, bf16 q/k/v, l2norm), to profile side by side.
Run under ncu (``bash scripts/gpu-machine/gpu_session.sh ncu_decode`` does, with the sections and metrics), e.g.
    ncu --clock-control none -k regex:"recurrent_kernel|copy16" \
        --section SpeedOfLight ... python3 scripts/profile_decode_ncu.py wide wide-cs
Prints one line per launch (batch, variant) in the order ncu sees them.
"""

from __future__ import annotations

import sys


def main(variants: list[str]) -> int:
    import cupy

    from cupy_kernels.decode import DecodeStep
    from gdn_verify.bench import decode as bench

    torch = bench._optional_torch()
    copy = bench._sm_copy(cupy)
    for B in (64, 1024):
        d = bench._inputs(cupy, torch, B, 16, 32, 128, 128, 0)
        args = {n: d[n] for n in ("q", "k", "v", "g", "beta")}
        for variant in variants:
            step = DecodeStep(
                **args,
                state=d["initial_state"],
                use_qk_l2norm_in_kernel=True,
                reuse_output=True,
                decode_variant=variant,
            )
            step(**args, state=d["initial_state"])
            if torch is not None:
                torch.cuda.synchronize()
            print(f"launch: B={B} {variant}", flush=True)
        dst = bench._empty_like(torch, cupy, d["initial_state"])
        copy(bench._ptr(d["initial_state"]), bench._ptr(dst), B * 32 * 128 * 128 * 4)
        cupy.cuda.get_current_stream().synchronize()
        print(f"launch: B={B} copy16", flush=True)
        del d, args, dst
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["wide", "wide-cs"]))
