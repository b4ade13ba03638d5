"""The shortcuts of the gradient tolerance model give the results of the plain computation.

The float64 engine (``core.adjoint.adjoint``) stops at the longest sequence instead of running the
padding up to the chunk multiple (``length=``) and fills the magnitudes of the first rows only
(``magnitude_rows=``); the gradient properties compute independent tolerances in worker processes.
Each must be bitwise what the plain computation gives.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from gdn_verify.core import adjoint as ng
from gdn_verify.core import grad_tolerance as gtol
from gdn_verify.core.gradients import cotangents
from gdn_verify.core.problem import Problem


def _varlen(lengths, HV=2, K=8, V=6, seed=0, dtype=np.float64) -> Problem:
    rng = np.random.default_rng(seed)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    T = int(cu[-1])
    k = rng.standard_normal((1, T, 1, K))
    return Problem(
        q=rng.standard_normal((1, T, 1, K)),
        k=k / np.linalg.norm(k, axis=-1, keepdims=True),
        v=rng.standard_normal((1, T, HV, V)),
        g=np.log(rng.uniform(0.8, 1.0, (1, T, HV))),
        beta=rng.uniform(0, 1, (1, T, HV)),
        initial_state=rng.standard_normal((len(lengths), HV, K, V)).astype(np.float32),
        cu_seqlens=cu,
    ).astype(dtype)


def _stacked_copies(problem: Problem, absolute: float):
    """Three copies of ``problem`` packed and stacked as ``_run_copies`` does: unperturbed, one
    perturbing every stage relatively, one absolutely (the float16 underflow probe)."""
    do, dht = cotangents(problem, 3, True)
    base = gtol._Inputs(
        q=np.asarray(problem.q, np.float64),
        k=np.asarray(problem.k, np.float64),
        v=np.asarray(problem.v, np.float64),
        g=np.asarray(problem.g, np.float64),
        beta=np.asarray(problem.beta, np.float64),
        h0=np.asarray(problem.initial_state, np.float64),
        do=np.asarray(do, np.float64),
        dht=np.asarray(dht, np.float64),
    )
    copies = [
        gtol._Copy("base", base),
        gtol._Copy("all", base, ng.STAGES),
        gtol._Copy("abs", base, ng.STAGES, absolute),
    ]
    packed = [gtol._packed(problem, c.inputs) for c in copies]
    ps = [p for p, _, _ in packed]
    stacked = dataclasses.replace(
        ps[0], **{f: np.concatenate([getattr(p, f) for p in ps]) for f in ("q", "k", "v", "g", "beta", "initial_state")}
    )
    N = ps[0].initial_state.shape[0]
    do_all = np.concatenate([d for _, d, _ in packed])
    dS_all = np.concatenate([s for _, _, s in packed])
    return stacked, do_all, dS_all, gtol._probe_hook(copies, N, 11), N


@pytest.mark.parametrize("lengths", [[1], [3, 1], [63], [64, 2], [65], [70, 5, 12], [128, 1], [0, 0], [40, 0, 100]])
@pytest.mark.parametrize("dg_form", ["direct", "both"])
def test_engine_stopping_at_the_longest_sequence_equals_the_full_run(lengths, dg_form):
    """``length=max(lengths)`` runs the last chunk only to its first padding token; every output is
    bitwise the full run's (the padding's too, but for an absolute hook's), under relative and
    absolute probe hooks; ``magnitude_rows`` gives the first rows' magnitudes of the full run."""
    problem = _varlen(lengths)
    p, do, dS, hook, N = _stacked_copies(problem, absolute=2.0**-25)
    full_mags: dict = {}
    full = ng.adjoint(p, do, dS, chunk_size=64, hook=hook, dg_form=dg_form, magnitudes=full_mags)
    mags: dict = {}
    short = ng.adjoint(
        p, do, dS, chunk_size=64, hook=hook, dg_form=dg_form, magnitudes=mags, length=max(lengths), magnitude_rows=N
    )
    # the tokens of some sequence in every row; padding too in the rows whose hooks are relative (an
    # absolute one gave each padding token its own write u, hence its own dk_state)
    real = np.concatenate([p.token_index[:N] >= 0] * 3)
    real[: 2 * N] = True
    for f in dataclasses.fields(full):
        a, b = getattr(full, f.name), getattr(short, f.name)
        assert (a is None) == (b is None), f.name
        if a is not None:
            np.testing.assert_array_equal(b if f.name == "dh0" else b[real], a if f.name == "dh0" else a[real], f.name)
    assert mags.keys() == full_mags.keys()
    for name in mags:  # the unperturbed rows: the padding's too
        np.testing.assert_array_equal(mags[name], full_mags[name][:N], err_msg=name)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_grad_tolerance_of_a_padded_pack_is_that_of_the_full_engine_run(dtype, monkeypatch):
    """The whole tolerance (reference, bounds, terms, scales) with the engine stopping at the longest
    sequence equals the one with the engine running every padding token."""
    problem = _varlen([5, 70, 1], HV=4, K=16, V=8, seed=2, dtype=dtype)
    do, dht = cotangents(problem, 7, True)
    reference, tolerance = gtol.grad_reference_and_tolerance(problem, do, dht, seed=7)
    engine = ng.adjoint

    def full_run(*args, length=None, magnitude_rows=None, magnitudes=None, **kw):
        out = engine(*args, magnitudes=magnitudes, **kw)
        if magnitudes is not None and magnitude_rows is not None:
            for name in magnitudes:
                magnitudes[name] = magnitudes[name][:magnitude_rows]
        return out

    monkeypatch.setattr(ng, "adjoint", full_run)
    want_reference, want = gtol.grad_reference_and_tolerance(problem, do, dht, seed=7)
    for name, x in want_reference.items():
        assert (x is None) == (reference[name] is None)
        if x is not None:
            assert reference[name].tobytes() == x.tobytes(), name
    assert tolerance.bounds == want.bounds
    assert tolerance.terms == want.terms
    assert tolerance.kappa == want.kappa
    for name, x in want.scales.items():
        np.testing.assert_array_equal(tolerance.scales[name], x)


