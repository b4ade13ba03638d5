"""Decode speed of our CuPy recurrent kernel against FLA and a device-to-device copy (GPU only).

``decode_bench`` runs, side by side in one process on the same inputs, for each batch size:

- ours: ``cupy_kernels.recurrent.recurrent_gated_delta_rule`` with T = 1, fp32 state (initial state
  in, final state out), l2norm in kernel, bf16 q/k/v when torch is present (else fp32);
- FLA's ``fused_recurrent_gated_delta_rule`` with the same torch tensors, when importable;
- a device-to-device copy of the same number of state bytes: the bandwidth ceiling. Two copies are
  timed the same way (same graphs, same rotation) and the FASTER one is the ceiling: the framework
  copy (``torch`` ``copy_`` / CuPy assignment, i.e. ``cudaMemcpyAsync`` device to device, which the
  driver may run on copy engines) and a plain SM copy kernel (16-byte loads and stores, grid-stride,
  ``4 * SMs`` CTAs of 256 threads). Each reads ``state_bytes`` and writes ``state_bytes``, like our
  kernel's state traffic. The earlier table used the framework copy alone, which on the H100 ran at
  2.4 TB/s for buffers of 512 MB and more (2.9 TB/s at 128 MB): a weak ceiling;
- every decode kernel variant (``cupy_kernels.decode.DECODE_VARIANTS``) through ``DecodeStep``
  (state updated in place: the same bytes), so one GPU run shows which variant wins.

Kernel times come from CUDA graphs (torch graphs when torch is present, CuPy stream capture
otherwise) replaying one call per rotating input set (enough sets to overflow L2 three times),
timed with CUDA events; the median over repetitions, divided by the calls in the graph.
Effective state bandwidth = (state bytes read + written) / time. At batch 1 the host latency of
one Python call to result is measured too: the median over 300 calls (after 20 warm-up calls) of
``perf_counter`` around the call plus a stream synchronize, for the general function (allocates
``o`` and the final state each call), for ``DecodeStep`` (pointers patched, ``o`` reused, state in
place), and for ``DecodeStep`` without the synchronize (the host-side cost of the call alone);
then for ``DecodeGraph`` (the step over fixed buffers, replayed as one CUDA graph launch) per
variant, with and without the synchronize, and both paths once more on a private non-blocking
stream instead of the legacy default stream. Nothing GPU is imported at import.
"""

from __future__ import annotations

import datetime
import statistics
import time
from collections.abc import Callable
from typing import Any

from gdn_verify.bench.prefill import one_line


def _optional_torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _optional_fla():
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except Exception:  # noqa: BLE001 - FLA missing or broken: benchmark without it
        return None
    return fused_recurrent_gated_delta_rule


def _inputs(cupy, torch, B: int, H: int, HV: int, K: int, V: int, seed: int) -> dict:
    """One decode step's tensors (torch bf16 q/k/v when torch is present, else CuPy fp32)."""
    if torch is not None:
        gen = torch.Generator(device="cuda").manual_seed(seed)

        def randn(*shape, dtype=torch.float32):
            return torch.randn(shape, generator=gen, device="cuda").to(dtype)

        return dict(
            q=randn(B, 1, H, K, dtype=torch.bfloat16),
            k=randn(B, 1, H, K, dtype=torch.bfloat16),
            v=randn(B, 1, HV, V, dtype=torch.bfloat16),
            g=torch.log(torch.rand((B, 1, HV), generator=gen, device="cuda") * 0.5 + 0.5),
            beta=torch.rand((B, 1, HV), generator=gen, device="cuda"),
            initial_state=randn(B, HV, K, V) * 0.1,
        )
    rs = cupy.random.RandomState(seed)
    return dict(
        q=rs.standard_normal((B, 1, H, K), dtype=cupy.float32),
        k=rs.standard_normal((B, 1, H, K), dtype=cupy.float32),
        v=rs.standard_normal((B, 1, HV, V), dtype=cupy.float32),
        g=cupy.log(rs.uniform(0.5, 1.0, (B, 1, HV)).astype(cupy.float32)),
        beta=rs.uniform(0.0, 1.0, (B, 1, HV)).astype(cupy.float32),
        initial_state=rs.standard_normal((B, HV, K, V), dtype=cupy.float32) * 0.1,
    )


