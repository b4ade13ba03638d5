"""Direct probe of a 16-bit backward's ``dh0`` under strong gates, outside gdn-verify (GPU).

FlashQLA's ``chunk_gated_delta_rule`` through torch autograd at T = 1 (B=1, H=2, HV=4, K=V=128),
every gate -40, -8 or -1, inputs in float16 and bfloat16, the initial state in the input dtype and
in float32; ``dh0`` against float64 torch autograd of the token loop (``fla_grad_repro.reference``,
independent of gdn-verify).
Under gates of -40 the exact ``dh0`` is about 3e-18: float16 cannot hold ``exp(-40)`` (below
2^-25), so a backward that stores ``scale q exp(G)`` in float16 returns 0 for it, whatever the
state's dtype; bfloat16 can. Prints one line per case.

    PYTHONPATH=/tmp/fqsite python3 scripts/dh0_underflow_probe.py
"""

from __future__ import annotations

import torch
from fla_grad_repro import reference  # this folder: python puts the script's own folder on sys.path


def main() -> None:
    from flash_qla import chunk_gated_delta_rule

    torch.manual_seed(0)
    B, T, H, HV, K, V = 1, 1, 2, 4, 128, 128
    for dtype in (torch.float16, torch.bfloat16):
        for gate in (-40.0, -8.0, -1.0):
            for state_dtype in (dtype, torch.float32):
                q = torch.randn(B, T, H, K, device="cuda").to(dtype)
                k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device="cuda"), dim=-1).to(dtype)
                v = torch.randn(B, T, HV, V, device="cuda").to(dtype)
                g = torch.full((B, T, HV), gate, device="cuda")  # float32, as FlashQLA's backward asserts
                beta = torch.rand(B, T, HV, device="cuda").to(dtype)
                h0 = torch.randn(B, HV, K, V, device="cuda").to(state_dtype)
                do = torch.randn(B, T, HV, V, device="cuda").to(dtype)
                leaves = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta, h0)]
                name = f"in {dtype} g={gate} h0 {state_dtype}"
                try:
                    o, _ = chunk_gated_delta_rule(*leaves[:5], initial_state=leaves[5], output_final_state=True)
                    (o.float() * do.float()).sum().backward()
                except Exception as exc:  # report the case and go on
                    print(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                    continue
                ref = reference(q, k, v, g, beta, h0, [0, T], K**-0.5, do)["dh0"][0]
                got = leaves[5].grad[0].double()
                rel = ((got - ref).norm() / ref.norm()).item()
                print(
                    f"{name}: dh0 dtype {leaves[5].grad.dtype}, |ref| max {ref.abs().max().item():.3e}, "
                    f"|got| max {got.abs().max().item():.3e}, rel rms {rel:.3e}"
                )


if __name__ == "__main__":
    main()
