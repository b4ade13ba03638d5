"""Where a prefill call's time goes, ours and FLA (when importable), on the bench rows.

Per row and library: the CUDA-event time of the whole call (as ``bench`` measures it), the host
time of one call with the GPU idle, and the device time of each kernel (torch profiler, CUPTI),
so that launcher overhead and kernel time can be told apart. Writes ``prefill_profile.json`` to
``$OUT`` (default: the current folder) and prints one JSON line per row. Needs a CUDA GPU:
  PYTHONPATH=. python3 scripts/profile_prefill.py        (or: bash scripts/gpu-machine/gpu_session.sh profile_prefill)
(On an H100, 2026-11-23, this showed 0.6-1.0 ms of launcher host time inside every bench row:
reports/2026-11-23-chunk-prefill/.)
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from cupy_kernels import chunk
from gdn_verify.bench.prefill import CASES, _inputs, _time_ms


def _host_ms(run, reps: int = 30) -> float:
    """Median host time of one call, the GPU idle before each."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - start)
        del out
    torch.cuda.synchronize()
    return statistics.median(times) * 1e3


def _kernels_ms(run, reps: int = 5) -> dict[str, float]:
    """Device time per kernel name (and copy) of one call, averaged over ``reps`` calls."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run()
        torch.cuda.synchronize()
    kernels = {}
    for event in prof.key_averages():
        total = getattr(event, "device_time_total", 0) or getattr(event, "cuda_time_total", 0)
        if total:
            kernels[event.key[:60]] = round(total / reps / 1e3, 4)
    return kernels


def main() -> None:
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla
    except ImportError:
        fla = None
    impls = {"ours": chunk.chunk_gated_delta_rule, "fla": fla}
    rows = []
    for seqs, length in CASES:
        x = _inputs(torch, seqs, length, 16, 32, 128, 128, 0, torch.bfloat16)
        cu = None if seqs == 1 else x["cu"]
        args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
        for name, fn in impls.items():
            if fn is None:
                continue

            def run(fn=fn, args=args, cu=cu):
                return fn(*args, output_final_state=True, cu_seqlens=cu)

            event = _time_ms(run, torch.cuda.synchronize, 3, 10)
            kernels = _kernels_ms(run)
            row = dict(
                shape=f"{seqs} x {length}",
                impl=name,
                event_ms=round(event, 4),
                host_ms=round(_host_ms(run), 4),
                kernels_ms=round(sum(kernels.values()), 4),
                kernels=kernels,
                device=torch.cuda.get_device_name(),
            )
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "prefill_profile.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
