"""Prefill speed, memory and accuracy: our CuPy chunked kernel beside FLA's ``chunk_gated_delta_rule``.

Both run on identical bf16 torch inputs, varlen-packed with ``B = 1`` and ``cu_seqlens`` as in
serving (no ``cu_seqlens`` for a single sequence), with the final state written. Per row:

- time: CUDA-event medians after warm-up, device time of the whole call including launches, taken
  in :data:`ROUNDS` interleaved rounds (ours, FLA, FLA, ours, ...; :func:`interleaved_rounds`): each
  time is the median over rounds of each round's median, and the ratio ours / FLA the median of the
  per-round ratios, with their spread. Both kernels read ``cu_seqlens`` on the host once per call,
  inside the timed window, so the varlen rows time host latency too, which drifts over a run (our
  own time on them moved 9-13 % between two runs on H100s, 2026-11-27); a ratio taken within each
  round cancels that drift, as both kernels see the same host in the same round;
- extra memory: the peak of device memory the call allocates beyond its inputs (outputs and
  scratch), measured the same way for both: torch's peak statistics plus CuPy's pool through a
  memory hook (ours allocates through torch for torch inputs, its small chunk tables through CuPy);
- accuracy: relative RMS of the output and of the final state against the float64 oracle
  (``core.reference``), on two sampled value heads (the first and the last: heads do not
  interact, so a head's oracle needs only its own inputs).

Needs torch and CuPy on a CUDA device; FLA is optional (its columns are None without it).
Nothing GPU-related is imported until a function runs.
"""

from __future__ import annotations

import datetime
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from gdn_verify.core.reference import chunk_gated_delta_rule as oracle

# The rows of issue 16's table: (sequences, length), H = 16, HV = 32, K = V = 128.
CASES = ((1, 4096), (1, 16384), (1, 65536), (8, 2048), (64, 512))
# The accuracy shape of the issue: H = 4, HV = 8, K = V = 128, one sequence of 8192 tokens.
ACCURACY_SHAPE = dict(H=4, HV=8, K=128, V=128, T=8192)
# Interleaved timing rounds per row, in alternating order (a, b, c, then c, b, a): an even count, so
# that each kernel runs as often before a peer as after it. The repetitions are split across them
# (12 reps: 2 a round), after 3 untimed calls before the first round and one before each later
# round (:func:`_round_timer`): 20 calls of each kernel a row.
ROUNDS = 6
REPS = 12


def _time_ms(fn: Callable[[], Any], sync: Callable[[], None], warmup: int, reps: int) -> float:
    """Median device time of ``fn`` in ms, one CUDA event pair per repetition."""
    import torch

    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``"Type: first line of the message"``, at most ``limit`` characters: an error as a table cell."""
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def interleave(
    timers: Mapping[str, Callable[[int], float]],
    rounds: int = ROUNDS,
    reference: str | None = None,
    catch: bool = False,
) -> dict[str, dict[str, Any]]:
    """Time every timer in turn in each of ``rounds`` rounds, in ``timers``' order in even rounds
    and in reverse in odd ones (a, b, c, c, b, a, a, b, c, ...), each taking the round's index and
    returning that round's time in ms. The alternation gives a kernel that runs after another (a
    warm L2, a GPU clock that follows the last kernel's load) as many rounds before it as after it,
    so a bias of position cancels in the median of the per-round ratios over an even number of
    rounds; on 2026-11-28 two calls of the same kernels a fixed order apart differed by 2-11 %
    (``reports/2026-11-28-peer-benches/``). Pure: no GPU.

    Returns per name ``ms`` (the median over rounds), ``rounds`` (the per-round times, in order),
    and against ``reference`` (a name in ``timers``): ``ratio`` (the median over rounds of the
    per-round ratio name / reference: both ran in the same round, so drift of the host over the
    run cancels), ``ratio_rounds`` and ``ratio_spread`` (``[min, max]`` of them); the ratio keys
    are None without a reference (or for one that failed). ``catch``: a timer that raises is
    timed no more, and its entry is ``{"error": one line}``; otherwise the exception propagates.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    times: dict[str, list[float]] = {name: [] for name in timers}
    errors: dict[str, str] = {}
    order = list(timers)
    for i in range(rounds):
        for name in order if i % 2 == 0 else order[::-1]:
            timer = timers[name]
            if name in errors:
                continue
            try:
                times[name].append(timer(i))
            except Exception as exc:  # noqa: BLE001 - with catch, one peer's failure ends its rounds only
                if not catch:
                    raise
                errors[name] = one_line(exc)
    ref = times.get(reference) if reference is not None and reference not in errors else None
    result: dict[str, dict[str, Any]] = {}
    for name, ts in times.items():
        if name in errors:
            result[name] = {"error": errors[name]}
            continue
        cell: dict[str, Any] = dict(ms=statistics.median(ts), rounds=ts)
        cell.update(ratio=None, ratio_rounds=None, ratio_spread=None)
        if ref is not None:
            ratios = [t / r for t, r in zip(ts, ref)]
            cell.update(ratio=statistics.median(ratios), ratio_rounds=ratios, ratio_spread=[min(ratios), max(ratios)])
        result[name] = cell
    return result


