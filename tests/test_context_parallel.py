"""The context-parallel chunked forward on the CPU: its segmentation, its scan and its choice of
segment count (``cupy_kernels/context_parallel.py``, ``chunk_plan.context_parallel_segments``).

The launcher's three state passes are emulated with the float64 oracle standing in for the state
kernel, through the same ``segment_bounds`` and ``scan_segment_states`` the launcher calls; the
result must equal the oracle on the whole sequences. The GPU launcher itself is tested in
``test_cupy_chunk.py``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from cupy_kernels.chunk import chunk_tables
from cupy_kernels.chunk_plan import (
    CP_GAIN,
    CP_MAX_SEGMENTS,
    CP_MIN_SEGMENT_CHUNKS,
    FUSED_SOURCE,
    PREP_SOURCE,
    WGMMA_K,
    WGMMA_SOURCE,
    ChunkPlan,
    Kernel,
    context_parallel_cost,
    context_parallel_passes,
    context_parallel_segments,
    resident_ctas,
    select_plan,
    state_only,
)
from cupy_kernels.context_parallel import scan_segment_states, segment_bounds
from gdn_verify.core.reference import chunk_gated_delta_rule as oracle

C = 64


@pytest.mark.parametrize(
    "lengths, segments",
    [([4096], 8), ([65, 0, 1, 640, 129], 3), ([100], 5), ([0], 2), ([64 * 7], 7), ([64 * 7 + 1], 7)],
)
def test_segments_are_runs_of_whole_chunks_over_the_same_chunks(lengths, segments):
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    seg = segment_bounds(bounds, C, segments)
    N = len(lengths)
    assert seg.shape == (N * segments + 1,) and np.all(np.diff(seg) >= 0)
    assert np.array_equal(seg[::segments], bounds), "segment 0 of each sequence starts it, the last ends it"
    for n in range(N):
        cuts = seg[n * segments : (n + 1) * segments + 1]
        runs = np.diff(cuts)
        per = math.ceil(math.ceil(lengths[n] / C) / segments)
        # every run that is not empty starts on a chunk boundary of its sequence, and none is longer than its share
        assert np.all((cuts[:-1][runs > 0] - bounds[n]) % C == 0) and max(runs) <= per * C
        assert runs.sum() == lengths[n]
    # the chunk tables list the same chunks: prep's output serves the segments unchanged
    start, length, _ = chunk_tables(bounds, C)
    seg_start, seg_length, seg_off = chunk_tables(seg, C)
    assert np.array_equal(start, seg_start) and np.array_equal(length, seg_length)
    assert seg_off.size == N * segments + 1 and seg_off[-1] == start.size


def emulated(case: dict, segments: int) -> tuple[np.ndarray, np.ndarray]:
    """The launcher's context-parallel passes with the float64 oracle as the state kernel: value
    pass from zero (B), transition pass (zero values, identity start, K columns: M), scan, value
    pass from the scanned starts. Returns ``(o, final_state)`` in the caller's layouts."""
    q, k, v, g, beta = (case[n] for n in ("q", "k", "v", "g", "beta"))
    Bt, T, HV, V = v.shape
    K = k.shape[-1]
    flat = [x.reshape(1, Bt * T, *x.shape[2:]) for x in (q, k, v, g, beta)]  # B > 1: flat tokens
    q, k, v, g, beta = flat
    bounds = np.asarray(case["cu_seqlens"] if case["cu_seqlens"] is not None else np.arange(Bt + 1) * T)
    N, NS = bounds.size - 1, (bounds.size - 1) * segments
    seg = segment_bounds(bounds, C, segments)
    l2 = case["l2norm"]
    _, b = oracle(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=l2, cu_seqlens=seg)
    eye = np.broadcast_to(np.eye(K), (NS, HV, K, K))
    zeros = np.zeros((1, Bt * T, HV, K))
    _, m = oracle(q, k, zeros, g, beta, None, eye, True, l2, cu_seqlens=seg)
    h0 = case["initial_state"]
    if h0 is None:
        h0 = np.zeros((N, HV, K, V))
    elif case["state_v_first"]:
        h0 = np.swapaxes(h0, -1, -2)
    starts, final = scan_segment_states(m, b, np.asarray(h0, np.float64), segments)
    o, _ = oracle(q, k, v, g, beta, None, starts, False, l2, cu_seqlens=seg)
    if case["state_v_first"]:
        final = np.swapaxes(final, -1, -2)
    return o.reshape(Bt, T, HV, V), final


