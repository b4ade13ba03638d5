"""Independent check of what `check --grad` reported for FLA 0.6 and FlashQLA 0.1.3 (H100, 2026-11-26).

Outside gdn-verify's pipeline: the inputs are built here, the reference is float64 torch autograd of
the token-by-token recurrence written below (FLA's convention: q, k [B, T, H, K], v [B, T, HV, V],
log-gates g and beta [B, T, HV], state [N, HV, K, V], S <- exp(g) S; S <- S + k (beta (v - S^T k))^T;
o = S^T (scale q)), and every kernel call runs in a subprocess of its own, so that an illegal
memory access ends one case, not the run. Prints one line per case and writes JSON (argv[1]).

Cases: FLA's own backward (FLA_FLASH_QLA=0) at head sizes K in 32-128 and V in 16-128 (the V < 64
bug), with an empty batch (T = 0), an empty sequence in a pack and padding tokens after
cu_seqlens[-1] (a negative length in CASES: their gradients must be zero); FLA with its FlashQLA
dispatch on (16-bit and float32 g, an empty sequence); FlashQLA called directly. For the cases in
AUTOTUNE_PRINTED the JSON keeps the autotuned configurations Triton printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CASES = [
    # name, env FLA_FLASH_QLA, entry ("fla" or "qla"), dtype, K, V, lengths, g dtype
    ("fla-bf16-K60-V32", "0", "fla", "bfloat16", 60, 32, [128], "same"),
    ("fla-bf16-K64-V32", "0", "fla", "bfloat16", 64, 32, [128], "same"),
    ("fla-bf16-K100-V100", "0", "fla", "bfloat16", 100, 100, [128], "same"),
    ("fla-bf16-K128-V128", "0", "fla", "bfloat16", 128, 128, [128], "same"),
    ("fla-bf16-K64-V64", "0", "fla", "bfloat16", 64, 64, [128], "same"),
    ("fla-bf16-K128-V32", "0", "fla", "bfloat16", 128, 32, [128], "same"),
    ("fla-bf16-K32-V128", "0", "fla", "bfloat16", 32, 128, [128], "same"),
    # which value sizes: below, between and above the failing 32
    ("fla-bf16-K64-V16", "0", "fla", "bfloat16", 64, 16, [128], "same"),
    ("fla-bf16-K64-V48", "0", "fla", "bfloat16", 64, 48, [128], "same"),
    ("fla-bf16-K64-V96", "0", "fla", "bfloat16", 64, 96, [128], "same"),
    ("fla-bf16-K64-V32-T64", "0", "fla", "bfloat16", 64, 32, [64], "same"),  # one chunk: no state passing
    ("fla-fp32-K60-V32", "0", "fla", "float32", 60, 32, [128], "same"),
    ("fla-fp32-K64-V32", "0", "fla", "float32", 64, 32, [128], "same"),
    ("fla-bf16-K60-V32-g-fp32", "0", "fla", "bfloat16", 60, 32, [128], "float32"),
    ("fla-bf16-T0", "0", "fla", "bfloat16", 128, 128, [0], "same"),
    ("fla-bf16-varlen-0-1", "0", "fla", "bfloat16", 128, 128, [0, 1, 70], "same"),
    # the checks' failing pack of 2026-11-26: an empty sequence in a pack of one token in all
    ("fla-bf16-varlen-0-1-short", "0", "fla", "bfloat16", 128, 128, [0, 1], "same"),
    ("fla-dispatch-bf16-K128", "1", "fla", "bfloat16", 128, 128, [128], "same"),
    ("fla-dispatch-bf16-K128-g-fp32", "1", "fla", "bfloat16", 128, 128, [128], "float32"),
    ("fla-dispatch-bf16-varlen-0-1", "1", "fla", "bfloat16", 128, 128, [0, 1, 70], "float32"),
    ("qla-bf16-K128-g-fp32", "1", "qla", "bfloat16", 128, 128, [128], "float32"),
    # tokens after cu_seqlens[-1] (3 here): their gradients must be zero, not left unwritten
    ("fla-bf16-varlen-tail", "0", "fla", "bfloat16", 128, 128, [1, 1, -3], "same"),
    # the same with do = 0 on the padding (zero gradients there under any reading of the padding,
    # even as a continuation of the last sequence) and torch's CUDA cache left full of NaN blocks
    # the size of each gradient before the backward: an unwritten gradient reads NaN
    ("fla-bf16-varlen-tail-do0", "0", "fla", "bfloat16", 128, 128, [1, 1, -3], "same"),
    # FlashQLA directly, the same (check --grad --impl flash-qla failed grad_padding_zero: NaN dq)
    ("qla-bf16-varlen-tail-do0", "1", "qla", "bfloat16", 128, 128, [1, 1, -3], "float32"),
]
# Cases whose kernels' autotuning choices are printed (TRITON_PRINT_AUTOTUNING=1): the V < 64 bug
# came and went between processes, so each run records which configurations its kernels picked.
AUTOTUNE_PRINTED = ("fla-bf16-K60-V32", "fla-bf16-K64-V32", "fla-bf16-K64-V64")


def reference(q, k, v, g, beta, h0, cu, scale, do):
    """float64 autograd of the token loop: (o, gradients) for the loss sum(o * do)."""
    import torch

    leaves = [x.detach().double().requires_grad_(True) for x in (q, k, v, g, beta, h0)]
    q, k, v, g, beta, h0 = leaves
    H, HV = q.shape[2], v.shape[2]
    outs = []
    for n in range(len(cu) - 1):
        S = h0[n]  # [HV, K, V]
        for t in range(cu[n], cu[n + 1]):
            qt, kt = q[0, t].repeat_interleave(HV // H, 0), k[0, t].repeat_interleave(HV // H, 0)
            S = S * torch.exp(g[0, t])[:, None, None]
            u = beta[0, t][:, None] * (v[0, t] - torch.einsum("hk,hkv->hv", kt, S))
            S = S + kt[:, :, None] * u[:, None, :]
            outs.append(torch.einsum("hk,hkv->hv", qt * scale, S))
    o = torch.stack(outs)[None] if outs else torch.zeros_like(v)
    loss = (o * do.double()).sum()
    grads = torch.autograd.grad(loss, leaves, allow_unused=True, materialize_grads=True)
    return dict(zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), grads))


def run_case(name, entry, dtype, K, V, lengths, g_dtype):
    import torch

    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    tail = -sum(n for n in lengths if n < 0)  # a negative length: that many padding tokens at the end
    lengths = [n for n in lengths if n >= 0]
    T, H, HV = sum(lengths) + tail, 1, 2
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    dev = "cuda"
    q = torch.randn(1, T, H, K, device=dev).to(dt)
    k = torch.nn.functional.normalize(torch.randn(1, T, H, K, device=dev), dim=-1).to(dt)
    v = torch.randn(1, T, HV, V, device=dev).to(dt)
    g = (-0.05 * torch.rand(1, T, HV, device=dev)).to(dt if g_dtype == "same" else torch.float32)
    beta = torch.rand(1, T, HV, device=dev).to(dt)
    h0 = torch.randn(len(lengths), HV, K, V, device=dev)
    do = torch.randn(1, T, HV, V, device=dev).to(dt)
    strict = name.endswith("-do0")
    if strict:
        do[:, cu[-1] :] = 0
    scale = K**-0.5
    if entry == "fla":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fn
    else:
        from flash_qla import chunk_gated_delta_rule as fn
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta, h0)]
    cu_t = torch.tensor(cu, device=dev, dtype=torch.long) if len(lengths) > 1 or tail else None
    o, _ = fn(*leaves[:5], scale=scale, initial_state=leaves[5], output_final_state=False, cu_seqlens=cu_t)
    if strict:  # NaN blocks of each gradient's size and dtype, freed into the cache the backward allocates from
        blocks = [torch.full_like(x, float("nan")) for x in leaves for _ in range(3)]
        del blocks
    got = torch.autograd.grad((o.float() * do.float()).sum(), leaves, allow_unused=True, materialize_grads=True)
    torch.cuda.synchronize()
    want = reference(
        q[:, : cu[-1]],
        k[:, : cu[-1]],
        v[:, : cu[-1]],
        g[:, : cu[-1]],
        beta[:, : cu[-1]],
        h0,
        cu,
        scale,
        do[:, : cu[-1]],
    )
    row = {}
    for (key, w), x in zip(want.items(), got):
        x = x.double()
        if tail and key != "dh0":  # the padding tokens' gradients: exactly zero, or how many are not
            pad = x[:, cu[-1] :]
            row[key + "_tail"] = {"nonzero": int((pad != 0).sum()), "nan": int(pad.isnan().sum()), "of": pad.numel()}
            x = x[:, : cu[-1]]
        denom = float(w.square().mean().sqrt()) or 1.0
        row[key] = {
            "rel_rms": float((x - w).square().mean().sqrt()) / denom if w.numel() else 0.0,
            "finite": bool(x.isfinite().all()),
        }
    return row


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--case":
        case = next(c for c in CASES if c[0] == sys.argv[2])
        name, _, entry, dtype, K, V, lengths, g_dtype = case
        try:
            print("RESULT " + json.dumps({"ok": True, "grads": run_case(name, entry, dtype, K, V, lengths, g_dtype)}))
        except Exception as exc:  # the kernel's own error is the finding
            print("RESULT " + json.dumps({"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}))
        return
    # argv: [JSON [CASE,CASE...]]; named cases run in the order given (the most wanted first)
    by_name = {c[0]: c for c in CASES}
    chosen = [by_name[n] for n in sys.argv[2].split(",")] if len(sys.argv) > 2 else CASES
    results = []
    for name, qla, entry, dtype, K, V, lengths, g_dtype in chosen:
        env = {**os.environ, "FLA_FLASH_QLA": qla}
        if name in AUTOTUNE_PRINTED:
            env["TRITON_PRINT_AUTOTUNING"] = "1"
        try:
            p = subprocess.run(
                [sys.executable, __file__, "--case", name], env=env, capture_output=True, text=True, timeout=600
            )
            line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
            last = (p.stderr.strip().splitlines() or [""])[-1][:300]
            out = json.loads(line[7:]) if line else {"ok": False, "error": f"exit {p.returncode}: {last}"}
            if name in AUTOTUNE_PRINTED:  # Triton's "Triton autotuning for function ... finished ..., best config ..."
                out["autotuning"] = [x for x in (p.stdout + p.stderr).splitlines() if "best config" in x.lower()]
        except subprocess.TimeoutExpired:
            out = {"ok": False, "error": "timeout after 600 s"}
        out.update(case=name, FLA_FLASH_QLA=qla, entry=entry, dtype=dtype, K=K, V=V, lengths=lengths, g_dtype=g_dtype)
        results.append(out)
        if out["ok"]:
            grads = out["grads"].items()
            cells = " ".join(
                f"{k} {v['nonzero']}/{v['of']} nonzero ({v['nan']} NaN)"
                if "nonzero" in v
                else f"{k} {v['rel_rms']:.2e}{'' if v['finite'] else ' NONFINITE'}"
                for k, v in grads
            )
        else:
            cells = "ERROR " + out["error"]
        print(f"{name:32s} {cells}", flush=True)
        if len(sys.argv) > 1:  # after every case: a run cut short keeps what it did
            with open(sys.argv[1], "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