def _time_torch_graph(torch, calls: list[Callable], min_ms: float = 20.0, samples: int = 15) -> float:
    """Microseconds per call: one torch CUDA graph of all ``calls``, replayed back to back."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            for call in calls:
                call()  # warm-up: compiles, fills the allocator
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        keep = [call() for call in calls]  # noqa: F841 - outputs stay alive with the graph
    return _event_median_us(torch, graph.replay, len(calls), min_ms, samples)


def _event_median_us(torch, run: Callable[[], object], calls: int, min_ms: float, samples: int) -> float:
    """Microseconds per call: ``run`` (``calls`` calls) repeated back to back for at least ``min_ms``
    between two CUDA events, the median over ``samples``."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    repeats = max(1, int(min_ms / max(start.elapsed_time(end), 1e-3)))
    times = []
    for _ in range(samples):
        start.record()
        for _ in range(repeats):
            run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (repeats * calls))
    return statistics.median(times)


def _time_cupy_graph(cupy, calls: list[Callable], min_ms: float = 20.0, samples: int = 15) -> float:
    """Microseconds per call: one CuPy stream-captured graph of all ``calls``, replayed back to back."""
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for _ in range(2):
            for call in calls:
                call()  # warm-up on this stream, so the pool has blocks to reuse while capturing
        stream.synchronize()
        stream.begin_capture()
        keep = [call() for call in calls]  # noqa: F841
        graph = stream.end_capture()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        graph.launch(stream)
        end.record(stream)
        end.synchronize()
        replays = max(1, int(min_ms / max(cupy.cuda.get_elapsed_time(start, end), 1e-3)))
        times = []
        for _ in range(samples):
            start.record(stream)
            for _ in range(replays):
                graph.launch(stream)
            end.record(stream)
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / (replays * len(calls)))
    return statistics.median(times)


_COPY_SRC = r"""
extern "C" __global__ void __launch_bounds__(256) copy16(const float4* __restrict__ src, float4* __restrict__ dst,
                                                        long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = src[i];
}
// In place: each element read and written back to the same address, scaled by s (1 at run time, so
// that the compiler cannot drop the store), as a decode kernel updates its state.
extern "C" __global__ void __launch_bounds__(256) scale16(float4* x, float s, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float4 v = x[i];
        v.x *= s; v.y *= s; v.z *= s; v.w *= s;
        x[i] = v;
    }
}
"""