def make_case(seed, B=1, T=300, H=1, HV=2, K=16, V=8, cu_seqlens=None, state=True, v_first=False, l2norm=False):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((B, T, H, K))
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    return dict(
        q=rng.standard_normal((B, T, H, K)),
        k=k if l2norm else k / np.linalg.norm(k, axis=-1, keepdims=True),
        v=rng.standard_normal((B, T, HV, V)),
        g=np.log(rng.uniform(0.9, 1.0, (B, T, HV))),  # slow decay: the start state matters far along
        beta=rng.uniform(0.0, 1.0, (B, T, HV)),
        initial_state=rng.standard_normal((N, HV, V, K) if v_first else (N, HV, K, V)) if state else None,
        cu_seqlens=cu_seqlens,
        state_v_first=v_first,
        l2norm=l2norm,
    )


CASES = {
    "one_sequence": (dict(T=1000), 4),
    "more_segments_than_chunks": (dict(T=200), 9),
    "varlen_ragged_empty": (dict(T=900, cu_seqlens=[0, 1, 64, 64, 600, 900], HV=4, H=2), 3),
    "batched_no_state": (dict(B=2, T=333, state=False), 2),
    "gva_v_first_l2norm": (dict(T=513, H=1, HV=3, K=12, V=20, v_first=True, l2norm=True), 5),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_context_parallel_passes_equal_the_whole_sequence(name):
    spec, segments = CASES[name]
    case = make_case(sum(map(ord, name)), **spec)
    o, s = emulated(case, segments)
    o_ref, s_ref = oracle(
        *(case[n] for n in ("q", "k", "v", "g", "beta")),
        initial_state=case["initial_state"],
        output_final_state=True,
        use_qk_l2norm_in_kernel=case["l2norm"],
        state_v_first=case["state_v_first"],
        cu_seqlens=case["cu_seqlens"],
    )
    # float64 throughout: equal to rounding; a start state off by one segment is off by O(1)
    np.testing.assert_allclose(o, o_ref, rtol=0, atol=1e-9 * np.abs(o_ref).max())
    np.testing.assert_allclose(s, s_ref, rtol=0, atol=1e-9 * np.abs(s_ref).max())


@pytest.mark.parametrize("array", ["numpy", "torch"])
def test_the_scan_starts_each_sequence_from_its_own_state(array):
    """Two sequences, two segments, scalar "states" in the state kernel's order: starts and finals
    by hand, through the NumPy path and the torch one the launcher takes (float32 in, float64 scan)."""
    M = np.array([2.0, 3.0, 5.0, 7.0], np.float32).reshape(4, 1, 1, 1)
    B = np.array([1.0, 1.0, 10.0, 20.0], np.float32).reshape(4, 1, 1, 1)
    initial = np.array([1.0, -1.0]).reshape(2, 1, 1, 1)
    if array == "torch":
        torch = pytest.importorskip("torch")
        M, B, initial = (torch.from_numpy(x) for x in (M, B, initial))
    starts, final = scan_segment_states(M, B, initial, 2)
    assert starts.dtype == M.dtype and final.dtype == initial.dtype
    assert starts.ravel().tolist() == [1.0, 3.0, -1.0, 5.0]  # 2 * 1 + 1 = 3; 5 * -1 + 10 = 5
    assert final.ravel().tolist() == [10.0, 55.0]  # 3 * 3 + 1; 7 * 5 + 20


@pytest.mark.parametrize("array", ["numpy", "torch"])
def test_the_scan_of_blocks_equals_a_loop_over_sequences_and_heads(array):
    """Matrices, three sequences, two heads, four segments: the segment-major reordering against a
    plain loop over (sequence, head) in float64."""
    rng = np.random.default_rng(7)
    N, J, HV, K, V = 3, 4, 2, 5, 3
    M = rng.standard_normal((N * J, HV, K, K)) / K
    B = rng.standard_normal((N * J, HV, K, V))
    initial = rng.standard_normal((N, HV, K, V))
    want_starts = np.empty_like(B)
    want_final = np.empty_like(initial)
    for n in range(N):
        for h in range(HV):
            s = initial[n, h]
            for j in range(J):
                want_starts[n * J + j, h] = s
                s = M[n * J + j, h] @ s + B[n * J + j, h]
            want_final[n, h] = s
    args = (M, B, initial)
    if array == "torch":
        torch = pytest.importorskip("torch")
        args = tuple(torch.from_numpy(x) for x in args)
    starts, final = (np.asarray(x) for x in scan_segment_states(*args, J))
    np.testing.assert_allclose(starts, want_starts, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(final, want_final, rtol=1e-13, atol=1e-13)


H100 = dict(sms=132, capability=(9, 0))


def choose(tokens, sequences, HV, K=128, V=128, requested=None, device=H100):
    """The launcher's choice for an H100 call of ``sequences`` equal sequences of ``tokens``."""
    plan = select_plan(
        "bfloat16", C, K, V, sequences, HV, True, None, None, None, None, device["sms"], device["capability"]
    )
    plan_m = select_plan(
        "bfloat16", C, K, K, sequences, HV, True, None, True, None, None, device["sms"], device["capability"]
    )
    passes = context_parallel_passes(plan, plan_m, sequences, HV, K, V, device["sms"], device["capability"])
    args = (-(-tokens // C), *passes)
    return context_parallel_segments(*args, requested), args


def test_the_choice_splits_long_sequences_at_few_heads_only():
    """Qwen3.5 tensor-parallel layouts on an H100 (wgmma: 64 columns and one CTA per SM): 8 value
    heads leave 16 CTAs on 132 SMs, so a 64k-token sequence is split; 32 value heads (64 CTAs) or
    many sequences fill the device enough that three passes cost more than they save."""
    assert (
        resident_ctas(
            select_plan("bfloat16", C, 128, 128, 1, 8, True, None, None, None, None, 132, (9, 0)).kernels[-1],
            132,
            (9, 0),
        )
        == 132
    )
    j, args = choose(65536, 1, 8)
    assert j > 1 and j * args[1] <= args[2], "one wave per pass"
    assert choose(262144, 1, 8)[0] > 1
    assert choose(65536, 1, 32)[0] == 1
    assert choose(4096, 1, 8)[0] == 1  # 64 chunks: the fixed costs eat the gain
    # measured on an H100 (2026-11-27): J = 8 took 1.5x the plain call's time at 1 x 16384 with 8
    # value heads, and no J gained more than 5 % at 16 value heads up to 131072 tokens
    assert choose(16384, 1, 8)[0] == 1 and choose(65536, 1, 16)[0] == 1
    assert choose(2048, 8, 8)[0] == 1 and choose(512, 64, 32)[0] == 1


@pytest.mark.parametrize("tokens, sequences, HV", [(65536, 1, 8), (65536, 1, 16), (16384, 1, 4), (262144, 1, 8)])
def test_an_auto_split_is_the_cheapest_and_beats_one_pass_by_the_margin(tokens, sequences, HV):
    j, (chunks, ctas, slots, ctas_m, slots_m) = choose(tokens, sequences, HV)
    passes = ((ctas, slots), (ctas_m, slots_m), (ctas, slots))
    plain = context_parallel_cost(chunks, 1, ((ctas, slots),))
    if j == 1:
        assert all(
            context_parallel_cost(chunks, s, passes) * CP_GAIN > plain
            for s in range(2, min(chunks // 8, CP_MAX_SEGMENTS) + 1)
        )
        return
    cost = context_parallel_cost(chunks, j, passes)
    assert cost * CP_GAIN <= plain
    assert all(
        cost <= context_parallel_cost(chunks, s, passes)
        for s in range(2, min(chunks // CP_MIN_SEGMENT_CHUNKS, CP_MAX_SEGMENTS) + 1)
    )


def test_a_requested_split_is_honoured():
    assert choose(65536, 1, 32, requested=6)[0] == 6
    assert choose(100, 1, 32, requested=True)[0] >= 2  # two chunks: one each, where auto keeps one pass
    assert choose(100, 1, 32)[0] == 1
    assert context_parallel_segments(1024, 16, 132, 16, 132, False) == 1


def _plan(path: str, K: int) -> ChunkPlan:
    """A plan of ``path`` ("wgmma" or "fused") for the stand-in state kernel: only its names matter."""
    prep = Kernel(PREP_SOURCE, "gdn_fused_prep", False, 256, 0)
    if path == "wgmma":
        return ChunkPlan(
            "wgmma", True, 4, 1, (prep, Kernel(WGMMA_SOURCE, f"gdn_fused_state_sm90_k{K}", True, 192, 0, 64))
        )
    return ChunkPlan("fused", True, 4, 1, (prep, Kernel(FUSED_SOURCE, "gdn_fused_state<4, 1>", False, 128, 0, 64)))


def test_only_the_wgmma_state_kernel_has_a_form_without_output():
    wgmma, fused = _plan("wgmma", 128), _plan("fused", 128)
    assert state_only(wgmma).kernels[1].name == "gdn_fused_state_sm90_k128_state_only"
    assert state_only(wgmma, values=False).kernels[1].name == "gdn_fused_state_sm90_k128_transition"
    assert state_only(fused, values=False) == fused
    assert state_only(wgmma).kernels[0] == wgmma.kernels[0] and state_only(wgmma).kernels[1].smem == 0
    assert state_only(fused) == fused
    source = (Path(__file__).resolve().parents[1] / "cupy_kernels" / WGMMA_SOURCE).read_text()
    for K in WGMMA_K:  # each entry point the launcher may name exists
        assert f"ENTRY(gdn_fused_state_sm90_k{K}_state_only, {K}, false)" in source
        assert f"ENTRY(gdn_fused_state_sm90_k{K}_transition, {K}, false, false)" in source


@pytest.mark.parametrize("path", ["wgmma", "fused"])
@pytest.mark.parametrize(
    "K, V, v_first, given, kept",
    [(16, 24, True, True, True), (16, 16, False, False, False)],  # K == V: the transition pass writes o, overwritten
)
def test_the_launchers_passes_with_a_stand_in_state_kernel(monkeypatch, path, K, V, v_first, given, kept):
    """``chunk._run_context_parallel`` on CPU torch tensors, each state launch replaced by the
    float64 oracle over the segments its tables name: the passes' arguments (zero values and the
    identity over K columns, zero and scanned start states, the v-first layouts), the scan and the
    final state's copy give the oracle's result on the whole sequences. On the wgmma path the B and
    M passes run the state-only kernel, which writes no output: the stand-in writes none there."""
    torch = pytest.importorskip("torch", reason="the launcher's context-parallel passes work on torch tensors")
    from cupy_kernels import chunk
    from cupy_kernels import tensors as ts

    case = make_case(7, T=700, H=1, HV=2, K=K, V=V, cu_seqlens=[0, 1, 300, 300, 700], v_first=v_first, state=given)
    segments, N = 4, 4
    seg = segment_bounds(np.asarray(case["cu_seqlens"]), C, segments)
    launches = []

    def state(c, plan, prep):
        V, given, kept = c.heads[3], isinstance(c.initial_state, torch.Tensor), isinstance(c.final_state, torch.Tensor)
        launches.append((plan, V, c.state_v_first, given, kept))
        h0 = c.initial_state.double().numpy() if given else None
        form = plan.kernels[1].name
        # the transition form reads no v: its values are zero, whatever the pointer passed
        v = torch.zeros(c.q.shape[:2] + (c.heads[1], V)) if form.endswith("_transition") else c.v
        o, s = oracle(
            *(t.double().numpy() for t in (c.q, c.k, v, c.g, c.beta)),
            initial_state=h0,
            output_final_state=True,
            state_v_first=bool(c.state_v_first),
            cu_seqlens=c.tables[2],
        )
        if not form.endswith(("_state_only", "_transition")):  # the forms without output write none
            c.o.copy_(torch.from_numpy(o))
        if kept:
            c.final_state.copy_(torch.from_numpy(s))

    monkeypatch.setattr(chunk, "_state", state)
    monkeypatch.setattr(chunk, "_prep", lambda c, plan: ("mats", "vecs"))
    monkeypatch.setattr(ts, "pointer", lambda x: x)  # the stand-in reads tensors, not addresses
    x = {n: torch.from_numpy(case[n]).to(torch.float32) for n in ("q", "k", "v", "g", "beta")}
    o = torch.full_like(x["v"], float("nan"))
    final = torch.full((N, 2, V, K) if v_first else (N, 2, K, V), float("nan")) if kept else None
    call = chunk._Call(
        **x, a_log=0, dt_bias=0, initial_state=1 if given else 0, o=o, final_state=final if kept else 0,
        tables=(None, None, seg), heads=(1, 2, K, V), scale=K**-0.5, gate_flags=0, l2norm=0,
        state_v_first=int(v_first), N=N * segments, NC=-1, C=C, like=x["q"], stream=0, device=0,
    )  # fmt: skip
    initial = torch.from_numpy(case["initial_state"]).to(torch.float32) if given else None
    plan, plan_m = _plan(path, K), _plan(path, K)
    chunk._run_context_parallel(call, plan, plan_m, segments, initial, final)

    o_ref, s_ref = oracle(
        *(case[n] for n in ("q", "k", "v", "g", "beta")),
        initial_state=case["initial_state"],
        output_final_state=True,
        state_v_first=v_first,
        cu_seqlens=case["cu_seqlens"],
    )
    plan_b, plan_m = state_only(plan), state_only(plan_m, values=False)
    assert launches == [(plan_b, V, 0, False, True), (plan_m, K, 0, True, True), (plan, V, 0, True, False)]
    assert (plan_b == plan) == (path == "fused")
    np.testing.assert_allclose(o.double().numpy(), o_ref, rtol=0, atol=1e-5 * np.abs(o_ref).max())
    if kept:
        np.testing.assert_allclose(final.double().numpy(), s_ref, rtol=0, atol=1e-5 * np.abs(s_ref).max())