def interleaved_rounds(
    time_ours: Callable[[int], float], time_fla: Callable[[int], float] | None, rounds: int = ROUNDS
) -> dict[str, Any]:
    """Time ours and FLA alternately in ``rounds`` rounds (ours, FLA, FLA, ours, ...), each callable
    taking the round's index and returning that round's time in ms; without FLA (``time_fla`` None),
    ours alone in rounds (:func:`interleave` of the two).

    Returns ``ours_ms`` and ``fla_ms`` (the median over rounds), ``ratio`` (the median over rounds of
    the per-round ratio ours / FLA), ``ratio_rounds`` (the per-round ratios, in order) and
    ``ratio_spread`` (``[min, max]`` of them); FLA's keys are None without FLA. Pure: no GPU.
    """
    timers = {"ours": time_ours} if time_fla is None else {"ours": time_ours, "fla": time_fla}
    return _ours_and_fla(interleave(timers, rounds, reference=None if time_fla is None else "fla"))


def _ours_and_fla(cells: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """:func:`interleave`'s cells of ``ours`` (and ``fla``, where timed, as the reference) in
    :func:`interleaved_rounds`' row shape."""
    ours = cells["ours"]
    return dict(
        ours_ms=ours["ms"],
        fla_ms=cells["fla"]["ms"] if "fla" in cells else None,
        ratio=ours["ratio"],
        ratio_rounds=ours["ratio_rounds"],
        ratio_spread=ours["ratio_spread"],
    )


def _round_timer(fn: Callable[[], Any], sync: Callable[[], None], warmup: int, reps: int) -> Callable[[int], float]:
    """A round timer for :func:`interleaved_rounds`: :func:`_time_ms` of ``fn`` with ``reps``
    repetitions, after ``warmup`` calls in the first round and one in each later one (the other
    kernel ran in between)."""
    return lambda i: _time_ms(fn, sync, warmup if i == 0 else 1, reps)


def interleave_calls(
    calls: Mapping[str, Callable[[], Any]],
    sync: Callable[[], None],
    warmup: int,
    reps: int,
    rounds: int = ROUNDS,
    reference: str | None = None,
    catch: bool = False,
) -> dict[str, dict[str, Any]]:
    """:func:`interleave` of zero-argument ``calls``: ``reps`` CUDA-event timings of each split
    over ``rounds`` (at least one a round), ``warmup`` calls before the first round and one before
    each later one (:func:`_round_timer`)."""
    per_round = max(1, reps // rounds)
    timers = {name: _round_timer(call, sync, warmup, per_round) for name, call in calls.items()}
    return interleave(timers, rounds, reference, catch)


# Gate regimes of the bench inputs (log-decay per token and value head, float32):
# "fast": logsigmoid(U(0, 1)), about -0.47 a token, -30 a 64-token chunk: the state forgets within
#   a chunk, so long rows are numerically short and a decay-truncated context-parallel pre-pass
#   (FlashQLA's, threshold -10) costs one chunk per segment;
# "slow": -exp(U(ln 1e-3, ln 1e-1)), about -0.02 a token, log-uniform like the range of softplus(dt)
#   at Qwen3-Next's dt_bias initialisation: the state remembers thousands of tokens.
GATES = ("fast", "slow")


def _check_gates(gates: str) -> None:
    if gates not in GATES:
        raise ValueError(f"gates: expected one of {', '.join(GATES)}, got {gates!r}")


def log_decay(torch, u, gates: str):
    """The gates of regime ``gates`` (:data:`GATES`) from ``u`` ~ U(0, 1), a tensor of any shape."""
    _check_gates(gates)
    if gates == "fast":
        return torch.nn.functional.logsigmoid(u)
    return -torch.exp(math.log(1e-3) + u * math.log(100.0))


def _inputs(
    torch, seqs: int, length: int, H: int, HV: int, K: int, V: int, seed: int, dtype, gates: str = "fast"
) -> dict:
    """Serving-like inputs: unit-norm keys, g in the regime ``gates`` (:data:`GATES`), beta =
    sigmoid(U(0, 1)); g stays fp32."""
    _check_gates(gates)  # before any device work
    gen = torch.Generator(device="cuda").manual_seed(seed)
    T = seqs * length

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device="cuda")

    k = torch.nn.functional.normalize(randn(1, T, H, K), dim=-1)
    g = log_decay(torch, torch.rand(1, T, HV, generator=gen, device="cuda"), gates)
    beta = torch.rand(1, T, HV, generator=gen, device="cuda").sigmoid()
    cu = torch.arange(seqs + 1, device="cuda", dtype=torch.int64) * length
    return dict(
        q=randn(1, T, H, K).to(dtype), k=k.to(dtype), v=randn(1, T, HV, V).to(dtype), g=g, beta=beta.to(dtype), cu=cu
    )


def _peak_bytes(torch, fn: Callable[[], Any]) -> int:
    """Peak device bytes ``fn`` allocates beyond its inputs while it runs and its outputs are held:
    torch's peak statistics plus CuPy's pool (a memory hook), so either library's allocations count."""
    from cupy.cuda import memory_hook

    class Peak(memory_hook.MemoryHook):
        name = "gdn_verify_peak"
        current = peak = 0

        def malloc_postprocess(self, **kw):
            self.current += kw["mem_size"]
            self.peak = max(self.peak, self.current)

        def free_postprocess(self, **kw):
            self.current -= kw["mem_size"]

    hook = Peak()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with hook:
        out = fn()
        torch.cuda.synchronize()
        del out  # outputs count while they are held
    return int(torch.cuda.max_memory_allocated() - base + hook.peak)


def _rel_rms(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-300))


