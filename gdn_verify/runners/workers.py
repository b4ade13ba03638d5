"""Fuzz campaigns over several worker processes, one per GPU (or per CPU core), merged into one report.

Each worker runs its own shard of the campaign (``shard``: disjoint sets of properties, or one
property per worker when there are more workers than properties) in a fresh ``spawn`` process
whose environment pins it to one GPU (``CUDA_VISIBLE_DEVICES``) or, for NumPy implementations,
to one BLAS thread. All share one example database directory (Hypothesis's directory database
is safe for concurrent writers). Progress and failures come back through a queue as they happen.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_module
import shutil
import subprocess
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from gdn_verify.core.property import Measurement
from gdn_verify.runners.check import PropertyResult
from gdn_verify.runners.fuzz import FuzzReport, merge_reports

Job = Callable[..., FuzzReport]  # job(**shard, progress=, on_result=, on_round=) -> FuzzReport; picklable by name
SINGLE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def visible_gpus() -> list[str]:
    """CUDA device ids this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else ``nvidia-smi -L``.

    Asking nvidia-smi rather than CUDA keeps this process from creating a CUDA context.
    """
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(line for line in out.splitlines() if line.startswith("GPU "))]


def default_workers(gpu: bool) -> int:
    """One worker per visible GPU for GPU implementations, else one per CPU core."""
    return max(1, len(visible_gpus())) if gpu else max(1, os.cpu_count() or 1)


def worker_environments(n: int, gpu: bool) -> list[dict[str, str]]:
    """Per worker: its GPU (round robin over the visible ones), or single-threaded BLAS on a CPU."""
    gpus = visible_gpus() if gpu else []
    if gpus:
        return [{"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]} for i in range(n)]
    return [dict(SINGLE_THREAD) for _ in range(n)]


def shard(names: Sequence[str], n: int) -> list[list[str]]:
    """Disjoint property sets for ``n`` workers (round robin); with more workers than properties, one each."""
    if n <= len(names):
        return [list(names[i::n]) for i in range(n)]
    return [[names[i % len(names)]] for i in range(n)]


def _worker(job: Job, index: int, kwargs: dict[str, Any], channel: Any) -> None:
    last = [0.0]

    def progress(report: FuzzReport, name: str) -> None:
        now = time.monotonic()
        if now - last[0] >= 1.0:  # the queue is for news, not for every example
            last[0] = now
            channel.put(("progress", index, (report.cases, report.elapsed, report.worst, name)))

    def on_result(result: PropertyResult) -> None:
        channel.put(("result", index, result))

    def on_round(report: FuzzReport) -> None:  # the verdicts so far: what an interrupted run keeps
        channel.put(("round", index, report))

    try:
        channel.put(("done", index, job(**kwargs, progress=progress, on_result=on_result, on_round=on_round)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
        channel.put(("error", index, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"))


def run_sharded(
    job: Job,
    shards: Sequence[dict[str, Any]],
    environments: Sequence[dict[str, str]],
    progress: Callable[[FuzzReport, str], None] | None = None,
    on_result: Callable[[PropertyResult], None] | None = None,
    on_round: Callable[[FuzzReport], None] | None = None,
) -> FuzzReport:
    """Run ``job(**shards[i])`` in worker ``i`` with ``environments[i]`` added; one merged report.

    A worker that raises or dies is named in ``worker_errors``; the others' results still count.
    ``progress`` and ``on_round`` see the merged report so far (every worker's latest verdicts),
    so that a caller interrupted mid-campaign can save what the workers had found.
    """
    ctx = mp.get_context("spawn")  # CUDA cannot be forked; spawn also applies the environment
    channel = ctx.Queue()
    procs = []
    try:
        for index, (kwargs, env) in enumerate(zip(shards, environments)):
            saved = {name: os.environ.get(name) for name in env}
            os.environ.update(env)
            try:
                proc = ctx.Process(target=_worker, args=(job, index, kwargs, channel), name=f"gdn-fuzz-{index}")
                proc.start()
            finally:
                for name, value in saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
            procs.append(proc)
        budgets = [s["budget"] for s in shards if isinstance(s.get("budget"), (int, float))]
        return _collect(procs, channel, progress, on_result, on_round, max(budgets, default=0.0))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
            proc.join()


Live = dict[int, tuple[int, float, tuple[str, Measurement] | None, str]]  # worker: (cases, elapsed, worst, now)


def _so_far(
    rounds: dict[int, FuzzReport], live: Live, found: list[PropertyResult], budget: float, n: int
) -> FuzzReport:
    """The campaign as the workers have reported it: their latest verdicts, live counts and failures."""
    now = merge_reports([rounds[i] for i in sorted(rounds)])
    now.budget, now.workers = budget, n
    now.failures += [f for f in found if f.name not in {x.name for x in now.failures}]
    if live:
        now.cases = max(now.cases, sum(v[0] for v in live.values()))
        now.elapsed = max(now.elapsed, *(v[1] for v in live.values()))
        for v in live.values():
            now.note_worst(v[2])
    return now


def _collect(procs, channel, progress, on_result, on_round, budget: float) -> FuzzReport:
    n = len(procs)
    reports: dict[int, FuzzReport] = {}
    rounds: dict[int, FuzzReport] = {}
    errors: dict[int, str] = {}
    live: Live = {}
    found: list[PropertyResult] = []
    silent_since: dict[int, float] = {}
    while len(reports) + len(errors) < n:
        try:
            kind, index, payload = channel.get(timeout=1.0)
        except queue_module.Empty:
            for index, proc in enumerate(procs):
                if index in reports or index in errors or proc.exitcode is None:
                    continue
                # exited without a word: allow its last message a few seconds in the pipe
                if time.monotonic() - silent_since.setdefault(index, time.monotonic()) > 5:
                    errors[index] = f"worker {index} exited with code {proc.exitcode} without a report"
            continue
        if kind == "progress":
            live[index] = payload
            if progress is not None:
                progress(_so_far(rounds, live, found, budget, n), ", ".join(v[3] for _, v in sorted(live.items())))
        elif kind == "round":
            rounds[index] = payload
            if on_round is not None:
                on_round(_so_far(rounds, live, found, budget, n))
        elif kind == "result":
            if payload.status == "failed":
                found.append(payload)
            if on_result is not None:
                on_result(payload)
        elif kind == "done":
            reports[index] = payload
        else:
            errors[index] = f"worker {index}: {payload}"
    merged = merge_reports([reports[i] for i in sorted(reports)])
    merged.workers = n
    merged.worker_errors += [errors[i] for i in sorted(errors)]
    return merged
