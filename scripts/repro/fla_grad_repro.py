"""Independent check of what `check --grad` reported for FLA 0.6 and FlashQLA 0.1.3 (H100, 2026-11-26).

Outside gdn-verify's pipeline: the inputs are built here, the reference is float64 torch autograd of
the token-by-token recurrence written below (FLA's convention: q, k [B, T, H, K], v [B, T, HV, V],
log-gates g and beta [B, T, HV], state [N, HV, K, V], S <- exp(g) S; S <- S + k (beta (v - S^T k))^T;
o = S^T (scale q)), and every kernel call runs in a subprocess of its own, so that an illegal
memory access ends one case, not the run. Prints one line per case and writes JSON (argv[1]).

Cases: FLA's own backward (FLA_FLASH_QLA=0) at head sizes K in 32-128 and V in 16-128 (the V < 64
bug), with an empty batch (T = 0), an empty sequence in a pack and padding tokens after
cu_seqlens[-1] (a negative length in CASES: their gradients must be zero); FLA with its FlashQLA
dispatch on (16-bit and float32 g, an empty sequence); FlashQLA called directly. A padding case
runs its backward POISON_RUNS times over freed memory of two byte values in turn (POISONS): a
padding gradient that changes between runs was never written. For the cases in
AUTOTUNE_PRINTED the JSON keeps the autotuned configurations Triton printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

# the layout of check --grad --impl flash-qla's failing grad_padding_zero example (2026-11-27 07:44)
CHECKED = {"H": 2, "HV": 4, "h0": False}
CHECKED_L2 = {**CHECKED, "l2norm": True}
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
    # even as a continuation of the last sequence); every padding case runs the POISONS test below
    ("fla-bf16-varlen-tail-do0", "0", "fla", "bfloat16", 128, 128, [1, 1, -3], "same"),
    # FlashQLA directly, the same (check --grad --impl flash-qla failed grad_padding_zero: NaN dq)
    ("qla-bf16-varlen-tail-do0", "1", "qla", "bfloat16", 128, 128, [1, 1, -3], "float32"),
    # the check's failing example itself (H100, 2026-11-27 07:44): GVA H=2 HV=4, l2norm in the kernel,
    # no initial state, 65 padding tokens after two one-token sequences (they reach a second chunk);
    # with do random on the padding as the check draws it, and with do = 0 there
    ("qla-bf16-pad65-l2", "1", "qla", "bfloat16", 128, 128, [1, 1, -65], "float32", CHECKED_L2),
    ("qla-bf16-pad65-l2-do0", "1", "qla", "bfloat16", 128, 128, [1, 1, -65], "float32", CHECKED_L2),
    ("qla-bf16-pad65-do0", "1", "qla", "bfloat16", 128, 128, [1, 1, -65], "float32", CHECKED),
    # FLA's own backward on the same example (report 1 with the two-poison test)
    ("fla-bf16-pad65-l2-do0", "0", "fla", "bfloat16", 128, 128, [1, 1, -65], "same", CHECKED_L2),
]
# The padding cases' backward runs POISON_RUNS times, each after torch's CUDA cache is left holding
# freed memory whose every byte is POISONS[0] (NaN in any float dtype), then POISONS[1] (12.06 in
# bfloat16, 12.08 in float32), in turn: a padding gradient that differs between runs was never
# written (the kernels are deterministic, grad_determinism). Where the allocator places a buffer is
# not ours to choose (on an H100, a stand-in that leaves its padding unwritten read the poison in
# some runs and reused unpoisoned blocks in others, 2026-11-27), hence several runs; a padding
# gradient that is nonzero but the same in every run was written wrong, or read stale memory.
POISONS = (0xFF, 0x41)
POISON_RUNS = 6
# Cases whose kernels' autotuning choices are printed (TRITON_PRINT_AUTOTUNING=1): the V < 64 bug
# came and went between processes, so each run records which configurations its kernels picked.
AUTOTUNE_PRINTED = ("fla-bf16-K60-V32", "fla-bf16-K64-V32", "fla-bf16-K64-V64")


def reference(q, k, v, g, beta, h0, cu, scale, do, l2norm=False):
    """float64 autograd of the token loop: (o, gradients) for the loss sum(o * do); with ``l2norm``
    q and k are normalized first (FLA's ``use_qk_l2norm_in_kernel``), inside the graph."""
    import torch

    leaves = [x.detach().double().requires_grad_(True) for x in (q, k, v, g, beta, h0)]
    q, k, v, g, beta, h0 = leaves
    if l2norm:
        q, k = (x / x.square().sum(-1, keepdim=True).sqrt() for x in (q, k))
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


def poison_cache(byte):
    """Leave torch's CUDA caching allocator holding freed blocks whose every byte is ``byte``: 256
    blocks of 1 MiB (the small pool serves requests up to 1 MiB from them) and 32 of 8 MiB."""
    import torch

    blocks = [torch.full((2**20,), byte, dtype=torch.uint8, device="cuda") for _ in range(256)]
    blocks += [torch.full((2**23,), byte, dtype=torch.uint8, device="cuda") for _ in range(32)]
    torch.cuda.synchronize()
    del blocks


def tail_stats(x, end):
    """How many of a padding gradient's entries (tokens from ``end`` on) are nonzero and NaN."""
    pad = x.double()[:, end:]
    return {"nonzero": int((pad != 0).sum()), "nan": int(pad.isnan().sum()), "of": pad.numel()}


def differing(runs, end):
    """Which padding entries (tokens from ``end`` on) differ from the first run in any other: a
    boolean mask ``[B, T - end, ...]``."""
    import torch

    first = runs[0].double()[:, end:]
    differs = torch.zeros_like(first, dtype=torch.bool)
    for other in runs[1:]:
        b = other.double()[:, end:]
        differs |= ~((first == b) | (first.isnan() & b.isnan()))
    return differs


def changed(runs, end):
    """How many padding entries (tokens from ``end`` on) differ from the first run in any other."""
    return int(differing(runs, end).sum())


def token_positions(mask, end, most=16):
    """The token indices (counted from the call's first token) of a padding mask ``[B, T - end,
    ...]`` where any entry is set, the first ``most`` of them."""
    rows = mask.reshape(mask.shape[0], mask.shape[1], -1).any(-1).any(0)
    return [end + int(t) for t in rows.nonzero().flatten()[:most]]


def run_case(name, entry, dtype, K, V, lengths, g_dtype, opts=None):
    import torch

    opts = opts or {}
    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    tail = -sum(n for n in lengths if n < 0)  # a negative length: that many padding tokens at the end
    lengths = [n for n in lengths if n >= 0]
    T, H, HV = sum(lengths) + tail, opts.get("H", 1), opts.get("HV", 2)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    dev = "cuda"
    q = torch.randn(1, T, H, K, device=dev).to(dt)
    k = torch.nn.functional.normalize(torch.randn(1, T, H, K, device=dev), dim=-1).to(dt)
    v = torch.randn(1, T, HV, V, device=dev).to(dt)
    g = (-0.05 * torch.rand(1, T, HV, device=dev)).to(dt if g_dtype == "same" else torch.float32)
    beta = torch.rand(1, T, HV, device=dev).to(dt)
    h0 = torch.randn(len(lengths), HV, K, V, device=dev) if opts.get("h0", True) else None
    do = torch.randn(1, T, HV, V, device=dev).to(dt)
    strict = name.endswith("-do0")
    if strict:
        do[:, cu[-1] :] = 0
    l2norm = bool(opts.get("l2norm", False))
    scale = K**-0.5
    if entry == "fla":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fn
    else:
        from flash_qla import chunk_gated_delta_rule as fn
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta) + ((h0,) if h0 is not None else ())]
    cu_t = torch.tensor(cu, device=dev, dtype=torch.long) if len(lengths) > 1 or tail else None

    def backward(poison=None):
        o, _ = fn(
            *leaves[:5],
            scale=scale,
            initial_state=leaves[5] if h0 is not None else None,
            output_final_state=False,
            use_qk_l2norm_in_kernel=l2norm,
            cu_seqlens=cu_t,
        )
        if poison is not None:  # freed memory of one byte value, which the backward allocates from
            poison_cache(poison)
        grads = torch.autograd.grad((o.float() * do.float()).sum(), leaves, allow_unused=True, materialize_grads=True)
        torch.cuda.synchronize()
        return grads

    runs = [backward(POISONS[i % 2]) for i in range(POISON_RUNS)] if tail else [backward()]
    got = runs[0]
    want = reference(
        *(x[:, : cu[-1]] for x in (q, k, v, g, beta)),
        h0 if h0 is not None else torch.zeros(len(lengths), HV, K, V, device=dev),
        cu,
        scale,
        do[:, : cu[-1]],
        l2norm,
    )
    if h0 is None:
        want.pop("dh0")
    row = {}
    if tail:
        row["poisons"] = [f"0x{POISONS[i % 2]:02X}" for i in range(POISON_RUNS)]
    for i, ((key, w), x) in enumerate(zip(want.items(), got)):
        x = x.double()
        if tail and key != "dh0":  # the padding tokens' gradients: exactly zero, or how many are not
            row[key + "_tail"] = tail_stats(x, cu[-1])
            row[key + "_tail_second_poison"] = tail_stats(runs[1][i], cu[-1])
            row[key + "_tail_changed"] = changed([run[i] for run in runs], cu[-1])
            # which padding tokens: those whose entries changed between runs (never written), and
            # those nonzero in the first run
            row[key + "_tail_tokens_changed"] = token_positions(differing([run[i] for run in runs], cu[-1]), cu[-1])
            row[key + "_tail_tokens_nonzero"] = token_positions(x[:, cu[-1] :] != 0, cu[-1])
            x = x[:, : cu[-1]]
        denom = float(w.square().mean().sqrt()) or 1.0
        row[key] = {
            "rel_rms": float((x - w).square().mean().sqrt()) / denom if w.numel() else 0.0,
            "finite": bool(x.isfinite().all()),
        }
    return row


