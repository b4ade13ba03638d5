"""Direct reproduction, outside gdn-verify, of a launch-grid limit in FLA's chunked GDN forward.

The scale tier (NVIDIA H100, 2026-11-25, FLA 0.6.0, Triton 3.6.0) saw
``chunk_gated_delta_rule`` raise ``Triton Error [CUDA]: invalid argument`` on a dense batch of
B = 8194 rows x HV = 16 value heads, while the same 8194 sequences packed with ``cu_seqlens``
passed. In fla 0.6.0 the dense path launches ``chunk_gated_delta_rule_fwd_kkt_solve_kernel`` on
``(NT, B * HV)`` (ops/gated_delta_rule/chunk_fwd.py) and ``chunk_fwd_kernel_o`` on
``(cdiv(V, BV) * NT, B * HV)`` (ops/common/chunk_o.py): gridDim.y is capped at 65535. This script
calls FLA directly at B * HV just below and just above 65535, dense and varlen, and compares the
passing dense call with FLA's own fused_recurrent (a second path) on the last rows, then runs the
backward of the dense call (its kernels put ``B * HV`` on axis 1 as well).

    PYTHONPATH=/tmp/site python3 scripts/repro/fla_grid_repro.py
"""

from __future__ import annotations

import torch
from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

H, HV, K, V, T = 4, 16, 128, 128, 64


def inputs(B: int, seed: int = 0) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)

    return dict(
        q=randn(B, T, H, K),
        k=randn(B, T, H, K),
        v=randn(B, T, HV, V),
        g=-0.02 * torch.rand((B, T, HV), generator=gen, device="cuda"),
        beta=torch.rand((B, T, HV), generator=gen, device="cuda"),
    )


def run(B: int, varlen: bool, backward: bool = False) -> str:
    kw = inputs(B)
    if backward:
        kw = {name: x.requires_grad_(True) for name, x in kw.items()}
    if varlen:
        kw = {name: x.reshape(1, B * T, *x.shape[2:]) for name, x in kw.items()}
        kw["cu_seqlens"] = torch.arange(B + 1, device="cuda", dtype=torch.long) * T
    try:
        o, _ = chunk_gated_delta_rule(**kw, use_qk_l2norm_in_kernel=True, output_final_state=True)
        torch.cuda.synchronize()
        if backward:
            o.float().square().sum().backward()
            torch.cuda.synchronize()
            bad = [n for n, x in kw.items() if x.grad is None or not torch.isfinite(x.grad).all()]
            return "backward ran" + (f"; missing or non-finite: {bad}" if bad else ", every gradient finite")
    except Exception as exc:  # noqa: BLE001 - the launch error is what this script reports
        return f"{type(exc).__name__}: {exc}"
    # the last two rows through FLA's recurrent kernel: a second path for the same outputs
    last = {name: x.detach().reshape(B, T, *x.shape[2:])[-2:] for name, x in kw.items() if name != "cu_seqlens"}
    ref, _ = fused_recurrent_gated_delta_rule(**last, use_qk_l2norm_in_kernel=True)
    got = o.reshape(B, T, HV, V)[-2:].float()
    rel = ((got - ref.float()).norm() / ref.float().norm()).item()
    return f"ok, last rows vs fused_recurrent: relative error {rel:.2e}"


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for B in (65535 // HV, 65535 // HV + 1):
        for varlen in (False, True):
            print(f"B={B} x HV={HV} = {B * HV} blocks on one axis, {'varlen' if varlen else 'dense'}: {run(B, varlen)}")
        # the backward (training) path of the dense call, whose kernels put B * HV on axis 1 too
        print(f"B={B} x HV={HV} = {B * HV}, dense, forward + backward: {run(B, False, backward=True)}", flush=True)
