"""Prefill speed: our CuPy chunked kernel beside FLA's ``chunk_gated_delta_rule`` on one GPU.

Both run on identical bf16 inputs (torch tensors; fp16 CuPy arrays for ours alone when torch is
missing), varlen-packed with ``B = 1`` and ``cu_seqlens`` as in serving, with the final state
written. Times are CUDA-event medians after warm-up, so they are device times of the whole call
including launch overhead. Nothing GPU-related is imported until :func:`prefill_bench` runs.
"""

from __future__ import annotations

import datetime
import statistics
from collections.abc import Callable, Sequence
from typing import Any


def _time_ms(fn: Callable[[], Any], event_cls, sync: Callable[[], None], warmup: int, reps: int) -> float:
    """Median device time of ``fn`` in ms, one event pair per repetition."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        start, end = event_cls(), event_cls()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(_elapsed(start, end))
    return statistics.median(times)


def _elapsed(start, end) -> float:
    if hasattr(start, "elapsed_time"):  # torch.cuda.Event
        return start.elapsed_time(end)
    import cupy

    return cupy.cuda.get_elapsed_time(start, end)


def _torch_inputs(torch, seqs: int, length: int, H: int, HV: int, K: int, V: int, seed: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    T = seqs * length
    dev, bf16 = "cuda", torch.bfloat16

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=dev)

    k = torch.nn.functional.normalize(randn(1, T, H, K), dim=-1)
    g = torch.nn.functional.logsigmoid(torch.rand(1, T, HV, generator=gen, device=dev))
    beta = torch.rand(1, T, HV, generator=gen, device=dev).sigmoid()
    cu = torch.arange(seqs + 1, device=dev, dtype=torch.int64) * length
    return dict(
        q=randn(1, T, H, K).to(bf16),
        k=k.to(bf16),
        v=randn(1, T, HV, V).to(bf16),
        g=g,
        beta=beta.to(bf16),
        cu_seqlens=cu,
    )


def _cupy_inputs(cupy, seqs: int, length: int, H: int, HV: int, K: int, V: int, seed: int) -> dict:
    rng = cupy.random.default_rng(seed)
    T = seqs * length
    k = rng.standard_normal((1, T, H, K), dtype=cupy.float32)
    k /= cupy.linalg.norm(k, axis=-1, keepdims=True)
    g = -cupy.log1p(cupy.exp(-rng.random((1, T, HV), dtype=cupy.float32)))  # logsigmoid(U(0, 1))
    beta = 1.0 / (1.0 + cupy.exp(-rng.random((1, T, HV), dtype=cupy.float32)))
    f16 = cupy.float16
    return dict(
        q=rng.standard_normal((1, T, H, K), dtype=cupy.float32).astype(f16),
        k=k.astype(f16),
        v=rng.standard_normal((1, T, HV, V), dtype=cupy.float32).astype(f16),
        g=g,
        beta=beta.astype(f16),
        cu_seqlens=cupy.arange(seqs + 1, dtype=cupy.int64) * length,
    )


def prefill_bench(
    cases: Sequence[tuple[int, int]] = ((1, 16384), (1, 65536), (64, 512)),
    H: int = 16,
    HV: int = 32,
    K: int = 128,
    V: int = 128,
    progress: Callable[[str], Any] | None = print,
    warmup: int = 3,
    reps: int = 10,
    seed: int = 0,
) -> list[dict]:
    """Time ours and FLA on ``cases`` of ``(sequences, length)``; one dict per case.

    Keys: ``device, dtype, sequences, length, tokens, ours_ms, ours_mtok_s``, and when FLA is
    importable ``fla_ms, fla_mtok_s, ratio`` (ours_ms / fla_ms, above 1 means slower) and
    ``rel_diff`` (relative RMS of the difference of the two outputs, a convention check).
    """
    import cupy

    from cupy_kernels.chunk import chunk_gated_delta_rule

    try:
        import torch
    except ImportError:
        torch = None
    fla = None
    if torch is not None:
        try:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla
        except ImportError:
            fla = None
    say = progress or (lambda _msg: None)
    device = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    device = device.decode() if isinstance(device, bytes) else device

    rows = []
    for seqs, length in cases:
        tokens = seqs * length
        if torch is not None:
            x = _torch_inputs(torch, seqs, length, H, HV, K, V, seed)
            event_cls, sync, dtype = (lambda: torch.cuda.Event(enable_timing=True)), torch.cuda.synchronize, "bfloat16"
        else:
            x = _cupy_inputs(cupy, seqs, length, H, HV, K, V, seed)
            event_cls, sync, dtype = cupy.cuda.Event, cupy.cuda.Device().synchronize, "float16"
        cu = None if seqs == 1 else x["cu_seqlens"]
        args = (x["q"], x["k"], x["v"], x["g"], x["beta"])

        def ours(args=args, cu=cu):
            return chunk_gated_delta_rule(*args, output_final_state=True, cu_seqlens=cu)

        row = dict(device=device, dtype=dtype, sequences=seqs, length=length, tokens=tokens)
        row["ours_ms"] = _time_ms(ours, event_cls, sync, warmup, reps)
        row["ours_mtok_s"] = tokens / row["ours_ms"] / 1e3
        if fla is not None:

            def theirs(args=args, cu=cu):
                return fla(*args, output_final_state=True, cu_seqlens=cu)

            row["fla_ms"] = _time_ms(theirs, event_cls, sync, warmup, reps)
            row["fla_mtok_s"] = tokens / row["fla_ms"] / 1e3
            row["ratio"] = row["ours_ms"] / row["fla_ms"]
            o_ours, o_fla = ours()[0].float(), theirs()[0].float()
            row["rel_diff"] = float((o_ours - o_fla).norm() / o_fla.norm())
        rows.append(row)
        say(_format_row(row))
        del x, args
    return rows


def _format_row(row: dict) -> str:
    text = f"{row['sequences']} x {row['length']}: ours {row['ours_ms']:.3f} ms ({row['ours_mtok_s']:.1f} Mtok/s)"
    if "fla_ms" in row:
        text += (
            f", FLA {row['fla_ms']:.3f} ms ({row['fla_mtok_s']:.1f} Mtok/s), ratio {row['ratio']:.2f}, "
            f"rel diff {row['rel_diff']:.1e}"
        )
    return text


def format_table(rows: list[dict]) -> str:
    """A Markdown table of :func:`prefill_bench` rows, headed by the device, dtype and date."""
    if not rows:
        return "(no rows)\n"
    today = datetime.date.today().isoformat()
    head = f"Prefill on {rows[0]['device']}, {rows[0]['dtype']} inputs, final state written, {today}.\n\n"
    lines = [
        "| sequences x length | tokens | ours ms | ours Mtok/s | FLA ms | FLA Mtok/s | ours / FLA | rel diff |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        fla = (
            f"{r['fla_ms']:.3f} | {r['fla_mtok_s']:.1f} | {r['ratio']:.2f} | {r['rel_diff']:.1e}"
            if "fla_ms" in r
            else "n/a | n/a | n/a | n/a"
        )
        lines.append(
            f"| {r['sequences']} x {r['length']} | {r['tokens']} | {r['ours_ms']:.3f} | "
            f"{r['ours_mtok_s']:.1f} | {fla} |"
        )
    return head + "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(format_table(prefill_bench()))
