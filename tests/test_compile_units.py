"""The compile workers' unit of work: a shape class and a part of its warm calls.

FlashQLA warms a batched class with 24 backward calls, each compiling a fused forward and backward
(20-90 s each on an H100): one worker per class left a cold pool of 4 classes 35 minutes in 4
workers while 11 sat idle. A class of an implementation whose declared ``warm_variants`` compile
apart is now split into units of its calls, scheduled over all the workers; any other class stays
one unit (FLA). ``tests.jit_like.jit_scaled`` compiles per scale (8 warm calls per class), keeps
its compiles in a disk-cache stand-in and logs every call, so each is seen to run once.
"""

from __future__ import annotations

import _thread
import collections
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from gdn_verify import implementations
from gdn_verify.core.shapes import ShapeClass
from gdn_verify.implementations import resolve
from gdn_verify.properties.strategies import Limits, pool_candidates
from gdn_verify.runners.compile import _start_workers, class_calls, unit_calls, warm_calls, warm_class
from gdn_verify.runners.compile_workers import CompilePool, split_units
from tests import jit_like
from tests.jit_like import QlaLike, alive, compiler_pids, worker_children

BATCHED = ShapeClass(2, 4, 16, 8, "float32")
VARLEN = ShapeClass(2, 4, 16, 8, "float32", varlen=True)
FAILING = ShapeClass(1, 2, 60, 32, "float32")  # jit_scaled fails its own call (default scale) alone
CALLS = 1 + jit_like.SCALED_VARIANTS  # warm calls per class of jit_scaled


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cold disk cache for tests.jit_like, in this process and its children."""
    directory = tmp_path / "jit-cache"
    directory.mkdir()
    monkeypatch.setenv(jit_like.CACHE_ENV, str(directory))
    jit_like.jit_scaled.seen.clear()
    yield directory
    jit_like.jit_scaled.seen.clear()


def costing(monkeypatch, seconds: float) -> None:
    """Each new compile key costs ``seconds``, here and in the workers."""
    monkeypatch.setenv("GDN_TEST_COMPILE_SECONDS", str(seconds))
    monkeypatch.setattr(jit_like, "COMPILE_SECONDS", seconds)


def logged(cache: Path) -> list[tuple[int, str]]:
    """Every call of jit_scaled so far: (process id, compile key)."""
    log = cache / jit_like.CALLS_LOG
    lines = log.read_text().splitlines() if log.exists() else []
    return [(int(pid), key) for pid, key in (line.split(" ", 1) for line in lines)]


def started(impl, classes, workers: int) -> CompilePool:
    pool, note = _start_workers(impl, classes, workers, None)
    assert pool is not None and note is None
    return pool


# Units, without processes -----------------------------------------------------------------------
def test_a_class_is_split_only_when_its_warm_variants_compile_apart():
    """FlashQLA's declared calls are split (units of consecutive calls, the class's own first); FLA's
    classes (variants and options that rerun the whole pipeline, not declared) stay one unit each,
    as before, and so does the worker count."""
    qla = QlaLike().impl
    classes = list(
        dict.fromkeys(c.replace(l2norm=False) for c in pool_candidates(Limits(dtype="bfloat16", head_dims=(128,))))
    )
    calls = unit_calls(qla, classes)
    assert sorted(set(calls.values())) == [4, 12] and sum(calls.values()) == 80
    units = split_units(classes, calls, 15)
    assert len(units) == 80 and all(sel is not None and len(sel) == 1 for _, sel in units)
    assert len(split_units(classes, calls, 7)) == 40  # 80 // (4 x 7) = 2 calls a unit
    for c in classes:  # every call of every class in exactly one unit, the class's own in its first
        mine = [sel for k, sel in units if k == c]
        assert mine[0] is not None and mine[0][0] == 0
        assert sorted(i for sel in mine if sel is not None for i in sel) == list(range(calls[c]))
    assert len(class_calls(qla, classes[0])) == 1 + len(warm_calls(qla, classes[0].example(), True)) == 12

    fla = implementations.resolve("numpy")
    fla.extra["compile_classes"] = True  # declared JIT-compiled like fla-chunk: 3 calls, 7 with options
    fla_classes = list(pool_candidates(Limits(dtype="float32")))[:15]
    assert len(class_calls(fla, fla_classes[0], True)) == 7 and unit_calls(fla, fla_classes, fla_classes[:2]) == {}
    assert split_units(fla_classes, {}, 15) == [(c, None) for c in fla_classes]
    assert split_units([BATCHED, VARLEN], {BATCHED: 8, VARLEN: 8}, 8) == [
        (c, (i,)) for c in (BATCHED, VARLEN) for i in range(8)
    ]
    assert split_units([BATCHED, VARLEN], {BATCHED: 24}, 2) == [
        (BATCHED, (i, i + 1, i + 2)) for i in range(0, 24, 3)
    ] + [(VARLEN, None)]  # 25 // (UNIT_ROUNDS x 2): runs of 3


def test_warm_class_runs_the_calls_selected_and_only_the_class_s_own_may_fail(cache, monkeypatch):
    costing(monkeypatch, 0.05)
    impl = resolve("tests.jit_like:jit_scaled")
    assert warm_class(impl, FAILING, calls=[3, 4]) >= 0  # the class's own call not among them: no failure
    assert [key.split("-")[-1] for _, key in logged(cache)] == ["1.1875", "1.25"]
    with pytest.raises(ValueError, match="default scale"):
        warm_class(impl, FAILING, calls=[0, 5])
    with pytest.raises(IndexError):
        warm_class(impl, FAILING, calls=[CALLS])


def test_an_implementation_without_warm_variants_keeps_one_unit_per_class(cache):
    """jit_gdn (FLA-like: no declared variants): one child per class with all its calls, as before."""
    classes = list(pool_candidates(Limits(dtype="float32")))[:4]
    pool = started(resolve("tests.jit_like:jit_gdn"), classes, 8)
    try:
        assert pool.workers == 4 and [(u.shape_class, u.calls) for u in pool.units] == [(c, None) for c in classes]
    finally:
        pool.close()


# Units in worker processes ----------------------------------------------------------------------
COST = 3.0  # seconds per compile key in the pool tests: well above a worker's start-up on 2 loaded cores


def test_two_classes_of_eight_calls_compile_over_eight_workers_in_about_two_calls(cache, monkeypatch):
    """16 units of one call over 8 workers: two rounds, not one class's 8 calls in a row; each call
    ran exactly once, in a worker; then this process warms each class cheaply from the disk cache."""
    costing(monkeypatch, COST)
    impl = resolve("tests.jit_like:jit_scaled")
    start = time.monotonic()
    pool = started(impl, [BATCHED, VARLEN], 8)
    try:
        assert pool.workers == 8 and len(pool.units) == 2 * CALLS
        outcomes = {c: pool.wait(c) for c in (BATCHED, VARLEN)}
    finally:
        pool.close()
    wall = time.monotonic() - start
    print(f"\n2 classes x {CALLS} calls of {COST} s over 8 workers: {wall:.1f} s")
    for outcome in outcomes.values():
        assert outcome is not None and outcome.status == "compiled" and outcome.units == CALLS
        assert outcome.seconds >= CALLS * COST * 0.9  # the serial cost: the sum over its units
        assert outcome.wall is not None and outcome.wall < outcome.seconds / 2
    assert wall < 6 * COST  # one unit per class: at least 8 x COST; two rounds and 16 start-ups here

    there = collections.Counter(key for pid, key in logged(cache) if pid != os.getpid())
    assert len(there) == 2 * CALLS and set(there.values()) == {1}  # every warm call, once, in a worker
    assert not any(pid == os.getpid() for pid, _ in logged(cache))
    for c in (BATCHED, VARLEN):
        assert warm_class(impl, c) < COST / 2  # all its calls here: from the disk cache
    assert {key for pid, key in logged(cache) if pid == os.getpid()} == set(there)
    assert not worker_children()


def test_a_class_whose_own_call_fails_fails_though_its_other_units_compile(cache, monkeypatch):
    costing(monkeypatch, 0.5)
    pool = started(resolve("tests.jit_like:jit_scaled"), [FAILING, BATCHED], 8)
    try:
        failing, fine = pool.wait(FAILING), pool.wait(BATCHED)
    finally:
        pool.close()
    assert failing is not None and failing.status == "error" and failing.units == CALLS
    assert "ValueError: K=60 miscompiled at the default scale" in failing.error
    assert fine is not None and fine.status == "compiled" and not fine.error
    keys = collections.Counter(key for _, key in logged(cache))
    assert sum(1 for key in keys if key.startswith("1-2-60-32")) == CALLS  # its variants ran (and compiled)
    assert [u.outcome.status for u in pool.units if u.shape_class == FAILING] == ["error"] + ["compiled"] * (CALLS - 1)


@pytest.fixture
def ctrl_c_raises():
    """SIGINT handled by Python's own KeyboardInterrupt handler for the test, as in a terminal.

    ``_thread.interrupt_main()`` does nothing where SIGINT is ignored, and a process started in the
    background by a non-interactive shell (``nohup .ci/run > log &``) inherits it ignored: there
    the pool ran its units to the end and the test failed with "DID NOT RAISE KeyboardInterrupt"."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