def _assert_same(got, want) -> None:
    (reference, tolerance), (want_reference, want_tolerance) = got, want
    for name, x in want_reference.items():
        assert (x is None) == (reference[name] is None), name
        if x is not None:
            assert reference[name].tobytes() == x.tobytes(), name
    for f in dataclasses.fields(want_tolerance):
        a, b = getattr(tolerance, f.name), getattr(want_tolerance, f.name)
        if f.name == "scales":
            assert a.keys() == b.keys()
            assert all(a[n].tobytes() == b[n].tobytes() for n in b)
        else:
            assert a == b, f.name


def test_grad_tolerances_in_worker_processes_equal_them_one_by_one(monkeypatch):
    """grad_varlen_equals_separate's sequences and grad_error_growth's prefixes run their references
    and probe batches in the shared worker processes: the same gradients and bounds, bitwise, as
    one task after another here; the pool is started once and kept for the next call."""
    from gdn_verify.core import processes

    monkeypatch.setattr(gtol, "COPY_BUDGET", 64 * 2 * 8 * 6 * 3)  # batches of 3 copies: several per problem
    pack = _varlen([5, 70, 1], HV=2, K=8, V=6, seed=4, dtype=np.float16)
    problems = [pack.sequence(n) for n in range(3)] + [pack]
    jobs = []
    for i, p in enumerate(problems):
        do, dht = cotangents(p, 20 + i, i % 2 == 0)
        jobs.append((p, do, dht, {"dv": "float32"}, None))
    assert len(gtol._batches(pack, 16)) > 1
    processes.shutdown()
    try:
        serial = gtol.grad_references_and_tolerances(jobs, seed=9, workers=1)
        assert processes._pool is None  # one worker: all here, no pool
        parallel = gtol.grad_references_and_tolerances(jobs, seed=9, workers=2)
        pool = processes._pool
        assert pool is not None
        alone = gtol.grad_reference_and_tolerance(*jobs[3][:3], grad_dtypes={"dv": "float32"}, seed=9, workers=2)
        assert processes._pool is pool  # reused, not started again
    finally:
        processes.shutdown()
    assert processes._pool is None
    for got, want in zip(parallel, serial):
        _assert_same(got, want)
    _assert_same(alone, serial[3])
    # the default: small problems stay here
    assert processes.workers_for([gtol.grad_work(p) for p in problems], gtol.PARALLEL_GRAD_WORK, None) == 1