def _oracle_reference(x: dict, heads: Sequence[int], H: int, HV: int) -> dict[int, tuple[np.ndarray, Any]]:
    """The float64 oracle's ``(o [B, T, 1, V], final_state [N, 1, K, V])`` of each value head in
    ``heads``: heads do not interact, so a head's oracle needs only its own slice of the inputs."""
    cu = x["cu"].cpu().numpy()
    group = HV // H

    def host(name: str, head: int) -> np.ndarray:
        return x[name][:, :, head : head + 1].float().cpu().numpy().astype(np.float64)

    refs = {}
    for hv in heads:
        hk = hv // group
        refs[hv] = oracle(
            host("q", hk),
            host("k", hk),
            host("v", hv),
            host("g", hv),
            host("beta", hv),
            output_final_state=True,
            cu_seqlens=cu if cu.size > 2 else None,
        )
    return refs


def _errors_against(refs: Mapping[int, tuple[np.ndarray, Any]], o, s) -> tuple[float, float]:
    """Relative RMS of ``o`` ``[B, T, HV, V]`` and the final state ``s`` ``[N, HV, K, V]`` (torch, our
    layout) against :func:`_oracle_reference`'s heads, pooled over them: ``(output, state)``."""
    sums = np.zeros(4)  # o diff, o ref, s diff, s ref
    for hv, (o_ref, s_ref) in refs.items():
        o_h = o[:, :, hv].float().cpu().numpy()[:, :, None]
        s_h = s[:, hv].float().cpu().numpy()[:, None]
        sums += [np.sum((o_h - o_ref) ** 2), np.sum(o_ref**2), np.sum((s_h - s_ref) ** 2), np.sum(s_ref**2)]
    return float(np.sqrt(sums[0] / sums[1])), float(np.sqrt(sums[2] / sums[3]))


def _oracle_errors(x: dict, heads: Sequence[int], H: int, HV: int, outs: dict) -> dict:
    """Relative RMS of each implementation's (o, final_state) on ``heads`` against the float64 oracle."""
    refs = _oracle_reference(x, heads, H, HV)
    return {name: _errors_against(refs, o, s) for name, (o, s) in outs.items()}


