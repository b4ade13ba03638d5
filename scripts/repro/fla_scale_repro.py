"""Direct reproductions, outside gdn-verify, of the scale tier's verdicts on FLA's chunked GDN forward.

The tier (H200, 2026-12-05) saw FLA 0.4.2 and 0.5.2's ``chunk_gated_delta_rule`` fail to launch
past the 65535 grid limit (a decode batch of 8194 requests x 16 heads, 8194 short packed
sequences, 65537 chunks of one sequence) and hit an illegal address past 2^31 elements (64 long
samples, dense and packed), where 0.6.0 passed all but the decode batch. This script calls the
installed FLA directly on plain torch tensors, H = HV = 16 (every release has that; GVA is not
needed to cross the limits), K = V = 128, bfloat16, each case in a child process of its own (an
illegal address kills the CUDA context), and judges the large call against a second path of
the same library where every grid and offset is small: the probed rows or sequences alone, or
for the long sequence its two halves chained through the state. Nothing of gdn-verify is used.

    PYTHONPATH=/tmp/site python3 scripts/repro/fla_scale_repro.py [CASE ...]
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch

H, D, CHUNK, GRID, OFFSET = 16, 128, 64, 65535, 2**31
DEVICE, DTYPE = "cuda", torch.bfloat16
if os.environ.get("FLA_SCALE_REPRO_DRY"):  # a dry run of this script on a CPU under TRITON_INTERPRET=1
    D, GRID, OFFSET, DEVICE, DTYPE = 16, 40, 2**15, "cpu", torch.float32  # the interpreter's bf16 is wrong


def randn(*shape, dtype=None, seed=0, scale=1.0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    return (scale * torch.randn(shape, generator=gen, device=DEVICE, dtype=torch.float32)).to(dtype or DTYPE)


def inputs(B: int, T: int, seed: int = 0) -> dict:
    """q, k (l2-normalised in the kernel), v, log gates in [-0.05, 0) and beta in (0, 1), bfloat16."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed + 7)
    return dict(
        q=randn(B, T, H, D, seed=seed),
        k=randn(B, T, H, D, seed=seed + 1),
        v=randn(B, T, H, D, seed=seed + 2),
        g=(-0.05 * torch.rand((B, T, H), generator=gen, device=DEVICE)),
        beta=torch.rand((B, T, H), generator=gen, device=DEVICE).to(DTYPE),
    )


def call(**kw):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    o, state = chunk_gated_delta_rule(**kw, use_qk_l2norm_in_kernel=True, output_final_state=True)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return o, state


def rel(a, b) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def size(o) -> str:
    """The output's RMS and whether it is finite: a zero or NaN output compares as equal to itself."""
    return f" (o RMS {o.float().square().mean().sqrt().item():.3g}, finite {bool(o.isfinite().all())})"


def rows(kw: dict, index: list[int]) -> dict:
    return {n: x[index] for n, x in kw.items()}


def dense_batch(B: int, T: int, initial: bool) -> str:
    """B rows of T tokens (grid axis B x H), probes: rows 0, just past the limit, the last."""
    kw = inputs(B, T)
    if initial:
        kw["initial_state"] = randn(B, H, D, D, dtype=torch.float32, seed=9, scale=0.1)
    past = GRID // H + 1 if T == 1 else -(-OFFSET // (T * H * D))
    probes = sorted({0, min(past, B - 1), B - 1})
    o, state = call(**kw)
    o2, state2 = call(**rows(kw, probes))
    each = ", ".join(
        f"row {n}: o {rel(o[n], o2[i]):.1e}, state {rel(state[n], state2[i]):.1e}" for i, n in enumerate(probes)
    )
    return f"ran; vs the rows alone: {each}{size(o)}"


def packed(lengths: list[int], initial: bool, probes: list[int]) -> str:
    """The sequences packed with cu_seqlens; each probed sequence against itself alone."""
    total = sum(lengths)
    kw = inputs(1, total)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=DEVICE, dtype=torch.long)
    if initial:
        kw["initial_state"] = randn(len(lengths), H, D, D, dtype=torch.float32, seed=9, scale=0.1)
    o, state = call(**{n: x for n, x in kw.items()}, cu_seqlens=cu)
    each = []
    for n in probes:
        a, b = cu[n].item(), cu[n + 1].item()
        alone = {name: x[:, a:b] for name, x in kw.items() if name != "initial_state"}
        if initial:
            alone["initial_state"] = kw["initial_state"][n : n + 1]
        o2, s2 = call(**alone)
        each.append(f"sequence {n}: o {rel(o[:, a:b], o2):.1e}, state {rel(state[n : n + 1], s2):.1e}")
    return f"ran; vs the sequences alone: {', '.join(each)}{size(o)}"


def decode_batch() -> str:
    n = max(GRID // H, OFFSET // (H * D * D)) + 2  # 8194: past the grid, states past 2^31 elements
    return dense_batch(n, 1, initial=True)


def varlen_many_short() -> str:
    n = max(GRID // H, OFFSET // (H * D * D)) + 2
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, CHUNK + 1, (n,), generator=gen).tolist()
    return packed(lengths, True, sorted({0, GRID // H + 1, OFFSET // (H * D * D) + 1, n - 1}))


def many_chunks() -> str:
    """One sequence of GRID + 2 chunks (one head would do; H heads keep one code path): its two
    halves, chained through the state, are the second path."""
    global H
    H = 1
    T = (GRID + 2) * CHUNK
    kw = inputs(1, T)
    o, state = call(**kw)
    half = T // 2
    o1, s1 = call(**{n: x[:, :half] for n, x in kw.items()})
    o2, s2 = call(**{n: x[:, half:] for n, x in kw.items()}, initial_state=s1)
    err_o = max(rel(o[:, :half], o1), rel(o[:, half:], o2))
    return f"ran; vs its two halves chained: o {err_o:.1e}, state {rel(state, s2):.1e}{size(o)}"


def offset_T(samples: int = 64) -> int:
    return -(-OFFSET // ((samples - 1) * H * D)) + CHUNK


def batch_offset() -> str:
    return dense_batch(64, offset_T(), initial=False)


def varlen_offset() -> str:
    T = offset_T()
    return packed([T] * 64, False, [0, -(-OFFSET // (T * H * D)), 63])


CASES = {
    "decode_batch": decode_batch,
    "varlen_many_short": varlen_many_short,
    "many_chunks": many_chunks,
    "batch_offset": batch_offset,
    "varlen_offset": varlen_offset,
}


def child(name: str) -> None:
    try:
        print(f"{name}: {CASES[name]()}", flush=True)
    except Exception as exc:  # noqa: BLE001 - the kernel's exception is what this script reports
        print(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        sys.exit(0)
    import fla

    print(
        torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE,
        "torch",
        torch.__version__,
        "fla",
        fla.__version__,
        flush=True,
    )
    for name in sys.argv[1:] or list(CASES):
        run = subprocess.run([sys.executable, __file__, "--child", name], capture_output=True, text=True, timeout=900)
        # the child's result line; the end of its stderr only when it printed none (it died)
        lines = [x for x in run.stdout.splitlines() if x.strip()]
        if not any(x.startswith(f"{name}:") for x in lines):
            lines += [x for x in run.stderr.splitlines() if x.strip()][-3:] or [
                f"{name}: child exited {run.returncode}"
            ]
        print("\n".join(lines), flush=True)