STARTED_WITHIN = 300.0  # seconds for 8 workers to start compiling on 2 loaded cores (a few, unloaded)


def test_ctrl_c_kills_every_unit_s_child_and_starts_no_more(cache, monkeypatch, ctrl_c_raises):
    costing(monkeypatch, 600.0)  # a compile outlasts the test: no unit can end before the Ctrl-C
    pool = started(resolve("tests.jit_like:jit_scaled"), [BATCHED, VARLEN], 8)
    try:  # every running unit's child past its start-up, mid-compile (it wrote compiling-<pid>)
        deadline = time.monotonic() + STARTED_WITHIN
        while len(compiler_pids(cache)) < pool.workers and not any(u.outcome for u in pool.units):
            if time.monotonic() > deadline:
                pytest.fail(f"{len(compiler_pids(cache))} of {pool.workers} workers compiling after {STARTED_WITHIN} s")
            time.sleep(0.05)
        ended = [(u.shape_class.describe(), u.describe(), u.outcome) for u in pool.units if u.outcome]
        assert not ended, f"units ended before the Ctrl-C, which would find nothing to kill: {ended}"
    except BaseException:
        pool.close()
        raise
    compiling = compiler_pids(cache)
    assert len(compiling) == pool.workers == 8 and len(pool.running) == 8 and len(pool.pending) == 8

    ctrl_c = threading.Timer(0.5, _thread.interrupt_main)  # while the main thread waits on the pool
    with pytest.raises(KeyboardInterrupt):
        try:
            ctrl_c.start()
            outcome = pool.wait(BATCHED, until=time.monotonic() + 120)
            pytest.fail(f"no KeyboardInterrupt: the wait returned {outcome} (SIGINT handled? the compiles cut short?)")
        finally:
            pool.close()  # what plan_shapes and warm_plan do on the way out
    ctrl_c.join()
    pids = compiler_pids(cache)
    assert pids == compiling and not any(map(alive, pids)) and not worker_children()
    assert pool._thread is not None and not pool._thread.is_alive() and not pool.pending
    time.sleep(0.3)
    assert compiler_pids(cache) == pids and not worker_children()  # nothing started after closing
    assert all(u.outcome is None or u.outcome.status == "died" for u in pool.units)