def _libraries():
    import torch

    from cupy_kernels.chunk import chunk_gated_delta_rule as ours

    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla
    except ImportError:
        fla = None
    return torch, ours, fla


def prefill_bench(
    cases: Sequence[tuple[int, int]] = CASES,
    H: int = 16,
    HV: int = 32,
    K: int = 128,
    V: int = 128,
    progress: Callable[[str], Any] | None = print,
    warmup: int = 3,
    reps: int = REPS,
    seed: int = 0,
    rounds: int = ROUNDS,
) -> list[dict]:
    """Time, memory and accuracy of ours and FLA on ``cases`` of ``(sequences, length)``, bf16 inputs.

    Each row is timed in ``rounds`` interleaved rounds (:func:`interleaved_rounds`) of
    ``max(1, reps // rounds)`` repetitions per kernel, after ``warmup`` calls of each before the first
    round and one before each later round.

    One dict per case: ``shape`` ("S x L"), ``sequences``, ``length``, ``tokens``, ``ours_ms``,
    ``fla_ms`` (medians over rounds), ``ratio`` (ours / FLA: the median of the per-round ratios),
    ``ratio_rounds`` (the per-round ratios), ``ratio_spread`` (``[min, max]`` of them),
    ``ours_peak_bytes``, ``fla_peak_bytes``, ``ours_rel_rms``, ``fla_rel_rms`` (output),
    ``ours_state_rel_rms``, ``fla_state_rel_rms``, ``heads`` (the value heads scored), ``ours_kernels``
    (which of our kernel paths ran), ``device``, ``date``, ``dtype``. FLA's keys (and the ratio's) are
    None where FLA is not importable.
    """
    from cupy_kernels import chunk

    torch, ours, fla = _libraries()
    say = progress or (lambda _msg: None)
    device, today = torch.cuda.get_device_name(), datetime.date.today().isoformat()
    heads = sorted({0, HV - 1})
    rows = []
    for seqs, length in cases:
        x = _inputs(torch, seqs, length, H, HV, K, V, seed, torch.bfloat16)
        cu = None if seqs == 1 else x["cu"]
        args = (x["q"], x["k"], x["v"], x["g"], x["beta"])

        def run_ours(args=args, cu=cu):
            return ours(*args, output_final_state=True, cu_seqlens=cu)

        row: dict[str, Any] = dict(
            shape=f"{seqs} x {length}", sequences=seqs, length=length, tokens=seqs * length, dtype="bfloat16"
        )
        calls = {"ours": run_ours}
        if fla is not None:

            def run_fla(args=args, cu=cu):
                return fla(*args, output_final_state=True, cu_seqlens=cu)

            calls["fla"] = run_fla
        reference = "fla" if fla is not None else None
        row.update(_ours_and_fla(interleave_calls(calls, torch.cuda.synchronize, warmup, reps, rounds, reference)))
        row["ours_kernels"] = chunk.last_kernels
        row["ours_peak_bytes"] = _peak_bytes(torch, run_ours)
        outs = {"ours": run_ours()}
        row["fla_peak_bytes"] = None
        if fla is not None:
            row["fla_peak_bytes"] = _peak_bytes(torch, run_fla)
            outs["fla"] = run_fla()
        errors = _oracle_errors(x, heads, H, HV, outs)
        row["ours_rel_rms"], row["ours_state_rel_rms"] = errors["ours"]
        row["fla_rel_rms"], row["fla_state_rel_rms"] = errors.get("fla", (None, None))
        row.update(heads=heads, device=device, date=today)
        rows.append(row)
        say(format_row(row))
        del x, args, outs
    return rows


