"""The peer prefill bench on a CPU (``gdn_verify.bench.floor``, ``peers``, ``peer_table`` and
``scripts/bench_peers.py``): no torch, no GPU.

- the floor: FLOP and bytes against hand counts for a small ragged case (and the triangular
  inverse against a counted forward substitution), the anchors' 0.18 MFLOP per token, the
  datasheet table by device name, the floor taking the larger bound, the copy floor;
- the row plan: the five rows, the 5 x 4 Qwen3.5 rows, the long rows last, each once;
- N-peer interleaving with fake timers: the order of calls, medians, per-round ratios, a peer
  failing mid-run, the two-peer wrapper unchanged;
- the oracle's per-head reference and pooled errors, on NumPy stand-ins for torch tensors;
- the bench loop with a stand-in torch and stand-in peers: a peer that does not load, one that
  raises on one row, a lost CUDA context ending the run after writing its row;
- the JSON document: Markdown of fake rows, merging two partial files, the script writing the JSON
  after every row and keeping the finished rows when interrupted, ``--resume``, ``--merge-only``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import signal
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from gdn_verify.bench import floor, peer_table, peers, prefill
from gdn_verify.core import reference

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- floor


def test_flop_of_a_ragged_sequence_matches_a_hand_count():
    """100 tokens = chunks of 64 and 36; HV = 2, K = 4, V = 8. Per chunk of c tokens:
    K K^T, Q K^T, W: 2 c^2 K each; U, P v_new: 2 c^2 V each; W S, Q S, K^T v_new: 2 c K V each;
    the inverse c (c-1) (c-2) / 3."""
    c64 = 3 * 2 * 64 * 64 * 4 + 2 * 2 * 64 * 64 * 8 + 3 * 2 * 64 * 4 * 8 + 64 * 63 * 62 // 3
    c36 = 3 * 2 * 36 * 36 * 4 + 2 * 2 * 36 * 36 * 8 + 3 * 2 * 36 * 4 * 8 + 36 * 35 * 34 // 3
    assert (c64, c36) == (324992, 93768)
    flop = floor.forward_flop([100], HV=2, K=4, V=8)
    assert flop["total"] == 2 * (c64 + c36)
    assert flop["inverse"] == 2 * (64 * 63 * 62 // 3 + 36 * 35 * 34 // 3)
    assert flop["total"] == sum(flop[p] for p in floor.PRODUCTS)
    # two sequences of 50 are two ragged chunks, not one full one
    assert floor.chunk_lengths([50, 50]) == [50, 50] and floor.chunk_lengths([130]) == [64, 64, 2]


def test_the_inverse_is_counted_as_forward_substitution():
    """Multiply-adds of inverting a unit lower-triangular c x c matrix column by column, counted."""
    for c in (1, 2, 3, 7, 64):
        fmas = 0
        for j in range(c):  # column j of the inverse: x_j = 1, x_i = -A[i, j] - sum_{j<m<i} A[i, m] x_m
            for i in range(j + 1, c):
                fmas += i - j - 1
        assert floor.chunk_flop(c, 1, 1)["inverse"] == 2 * fmas


def test_flop_per_token_is_the_anchors_figure():
    """``shared/anchors.md``: about 0.18 MFLOP per token per value head at K = V = 128, C = 64."""
    per_token = floor.forward_flop([64 * 16], HV=1, K=128, V=128)["total"] / (64 * 16)
    assert 0.17e6 < per_token < 0.19e6


def test_bytes_match_a_hand_count():
    """T = 100, one sequence, H = 1, HV = 2, K = 4, V = 8: q, k 800 each, v 3200, g 800 (fp32),
    beta 400, o 3200, the fp32 state 2 x 4 x 8 x 4 = 256."""
    parts = floor.hbm_bytes([100], H=1, HV=2, K=4, V=8)
    assert parts == dict(q=800, k=800, v=3200, g=800, beta=400, o=3200, state=256, total=9456)
    # q and k once per q-k head: more value heads add v, g, beta, o and state traffic only
    assert floor.hbm_bytes([100], 1, 4, 4, 8)["q"] == parts["q"]
    assert floor.hbm_bytes([50, 50], 1, 2, 4, 8)["state"] == 2 * parts["state"]


@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 SXM5 80GB", "H100 SXM"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H100 PCIe", None),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA H200 NVL", None),
        ("NVIDIA A100-SXM4-80GB", None),
        (None, None),
    ],
)
def test_device_peaks_by_name(name, peak):
    found = floor.device_peak(name)
    assert (found and found.name) == peak


def test_the_datasheet_peaks():
    h100, h200 = floor.PEAKS["H100 SXM"], floor.PEAKS["H200"]
    assert h100.flops == h200.flops == 989.4e12
    assert (h100.bandwidth, h200.bandwidth) == (3.35e12, 4.8e12)


def test_the_floor_is_the_larger_bound():
    compute = floor.floor_ms(2e12, 1e9, flops=1e15, bandwidth=1e12)
    assert compute == dict(compute_ms=2.0, memory_ms=1.0, floor_ms=2.0, bound="compute")
    memory = floor.floor_ms(1e12, 3e9, flops=1e15, bandwidth=1e12)
    assert memory["floor_ms"] == pytest.approx(3.0) and memory["bound"] == "memory"


def test_row_floor_reports_datasheet_and_copy_floors():
    lengths = [65536]
    row = floor.row_floor(lengths, 16, 32, 128, 128, "NVIDIA H100 80GB HBM3", copy_gbps=3000.0)
    flop = floor.forward_flop(lengths, 32, 128, 128)["total"]
    nbytes = floor.hbm_bytes(lengths, 16, 32, 128, 128)["total"]
    assert (row["flop"], row["bytes"], row["peak"]) == (flop, nbytes, "H100 SXM")
    assert row["datasheet"]["memory_ms"] == pytest.approx(nbytes / 3.35e12 * 1e3)
    assert row["datasheet"]["compute_ms"] == pytest.approx(flop / 989.4e12 * 1e3)
    assert row["copy"]["memory_ms"] == pytest.approx(nbytes / 3.0e12 * 1e3)
    assert row["copy"]["compute_ms"] == row["datasheet"]["compute_ms"]
    assert row["copy"]["floor_ms"] >= row["datasheet"]["floor_ms"]  # a copy below the datasheet
    assert sum(row["flop_by_product"].values()) == flop
    unknown = floor.row_floor(lengths, 16, 32, 128, 128, "NVIDIA A100-SXM4-80GB", copy_gbps=1500.0)
    assert unknown["datasheet"] is None and unknown["copy"] is None and unknown["flop"] == flop
    assert floor.row_floor(lengths, 16, 32, 128, 128, "NVIDIA H200")["copy"] is None  # no copy measured


# ---------------------------------------------------------------- the row plan


def test_the_plan_has_every_row_once():
    plan = peers.rows()
    keys = [r.key for r in plan]
    assert len(keys) == len(set(keys))
    standard = {peers.Row(16, 32, s, L) for s, L in prefill.CASES}
    qwen = {peers.Row(H, HV, s, L) for H, HV in peers.QWEN35_LAYOUTS for s, L in peers.QWEN35_SHAPES}
    long = [peers.Row(H, HV, 1, 262144) for H, HV in peers.LONG_LAYOUTS]
    assert len(standard) == 5 and len(qwen) == 20
    assert set(plan) == standard | qwen | set(long)
    assert len(plan) == len(standard | qwen) + len(long)
    assert plan[:5] == [peers.Row(16, 32, s, L) for s, L in prefill.CASES]  # prefill.CASES's five first, in order
    assert plan[-len(long) :] == long  # a kernel that breaks the context there loses no other row
    layouts = {(r.H, r.HV) for r in qwen}
    assert layouts == {(2, 8), (4, 8), (8, 16), (16, 32), (16, 64)}
    assert all(r.K == r.V == 128 for r in plan)


def test_the_oracle_samples_one_head_only_on_the_long_rows():
    for row in peers.rows():
        heads, note = peers.oracle_heads(row)
        assert len(heads) * row.tokens <= peers.ORACLE_TOKEN_HEADS or len(heads) == 1
        if row.tokens == peers.LONG_TOKENS:
            assert heads == [row.HV - 1] and "one value head" in note
        else:
            assert heads == [0, row.HV - 1] and note is None


def test_rows_and_peers_are_selected_by_name():
    plan = peers.rows()
    assert [r.key for r in peers.select_rows(plan, ["^2/8 "])] == [
        "2/8 1x4096",
        "2/8 1x65536",
        "2/8 8x2048",
        "2/8 64x512",
        "2/8 1x262144",
    ]
    assert {r.key for r in peers.select_rows(plan, ["1x262144$", "^4/8 64x"])} == {
        "2/8 1x262144",
        "16/64 1x262144",
        "4/8 64x512",
    }
    assert peers.select_rows(plan, None) == plan
    assert peers.peer_names(None) == list(peers.PEERS)
    assert peers.peer_names("ours, flashqla") == ["ours", "flashqla"]
    with pytest.raises(ValueError, match="unknown peers"):
        peers.peer_names("ours,flash-qla")


def test_every_peer_has_a_loader_and_a_table_column():
    assert set(peers.PEERS + peers.OPTIONAL_PEERS) == set(peers.LOADERS)
    assert peer_table.peer_order(peers.LOADERS) == list(peer_table.ORDER)


def test_a_peer_that_cannot_import_gives_the_reason(monkeypatch):
    def missing():
        raise ImportError("No module named 'flash_qla'")

    monkeypatch.setitem(peers.LOADERS, "flashqla", missing)
    assert peers.load_peer("flashqla") == (None, "ImportError: No module named 'flash_qla'")

    def refused():
        raise peers.PeerUnavailable("no context_parallel keyword")

    monkeypatch.setitem(peers.LOADERS, "ours-cp-off", refused)
    assert peers.load_peer("ours-cp-off") == (None, "no context_parallel keyword")


# ---------------------------------------------------------------- interleaving


def fixed(times, log=None, name=None):
    def timer(i):
        if log is not None:
            log.append((name, i))
        value = times[i]
        if isinstance(value, Exception):
            raise value
        return value

    return timer


def test_n_peers_interleave_in_order_each_round():
    log = []
    timers = {n: fixed([1.0] * 3, log, n) for n in ("ours", "fla", "vllm")}
    prefill.interleave(timers, rounds=3, reference="ours")
    forward = ("ours", "fla", "vllm")
    assert log == [(n, i) for i in range(3) for n in (forward if i % 2 == 0 else forward[::-1])]


def test_a_bias_of_position_cancels_over_alternating_rounds():
    """Whichever kernel runs second in a round is 10 % faster (say, a warm L2): with the order
    alternating over an even number of rounds, two equal kernels come out equal, where a fixed
    order would report 0.9 (what the peer bench of 2026-11-28 showed for two identical calls)."""
    position = []

    def timer(name):
        def time(i):
            position.append(name)
            second = len(position) % 2 == 0
            return 0.9 if second else 1.0

        return time

    cells = prefill.interleave({"a": timer("a"), "b": timer("b")}, rounds=prefill.ROUNDS, reference="a")
    assert prefill.ROUNDS % 2 == 0
    assert cells["b"]["ratio"] == pytest.approx(1.0, abs=0.06)
    assert sorted(cells["b"]["ratio_rounds"]) == pytest.approx([0.9] * 3 + [1 / 0.9] * 3)


def test_n_peer_medians_and_ratios_to_the_reference():
    ours = [1.0, 2.0, 1.0, 4.0, 1.0]
    fla = [2.0, 2.0, 4.0, 4.0, 3.0]  # per round 2, 1, 4, 1, 3 x ours
    vllm = [3.0, 8.0, 1.0, 4.0, 2.0]  # 3, 4, 1, 1, 2 x ours
    cells = prefill.interleave({"ours": fixed(ours), "fla": fixed(fla), "vllm": fixed(vllm)}, 5, reference="ours")
    assert [cells[n]["ms"] for n in ("ours", "fla", "vllm")] == [1.0, 3.0, 3.0]
    assert cells["fla"]["ratio_rounds"] == [2.0, 1.0, 4.0, 1.0, 3.0]
    assert cells["fla"]["ratio"] == 2.0 and cells["fla"]["ratio_spread"] == [1.0, 4.0]
    assert cells["vllm"]["ratio"] == 2.0  # not vllm_ms / ours_ms = 3
    assert cells["ours"]["ratio"] == 1.0 and cells["ours"]["rounds"] == ours
    no_ref = prefill.interleave({"fla": fixed(fla)}, 5)
    assert no_ref["fla"]["ratio"] is None and no_ref["fla"]["ms"] == 3.0


def test_a_peer_failing_mid_run_is_timed_no_more_and_the_others_go_on():
    log = []
    timers = {
        "ours": fixed([1.0, 1.0, 1.0], log, "ours"),
        "fla": fixed([2.0, RuntimeError("CUDA error: too many resources requested\nmore"), 2.0], log, "fla"),
        "vllm": fixed([3.0, 3.0, 3.0], log, "vllm"),
    }
    cells = prefill.interleave(timers, 3, reference="ours", catch=True)
    assert cells["fla"] == {"error": "RuntimeError: CUDA error: too many resources requested"}
    assert ("fla", 2) not in log and ("vllm", 2) in log
    assert cells["vllm"]["ratio"] == 3.0
    timers["ours"] = fixed([ValueError("bad"), 1.0, 1.0])
    timers["fla"] = fixed([2.0, 2.0, 2.0])
    cells = prefill.interleave(timers, 3, reference="ours", catch=True)
    assert "error" in cells["ours"] and cells["fla"]["ms"] == 2.0 and cells["fla"]["ratio"] is None
    with pytest.raises(ValueError, match="bad"):
        prefill.interleave(timers, 3, reference="ours")  # without catch the error propagates


def test_the_two_peer_rounds_keep_their_keys():
    row = prefill.interleaved_rounds(fixed([1.0, 3.0, 2.0]), fixed([2.0, 2.0, 2.0]), rounds=3)
    assert row == dict(ours_ms=2.0, fla_ms=2.0, ratio=1.0, ratio_rounds=[0.5, 1.5, 1.0], ratio_spread=[0.5, 1.5])


def test_one_line_errors():
    assert prefill.one_line(ValueError("first\nsecond")) == "ValueError: first"
    assert prefill.one_line(KeyError()) == "KeyError"
    assert len(prefill.one_line(RuntimeError("x" * 1000))) == 300


# ---------------------------------------------------------------- the oracle on sampled heads


class Host:
    """A NumPy stand-in for the few torch tensor methods the oracle helpers and the peers'
    conversions call."""

    def __init__(self, a):
        self.a = np.asarray(a)

    @property
    def shape(self):
        return self.a.shape

    def __getitem__(self, index):
        return Host(self.a[index])

    def float(self):
        return Host(self.a.astype(np.float32))

    def double(self):
        return Host(self.a.astype(np.float64))

    def int(self):
        return Host(self.a.astype(np.int32))

    def exp(self):
        return Host(np.exp(self.a))

    def reshape(self, *shape):
        return Host(self.a.reshape(*shape))

    def contiguous(self):
        return Host(np.ascontiguousarray(self.a))

    def transpose(self, i, j):
        return Host(np.swapaxes(self.a, i, j))

    def cpu(self):
        return self

    def numpy(self):
        return self.a


def _small_inputs(seqs=2, length=40, H=2, HV=4, K=8, V=8):
    rng = np.random.default_rng(3)
    T = seqs * length
    k = rng.standard_normal((1, T, H, K))
    x = dict(
        q=rng.standard_normal((1, T, H, K)),
        k=k / np.linalg.norm(k, axis=-1, keepdims=True),
        v=rng.standard_normal((1, T, HV, V)),
        g=np.log(1 / (1 + np.exp(-rng.random((1, T, HV))))),
        beta=1 / (1 + np.exp(-rng.random((1, T, HV)))),
    )
    x = {n: a.astype(np.float32) for n, a in x.items()}  # as a float32 run would hold them: .float() is exact
    x["cu"] = np.arange(seqs + 1) * length
    return {n: Host(a) for n, a in x.items()}, x


def test_sampled_heads_score_against_the_oracle():
    x, raw = _small_inputs()
    o, s = reference.recurrent_gated_delta_rule(
        raw["q"], raw["k"], raw["v"], raw["g"], raw["beta"], output_final_state=True, cu_seqlens=raw["cu"]
    )
    refs = prefill._oracle_reference(x, [0, 3], H=2, HV=4)
    assert set(refs) == {0, 3} and refs[3][0].shape == (1, 80, 1, 8) and refs[3][1].shape == (2, 1, 8, 8)
    exact = prefill._errors_against(refs, Host(o), Host(s))
    assert exact[0] < 1e-6 and exact[1] < 1e-6  # the token loop of all heads agrees (to float32 rounding)
    wrong = o.copy()
    wrong[:, :, 3] += 0.5  # head 3 only
    got = prefill._errors_against(refs, Host(wrong), Host(s))
    expected = math.sqrt(0.25 * wrong[:, :, 3].size / (np.sum(o[:, :, 0] ** 2) + np.sum(o[:, :, 3] ** 2)))
    assert got[0] == pytest.approx(expected, rel=1e-5) and got[1] < 1e-6
    wrong[:, :, 1] += 100.0  # a head not sampled changes nothing
    assert prefill._errors_against(refs, Host(wrong), Host(s))[0] == pytest.approx(got[0], rel=1e-12)
    both = prefill._oracle_errors(x, [0, 3], 2, 4, {"a": (Host(o), Host(s)), "b": (Host(wrong), Host(s))})
    assert both["a"][0] < 1e-6 and both["b"][0] == pytest.approx(got[0])


# ---------------------------------------------------------------- peers' conventions, stand-in libraries


def test_ours_runs_twice_where_the_launcher_has_context_parallel(monkeypatch):
    from cupy_kernels import chunk

    seen = []

    def launcher(q, k, v, g, beta, output_final_state=False, cu_seqlens=None, context_parallel="absent"):
        seen.append((output_final_state, cu_seqlens, context_parallel))
        return "o", "state"

    class DeviceOffsets:  # what .cpu() gives is what ours reads: host offsets, no synchronizing copy a call
        def cpu(self):
            return "host cu"

    monkeypatch.setattr(chunk, "chunk_gated_delta_rule", launcher)
    x = {**{n: n for n in ("q", "k", "v", "g", "beta")}, "cu": DeviceOffsets()}
    row = peers.Row(2, 8, 1, 64)
    for name, expected in (("ours", None), ("ours-cp-off", False)):
        peer, reason = peers.load_peer(name)
        assert reason is None and peer(x, row) == ("o", "state")
        assert seen[-1] == (True, "host cu", expected)

    def without(q, k, v, g, beta, output_final_state=False, cu_seqlens=None):
        seen.append("no keyword")
        return "o", "state"

    monkeypatch.setattr(chunk, "chunk_gated_delta_rule", without)
    peer, reason = peers.load_peer("ours-cp-off")
    assert peer is None and "no context_parallel keyword" in reason
    peer, reason = peers.load_peer("ours")
    assert peer(x, row) == ("o", "state") and seen[-1] == "no keyword"  # ours once, as it is


def _fake_flashinfer(monkeypatch, with_cp=True):
    """``flashinfer.gdn_prefill.chunk_gated_delta_rule`` as documented (packed [T, H, K] tokens,
    linear-space alpha, [N, HV, V, K] state), computed by the float64 oracle; records its keywords."""
    calls = []

    def kernel(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
               cu_seqlens=None, use_qk_l2norm_in_kernel=False, use_cp="auto", backend="auto",
               max_seqlen=None):  # fmt: skip
        calls.append(dict(use_cp=use_cp, backend=backend, max_seqlen=max_seqlen, g=g.a, beta=beta.a))
        assert q.a.ndim == 3 and g.a.dtype == beta.a.dtype == np.float32
        o, s = reference.chunk_gated_delta_rule(
            q.a[None], k.a[None], v.a[None], np.log(g.a.astype(np.float64))[None], beta.a[None],
            output_final_state=output_final_state, cu_seqlens=cu_seqlens.a,
        )  # fmt: skip
        return Host(o[0]), Host(s.swapaxes(-1, -2))

    if not with_cp:

        def kernel(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,  # noqa: F811
                   cu_seqlens=None, use_qk_l2norm_in_kernel=False):  # fmt: skip
            calls.append(dict(use_cp="absent", g=g.a, beta=beta.a))
            return Host(np.zeros((q.a.shape[0], v.a.shape[1], v.a.shape[2]))), Host(np.zeros((1, 1, 1, 1)))

    package, module = types.ModuleType("flashinfer"), types.ModuleType("flashinfer.gdn_prefill")
    package.__path__ = []
    module.chunk_gated_delta_rule = kernel
    monkeypatch.setitem(sys.modules, "flashinfer", package)
    monkeypatch.setitem(sys.modules, "flashinfer.gdn_prefill", module)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace())
    return calls


def test_flashinfer_gets_its_own_convention_and_the_result_comes_back_in_ours(monkeypatch):
    calls = _fake_flashinfer(monkeypatch)
    x, raw = _small_inputs()
    row = peers.Row(2, 4, 2, 40, K=8, V=8)
    o_ref, s_ref = reference.chunk_gated_delta_rule(
        raw["q"], raw["k"], raw["v"], raw["g"], raw["beta"], output_final_state=True, cu_seqlens=raw["cu"]
    )
    for name, use_cp in (("flashinfer", False), ("flashinfer-cp", "auto"), ("flashinfer-cp-on", True)):
        peer, reason = peers.load_peer(name)
        assert reason is None and peer.hints == ("max_seqlen",)
        o, s = peer(x, row)
        assert o.shape == (1, 80, 4, 8) and s.shape == (2, 4, 8, 8)  # ours: [1, T, HV, V], [N, HV, K, V]
        assert np.abs(o.a - o_ref).max() < 1e-6 and np.abs(s.a - s_ref).max() < 1e-6  # alpha rounded to float32
        last = calls[-1]
        assert (last["use_cp"], last["backend"], last["max_seqlen"]) == (use_cp, "flashinfer", 40)
        assert np.allclose(last["g"], np.exp(raw["g"].reshape(80, 4)), rtol=1e-6)  # alpha, linear space
        assert peer.describe(row) in (None, f"use_cp={use_cp!r}")


def test_a_flashinfer_without_use_cp_runs_once(monkeypatch):
    calls = _fake_flashinfer(monkeypatch, with_cp=False)
    peer, reason = peers.load_peer("flashinfer-cp")
    assert peer is None and "no use_cp" in reason
    peer, reason = peers.load_peer("flashinfer")
    x, _ = _small_inputs()
    peer(x, peers.Row(2, 4, 2, 40, K=8, V=8))
    assert calls[-1]["use_cp"] == "absent" and peer.hints == ()


# ---------------------------------------------------------------- the bench loop, stand-ins


class FakeCuda:
    def __init__(self):
        self.alive = True

    def is_available(self):
        return True

    def get_device_name(self):
        return "NVIDIA H100 80GB HBM3"

    def synchronize(self):
        if not self.alive:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def empty_cache(self):
        pass


class Call:
    """A stand-in kernel call: its time (ms), extra memory and errors are attributes."""

    def __init__(self, ms, peak=2**20, err=(1e-3, 1e-6), raises=None, on_call=None):
        self.ms, self.peak, self.err, self.raises, self.on_call = ms, peak, err, raises, on_call

    def __call__(self):
        if self.on_call:
            self.on_call()
        if self.raises:
            raise self.raises
        return self.err


def _peer(name, make_call):
    return peers.Peer(name, f"{name} 1.0", f"{name}'s convention", lambda x, row: make_call(row), lambda r, row: r)


@pytest.fixture
def standins(monkeypatch):
    """A stand-in torch in sys.modules and stand-ins for every GPU step of the bench."""
    cuda = FakeCuda()
    torch = SimpleNamespace(
        cuda=cuda,
        version=SimpleNamespace(cuda="13.0"),
        inference_mode=lambda mode=True: contextlib.nullcontext(),
        bfloat16="bfloat16",
    )
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(peers, "copy_bandwidth", lambda torch: {"gbps": 3000.0, "bytes": 2**30})
    monkeypatch.setattr(prefill, "_inputs", lambda *a: {})
    monkeypatch.setattr(prefill, "_time_ms", lambda fn, sync, warmup, reps: fn.ms)
    monkeypatch.setattr(prefill, "_peak_bytes", lambda torch, fn: fn.peak)
    monkeypatch.setattr(prefill, "_oracle_reference", lambda x, heads, H, HV: {})
    monkeypatch.setattr(prefill, "_errors_against", lambda refs, o, s: (o, s))

    def missing():
        raise ImportError("No module named 'flash_qla'")

    loaders = {
        "ours": lambda: _peer("ours", lambda row: Call(1.0)),
        "fla": lambda: _peer("fla", lambda row: Call(2.0, err=(3e-3, 2e-3))),
        "flashinfer": lambda: _peer(
            "flashinfer", lambda row: Call(0.5, raises=ValueError("unsupported layout")) if row.HV == 8 else Call(0.5)
        ),
        "flashqla": missing,
    }
    monkeypatch.setattr(peers, "LOADERS", loaders)
    return cuda


def test_the_bench_runs_every_loaded_peer_and_records_failures(standins):
    plan = [peers.Row(16, 32, 1, 4096), peers.Row(2, 8, 1, 4096)]
    seen = []
    meta = peers.bench(plan, ["ours", "fla", "flashinfer", "flashqla"], on_row=seen.append, progress=None)
    assert meta["not_loaded"] == {"flashqla": "ImportError: No module named 'flash_qla'"}
    assert set(meta["peers"]) == {"ours", "fla", "flashinfer"} and "stopped" not in meta
    assert [r["key"] for r in seen] == ["16/32 1x4096", "2/8 1x4096"]
    first, second = (r["cells"] for r in seen)
    assert first["fla"]["ms"] == 2.0 and first["fla"]["ratio"] == 2.0 and first["fla"]["ours_ms"] == 1.0
    assert first["flashinfer"]["ratio"] == 0.5
    assert first["fla"]["o_rel_rms"] == 3e-3 and first["fla"]["state_rel_rms"] == 2e-3
    assert first["fla"]["peak_bytes"] == 2**20
    datasheet = seen[0]["floor"]["datasheet"]["floor_ms"]
    assert first["fla"]["floor_ratio"] == pytest.approx(2.0 / datasheet)
    assert first["fla"]["floor_copy_ratio"] == pytest.approx(2.0 / seen[0]["floor"]["copy"]["floor_ms"])
    assert second["flashinfer"] == {"error": "ValueError: unsupported layout", "stage": "first call", "run": 0}
    assert second["fla"]["ms"] == 2.0  # the others go on
    assert all(cell["run"] == 0 for r in seen for cell in r["cells"].values())


def test_a_lost_context_ends_the_run_after_writing_its_row(standins):
    def crash():
        standins.alive = False

    peers.LOADERS["fla"] = lambda: _peer("fla", lambda row: Call(2.0, raises=RuntimeError("illegal"), on_call=crash))
    plan = [peers.Row(16, 32, 1, 4096), peers.Row(2, 8, 1, 4096)]
    seen = []
    meta = peers.bench(plan, ["ours", "fla", "flashinfer"], on_row=seen.append, progress=None)
    assert len(seen) == 1 and "the CUDA context was lost" in meta["stopped"]
    cells = seen[0]["cells"]
    assert cells["fla"]["error"] == "RuntimeError: illegal" and cells["fla"]["stage"] == "first call"
    assert cells["flashinfer"]["stage"] == "not run"
    assert "ms" not in cells["ours"] and cells["ours"]["stage"] == "not run"  # never timed: the row ended


def test_without_a_peer_nothing_runs(standins):
    seen = []
    meta = peers.bench([peers.Row(16, 32, 1, 4096)], ["flashqla"], on_row=seen.append, progress=None)
    assert seen == [] and meta["stopped"] == "no peer loaded" and "flashqla" in meta["not_loaded"]


def test_skipped_rows_are_not_run(standins):
    plan = [peers.Row(16, 32, 1, 4096), peers.Row(2, 8, 1, 4096)]
    seen = []
    peers.bench(plan, ["ours"], on_row=seen.append, progress=None, skip=frozenset({"16/32 1x4096"}))
    assert [r["key"] for r in seen] == ["2/8 1x4096"]
    assert seen[0]["plan_index"] == [r.key for r in peers.rows()].index("2/8 1x4096")  # its place in the whole plan


def test_a_failing_oracle_leaves_the_times(standins, monkeypatch):
    def no_memory(*a):
        raise MemoryError("cannot allocate 8 GiB")

    monkeypatch.setattr(prefill, "_oracle_reference", no_memory)
    seen = []
    peers.bench([peers.Row(16, 32, 1, 4096)], ["ours", "fla"], on_row=seen.append, progress=None)
    cells = seen[0]["cells"]
    assert cells["fla"]["ms"] == 2.0 and "error" not in cells["fla"] and "o_rel_rms" not in cells["fla"]
    assert cells["fla"]["accuracy_error"] == "float64 oracle: MemoryError: cannot allocate 8 GiB"
    doc = _doc(_run(["ours", "fla"]), seen)
    assert "`fla` (accuracy; its time stands): float64 oracle: MemoryError" in peer_table.render(doc)


# ---------------------------------------------------------------- documents and tables


def _cell(ms, ratio, run=0, **extra):
    cell = dict(
        ms=ms, rounds=[ms] * 3, ratio=ratio, ratio_rounds=[ratio] * 3, ratio_spread=[ratio, ratio], ours_ms=ms / ratio,
        floor_ratio=ms / 0.5, floor_copy_ratio=ms / 0.6, peak_bytes=3 * 2**20, o_rel_rms=1.7e-3, state_rel_rms=2e-6,
        kernels=None, run=run,
    )  # fmt: skip
    return {**cell, **extra}


def _row(key, index, cells, run=0):
    layout, shape = key.split()
    H, HV = map(int, layout.split("/"))
    seqs, length = map(int, shape.split("x"))
    fl = floor.row_floor([length] * seqs, H, HV, 128, 128, "NVIDIA H100 80GB HBM3", 3000.0)
    return dict(
        key=key, layout=layout, H=H, HV=HV, K=128, V=128, sequences=seqs, length=length, tokens=seqs * length,
        plan_index=index, run=run, floor=fl, heads=[0, HV - 1], oracle_note=None, wall_s=1.0, cells=cells,
    )  # fmt: skip


def _run(peers_run, not_loaded=None, device="NVIDIA H100 80GB HBM3"):
    return dict(
        device=device, date="2026-11-28", started="2026-11-28T10:00:00+00:00",
        versions={"torch": "2.11.0", "triton": "3.6.0", "cupy-cuda13x": "14.2.0", "cuda_runtime": "13.0"},
        peers={n: dict(version=f"{n} 1.0", convention="c", hints=[]) for n in peers_run},
        not_loaded=not_loaded or {}, copy={"gbps": 3000.0},
        peak=dict(name="H100 SXM", flops=989.4e12, bandwidth=3.35e12),
        settings=dict(dtype="bfloat16", K=128, V=128, cu_seqlens="every call", inference_mode=True, warmup=3, reps=10,
                      rounds=5, gates="fast"),
    )  # fmt: skip


def _doc(run, rows):
    doc = peer_table.new_document()
    peer_table.add_run(doc, run)
    for row in rows:
        peer_table.put_row(doc, row)
    return doc


def _tables(text):
    """Each Markdown table of ``text`` as its lines."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables


