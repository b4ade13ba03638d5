"""The fast NumPy oracle path of ``oracle_and_tolerance`` computes what the straightforward one did.

The fast path (``verdict.oracle_and_tolerance`` with ``numpy_oracle``) takes the state norms from
the reference run, stacks the condition reruns into one token loop, updates the state by one BLAS
call per block and perturbs the rounding probes by slices. Kappa is a difference of float64 runs
divided by 2^-30, so any change in the oracle's arithmetic moves it by about 1e-8: agreement to
1e-9 pins the same arithmetic. The slow path kept here is the code before those changes: the plain
token loop, one oracle call per rerun, and the rounding probe with fancy-indexed signs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gdn_verify.core import reference as ref
from gdn_verify.core import tolerance as tol
from gdn_verify.core.conventions import Packed, export_state, unpack_output
from gdn_verify.core.oracle import numpy_oracle, numpy_oracle_stacked, numpy_oracle_with_norms, pack_problem, token_loop
from gdn_verify.core.problem import DTYPES, Problem
from gdn_verify.core.reference import chunk_core, recurrent_core, stack_packed
from gdn_verify.core.shapes import ShapeClass
from gdn_verify.core.verdict import oracle_and_tolerance

RTOL = 1e-9


def _plain_recurrent_core(p: Packed, norms: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The token loop as it was: NumPy's broadcast outer product, one sequence scale."""
    S = p.initial_state.copy()
    N, L, HV, V = p.v.shape
    o = np.empty((N, L, HV, V))
    decay = np.exp(p.g)
    for t in range(L):
        S *= decay[:, t, :, None, None]
        k_t = p.k[:, t, :, None, :]
        u = p.beta[:, t, :, None] * (p.v[:, t] - (k_t @ S)[:, :, 0])
        S += k_t.swapaxes(-1, -2) * u[:, :, None, :]
        o[:, t] = p.scale * (p.q[:, t, :, None, :] @ S)[:, :, 0]
        if norms is not None:
            norms[:, t] = np.sqrt(np.einsum("nhkv,nhkv->nh", S, S))
    return o, S