def prefill_accuracy(
    dtypes: Sequence[str] = ("bfloat16", "float32"), progress: Callable[[str], Any] | None = print, seed: int = 1
) -> list[dict]:
    """Output and final-state relative RMS against the float64 oracle at :data:`ACCURACY_SHAPE`, all heads.

    One dict per input dtype: ``dtype``, ``shape``, ``ours_rel_rms``, ``ours_state_rel_rms``,
    ``fla_rel_rms``, ``fla_state_rel_rms`` (None without FLA), ``device``, ``date``.
    """
    torch, ours, fla = _libraries()
    say = progress or (lambda _msg: None)
    s = ACCURACY_SHAPE
    rows = []
    for name in dtypes:
        x = _inputs(torch, 1, s["T"], s["H"], s["HV"], s["K"], s["V"], seed, getattr(torch, name))
        args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
        outs = {"ours": ours(*args, output_final_state=True)}
        if fla is not None:
            outs["fla"] = fla(*args, output_final_state=True)
        errors = _oracle_errors(x, range(s["HV"]), s["H"], s["HV"], outs)
        row = dict(dtype=name, shape=f"H={s['H']} HV={s['HV']} K={s['K']} V={s['V']} T={s['T']}")
        row["ours_rel_rms"], row["ours_state_rel_rms"] = errors["ours"]
        row["fla_rel_rms"], row["fla_state_rel_rms"] = errors.get("fla", (None, None))
        row.update(device=torch.cuda.get_device_name(), date=datetime.date.today().isoformat())
        rows.append(row)
        say(
            f"accuracy {name}: ours o {row['ours_rel_rms']:.2e} state {row['ours_state_rel_rms']:.2e}"
            + (f", FLA o {row['fla_rel_rms']:.2e} state {row['fla_state_rel_rms']:.2e}" if fla is not None else "")
        )
        del x, args, outs
    return rows


def _num(x: float | None, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def _mib(x: int | None) -> str:
    return "n/a" if x is None else f"{x / 2**20:.0f} MiB"


def _spread(row: dict) -> str:
    """The ratio's spread over rounds as "min-max", or "n/a" (no FLA, or a row from before the rounds)."""
    spread = row.get("ratio_spread")
    return "n/a" if not spread else f"{spread[0]:.2f}-{spread[1]:.2f}"


def format_row(row: dict) -> str:
    """One progress line of a :func:`prefill_bench` row."""
    return (
        f"{row['shape']}: ours {row['ours_ms']:.3f} ms, FLA {_num(row['fla_ms'], '.3f')} ms, "
        f"ratio {_num(row['ratio'], '.2f')} (rounds {_spread(row)}), extra memory ours {_mib(row['ours_peak_bytes'])} "
        f"FLA {_mib(row['fla_peak_bytes'])}, "
        f"o rel RMS ours {row['ours_rel_rms']:.2e} FLA {_num(row['fla_rel_rms'], '.2e')} "
        f"({row.get('ours_kernels') or 'kernels not recorded'})"
    )


def format_table(rows: list[dict], accuracy: Sequence[dict] = ()) -> str:
    """Markdown tables of :func:`prefill_bench` and :func:`prefill_accuracy` rows, naming the device and date."""
    if not rows:
        return "(no rows)\n"
    r0 = rows[0]
    head = (
        f"Prefill on {r0['device']}, {r0['dtype']} inputs, final state written, {r0['date']}; "
        f"relative RMS against the float64 oracle on value heads {r0['heads']}.\n\n"
    )
    lines = [
        "| sequences x length | tokens | ours ms | FLA ms | ours / FLA | ours / FLA over rounds | ours extra memory "
        "| FLA extra memory | ours o rel RMS | FLA o rel RMS | ours state rel RMS | FLA state rel RMS | our kernels |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['tokens']} | {r['ours_ms']:.3f} | {_num(r['fla_ms'], '.3f')} | "
            f"{_num(r['ratio'], '.2f')} | {_spread(r)} | {_mib(r['ours_peak_bytes'])} | {_mib(r['fla_peak_bytes'])} | "
            f"{r['ours_rel_rms']:.2e} | {_num(r['fla_rel_rms'], '.2e')} | {r['ours_state_rel_rms']:.2e} | "
            f"{_num(r['fla_state_rel_rms'], '.2e')} | {r.get('ours_kernels') or 'n/a'} |"
        )
    text = head + "\n".join(lines) + "\n"
    if accuracy:
        text += f"\nAccuracy against the float64 oracle, all heads, {accuracy[0]['shape']}:\n\n"
        text += "| inputs | ours o | ours state | FLA o | FLA state |\n| --- | --- | --- | --- | --- |\n"
        for a in accuracy:
            text += (
                f"| {a['dtype']} | {a['ours_rel_rms']:.2e} | {a['ours_state_rel_rms']:.2e} | "
                f"{_num(a['fla_rel_rms'], '.2e')} | {_num(a['fla_state_rel_rms'], '.2e')} |\n"
            )
    return text


if __name__ == "__main__":
    print(format_table(prefill_bench(), prefill_accuracy()))
