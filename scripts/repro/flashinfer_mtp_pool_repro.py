"""Direct reproduction: FlashInfer's ``gated_delta_rule_mtp`` on a state pool that is a view.

Outside the properties: ``flashinfer.gdn_decode.gated_delta_rule_mtp`` on plain torch tensors,
nothing of ours. The same call (B = 2 requests of T = 3 tokens, H = 1, HV = 2, K = V = 128,
bfloat16, per-token scatter ``ssm_state_indices``) runs on a contiguous float32 pool and on views of
the same values: ``padded`` (``gap`` spare elements after each slot: ``buf.view(slots, E + gap)[:,
:E]``, slot starts ``4 (E + gap)`` bytes apart) for gaps 1, 4 and 8, and ``strided`` (every other
slot of a pool twice the size). FlashInfer documents non-contiguous pools for this kernel. Each row
says whether the call ran, and how far its output and written slots are from the contiguous call's
(0 when the view is honoured), or the exception's last line.

    PYTHONPATH=<FlashInfer site> python scripts/repro/flashinfer_mtp_pool_repro.py

Prints one line per layout and ends with one JSON line per layout.
"""

from __future__ import annotations

import json

import torch


def call(fn, pool, inputs):
    q, k, v, a, b, read, scatter = inputs
    HV = v.shape[2]
    zeros = torch.zeros(HV, dtype=torch.float32, device=q.device)
    o, _ = fn(q=q, k=k, v=v, initial_state=pool, initial_state_indices=read, A_log=zeros, a=a, dt_bias=zeros, b=b,
              ssm_state_indices=scatter, disable_state_update=False, use_qk_l2norm=True)  # fmt: skip
    return o


def main() -> None:
    import flashinfer
    from flashinfer.gdn_decode import gated_delta_rule_mtp

    torch.manual_seed(0)
    dev = "cuda"
    B, T, H, HV, K, V, slots = 2, 3, 1, 2, 128, 128, 8
    E = HV * V * K
    q, k = (torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(B, T, HV, V, device=dev, dtype=torch.bfloat16)
    a, b = (torch.randn(B, T, HV, device=dev, dtype=torch.bfloat16) for _ in range(2))
    read = torch.tensor([0, 4], dtype=torch.int32, device=dev)
    scatter = torch.tensor([[1, 2, 3], [5, 6, 7]], dtype=torch.int32, device=dev)
    inputs = (q, k, v, a, b, read, scatter)
    values = torch.randn(slots, HV, V, K, device=dev) * 0.1
    ref_pool = values.clone()
    ref_o = call(gated_delta_rule_mtp, ref_pool, inputs)
    rows = []
    layouts = [("padded", g) for g in (1, 4, 8)] + [("strided", 0)]
    for layout, gap in layouts:
        if layout == "padded":
            buf = torch.full((slots, E + gap), 7.0, device=dev)
            pool = buf[:, :E].view(slots, HV, V, K)
        else:
            buf = torch.full((2 * slots, E), 7.0, device=dev)
            pool = buf[::2].view(slots, HV, V, K)
        pool.copy_(values)
        row = dict(layout=layout, gap=gap, stride0=pool.stride(0), flashinfer=flashinfer.__version__)
        try:
            o = call(gated_delta_rule_mtp, pool, inputs)
            torch.cuda.synchronize()
            row.update(ran=True, o_diff=float((o.float() - ref_o.float()).abs().max()),
                       pool_diff=float((pool - ref_pool).abs().max()),
                       canaries_intact=bool((buf[:, E:] == 7.0).all()) if layout == "padded" else
                       bool((buf[1::2] == 7.0).all()))  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - the refusal or crash is the result
            row.update(ran=False, error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}")
        rows.append(row)
        print(row)
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
