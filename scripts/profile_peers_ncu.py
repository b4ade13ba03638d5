"""The launches for Nsight Compute of our kernels beside the fastest peers' (issue 29's causes): each
prefill peer on the chosen rows of ``gdn_verify.bench.peers`` and the float32-state decode of ours
and FlashInfer at the chosen layouts and batches, each inside an NVTX range named ``peer/row`` and between
``cudaProfilerStart`` / ``Stop``, after warm-up calls outside them (compiles and autotuning are not
profiled). One ``ncu`` run per peer keeps each log to one peer's kernels. Before the profiled
calls it prints each prefill peer's host time (``perf_counter`` around
the call, no synchronize: what the Python call costs before its kernels run; median of 50) beside its
device time, so that a host-side cost shows apart from kernel time. Usage (GPU, FlashInfer's site on
``PYTHONPATH``, from ``gpu_peers.sh`` step ``ncu``)::

    ncu --profile-from-start off --nvtx ... python3 scripts/profile_peers_ncu.py \\
        [--rows '16/32 8x2048$,2/8 1x65536$'] [--peers ours,ours-cp-off,flashinfer,flashinfer-cp] \\
        [--decode 16/32:1024,16/32:1] [--decode-peers ours,flashinfer] [--calls 2]
    python3 scripts/profile_peers_ncu.py --calls 0 --decode ''     # host and device times alone
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gdn_verify.bench import decode, peers, prefill  # noqa: E402 - after the path above


def _host_and_device_ms(torch, call, reps: int = 50) -> tuple[float, float]:
    host = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        host.append((time.perf_counter() - start) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(host), prefill._time_ms(call, torch.cuda.synchronize, 2, 10)


def _profiled(torch, label: str, call, calls: int) -> None:
    if calls < 1:
        return
    torch.cuda.synchronize()
    print(f"range: {label}", flush=True)  # names the launches after it in ncu's log (gdn_verify.bench.ncu_text)
    torch.cuda.nvtx.range_push(label)
    torch.cuda.profiler.start()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    torch.cuda.nvtx.range_pop()


def prefill_rows(torch, patterns: list[str], names: list[str], calls: int) -> None:
    loaded = {}
    for name in names:
        peer, reason = peers.load_peer(name)
        if peer is None:
            print(f"{name}: not loaded: {reason}")
        else:
            loaded[name] = peer
    for row in peers.select_rows(peers.rows(), patterns):
        x = prefill._inputs(torch, row.sequences, row.length, row.H, row.HV, row.K, row.V, 0, torch.bfloat16)
        for name, peer in loaded.items():
            call = peer.prepare(x, row)
            for _ in range(3):  # compile, autotune, warm the caches outside the profiled range
                call()
            host, device = _host_and_device_ms(torch, call)
            print(f"{row.key} {name}: host {host:.3f} ms per call, device {device:.3f} ms ({peer.describe(row)})")
            _profiled(torch, f"{name}/{row.key}", call, calls)
        del x


def decode_layout(torch, spec: str, names: list[str], calls: int, flashinfer: Callable | None) -> None:
    """The float32-state decode of the peers in ``names`` at ``spec`` (``H/HV:B``); ``flashinfer``:
    FlashInfer's kernel, loaded once for every layout (None: not loaded)."""
    import cupy

    from cupy_kernels.recurrent import recurrent_gated_delta_rule as ours

    layout, batch = spec.split(":")
    H, HV = map(int, layout.split("/"))
    B = int(batch)
    d = decode._inputs(cupy, torch, B, H, HV, 128, 128, 0)
    steps = {}
    if "ours" in names:
        steps["ours"] = lambda: ours(**d, output_final_state=True, use_qk_l2norm_in_kernel=True)
    if "flashinfer" in names and flashinfer is not None:
        steps["flashinfer"] = decode._flashinfer_step(torch, flashinfer, d, torch.float32)
    for name, step in steps.items():
        for _ in range(3):
            step()
        _profiled(torch, f"decode-{name}/{spec}", step, calls)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="profile_peers_ncu.py")
    parser.add_argument("--rows", default="16/32 8x2048$,2/8 1x65536$", help="comma-separated row regexes ('' none)")
    parser.add_argument("--peers", default="ours,ours-cp-off,flashinfer,flashinfer-cp")
    parser.add_argument("--decode", default="16/32:1024", help="H/HV:B, comma-separated ('' none)")
    parser.add_argument("--decode-peers", default="ours,flashinfer", help="of ours, flashinfer")
    parser.add_argument("--calls", type=int, default=2, help="profiled calls per peer (0: host times only)")
    args = parser.parse_args(argv)
    import torch

    if args.rows:
        prefill_rows(torch, args.rows.split(","), peers.peer_names(args.peers), args.calls)
    specs, decode_peers = [x for x in args.decode.split(",") if x], args.decode_peers.split(",")
    flashinfer = None
    if specs and "flashinfer" in decode_peers:  # FlashInfer loads only where its decode is asked for
        decoders, reason = decode._flashinfer_decoders()
        flashinfer = decoders.get("flashinfer")
        if flashinfer is None:
            print(f"flashinfer decode: not loaded: {reason}")
    for spec in specs:
        decode_layout(torch, spec, decode_peers, args.calls, flashinfer)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