def _sm_copy(cupy):
    """``copy(src_ptr, dst_ptr, nbytes)``: the SM copy kernel on CuPy's current stream (nbytes % 16 == 0)."""
    kernel = cupy.RawKernel(_COPY_SRC, "copy16")
    blocks = 4 * cupy.cuda.Device().attributes["MultiProcessorCount"]

    def copy(src_ptr: int, dst_ptr: int, nbytes: int):
        kernel((blocks,), (256,), (cupy.uint64(src_ptr), cupy.uint64(dst_ptr), cupy.int64(nbytes // 16)))

    return copy


def _sm_inplace(cupy):
    """``rewrite(ptr, nbytes)``: read and write back ``nbytes`` in place (``scale16`` by 1) on CuPy's
    current stream, the traffic of a decode step's state with no arithmetic (nbytes % 16 == 0)."""
    kernel = cupy.RawKernel(_COPY_SRC, "scale16")
    blocks = 4 * cupy.cuda.Device().attributes["MultiProcessorCount"]

    def rewrite(ptr: int, nbytes: int):
        kernel((blocks,), (256,), (cupy.uint64(ptr), cupy.float32(1.0), cupy.int64(nbytes // 16)))

    return rewrite


def _ptr(x) -> int:
    return x.data_ptr() if hasattr(x, "data_ptr") else x.data.ptr


def _host_latency_us(cupy, call: Callable, reps: int = 300, sync: bool = True, stream=None) -> float:
    """Median wall time of one Python call to result (call + synchronize of ``stream``, default
    CuPy's current stream), microseconds."""
    stream = cupy.cuda.get_current_stream() if stream is None else stream
    for _ in range(20):
        call()
    stream.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        if sync:
            stream.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
        if not sync:
            stream.synchronize()
    return statistics.median(times)


def decode_bench(
    batches=(1, 8, 64, 256, 1024),
    H: int = 16,
    HV: int = 32,
    K: int = 128,
    V: int = 128,
    progress: Callable[[str], object] | None = print,
) -> list[dict]:
    """Decode timings per batch size: ours, FLA (if importable) and a copy of the state bytes.

    Returns one dict per batch: ``batch``, ``state_bytes``, ``sets`` (rotating input sets),
    ``ours_us``, ``fla_us`` (None without FLA), ``copy_us``, ``ours_gbps``, ``fla_gbps``,
    ``copy_gbps``, ``ours_frac``, ``fla_frac`` (fractions of the copy bandwidth), ``dtype``, and at
    batch 1 ``ours_host_us`` / ``fla_host_us`` (Python call to result).
    """
    import cupy

    from cupy_kernels.decode import DECODE_VARIANTS, DecodeStep
    from cupy_kernels.recurrent import recurrent_gated_delta_rule as ours
    from cupy_kernels.tensors import external_stream

    say = progress or (lambda _msg: None)
    torch = _optional_torch()
    fla = _optional_fla() if torch is not None else None
    l2_bytes = cupy.cuda.Device().attributes["L2CacheSize"]
    sm_copy = _sm_copy(cupy)
    rows = []
    for B in batches:
        state_bytes = B * HV * K * V * 4
        sets = max(1, min(64, -(-3 * l2_bytes // (2 * state_bytes))))
        data = [_inputs(cupy, torch, B, H, HV, K, V, seed) for seed in range(sets)]

        def our_call(d):
            return ours(**d, output_final_state=True, use_qk_l2norm_in_kernel=True)

        def step_for(d, variant, reuse=True, stream=None):
            args = {n: d[n] for n in ("q", "k", "v", "g", "beta")}
            step = DecodeStep(
                **args,
                state=d["initial_state"],
                use_qk_l2norm_in_kernel=True,
                reuse_output=reuse,
                decode_variant=variant,
                stream=stream,
            )
            return lambda: step(**args, state=d["initial_state"])

        def graph_for(d, variant, stream=None):
            """DecodeGraph over d's tensors as the fixed buffers: the call is the replay alone."""
            args = {n: d[n] for n in ("q", "k", "v", "g", "beta")}
            step = DecodeStep(**args, state=d["initial_state"], use_qk_l2norm_in_kernel=True, decode_variant=variant)
            return step.capture(**args, state=d["initial_state"], stream=stream)

        dst = [_empty_like(torch, cupy, d["initial_state"]) for d in data]
        if torch is not None:

            def on_torch_stream(call):
                with external_stream(torch.cuda.current_stream().cuda_stream):
                    return call()

            def timed(calls):
                return _time_torch_graph(torch, [lambda c=c: on_torch_stream(c) for c in calls])

            ours_us = timed([lambda d=d: our_call(d) for d in data])
            copy_fw_us = _time_torch_graph(
                torch, [lambda d=d, o=o: o.copy_(d["initial_state"]) for d, o in zip(data, dst)]
            )
        else:

            def timed(calls):
                return _time_cupy_graph(cupy, calls)

            ours_us = timed([lambda d=d: our_call(d) for d in data])
            copy_fw_us = _time_cupy_graph(
                cupy, [lambda d=d, o=o: o.__setitem__(Ellipsis, d["initial_state"]) for d, o in zip(data, dst)]
            )
        copy_sm_us = timed(
            [lambda d=d, o=o, n=state_bytes: sm_copy(_ptr(d["initial_state"]), _ptr(o), n) for d, o in zip(data, dst)]
        )
        copy_us = min(copy_fw_us, copy_sm_us)
        variant_us = {}
        for name in DECODE_VARIANTS:
            try:
                variant_us[name] = timed([step_for(d, name) for d in data])
            except Exception as exc:  # noqa: BLE001 - report and go on with the other variants
                say(f"variant {name} failed at batch {B}: {exc}")
        fla_us = None
        if fla is not None:
            try:
                fla_us = _time_torch_graph(
                    torch,
                    [lambda d=d: fla(**d, output_final_state=True, use_qk_l2norm_in_kernel=True) for d in data],
                )
            except Exception as exc:  # noqa: BLE001 - report and go on without FLA
                say(f"FLA failed at batch {B}: {exc}")
        traffic = 2 * state_bytes  # read once + written once
        row = dict(
            batch=B,
            state_bytes=state_bytes,
            sets=sets,
            dtype="bfloat16" if torch is not None else "float32",
            ours_us=ours_us,
            fla_us=fla_us,
            copy_us=copy_us,
            copy_fw_us=copy_fw_us,
            copy_sm_us=copy_sm_us,
            variant_us=variant_us,
            ours_gbps=traffic / ours_us / 1e3,
            fla_gbps=None if fla_us is None else traffic / fla_us / 1e3,
            copy_gbps=traffic / copy_us / 1e3,
        )
        row["ours_frac"] = row["ours_gbps"] / row["copy_gbps"]
        row["fla_frac"] = None if fla_us is None else row["fla_gbps"] / row["copy_gbps"]
        row["variant_frac"] = {n: copy_us / t for n, t in variant_us.items()}
        if B == 1:
            first = data[0]
            row["ours_host_us"] = _host_latency_us(cupy, lambda d=first: our_call(d))
            for name in DECODE_VARIANTS:
                fast = step_for(first, name)
                row[f"step_host_us[{name}]"] = _host_latency_us(cupy, fast)
            fast = step_for(first, None)
            row["step_host_us"] = _host_latency_us(cupy, fast)
            row["step_call_us"] = _host_latency_us(cupy, fast, sync=False)
            row["step_alloc_host_us"] = _host_latency_us(cupy, step_for(first, None, reuse=False))
            try:
                for name in DECODE_VARIANTS:
                    row[f"graph_host_us[{name}]"] = _host_latency_us(cupy, graph_for(first, name))
                replay = graph_for(first, None)
                row["graph_host_us"] = _host_latency_us(cupy, replay)
                row["graph_call_us"] = _host_latency_us(cupy, replay, sync=False)
                private = cupy.cuda.Stream(non_blocking=True)
                row["step_host_us_private_stream"] = _host_latency_us(
                    cupy, step_for(first, None, stream=private), stream=private
                )
                row["graph_host_us_private_stream"] = _host_latency_us(
                    cupy, graph_for(first, None, stream=private), stream=private
                )
            except Exception as exc:  # noqa: BLE001 - report and keep the rest of the bench
                say(f"DecodeGraph failed at batch {B}: {exc!r}")
                row["graph_error"] = repr(exc)
            row["fla_host_us"] = None
            if fla is not None and fla_us is not None:

                def fla_to_result(d=first):
                    fla(**d, output_final_state=True, use_qk_l2norm_in_kernel=True)
                    torch.cuda.synchronize()

                row["fla_host_us"] = _host_latency_us(cupy, fla_to_result)
        rows.append(row)
        fla_text = "n/a" if fla_us is None else f"{fla_us:.1f} us ({row['fla_frac']:.0%})"
        var_text = ", ".join(f"{n} {t:.1f} us ({copy_us / t:.0%})" for n, t in variant_us.items())
        say(
            f"B={B}: ours {ours_us:.1f} us ({row['ours_frac']:.0%} of copy), FLA {fla_text}, copy {copy_us:.1f} us "
            f"(framework {copy_fw_us:.1f}, SM kernel {copy_sm_us:.1f}); variants: {var_text}"
        )
        del data, dst
    return rows


def _empty_like(torch, cupy, x):
    return torch.empty_like(x) if torch is not None else cupy.empty_like(x)


def _fmt(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def format_table(rows: list[dict]) -> str:
    """Markdown table of ``decode_bench`` rows, naming the device and the date."""
    import cupy

    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    dtype = rows[0]["dtype"] if rows else "?"
    lines = [
        f"Decode (T = 1, fp32 state, {dtype} q/k/v, l2norm in kernel) on **{name}**, {datetime.date.today()}",
        "",
        "| batch | ours (us) | FLA (us) | copy (us) | ours GB/s | FLA GB/s | copy GB/s | ours / copy | FLA / copy |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['batch']} | {r['ours_us']:.1f} | {_fmt(r['fla_us'], '.1f')} | {r['copy_us']:.1f} "
            f"| {r['ours_gbps']:.0f} | {_fmt(r['fla_gbps'], '.0f')} | {r['copy_gbps']:.0f} "
            f"| {r['ours_frac']:.0%} | {_fmt(r['fla_frac'], '.0%')} |"
        )
    names = list(rows[0].get("variant_us", {})) if rows else []
    if names:
        lines += [
            "",
            "Copy ceiling = the faster of the framework copy (cudaMemcpyAsync) and an SM copy kernel; decode variants "
            "(DecodeStep, state in place), us and fraction of the copy ceiling:",
            "",
            "| batch | copy framework (us) | copy SM kernel (us) | " + " | ".join(names) + " |",
            "| --- | --- | --- | " + " | ".join("---" for _ in names) + " |",
        ]
        for r in rows:
            cells = [
                f"{r['variant_us'][n]:.1f} ({r['variant_frac'][n]:.0%})" if n in r["variant_us"] else "n/a"
                for n in names
            ]
            head = f"| {r['batch']} | {r['copy_fw_us']:.1f} | {r['copy_sm_us']:.1f} | "
            lines.append(head + " | ".join(cells) + " |")
    for r in rows:
        if "ours_host_us" in r:
            lines.append("")
            lines.append(
                f"Batch {r['batch']}, Python call to result (median of 300, call + synchronize): general function "
                f"{r['ours_host_us']:.1f} us, DecodeStep {r['step_host_us']:.1f} us (fresh o each call: "
                f"{r['step_alloc_host_us']:.1f} us; the call alone, no synchronize: {r['step_call_us']:.1f} us), "
                f"FLA {_fmt(r.get('fla_host_us'), '.1f')} us."
            )
            per = ", ".join(f"{n} {r[f'step_host_us[{n}]']:.1f}" for n in names if f"step_host_us[{n}]" in r)
            if per:
                lines.append(f"DecodeStep call to result per variant (us): {per}.")
            if "graph_host_us" in r:
                per = ", ".join(f"{n} {r[f'graph_host_us[{n}]']:.1f}" for n in names if f"graph_host_us[{n}]" in r)
                lines.append(
                    f"DecodeGraph (fixed buffers, one graph launch) call to result {r['graph_host_us']:.1f} us "
                    f"(the call alone: {r['graph_call_us']:.1f} us); per variant (us): {per}. On a private "
                    f"non-blocking stream: DecodeStep {r['step_host_us_private_stream']:.1f} us, DecodeGraph "
                    f"{r['graph_host_us_private_stream']:.1f} us."
                )
            elif "graph_error" in r:
                lines.append(f"DecodeGraph failed: {r['graph_error']}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- decode against its peers

# Qwen3.5's tensor-parallel head layouts (q-k heads, value heads), as the prefill peer bench.
LAYOUTS = ((2, 8), (4, 8), (8, 16), (16, 32), (16, 64))
PEER_BATCHES = (1, 8, 64, 256, 1024)
# ours-vf-*: DecodeStep with the state v-first [.., V, K], FlashInfer's layout, under the default
# variant and under rows-cs (its v-first tiling)
DECODE_PEERS = ("ours", "ours-step", "ours-vf-step", "ours-vf-rows", "fla", "flashinfer", "flashinfer-bf16-state")


def _flashinfer_decoders() -> tuple[dict[str, Callable | None], str | None]:
    """FlashInfer's pretranspose decode with a float32 and a bfloat16 state (None where absent),
    and why they are not there."""
    try:
        from gdn_verify.implementations.flashinfer import _flashinfer_kernels

        kernels = _flashinfer_kernels()
    except Exception as exc:  # noqa: BLE001 - a peer that does not load is a row note, not a failure
        return {}, one_line(exc)
    found = {"flashinfer": kernels["decode"], "flashinfer-bf16-state": kernels["decode_bf16"]}
    return found, None if found["flashinfer-bf16-state"] else "no bfloat16-state kernels in this FlashInfer"


def _flashinfer_step(torch, kernel: Callable, d: dict, state_dtype) -> Callable[[], Any]:
    """One FlashInfer decode step on ``d``'s tensors, its state k-last ``[B, HV, V, K]`` in
    ``state_dtype``, updated in place, and the gates as its raw ``a, b`` with ``A_log = dt_bias = 0``
    (``-softplus(a) = g``, ``sigmoid(b) = beta``: the adapter's encoding)."""
    from gdn_verify.implementations.flashinfer import TorchOps, raw_gates

    a, b = (x.to(d["q"].dtype) for x in raw_gates(TorchOps(), d["g"], d["beta"]))
    state = d["initial_state"].transpose(-1, -2).to(state_dtype).contiguous()
    zeros = torch.zeros(d["g"].shape[-1], dtype=torch.float32, device=d["q"].device)
    args = dict(q=d["q"], k=d["k"], v=d["v"], state=state, A_log=zeros, a=a, dt_bias=zeros, b=b)
    return lambda: kernel(**args, scale=None, use_qk_l2norm=True)


def peer_fractions(times_us: dict[str, float | None], state_bytes: int, copy_us: float) -> dict[str, float | None]:
    """Each peer's share of the copy ceiling: its state traffic (read and written once: twice
    ``state_bytes``, half that for the bfloat16-state kernel) over its time, against the copy of
    ``state_bytes`` (read and written) in ``copy_us``. Pure."""
    out: dict[str, float | None] = {}
    for name, us in times_us.items():
        traffic = state_bytes // 2 if name.endswith("bf16-state") else state_bytes
        out[name] = None if us is None else (traffic / us) / (state_bytes / copy_us)
    return out


def decode_peers_bench(
    layouts=LAYOUTS,
    batches=PEER_BATCHES,
    K: int = 128,
    V: int = 128,
    progress: Callable[[str], object] | None = print,
) -> list[dict]:
    """Decode (T = 1, l2norm in kernel, bf16 q/k/v) per head layout and batch size, side by side in
    one process: ours (the general function, and ``DecodeStep``'s default variant, state in place;
    ``DecodeStep`` with the state v-first under the default variant and under ``rows-cs``),
    FLA's ``fused_recurrent_gated_delta_rule``, FlashInfer's pretranspose decode with a float32 and
    with a bfloat16 state, and the copy ceiling of the float32 state bytes (the faster of the
    framework copy and the SM copy kernel). Times from CUDA graphs over rotating input sets, as
    :func:`decode_bench`; a peer a graph cannot capture is timed eagerly (``eager`` lists it).

    One dict per (layout, batch): ``H``, ``HV``, ``batch``, ``state_bytes``, ``times_us`` and
    ``fractions`` (of the copy ceiling, :func:`peer_fractions`) by peer (None: not run),
    ``copy_us``, ``inplace_us`` (the same bytes rewritten in place by an SM kernel), ``errors``
    (peer: one line), ``eager``, ``unavailable`` (peer: why), ``device``, ``date``.
    """
    import cupy

    from cupy_kernels.decode import DecodeStep
    from cupy_kernels.recurrent import recurrent_gated_delta_rule as ours
    from cupy_kernels.tensors import external_stream

    torch = _optional_torch()
    if torch is None:
        raise RuntimeError("the decode peer bench needs torch with CUDA (its peers take torch tensors)")
    say = progress or (lambda _msg: None)
    fla = _optional_fla()
    decoders, fi_reason = _flashinfer_decoders()
    unavailable = {"fla": "FLA is not importable"} if fla is None else {}
    for name in ("flashinfer", "flashinfer-bf16-state"):
        if decoders.get(name) is None:
            unavailable[name] = fi_reason or "not loaded"
    l2_bytes = cupy.cuda.Device().attributes["L2CacheSize"]
    sm_copy, sm_inplace = _sm_copy(cupy), _sm_inplace(cupy)
    device, today = torch.cuda.get_device_name(), datetime.date.today().isoformat()

    def on_torch_stream(call):
        with external_stream(torch.cuda.current_stream().cuda_stream):
            return call()

    rows = []
    for H, HV in layouts:
        for B in batches:
            state_bytes = B * HV * K * V * 4
            sets = max(1, min(64, -(-3 * l2_bytes // (2 * state_bytes))))
            data = [_inputs(cupy, torch, B, H, HV, K, V, seed) for seed in range(sets)]
            calls: dict[str, list[Callable]] = {
                "ours": [
                    lambda d=d: on_torch_stream(
                        lambda: ours(**d, output_final_state=True, use_qk_l2norm_in_kernel=True)
                    )
                    for d in data
                ],
            }
            k_first = [d["initial_state"] for d in data]
            v_first = [state.transpose(-1, -2).contiguous() for state in k_first]
            for name, variant, states in (
                ("ours-step", None, k_first),
                ("ours-vf-step", None, v_first),
                ("ours-vf-rows", "rows-cs", v_first),
            ):
                calls[name] = []
                for d, state in zip(data, states):
                    args = {n: d[n] for n in ("q", "k", "v", "g", "beta")}
                    step = DecodeStep(
                        **args,
                        state=state,
                        use_qk_l2norm_in_kernel=True,
                        state_v_first=states is v_first,
                        decode_variant=variant,
                    )
                    calls[name].append(lambda s=step, a=args, st=state: on_torch_stream(lambda: s(**a, state=st)))
            if fla is not None:
                calls["fla"] = [
                    lambda d=d: fla(**d, output_final_state=True, use_qk_l2norm_in_kernel=True) for d in data
                ]
            for name, dtype in (("flashinfer", torch.float32), ("flashinfer-bf16-state", torch.bfloat16)):
                if decoders.get(name) is not None:
                    calls[name] = [_flashinfer_step(torch, decoders[name], d, dtype) for d in data]
            dst = [torch.empty_like(d["initial_state"]) for d in data]
            copy_fw = _time_torch_graph(
                torch, [lambda d=d, o=o: o.copy_(d["initial_state"]) for d, o in zip(data, dst)]
            )
            copy_sm = _time_torch_graph(
                torch,
                [
                    lambda d=d, o=o, n=state_bytes: on_torch_stream(
                        lambda: sm_copy(_ptr(d["initial_state"]), _ptr(o), n)
                    )
                    for d, o in zip(data, dst)
                ],
            )
            copy_us = min(copy_fw, copy_sm)
            # FlashInfer's float32-state kernel, in place, ran at 103-105 % of copy_us on an H100
            # (2026-11-28): the same traffic in place, recorded beside the ceiling, not in it
            inplace_us = _time_torch_graph(
                torch,
                [
                    lambda d=d, n=state_bytes: on_torch_stream(lambda: sm_inplace(_ptr(d["initial_state"]), n))
                    for d in data
                ],
            )
            times: dict[str, float | None] = dict.fromkeys(DECODE_PEERS)
            errors, eager = {}, []
            for name, fns in calls.items():
                try:
                    times[name] = _time_torch_graph(torch, fns)
                except Exception as graph_exc:  # noqa: BLE001 - not capturable: time it eagerly
                    torch.cuda.synchronize()
                    try:
                        times[name] = _time_eager(torch, fns)
                        eager.append(name)
                    except Exception as exc:  # noqa: BLE001 - report and go on with the other peers
                        errors[name] = f"{one_line(exc)} (in a graph: {type(graph_exc).__name__})"
            row = dict(
                H=H,
                HV=HV,
                batch=B,
                K=K,
                V=V,
                state_bytes=state_bytes,
                sets=sets,
                times_us=times,
                fractions=peer_fractions(times, state_bytes, copy_us),
                copy_us=copy_us,
                copy_fw_us=copy_fw,
                copy_sm_us=copy_sm,
                inplace_us=inplace_us,
                errors=errors,
                eager=eager,
                unavailable=unavailable,
                device=device,
                date=today,
            )
            rows.append(row)
            say(format_peers_row(row))
            del data, dst, calls, k_first, v_first
    return rows


def _time_eager(torch, calls: list[Callable], min_ms: float = 20.0, samples: int = 15) -> float:
    """Microseconds per call of ``calls`` run back to back without a graph (launch costs included)."""
    for call in calls * 2:
        call()
    torch.cuda.synchronize()
    return _event_median_us(torch, lambda: [call() for call in calls], len(calls), min_ms, samples)


def format_peers_row(row: dict) -> str:
    """One progress line of a :func:`decode_peers_bench` row."""
    cells = [f"{n} {t:.1f} us ({row['fractions'][n]:.0%})" for n, t in row["times_us"].items() if t is not None] + [
        f"{n}: {e}" for n, e in row["errors"].items()
    ]
    return f"{row['H']}/{row['HV']} B={row['batch']}: copy {row['copy_us']:.1f} us; " + ", ".join(cells)


def format_peers_table(rows: list[dict]) -> str:
    """Markdown of :func:`decode_peers_bench` rows: per layout and batch, each peer's time and share
    of the copy ceiling; the device, date and the peers that did not load."""
    if not rows:
        return "(no rows)\n"
    r0 = rows[0]
    lines = [
        f"Decode (T = 1, bf16 q/k/v, l2norm in kernel, K = V = {r0['K']}) on {r0['device']}, {r0['date']}; "
        "time in us and share of the copy ceiling (the float32 state read and written once, against a "
        "same-size device copy; the bfloat16-state kernel moves half the bytes). In place: the same "
        "bytes read and written back to their own addresses by an SM kernel, beside the ceiling, not in it.",
        "",
        "| q-k / value heads | batch | copy (us) | in place (us) | " + " | ".join(DECODE_PEERS) + " |",
        "| --- | --- | --- | --- | " + " | ".join("---" for _ in DECODE_PEERS) + " |",
    ]
    for r in rows:
        cells = []
        for n in DECODE_PEERS:
            t = r["times_us"].get(n)
            if t is not None:
                cells.append(f"{t:.1f} ({r['fractions'][n]:.0%})" + (" eager" if n in r["eager"] else ""))
            else:
                cells.append("error" if n in r["errors"] else "n/a")
        inplace = _fmt(r.get("inplace_us"), ".1f")
        lines.append(
            f"| {r['H']}/{r['HV']} | {r['batch']} | {r['copy_us']:.1f} | {inplace} | " + " | ".join(cells) + " |"
        )
    notes = {n: why for r in rows for n, why in r["unavailable"].items()}
    notes.update({f"{n} at {r['H']}/{r['HV']} B={r['batch']}": e for r in rows for n, e in r["errors"].items()})
    if notes:
        lines += ["", *(f"- {n}: {why}" for n, why in notes.items())]
    return "\n".join(lines) + "\n"