def test_markdown_shows_times_failures_and_peers_that_did_not_load():
    failed = {"error": "ValueError: unsupported layout", "stage": "first call", "run": 0}
    doc = _doc(
        _run(["ours", "fla"], {"flashqla": "ImportError: No module named 'flash_qla'"}),
        [
            _row("2/8 1x4096", 5, {"ours": _cell(0.4, 1.0), "fla": failed}),
            _row("16/32 1x4096", 0, {"ours": _cell(0.3, 1.0), "fla": _cell(0.9, 3.0)}),
        ],
    )
    text = peer_table.render(doc)
    assert [r["key"] for r in doc["rows"]] == ["16/32 1x4096", "2/8 1x4096"]  # plan order
    tables = _tables(text)
    assert len(tables) == 4  # runs, summary, goal, detail
    for table in tables:
        assert len({line.count("|") for line in table}) == 1, table  # every line has the header's columns
    summary = tables[1]
    assert "| ours | fla |" in summary[0]
    assert summary[2].endswith("| 0.300 | 0.900 (3.00x) |")
    assert summary[3].endswith("| 0.400 | error (first call) |")
    assert "- `flashqla` (run 0): ImportError: No module named 'flash_qla'" in text
    assert "- 2/8 1x4096, `fla` (first call): ValueError: unsupported layout" in text
    assert "NVIDIA H100 80GB HBM3" in text and "2026-11-28" in text and "| 2.11.0 | 3.6.0 | 14.2.0 |" in text
    fl = doc["rows"][0]["floor"]
    assert summary[2].startswith(
        f"| 16/32 | 1 x 4096 | 4096 | {fl['flop'] / 1e9:.1f} | {fl['bytes'] / 1e9:.3f} | "
        f"{fl['datasheet']['floor_ms']:.3f} | {fl['datasheet']['bound']} | {fl['copy']['floor_ms']:.3f} |"
    )
    detail = [line for line in tables[3] if "| fla |" in line and "16/32" in line][0]
    assert "| 3.00 (3.00-3.00) |" in detail and "| 1.8x |" in detail and "| 3 MiB |" in detail
    line = peer_table.format_row(doc["rows"][1], ["ours", "fla"])
    assert "fla first call: ValueError: unsupported layout" in line and "ours 0.400" in line


