"""The decode peer bench's pure parts on the CPU: shares of the copy ceiling and the table."""

from __future__ import annotations

import pytest

from gdn_verify.bench.decode import DECODE_PEERS, format_peers_table, peer_fractions


def test_fractions_count_each_peers_own_state_traffic():
    # 1 MB of float32 state copied in 10 us; a peer at 10 us moves as much: 100 %, the bf16-state
    # kernel at 10 us moves half the bytes: 50 %; at 5 us it matches the copy's bandwidth
    got = peer_fractions({"ours": 10.0, "fla": 20.0, "flashinfer-bf16-state": 5.0, "flashinfer": None}, 10**6, 10.0)
    assert got.pop("flashinfer") is None
    assert got == pytest.approx({"ours": 1.0, "fla": 0.5, "flashinfer-bf16-state": 1.0})


def row(H, HV, B, times, errors=None, eager=(), unavailable=None):
    times = dict.fromkeys(DECODE_PEERS) | times
    return dict(
        H=H, HV=HV, batch=B, K=128, V=128, state_bytes=B * HV * 128 * 128 * 4, times_us=times,
        fractions=peer_fractions(times, B * HV * 128 * 128 * 4, 4.0), copy_us=4.0, errors=errors or {},
        eager=list(eager), unavailable=unavailable or {}, device="NVIDIA H100 80GB HBM3", date="2026-11-27",
    )  # fmt: skip


def test_table_has_a_cell_per_peer_and_says_why_a_peer_is_missing():
    rows = [
        row(2, 8, 1, {"ours": 5.7, "ours-step": 5.0, "fla": 5.1}, unavailable={"flashinfer": "not installed"}),
        row(16, 64, 1024, {"ours": 400.0, "flashinfer-bf16-state": 150.0}, {"fla": "RuntimeError: boom"}, ["ours"]),
    ]
    text = format_peers_table(rows)
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert len({line.count("|") for line in table}) == 1 and len(table) == 4
    assert "NVIDIA H100 80GB HBM3, 2026-11-27" in text
    assert "| 2/8 | 1 | 4.0 | n/a | 5.7 (" in text and "| n/a |" in table[2]  # no in-place time recorded
    rows[0]["inplace_us"] = 3.8
    assert "| 2/8 | 1 | 4.0 | 3.8 | 5.7 (" in format_peers_table(rows)
    assert "400.0 (" in table[3] and " eager" in table[3] and "| error |" in table[3]
    assert "- flashinfer: not installed" in text and "- fla at 16/64 B=1024: RuntimeError: boom" in text
    assert format_peers_table([]) == "(no rows)\n"


def test_event_timing_repeats_until_the_minimum_and_divides_by_the_calls():
    """A stand-in clock: each run of 4 calls takes 0.5 ms, so 20 ms needs 40 repeats a sample and
    every sample reads 125 us a call; the eager timer warms each call twice first."""
    from types import SimpleNamespace

    from gdn_verify.bench.decode import _event_median_us, _time_eager

    clock = [0.0]

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = clock[0]

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return end.t - self.t

    torch = SimpleNamespace(cuda=SimpleNamespace(Event=Event, synchronize=lambda: None))
    runs = []

    def run():
        runs.append(1)
        clock[0] += 0.5

    assert _event_median_us(torch, run, 4, min_ms=20.0, samples=3) == pytest.approx(125.0)
    assert len(runs) == 1 + 3 * 40
    calls = []

    def call():
        calls.append(1)
        clock[0] += 0.25

    assert _time_eager(torch, [call, call], min_ms=10.0, samples=2) == pytest.approx(250.0)
    assert len(calls) == 2 * 2 + 2 + 2 * 2 * 20