def _plain_oracle(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    p = pack_problem(problem)
    o, S = _plain_recurrent_core(p)
    return unpack_output(p, o), export_state(p, S)


def _plain_rounding_condition(problem, reference, scales, seed, copies=None):
    """``tolerance.rounding_condition`` the straightforward way (fancy-indexed rows, signs as 2 b - 1,
    one copy's rows at a time), with the same random numbers (each draw's own stream)."""
    eta = tol.underflow_unit(problem.dtype)
    copies = tol.rounding_copies(problem) if copies is None else copies
    streams = [np.random.default_rng([seed, 2, list(tol.ROUNDINGS).index(n), d]) for n, d in copies]
    longest = int(problem.lengths.max(initial=1))
    C = min(tol.MAX_CHUNK, 1 << max(1, (longest - 1).bit_length()))
    p = pack_problem(problem, C)
    N = p.v.shape[0]
    owner = np.repeat(np.arange(len(copies)), N)

    def perturb(x, stage):
        out = x
        for i, (name, _) in enumerate(copies):
            if stage not in tol.ROUNDINGS[name]:
                continue
            rows = np.flatnonzero(owner == i)
            out = out.copy() if out is x else out
            signs = streams[i].integers(0, 2, size=(rows.size,) + x.shape[1:], dtype=np.int8) * 2.0 - 1.0
            if name == "underflow":
                out[rows] += tol.PERTURBATION * eta * signs
            else:
                out[rows] *= 1.0 + tol.PERTURBATION * signs
        return out

    def stack(x):
        return np.concatenate([x] * len(copies))

    stacked = dataclasses.replace(
        p,
        q=perturb(stack(p.q), "qk"),
        k=perturb(stack(p.k), "qk"),
        v=stack(p.v),
        g=stack(p.g),
        beta=stack(p.beta),
        initial_state=stack(p.initial_state),
    )
    o, S = chunk_core(stacked, C, hook=lambda stage, x: perturb(x, stage))
    out = {}
    for i, (name, _) in enumerate(copies):
        part = slice(i * N, (i + 1) * N)
        errors = tol.measure(
            unpack_output(p, o[part]), export_state(p, S[part]), reference[0], reference[1], problem, scales
        )
        out[name] = np.maximum(out.get(name, 0.0), [getattr(errors, m) / tol.PERTURBATION for m in tol.METRICS])
    return {name: tuple(float(v) for v in x) for name, x in out.items()}


def _slow_oracle_and_tolerance(problem: Problem, monkeypatch) -> tuple[tuple, tol.Kappa]:
    """The reference and Kappa computed the straightforward way (an oracle that is not
    ``numpy_oracle``, so every rerun is its own call; the scales from a rerun of the recurrence)."""
    reference = _plain_oracle(problem)
    with monkeypatch.context() as m:
        m.setattr(tol, "recurrent_core", _plain_recurrent_core)
        m.setattr(tol, "rounding_condition", _plain_rounding_condition)
        kappa = tol.condition(problem, reference, oracle=_plain_oracle)
    return reference, kappa


def _problem(seed, B=1, T=40, H=1, HV=2, K=16, V=8, dtype=np.float32, cu=None, state=True, **kw) -> Problem:
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((B, T, H, K))
    N = B if cu is None else len(cu) - 1
    return Problem(
        q=rng.standard_normal((B, T, H, K)),
        k=k / np.linalg.norm(k, axis=-1, keepdims=True),
        v=rng.standard_normal((B, T, HV, V)),
        g=np.log(rng.uniform(0.9, 1.0, (B, T, HV))),
        beta=rng.uniform(0.0, 1.0, (B, T, HV)),
        initial_state=rng.standard_normal((N, HV, K, V)).astype(np.float32) if state else None,
        cu_seqlens=None if cu is None else np.array(cu, np.int64),
        **kw,
    ).astype(dtype)


def _spike(problem: Problem, token: int) -> Problem:
    g = np.array(problem.g, np.float64)
    g[:, token] = -1e4
    return problem.replace(g=g.astype(problem.dtype))


def _state_v_first(problem: Problem) -> Problem:
    return problem.replace(
        initial_state=np.ascontiguousarray(problem.initial_state.swapaxes(-1, -2)), state_v_first=True
    )


BF16 = DTYPES["bfloat16"]
CORPUS = {
    "g1 bfloat16 batched state": ShapeClass(2, 4, 128, 100, "bfloat16", False, True, False).example(),
    "g2 bfloat16 varlen l2norm": ShapeClass(1, 2, 60, 32, "bfloat16", True, False, True).example(seed=1),
    "gva bfloat16 batched scale blas": _problem(2, B=2, H=2, HV=4, K=32, V=48, dtype=BF16, scale=0.3),
    "float16 varlen ragged l2norm": _problem(
        3, T=64, cu=[0, 17, 60, 64], dtype=np.float16, use_qk_l2norm_in_kernel=True
    ),
    "float16 empty sequence, no state": _problem(4, T=30, cu=[0, 0, 30], dtype=np.float16, state=False),
    "float32 saturated gate": _spike(_problem(5, B=2, T=70, K=16, V=8), 40),
    "bfloat16 saturated gate blas": _spike(_problem(6, T=50, H=2, HV=2, K=64, V=40, dtype=BF16), 20),
    "float32 no gates": _problem(7, T=20, dtype=np.float32).replace(g=np.zeros((1, 20, 2), np.float32)),
    "bfloat16 state_v_first varlen": _state_v_first(
        _problem(8, T=33, H=1, HV=1, K=40, V=32, cu=[0, 12, 33], dtype=BF16, scale=0.125)
    ),
    "float32 one token, no final state": _problem(9, T=1, output_final_state=False),
}


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = np.maximum(np.abs(a), np.abs(b))
    return float(np.max(np.abs(a - b) / np.where(scale > 0, scale, 1.0), initial=0.0))


@pytest.mark.parametrize("name", list(CORPUS))
def test_fast_oracle_and_tolerance_equals_the_straightforward_path(name, monkeypatch):
    problem = CORPUS[name]
    (o, state), bound = oracle_and_tolerance(problem)
    (slow_o, slow_state), kappa = _slow_oracle_and_tolerance(problem, monkeypatch)
    assert _rel(o, slow_o) <= RTOL
    if problem.output_final_state:
        assert _rel(state, slow_state) <= RTOL
    else:
        assert state is None
    fast = tol.condition(problem, numpy_oracle(problem))  # condition() on its own takes the fast path too
    slow_bound = tol.tolerance(problem, kappa)
    for field in ("output_rms", "output_token", "state", "kappa_output", "kappa_state", "algorithm"):
        assert _rel(getattr(bound, field), getattr(slow_bound, field)) <= RTOL, field
    for field in ("output_rms", "output_token", "state", "gate", "decay"):
        assert _rel(getattr(fast, field), getattr(kappa, field)) <= RTOL, field
    assert fast.rounding is not None and kappa.rounding is not None
    assert fast.rounding.keys() == kappa.rounding.keys()
    for key in kappa.rounding:
        assert _rel(fast.rounding[key], kappa.rounding[key]) <= RTOL, key
    assert fast.scales is not None and kappa.scales is not None
    assert _rel(fast.scales.token, kappa.scales.token) <= RTOL
    assert _rel(fast.scales.state, kappa.scales.state) <= RTOL
    assert [n for n, _ in bound.terms] == [n for n, _ in slow_bound.terms]
    assert _rel([v for _, v in bound.terms], [v for _, v in slow_bound.terms]) <= RTOL


@pytest.mark.parametrize("name", ["g1 bfloat16 batched state", "gva bfloat16 batched scale blas", "float32 no gates"])
def test_recurrent_core_is_the_plain_token_loop_bitwise(name):
    # The BLAS rank-one update (blocks of 1024 elements and more) and NumPy's broadcast product
    # round the same way; the norms come from the same einsum.
    p = pack_problem(CORPUS[name])
    norms, plain_norms = (np.zeros(p.v.shape[:3]) for _ in range(2))
    o, S = recurrent_core(p, norms)
    plain_o, plain_S = _plain_recurrent_core(p, plain_norms)
    np.testing.assert_array_equal(o, plain_o)
    np.testing.assert_array_equal(S, plain_S)
    np.testing.assert_array_equal(norms, plain_norms)


TILED = [
    ("gva bfloat16 batched scale blas", 64),  # one head a tile (the BLAS update's 32 x 48 blocks)
    ("gva bfloat16 batched scale blas", 3072),  # two heads a tile
    ("gva bfloat16 batched scale blas", 12288),  # two sequences a tile, the last one's norms not kept
    ("float32 saturated gate", 64),
    ("float32 saturated gate", 256),  # one sequence a tile
    ("float32 no gates", 256),
]


@pytest.mark.parametrize(("name", "tile"), TILED)
def test_the_token_loop_by_tiles_is_the_whole_loop_bitwise(name, tile, monkeypatch):
    """Tiles of one head, of several heads and of several sequences (``reference.TILE_ELEMENTS`` made
    small), with per-sequence scales of stacked problems and norms for all but the last sequence,
    give the results of one tile over the whole state, bitwise."""
    problem = CORPUS[name]
    scales = (0.5, 0.7, 1.3, 0.9, 1.1)
    parts = [pack_problem(problem.replace(scale=x)) for x in scales]
    p = stack_packed(parts)
    N = p.v.shape[0]
    scale = np.repeat(scales, parts[0].v.shape[0])
    norms = {x: np.zeros((N - 1,) + p.v.shape[1:3]) for x in ("tiled", "whole")}
    monkeypatch.setattr(ref, "TILE_ELEMENTS", tile)
    assert len(ref._tiles(N, p.v.shape[2], p.k.shape[-1] * p.v.shape[-1])) > 1
    o, S = recurrent_core(p, norms["tiled"], scale=scale)
    monkeypatch.setattr(ref, "TILE_ELEMENTS", 1 << 40)
    want_o, want_S = recurrent_core(p, norms["whole"], scale=scale)
    np.testing.assert_array_equal(o, want_o)
    np.testing.assert_array_equal(S, want_S)
    np.testing.assert_array_equal(norms["tiled"], norms["whole"])


def test_stacked_oracle_runs_each_problem_as_numpy_oracle_does():
    problem = CORPUS["gva bfloat16 batched scale blas"]
    problems = [problem, problem.replace(scale=0.7), problem.replace(g=np.asarray(problem.g, np.float64) * 0.5)]
    for (o, state), x in zip(numpy_oracle_stacked(problems), problems):
        want_o, want_state = numpy_oracle(x)
        np.testing.assert_array_equal(o, want_o)
        np.testing.assert_array_equal(state, want_state)


def test_prefix_oracles_in_worker_processes_equal_them_one_by_one():
    """error_growth's prefixes may run their oracles in spawned processes: the same references and
    tolerances, bitwise, as in this process."""
    from gdn_verify.core.verdict import oracle_and_tolerance, oracles_and_tolerances

    rng = np.random.default_rng(5)
    T, H, HV, K, V = 600, 1, 2, 8, 6  # 600: past the token loop, its reference and parts run apart
    long = Problem(
        rng.standard_normal((1, T, H, K)),
        rng.standard_normal((1, T, H, K)) / np.sqrt(K),
        rng.standard_normal((1, T, HV, V)),
        np.log(rng.uniform(0.9, 1.0, (1, T, HV))),
        rng.uniform(0, 1, (1, T, HV)),
        initial_state=rng.standard_normal((1, HV, K, V)).astype(np.float32),
    ).astype(np.float32)
    parts = [long.tokens(0, n) for n in (64, 130, 600)]
    assert not token_loop(parts[-1]) and token_loop(parts[1])
    parallel = oracles_and_tolerances(parts, workers=2)
    parallel[-1:] = oracles_and_tolerances(parts[-1:], workers=2)  # one problem: its parts still run apart
    for part, (reference, tolerance) in zip(parts, parallel):
        want_reference, want_tolerance = oracle_and_tolerance(part)
        for got, want in zip(reference, want_reference):
            assert got.tobytes() == want.tobytes()
        # field by field (Tolerance compares by identity); Scales.of names the problem object
        for f in dataclasses.fields(tolerance):
            if f.name != "scales":
                assert getattr(tolerance, f.name) == getattr(want_tolerance, f.name), f.name
        for name in ("token", "state"):
            assert getattr(tolerance.scales, name).tobytes() == getattr(want_tolerance.scales, name).tobytes()
        # and they name this process's problem: comparisons use them instead of recomputing them
        assert tol.scales_for(part, tolerance) is tolerance.scales


def _erasing(problem: Problem, keys: np.ndarray) -> Problem:
    """``problem`` with the given keys, ``beta = 1`` and ``v = 0``: every token erases the state along its key."""
    return problem.replace(
        k=keys.astype(problem.dtype),
        beta=np.ones(problem.beta.shape, problem.dtype),
        v=np.zeros(problem.v.shape, problem.dtype),
    )


def _norm_cases() -> dict[str, Problem]:
    strong = _problem(13, T=600, dtype=BF16)
    g = np.array(strong.g, np.float64)
    g[:, ::7] = -np.random.default_rng(13).uniform(1.0, 20.0, g[:, ::7].shape)
    g[:, [100, 500, 501]] = -1e4
    g[:, 300:400] = 0.0
    runs = _problem(14, T=600, K=4, V=4, dtype=BF16)
    repeated = np.repeat(np.asarray(runs.k)[:, ::50], 50, axis=1)  # one key per run of 50 tokens
    signs = _problem(15, T=600, K=1, V=4, dtype=BF16)
    return {
        "bfloat16 state": _problem(10, T=600, dtype=BF16),
        "bfloat16 varlen gva padding": _problem(11, T=1400, H=2, HV=4, cu=[0, 100, 713, 713, 1400], dtype=BF16),
        "gva blas update": _problem(12, T=600, H=2, HV=4, K=32, V=48, dtype=BF16, scale=0.3),
        "strong and zero gates": strong.replace(g=g.astype(BF16)),
        "beta 1 repeated keys": _erasing(runs, repeated),
        "beta 1 keys +-1 erase to zero": _erasing(signs, np.sign(np.asarray(signs.k, np.float64))),
        "float16 l2norm no state": _problem(16, T=520, dtype=np.float16, state=False, use_qk_l2norm_in_kernel=True),
        "float32 state_v_first varlen": _state_v_first(_problem(17, T=900, K=8, V=16, cu=[0, 600, 900])),
    }


@pytest.mark.parametrize("name", list(_norm_cases()))
def test_chunked_oracle_state_norms_equal_the_token_loops(name):
    """Beyond the token-loop regime ``numpy_oracle_with_norms`` takes the norms from the chunked form:
    its outputs are ``numpy_oracle``'s bitwise, its norms the token loop's to 1e-12 relative (measured
    at most 4.4e-16, and 1.6e-15 where repeated keys erase the state to 1e-14 of its size). Where the
    delta rule erases the state exactly (the token loop's norm is 0), each form keeps its own rounding
    residue: within 1e-14 of the largest state it came from (measured 1.7e-15)."""
    problem = _norm_cases()[name]
    assert not token_loop(problem)
    (o, state), norms = numpy_oracle_with_norms(problem)
    want_o, want_state = numpy_oracle(problem)
    np.testing.assert_array_equal(o, want_o)
    np.testing.assert_array_equal(state, want_state)
    p = pack_problem(problem)
    want = np.zeros(p.v.shape[:3])
    recurrent_core(p, want)
    assert norms.shape == want.shape
    # The largest norm the state had, decayed to each token (the initial state included): the size of
    # the rounding residue either form leaves where the state is erased.
    largest = np.empty_like(want)
    with np.errstate(divide="ignore"):
        log_norms, top = np.log(want), np.log(np.linalg.norm(p.initial_state, axis=(-2, -1)))
    for t in range(want.shape[1]):
        top = np.maximum(top + p.g[:, t], log_norms[:, t])
        largest[:, t] = top
    np.testing.assert_array_less(np.abs(norms - want), 1e-12 * want + 1e-14 * np.exp(largest) + 1e-300)
    # the final state's scale, the largest norm decayed to the end, too (token scales are the norms times |q|)
    assert _rel(tol.natural_scales(problem, norms).state, tol.natural_scales(problem).state) <= 1e-12


def test_a_rounding_draw_responds_the_same_alone_or_stacked():
    """condition()'s parts of a long problem run one draw each (in worker processes): each draw's
    response equals the one it gives stacked with the others (the short problems' single run)."""
    problem = _problem(7, T=40, H=1, HV=2, K=16, V=8, use_qk_l2norm_in_kernel=True).astype(np.float16)
    reference, norms = numpy_oracle_with_norms(problem)
    scales = tol.natural_scales(problem, norms)
    copies = tol.rounding_copies(problem)
    assert {name for name, _ in copies} == {"qk", "operands", "stored", "underflow"}
    stacked = tol.rounding_condition(problem, reference, scales, seed=3)
    alone = [tol.rounding_condition(problem, reference, scales, seed=3, copies=[c]) for c in copies]
    merged = tol.kappa_of([{"rounding": r} for r in alone] + [{"inputs": (1.0, 1.0, 1.0)}], scales).rounding
    assert merged is not None and merged.keys() == stacked.keys()
    for name in stacked:
        assert _rel(merged[name], stacked[name]) <= 1e-12, name
    # and the draws differ: a draw of its own, not the same numbers again
    assert alone[0]["qk"] != alone[1]["qk"]