def test_the_goal_takes_the_fastest_other_peer_and_names_each_shortfall():
    fast = dict(o_rel_rms=3e-3, state_rel_rms=2e-3)
    doc = _doc(
        _run(["ours", "ours-cp-off", "fla", "flashinfer"]),
        [
            # ours-cp-off is ours: never the fastest peer; flashinfer is 2x faster with a third of the memory
            _row("16/32 1x4096", 0, {
                "ours": _cell(0.4, 1.0, peak_bytes=90), "ours-cp-off": _cell(0.1, 0.25, peak_bytes=10),
                "fla": _cell(0.6, 1.5, peak_bytes=60), "flashinfer": _cell(0.2, 0.5, peak_bytes=30, **fast),
            }),
            # ours is the fastest and smallest; met
            _row("2/8 1x4096", 1, {"ours": _cell(0.2, 1.0, peak_bytes=10), "fla": _cell(0.3, 1.5, peak_bytes=20)}),
            # faster, but the state error is past the goal's 1e-4
            _row("4/8 1x4096", 2, {"ours": _cell(0.2, 1.0, state_rel_rms=2e-4), "fla": _cell(0.3, 1.5)}),
            # a failed peer is not the fastest
            _row("8/16 1x4096", 3, {"ours": _cell(0.2, 1.0), "flashinfer": {"error": "E", "stage": "first call"}}),
        ],
    )  # fmt: skip
    goal = {g["key"]: g for g in peer_table.goal_rows(doc)}
    first = goal["16/32 1x4096"]
    assert first["fastest"] == "flashinfer" and first["ours_over_fastest"] == pytest.approx(2.0)
    assert first["memory_ratio"] == pytest.approx(3.0) and not first["met"] and first["accurate"]
    assert not first["fastest_accurate"]
    assert goal["2/8 1x4096"]["met"] and goal["2/8 1x4096"]["ours_over_fastest"] == pytest.approx(1 / 1.5)
    assert not goal["4/8 1x4096"]["met"] and not goal["4/8 1x4096"]["accurate"]
    assert goal["8/16 1x4096"]["fastest"] is None and goal["8/16 1x4096"]["met"]
    text = peer_table.render(doc)
    assert "Met on 2 of 4 rows; the fastest peer itself is within those errors on 2." in text
    assert "| flashinfer | 0.200 | 2.00x | 3.00x |" in text and "| short: time 2.00x, memory 3.00x |" in text
    assert "| short: accuracy |" in text


