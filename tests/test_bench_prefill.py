"""The prefill bench's interleaved timing rounds (``gdn_verify.bench.prefill``).

CPU: :func:`interleaved_rounds` with fake timers (the ratio is the median of the per-round ratios,
and a host that drifts over the run leaves it steady where a one-pass timing would not), the round
timers' warm-up, and the table's and progress line's new column. One GPU smoke test (marked
``gpu``, skipped without CuPy, torch or a CUDA device) runs the bench on a tiny shape and checks the
row's fields.
"""

from __future__ import annotations

import statistics

import pytest

from gdn_verify.bench import prefill


def fixed(times):
    """A fake round timer returning ``times[i]`` in round ``i``, logging its calls."""
    calls = []

    def timer(i):
        calls.append(i)
        return times[i]

    timer.calls = calls  # type: ignore[attr-defined]
    return timer


def test_the_reported_ratio_is_the_median_of_the_per_round_ratios():
    ours = [1.0, 1.0, 1.0, 3.0, 3.0]
    fla = [2.0, 1.0, 4.0, 3.0, 2.0]
    row = prefill.interleaved_rounds(fixed(ours), fixed(fla), rounds=5)
    assert row["ours_ms"] == 1.0 and row["fla_ms"] == 2.0  # medians over rounds
    assert row["ratio_rounds"] == [0.5, 1.0, 0.25, 1.0, 1.5]
    assert row["ratio"] == 1.0  # not ours_ms / fla_ms = 0.5
    assert row["ratio_spread"] == [0.25, 1.5]


def test_rounds_interleave_ours_and_fla_in_alternating_order():
    log = []

    def timer(name):
        def time(i):
            log.append((name, i))
            return 1.0

        return time

    prefill.interleaved_rounds(timer("ours"), timer("fla"), rounds=3)
    assert log == [("ours", 0), ("fla", 0), ("fla", 1), ("ours", 1), ("ours", 2), ("fla", 2)]


def test_a_host_drifting_each_round_leaves_the_ratio_steady():
    """Both kernels 10 % slower each round (host latency growing over the run): the times drift
    by 46 % from the first round to the last, the per-round ratio does not move."""
    drift = [1.1**i for i in range(5)]
    row = prefill.interleaved_rounds(fixed([0.8 * d for d in drift]), fixed([1.0 * d for d in drift]), rounds=5)
    assert row["ratio"] == pytest.approx(0.8)
    assert row["ratio_spread"] == pytest.approx([0.8, 0.8])
    assert all(r == pytest.approx(0.8) for r in row["ratio_rounds"])
    assert row["ours_ms"] == pytest.approx(0.8 * 1.1**2)


def test_a_host_drifting_each_call_moves_interleaved_ratios_far_less_than_one_pass():
    """A host whose latency grows with every call (3 % of the device time per call): ours then FLA
    in one pass each (the bench before the rounds) puts FLA late in the drift; interleaved rounds
    keep each ratio within one call's drift of the truth."""
    true_ratio, step = 0.8, 0.03

    def host():
        calls = [0]

        def call(base):
            calls[0] += 1
            return base * (1 + step * calls[0])

        return call

    call = host()
    row = prefill.interleaved_rounds(lambda i: call(true_ratio), lambda i: call(1.0), rounds=5)
    assert abs(row["ratio"] / true_ratio - 1) < step
    call = host()
    one_pass = statistics.median([call(true_ratio) for _ in range(5)]) / statistics.median(
        [call(1.0) for _ in range(5)]
    )
    assert abs(one_pass / true_ratio - 1) > 0.1


def test_without_fla_ours_is_timed_alone_in_rounds():
    ours = fixed([2.0, 1.0, 3.0])
    row = prefill.interleaved_rounds(ours, None, rounds=3)
    assert ours.calls == [0, 1, 2]
    assert row == dict(ours_ms=2.0, fla_ms=None, ratio=None, ratio_rounds=None, ratio_spread=None)


def test_rounds_must_be_positive():
    with pytest.raises(ValueError, match="rounds"):
        prefill.interleaved_rounds(fixed([1.0]), None, rounds=0)


