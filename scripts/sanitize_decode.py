"""The decode variants and DecodeGraph in one short process, for compute-sanitizer memcheck (GPU).

Every decode variant the product ships (``recurrent_kernel.VARIANTS``) over a pool with padding
and with a slot past the pool, varlen decode with empty sequences and with bad device cu_seqlens,
and DecodeGraph replays (plain, pool, a bad slot written into the captured slot table). Exit
status 0 when every expected ValueError was raised and nothing else failed; memcheck adds its own
error count:

    compute-sanitizer --tool memcheck --error-exitcode 9 python3 scripts/sanitize_decode.py
    bash scripts/gpu-machine/gpu_session.sh memcheck_decode
"""

from __future__ import annotations

import numpy as np


def main() -> int:
    import cupy as cp

    from cupy_kernels import recurrent_kernel
    from cupy_kernels.decode import DecodeStep, pooled_decode
    from cupy_kernels.recurrent import recurrent_gated_delta_rule

    rng = np.random.default_rng(0)
    failures = []

    def arr(*shape):
        return cp.asarray(rng.standard_normal(shape).astype(np.float32))

    def inputs(B, H, HV, K, V):
        g = cp.asarray(np.log(rng.uniform(0.5, 1.0, (B, 1, HV))).astype(np.float32))
        beta = cp.asarray(rng.uniform(0, 1, (B, 1, HV)).astype(np.float32))
        return dict(q=arr(B, 1, H, K), k=arr(B, 1, H, K), v=arr(B, 1, HV, V), g=g, beta=beta)

    def expect_error(name, fn, **kwargs):
        try:
            fn(**kwargs)
        except ValueError as exc:
            if not str(exc).startswith(name):
                failures.append(f"{name}: wrong error {exc}")
        else:
            failures.append(f"{name}: no ValueError")

    B, H, HV, K, V, slots = 64, 2, 32, 32, 32, 80
    x = inputs(B, H, HV, K, V)
    for variant in recurrent_kernel.VARIANTS:
        pool = arr(slots, HV, K, V)
        idx = np.arange(B, dtype=np.int32)[::-1].copy()
        idx[::5] = -1
        pooled_decode(**x, state_pool=pool, slot_indices=cp.asarray(idx), decode_variant=variant, checked=True)
        idx[3] = slots
        expect_error(
            "slot_indices",
            pooled_decode,
            **x,
            state_pool=pool,
            slot_indices=cp.asarray(idx),
            decode_variant=variant,
            checked=True,
        )
        recurrent_kernel._PLANS.clear()
        saved = recurrent_kernel.DEFAULT_VARIANT
        recurrent_kernel.DEFAULT_VARIANT = variant
        try:
            one = inputs(1, H, HV, 128, 128)
            s0 = arr(5, HV, 128, 128)
            recurrent_gated_delta_rule(
                **one,
                initial_state=s0,
                output_final_state=True,
                use_qk_l2norm_in_kernel=True,
                cu_seqlens=cp.asarray([0, 0, 1, 1, 1, 1]),
                checked=True,
            )
            expect_error(
                "cu_seqlens",
                recurrent_gated_delta_rule,
                **one,
                initial_state=s0,
                cu_seqlens=cp.asarray([0, 0, 5000, 1, 1, 1]),
                checked=True,
            )
        finally:
            recurrent_kernel.DEFAULT_VARIANT = saved
            recurrent_kernel._PLANS.clear()

    for variant in (None, "wide"):
        state = arr(B, HV, K, V)
        step = DecodeStep(**x, state=state, use_qk_l2norm_in_kernel=True, decode_variant=variant)
        graph = step.capture(**x, state=state)
        for _ in range(3):
            graph()
        pool = arr(slots, HV, K, V)
        idx = cp.asarray(np.arange(B, dtype=np.int64))
        pstep = DecodeStep(**x, state=pool, slot_indices=idx, decode_variant=variant)
        pgraph = pstep.capture(**x, state=pool, slot_indices=idx)
        pgraph()
        idx[7] = slots + 1
        pgraph()
        cp.cuda.runtime.deviceSynchronize()
        expect_error("slot_indices", pgraph)
    cp.cuda.runtime.deviceSynchronize()
    for f in failures:
        print("FAIL", f)
    print(f"sanitize_decode: {'FAILED' if failures else 'all expectations held'}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