def test_runs_of_different_gate_regimes_are_not_merged():
    row = _row("2/8 1x4096", 5, {"ours": _cell(0.4, 1.0)})
    fast, slow, before = (_run(["ours"]) for _ in range(3))
    fast["settings"]["gates"], slow["settings"]["gates"] = "fast", "slow"
    del before["settings"]["gates"]  # a file from before the setting: fast gates
    assert len(peer_table.merge(_doc(before, [row]), _doc(fast, [row]))["runs"]) == 2
    with pytest.raises(ValueError, match="different gate regimes"):
        peer_table.merge(_doc(fast, [row]), _doc(slow, [row]))
    assert "(slow gates:" in peer_table.render(_doc(slow, [row]))


def test_merging_two_partial_files_joins_rows_by_key():
    base = _doc(
        _run(["ours", "fla"], {"flashqla": "ImportError: No module named 'flash_qla'"}),
        [
            _row("16/32 1x4096", 0, {"ours": _cell(0.3, 1.0), "fla": {"error": "boom", "stage": "timing", "run": 0}}),
            _row("2/8 1x4096", 5, {"ours": _cell(0.4, 1.0), "fla": _cell(1.2, 3.0)}),
        ],
    )
    other = _doc(
        _run(["ours", "flashqla", "fla"]),
        [
            _row("16/32 1x4096", 0, {"ours": _cell(0.33, 1.0), "flashqla": _cell(0.66, 2.0), "fla": _cell(0.99, 3.0)}),
            _row("4/8 1x4096", 9, {"ours": _cell(0.5, 1.0), "flashqla": _cell(0.5, 1.0)}),
        ],
    )
    before = json.dumps(base), json.dumps(other)
    merged = peer_table.merge(base, other)
    assert (json.dumps(base), json.dumps(other)) == before  # inputs untouched
    assert len(merged["runs"]) == 2
    assert [r["key"] for r in merged["rows"]] == ["16/32 1x4096", "2/8 1x4096", "4/8 1x4096"]
    first = merged["rows"][0]["cells"]
    assert first["ours"]["ms"] == 0.3 and first["ours"]["run"] == 0  # base's own cell wins
    assert first["flashqla"]["ms"] == 0.66 and first["flashqla"]["run"] == 1  # with its run's ours time
    assert first["flashqla"]["ours_ms"] == pytest.approx(0.33)
    assert first["fla"]["ms"] == 0.99 and first["fla"]["run"] == 1  # an error gives way to a result
    added = merged["rows"][2]
    assert added["run"] == 1 and all(c["run"] == 1 for c in added["cells"].values())
    text = peer_table.render(merged)
    assert "Peers that did not load\n\n(none)" in text  # flashqla loaded in run 1
    assert "| 0.660 (2.00x) |" in text
    with pytest.raises(ValueError, match="different devices"):
        peer_table.merge(base, _doc(_run(["ours"], device="NVIDIA H200"), []))
    with pytest.raises(ValueError, match="not a peer-bench document"):
        peer_table.merge(base, {"kind": "something else"})