def test_round_timer_warms_up_fully_once_then_once_a_round(monkeypatch):
    seen = []

    def fake_time_ms(fn, sync, warmup, reps):
        seen.append((warmup, reps))
        return 1.0

    monkeypatch.setattr(prefill, "_time_ms", fake_time_ms)
    timer = prefill._round_timer(lambda: None, lambda: None, warmup=3, reps=2)
    prefill.interleaved_rounds(timer, None, rounds=prefill.ROUNDS)
    assert seen == [(3, 2)] + [(1, 2)] * (prefill.ROUNDS - 1)


def _row(**extra):
    row = dict(
        shape="8 x 2048", tokens=16384, ours_ms=0.9, fla_ms=1.2, ratio=0.75, ours_peak_bytes=2**20,
        fla_peak_bytes=2**21, ours_rel_rms=1.7e-3, fla_rel_rms=3.4e-3, ours_state_rel_rms=2.5e-6,
        fla_state_rel_rms=2.5e-3, ours_kernels="prep+wgmma", heads=[0, 31], device="dev", date="2026-11-28",
        dtype="bfloat16",
    )  # fmt: skip
    row.update(extra)
    return row


def test_the_table_shows_the_spread_over_rounds():
    rows = [_row(ratio_rounds=[0.74, 0.75, 0.81], ratio_spread=[0.74, 0.81]), _row(shape="1 x 4096")]
    lines = prefill.format_table(rows).splitlines()
    table = [line for line in lines if line.startswith("|")]
    assert "ours / FLA over rounds" in table[0]
    assert len({line.count("|") for line in table}) == 1  # every line has the header's columns
    assert "| 0.75 | 0.74-0.81 |" in table[2]
    assert "| 0.75 | n/a |" in table[3]  # a row from before the rounds
    assert "ratio 0.75 (rounds 0.74-0.81)" in prefill.format_row(rows[0])
    no_fla = _row(fla_ms=None, ratio=None, fla_peak_bytes=None, fla_rel_rms=None, fla_state_rel_rms=None)
    assert "ratio n/a (rounds n/a)" in prefill.format_row({**no_fla, "ratio_rounds": None, "ratio_spread": None})


@pytest.mark.gpu
def test_bench_rows_carry_the_rounds_on_a_gpu(cp):
    torch = pytest.importorskip("torch", reason="the prefill bench runs on torch inputs")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    rows = prefill.prefill_bench(cases=((1, 256), (2, 128)), H=2, HV=4, progress=None, warmup=1, reps=5, rounds=5)
    for row in rows:
        assert row["ours_ms"] > 0
        if row["fla_ms"] is None:
            assert row["ratio"] is None and row["ratio_rounds"] is None and row["ratio_spread"] is None
            continue
        assert len(row["ratio_rounds"]) == 5
        assert row["ratio"] == statistics.median(row["ratio_rounds"])
        assert row["ratio_spread"] == [min(row["ratio_rounds"]), max(row["ratio_rounds"])]


def test_the_two_gate_regimes():
    """fast: logsigmoid(U(0, 1)) in [-0.69, -0.31], about -30 a 64-token chunk; slow: log-uniform
    magnitudes in [1e-3, 1e-1], median 1e-2, about -1 a chunk; any other name is refused before
    the inputs are made."""
    torch = pytest.importorskip("torch")
    u = torch.rand(200_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    fast, slow = prefill.log_decay(torch, u, "fast"), prefill.log_decay(torch, u, "slow")
    assert -0.70 < float(fast.min()) and float(fast.max()) < -0.31 and 64 * float(fast.mean()) < -25
    assert -0.1 <= float(slow.min()) and float(slow.max()) <= -1e-3
    assert float(slow.median()) == pytest.approx(-1e-2, rel=0.02)
    assert -2.0 < 64 * float(slow.mean()) < -1.0
    with pytest.raises(ValueError, match="gates: expected one of fast, slow"):
        prefill.log_decay(torch, u, "medium")
    with pytest.raises(ValueError, match="gates"):
        prefill._inputs(None, 1, 64, 1, 1, 16, 16, 0, None, gates="medium")