def cell(key, value):
    """One gradient's entry of a case's printed line."""
    if "_tail_tokens_" in key:
        return f"{key.split('_tail_tokens_')[1]} at tokens {value}"
    if key.endswith("_changed"):
        return f"changed {value}"
    if key.endswith("_second_poison"):
        return f"then {value['nonzero']} ({value['nan']} NaN)"
    if "nonzero" in value:
        return f"{key} {value['nonzero']}/{value['of']} nonzero ({value['nan']} NaN)"
    return f"{key} {value['rel_rms']:.2e}{'' if value['finite'] else ' NONFINITE'}"


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--case":
        case = next(c for c in CASES if c[0] == sys.argv[2])
        name, _, entry, dtype, K, V, lengths, g_dtype, *opts = case
        try:
            grads = run_case(name, entry, dtype, K, V, lengths, g_dtype, *opts)
            print("RESULT " + json.dumps({"ok": True, "grads": grads}))
        except Exception as exc:  # the kernel's own error is the finding
            print("RESULT " + json.dumps({"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}))
        return
    # argv: [JSON [CASE,CASE...]]; named cases run in the order given (the most wanted first)
    by_name = {c[0]: c for c in CASES}
    chosen = [by_name[n] for n in sys.argv[2].split(",")] if len(sys.argv) > 2 else CASES
    results = []
    for name, qla, entry, dtype, K, V, lengths, g_dtype, *opts in chosen:
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
        if opts:
            out["options"] = opts[0]
        results.append(out)
        if out["ok"]:
            grads = out["grads"].items()
            cells = " ".join(cell(k, v) for k, v in grads if k != "poisons")
        else:
            cells = "ERROR " + out["error"]
        print(f"{name:32s} {cells}", flush=True)
        if len(sys.argv) > 1:  # after every case: a run cut short keeps what it did
            with open(sys.argv[1], "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