def _script():
    spec = importlib.util.spec_from_file_location("bench_peers_script", ROOT / "scripts" / "bench_peers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_writes_the_json_after_every_row_and_keeps_them_when_interrupted(tmp_path, monkeypatch):
    script = _script()
    on_disk = []

    def fake_bench(plan, names, on_start, on_row, skip, **kw):
        run = on_start(_run(names))
        for i, key in enumerate(["16/32 1x4096", "2/8 1x4096"]):
            on_row(_row(key, i, {"ours": _cell(0.3, 1.0, run)}, run))
            on_disk.append([r["key"] for r in json.loads((tmp_path / peer_table.JSON_NAME).read_text())["rows"]])
        raise KeyboardInterrupt("signal 15")

    monkeypatch.setattr(script.peers, "bench", fake_bench)
    handler = signal.getsignal(signal.SIGTERM)
    assert script.main([str(tmp_path), "--peers", "ours"]) == 130
    assert signal.getsignal(signal.SIGTERM) is handler  # the script's SIGTERM handler is gone with it
    assert on_disk == [["16/32 1x4096"], ["16/32 1x4096", "2/8 1x4096"]]
    doc = peer_table.load(tmp_path / peer_table.JSON_NAME)
    assert len(doc["rows"]) == 2 and "interrupted (signal 15)" in doc["runs"][0]["stopped"]
    assert doc["runs"][0]["command"] == ["scripts/bench_peers.py", str(tmp_path), "--peers", "ours"]
    assert "16/32" in (tmp_path / peer_table.MD_NAME).read_text()
    assert not list(tmp_path.glob("*.tmp"))

    skipped = []

    def resumed(plan, names, on_start, on_row, skip, **kw):
        skipped.append(skip)
        run = on_start(_run(names))
        on_row(_row("4/8 1x4096", 9, {"ours": _cell(0.5, 1.0, run)}, run))
        return {"device": "NVIDIA H100 80GB HBM3"}

    monkeypatch.setattr(script.peers, "bench", resumed)
    assert script.main([str(tmp_path), "--peers", "ours", "--resume"]) == 0
    assert skipped == [frozenset({"16/32 1x4096", "2/8 1x4096"})]
    doc = peer_table.load(tmp_path / peer_table.JSON_NAME)
    assert [r["key"] for r in doc["rows"]] == ["16/32 1x4096", "2/8 1x4096", "4/8 1x4096"]
    assert [r["run"] for r in doc["rows"]] == [0, 0, 1]


def test_the_script_merges_files_without_a_gpu(tmp_path):
    script = _script()
    a, b = tmp_path / "a", tmp_path / "b"
    peer_table.write(_doc(_run(["ours", "fla"]), [_row("16/32 1x4096", 0, {"ours": _cell(0.3, 1.0)})]), a)
    peer_table.write(_doc(_run(["ours", "flashqla"]), [_row("16/32 1x4096", 0, {"flashqla": _cell(0.6, 2.0)})]), b)
    assert script.main([str(a), "--merge-only", "--merge", str(b / peer_table.JSON_NAME)]) == 0
    doc = peer_table.load(a / peer_table.JSON_NAME)
    assert set(doc["rows"][0]["cells"]) == {"ours", "flashqla"} and len(doc["runs"]) == 2
    assert "| 0.600 (2.00x) |" in (a / peer_table.MD_NAME).read_text()