def test_a_split_class_reports_its_serial_seconds_units_and_wall_time():
    """The plan's line and the ``compile`` JSON keep the serial cost (the sum over units) and add
    the units and their wall time; the JSON validates against the published schema."""
    from gdn_verify import api
    from gdn_verify.runners.compile import ShapePlan

    jsonschema = pytest.importorskip("jsonschema")
    plan = ShapePlan((BATCHED, VARLEN, FAILING), None, None, True, compile_seconds=190.0, workers=15)
    plan.class_seconds = {BATCHED: 300.0, VARLEN: 2.0, FAILING: 1.0}
    plan.parallel_seconds = {VARLEN: 700.0, FAILING: 2100.0}
    plan.parallel_units, plan.parallel_wall = {VARLEN: 4, FAILING: 12}, {VARLEN: 90.0, FAILING: 180.0}
    line = plan.parallel()
    assert line == (
        "3 classes compiled in 190 s, 2 of them in 15 worker processes as 16 units "
        "(slowest class 2100 s of compiles in 180 s; serial sum 3100 s)"
    )
    compile = api._plan_dict(plan, 200.0)["compile"]
    assert compile["worker_seconds"][FAILING.describe()] == 2100.0 and compile["worker_units"][VARLEN.describe()] == 4
    assert compile["worker_wall_seconds"][FAILING.describe()] == 180.0
    schema = json.loads(api.SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator({"$schema": schema["$schema"], **schema["properties"]["compile"]}).validate(
        json.loads(json.dumps(compile))
    )
    plan.parallel_units, plan.parallel_wall = {}, {}  # no class split (FLA): the line and the JSON as before
    assert plan.parallel() == (
        "3 classes compiled in 190 s, 2 of them in 15 worker processes (slowest class 2100 s; serial sum 3100 s)"
    )
    assert "worker_units" not in api._plan_dict(plan, 200.0)["compile"]


def test_the_classes_the_pool_needs_start_past_the_budget_and_the_others_do_not(cache, monkeypatch):
    """A unit starts only before ``start_by``, unless its class is one the planner must wait for (the
    pool's first MIN_CLASSES): compiling that in the parent would cost its calls in a row."""
    from gdn_verify.runners.compile import MIN_CLASSES, _needed

    costing(monkeypatch, 0.3)
    pool = started(resolve("tests.jit_like:jit_scaled"), [BATCHED, VARLEN], 2)
    try:
        assert len(pool.units) == 8 and len(pool.running) == 2  # runs of 2 calls; two of BATCHED running
        pool.start_by = time.monotonic() - 1
        pool.require([VARLEN])
        assert pool.wait(BATCHED) is None  # its other units will not start
        varlen = pool.wait(VARLEN)
        assert varlen is not None and varlen.status == "compiled" and varlen.units == 4
        assert [u.outcome is None for u in pool.units if u.shape_class == BATCHED] == [False, False, True, True]
    finally:
        pool.close()
    candidates = list(pool_candidates(Limits(dtype="float32")))
    free = candidates[2]  # compiled already under the implementation's key
    needed = _needed(candidates, candidates[:2], {free}, lambda c: c)
    assert needed == candidates[3:MIN_CLASSES]  # 2 in the pool, 1 free: one to compile


def test_a_planned_pool_records_its_split_classes(cache, monkeypatch):
    """Through plan_shapes: the classes past the probe compile as units in the workers, and this
    process then warms them cheaply; the plan keeps their units and wall time."""
    from gdn_verify.runners.compile import plan_shapes

    costing(monkeypatch, 0.5)
    candidates = pool_candidates(Limits(dtype="float32", head_dims=(16, 32)))[:4]  # small: cheap NumPy calls
    plan = plan_shapes(resolve("tests.jit_like:jit_scaled"), candidates, 60, workers=8)
    print(f"\n{plan.describe()}")
    assert plan.classes == candidates and plan.workers == 8 and not plan.note and not plan.worker_errors
    assert plan.parallel_units == {c: CALLS for c in candidates[2:]} and set(plan.parallel_wall) == set(candidates[2:])
    assert all(plan.parallel_seconds[c] >= CALLS * 0.5 * 0.9 for c in candidates[2:])
    assert all(plan.class_seconds[c] < CALLS * 0.5 / 2 for c in candidates[2:])  # from the disk cache here
    assert "2 of them in 8 worker processes as 16 units (slowest class" in plan.describe()
    there = collections.Counter(key for pid, key in logged(cache) if pid != os.getpid())
    assert len(there) == 2 * CALLS and set(there.values()) == {1}
