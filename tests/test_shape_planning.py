"""Compile-aware shape planning (issue 14): a kernel that pays for every new shape class gets a pool.

``tests/jit_like.py`` is the stand-in for a JIT library: a correct (or planted-bug) NumPy
implementation that sleeps on the first call of every new class in the process. The slow tests
(``--runslow``) are the CPU "Done when": a full default ``check`` at 3 s per class.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gdn_verify import api
from gdn_verify.core.implementation import ConfigurationError
from gdn_verify.core.shapes import ShapeClass
from gdn_verify.implementations import planted, resolve
from gdn_verify.properties import catalogue
from gdn_verify.properties.strategies import Limits, pool_candidates
from gdn_verify.runners import compile_workers, workers
from gdn_verify.runners.campaigns import append_campaign, campaign_row
from gdn_verify.runners.check import RunSettings, run_property
from gdn_verify.runners.compile import MIN_CLASSES, plan_shapes
from gdn_verify.runners.fuzz import FuzzReport
from tests import jit_like
from tests.jit_like import alive, compiler_pids, worker_children

ROOT = Path(__file__).resolve().parent.parent
FAST = 0.8  # seconds per new class: well above the 0.5 s threshold, cheap enough for the normal suite


def coverage(classes) -> dict[str, bool]:
    """What bugs hide in, and whether ``classes`` has it."""
    return dict(
        gva=any(c.HV > c.H for c in classes),
        mha=any(c.HV == c.H for c in classes),
        k_not_v=any(c.K != c.V for c in classes),
        awkward=any(c.K % 16 or c.V % 16 for c in classes),
        varlen=any(c.varlen for c in classes),
        batched=any(not c.varlen for c in classes),
        state=any(c.initial_state for c in classes),
        no_state=any(not c.initial_state for c in classes),
        l2norm=any(c.l2norm for c in classes),
        no_l2norm=any(not c.l2norm for c in classes),
    )


# The pool ---------------------------------------------------------------------------------------
def test_every_prefix_of_the_pool_from_four_covers_what_bugs_hide_in():
    candidates = pool_candidates(Limits(dtype="bfloat16"))
    assert len(set(candidates)) == len(candidates) <= 40
    for n in range(MIN_CLASSES, len(candidates) + 1):
        missing = [k for k, v in coverage(candidates[:n]).items() if not v]
        assert not missing, (n, missing)
    assert all(c.dtype == "bfloat16" for c in candidates)


def test_the_pool_stays_within_the_head_sizes_given():
    candidates = pool_candidates(Limits(dtype="float32", head_dims=(64, 128)))
    assert {c.K for c in candidates} | {c.V for c in candidates} <= {64, 128}
    assert coverage(candidates)["k_not_v"]
    assert {c.K for c in pool_candidates(Limits(head_dims=(32,)))} == {32}


POOL = pool_candidates(Limits(dtype="float32"))[:6]
POOLED = Limits(dtype="float32", shape_classes=POOL)


def _spec_class(problem) -> ShapeClass:
    c = ShapeClass.of(problem)  # the spec convention is always varlen with a state pool: compare the rest
    return c.replace(varlen=False, initial_state=False)


@pytest.mark.parametrize("name", list(catalogue(POOLED)))
def test_every_strategy_draws_from_the_pool(name):
    prop = catalogue(POOLED)[name]
    allowed = set(POOL) | {c.replace(initial_state=True) for c in POOL}  # state_layout adds a state to any

    @settings(max_examples=12, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(prop.strategy(resolve("numpy")))
    def draws(case):
        problem, _ = case
        if name.startswith("spec_"):  # every speculative-decoding property draws spec_cases
            assert _spec_class(problem) in {c.replace(varlen=False, initial_state=False) for c in POOL}
        else:
            assert ShapeClass.of(problem) in allowed, ShapeClass.of(problem)

    draws()


@given(st.data())
@settings(max_examples=5, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_large_fuzz_problems_draw_from_the_pool(data):
    large = Limits(dtype="float32", max_len=256, shape_classes=POOL)
    props = catalogue(POOLED, large)
    problem, _ = data.draw(props["matches_reference"].strategy(resolve("numpy")))
    assert ShapeClass.of(problem) in POOL


# The planner ------------------------------------------------------------------------------------
def test_a_cheap_implementation_keeps_full_variety():
    plain = api.implementation(jit_like.compiling(jit_like.numpy_impl.chunk_gated_delta_rule, seconds=0.0))
    plan = plan_shapes(plain, pool_candidates(Limits(dtype="float32")), budget=60)
    assert plan.classes is None and plan.new_class_seconds is not None and plan.new_class_seconds < 0.5
    assert plan_shapes(resolve("numpy"), POOL, 60).new_class_seconds is None  # declared: no probe at all


def test_an_expensive_implementation_gets_a_pool_sized_by_the_budget():
    impl = jit_like.compiled_implementation(resolve("numpy-chunk"), seconds=FAST)
    seen = []
    candidates = pool_candidates(Limits(dtype="float32"))
    plan = plan_shapes(impl, candidates, budget=6, progress=lambda *a: seen.append(a))
    assert plan.expensive and plan.new_class_seconds > 0.5
    assert plan.classes == candidates[: len(plan.classes)]  # a prefix: the most informative first
    assert MIN_CLASSES <= len(plan.classes) <= 8
    assert seen[-1][0] == seen[-1][1] == len(plan.classes)
    assert plan.compile_seconds < 6 + 2 * FAST
    small = plan_shapes(jit_like.compiled_implementation(resolve("numpy-chunk"), FAST), candidates, budget=0.1)
    assert len(small.classes) == MIN_CLASSES  # never fewer than cover what bugs hide in


def test_classes_the_implementation_does_not_support_are_left_out():
    def no_varlen(**kw):
        if kw.get("cu_seqlens") is not None:
            raise NotImplementedError("varlen")
        return jit_like.numpy_impl.chunk_gated_delta_rule(**kw)

    impl = api.implementation(jit_like.compiling(no_varlen, seconds=FAST))
    plan = plan_shapes(impl, pool_candidates(Limits(dtype="float32")), budget=4)
    assert plan.expensive and not any(c.varlen for c in plan.classes)


def test_a_declared_class_key_compiles_each_key_once():
    impl = jit_like.compiled_implementation(resolve("numpy-chunk"), seconds=FAST)
    impl.extra["compile_classes"] = lambda c: (c.H, c.HV, c.K, c.V)  # flags and dtype cost nothing here
    candidates = pool_candidates(Limits(dtype="float32"))  # 18 classes of 3 geometries
    # 3 compiles of FAST fit a 10 s budget with room for a loaded machine (5 s was flaky on 2 busy
    # cores, 2026-11-27); one compile per class would fit about 12 of the 18
    plan = plan_shapes(impl, candidates, budget=10)
    assert plan.declared and len(plan.classes) == len(candidates)  # the flag variants were free


def test_check_with_a_pool_meets_only_compiled_classes_and_says_what_compilation_cost(tmp_path):
    impl = jit_like.compiled_implementation(resolve("numpy"), seconds=FAST)
    names = ["varlen_equals_separate", "state_continuation", "head_mapping", "error_growth", "chunk_equals_recurrent"]
    result = api.check(
        impl, properties=names, max_examples=8, seed=3, cases_dir=tmp_path, compile_budget=5, max_tokens=256
    )
    assert result.passed, result.report()
    pool = set(result.shapes.classes)
    for fn in impl.forms.values():
        assert {ShapeClass(*k) for k in fn.seen} <= pool  # derived calls (twins) were compiled up front
    assert 0 < result.shapes.compile_seconds < result.seconds
    d = result.as_dict()
    assert d["compile"]["shape_classes"] and d["compile"]["seconds"] > 0


def test_the_minimal_example_of_a_planted_bug_stays_in_the_pool(tmp_path):
    impl = jit_like.compiled_implementation(planted.implementation("wrong_gva_mapping"), seconds=FAST)
    result = api.check(impl, properties=["head_mapping"], seed=5, cases_dir=tmp_path, compile_budget=3)
    assert result["head_mapping"].status == "failed"
    assert ShapeClass.of(result["head_mapping"].failure.problem) in result.shapes.classes


# A representative handful of planted bugs, each wrapped as a JIT library; the full set: --runslow.
HANDFUL = ["wrong_gva_mapping", "ragged_chunk_reads_next", "state_across_sequences", "nan_on_zero_rows", "bf16_state"]


def caught_with_compile_cost(bug: str, seconds: float, cases_dir: Path, budget: float | None = None) -> str | None:
    """The first property (selftest order) that fails the bug wrapped as a JIT library, or None."""
    impl = jit_like.compiled_implementation(planted.implementation(bug), seconds=seconds)
    limits, plan = api.plan_limits(impl, Limits(dtype="float32", max_tokens=2048), budget)
    assert plan.expensive or not impl.native_forms  # a speculative-decoding form alone is not probed
    for prop in api.select(catalogue(limits), None, impl):
        result = run_property(prop, impl, RunSettings(seed=1, cases_dir=cases_dir))
        if result.status == "failed":
            return prop.name
    return None


@pytest.mark.parametrize("bug", HANDFUL)
def test_planted_bugs_are_caught_through_the_pool(bug, tmp_path):
    assert caught_with_compile_cost(bug, FAST, tmp_path, budget=4) is not None  # the smallest pool (4 classes)


@pytest.mark.slow
def test_every_planted_bug_is_caught_through_the_pool(tmp_path):
    start, missed = time.monotonic(), []
    for bug in planted.BUGS:
        t = time.monotonic()
        by = caught_with_compile_cost(bug, jit_like.COMPILE_SECONDS, tmp_path)
        print(f"\n  {bug}: {'caught by ' + by if by else 'MISSED'} ({time.monotonic() - t:.0f}s)", flush=True)
        if by is None:
            missed.append(bug)
    print(
        f"\n{len(planted.BUGS)} planted bugs at {jit_like.COMPILE_SECONDS} s per class: {time.monotonic() - start:.0f}s"
    )
    assert not missed


@pytest.mark.slow
def test_a_default_check_of_a_jit_like_kernel_completes_in_five_minutes(tmp_path):
    """The CPU "Done when": 3 s per new class, the defaults, under 5 minutes, at most about 40 classes."""
    code = (
        "import json, sys, time; from gdn_verify import api; from tests import jit_like\n"
        "t = time.monotonic(); r = api.check('tests.jit_like:jit_gdn', seed=20261123, cases_dir=sys.argv[1])\n"
        "print(json.dumps(dict(seconds=time.monotonic() - t, compile=r.shapes.compile_seconds, counts=r.counts(),"
        " seen=sorted(jit_like.SEEN))))"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), GDN_TEST_COMPILE_SECONDS="3")
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    seen = [ShapeClass(*k) for k in got["seen"]]
    print(f"\ncheck: {got['seconds']:.0f}s (compile {got['compile']:.0f}s), {len(seen)} classes, {got['counts']}")
    assert got["counts"]["failed"] == 0
    assert got["seconds"] < 300
    assert len(seen) <= 40
    assert all(coverage(seen).values()), coverage(seen)


# Workers, campaigns.json, the command line --------------------------------------------------------
def test_shards_are_disjoint_and_cover_every_property():
    names = [f"p{i}" for i in range(14)]
    parts = workers.shard(names, 3)
    assert sorted(sum(parts, [])) == sorted(names) and len(parts) == 3
    assert workers.shard(names[:2], 4) == [["p0"], ["p1"], ["p0"], ["p1"]]


def test_workers_are_pinned_one_gpu_each_or_one_blas_thread(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert [e["CUDA_VISIBLE_DEVICES"] for e in workers.worker_environments(3, gpu=True)] == ["2", "5", "2"]
    assert workers.default_workers(gpu=True) == 2
    assert all(e["OMP_NUM_THREADS"] == "1" for e in workers.worker_environments(2, gpu=False))


def test_fuzz_with_two_workers_merges_one_report(tmp_path):
    seen = []
    kw = dict(database=tmp_path / "db", cases_dir=tmp_path / "cases", max_tokens=256)
    report = api.fuzz(
        api.implementation("planted:off_by_one_final_state"),  # resolved, as the CLI passes it
        "8s",
        properties=["matches_reference", "determinism", "linearity"],
        workers=2,
        on_result=seen.append,
        **kw,
    )
    assert report.workers == 2 and not report.worker_errors
    assert report.cases > 2 and [f.name for f in report.failures] == ["matches_reference"]
    assert [r.name for r in seen if r.status == "failed"] == ["matches_reference"]
    assert (tmp_path / "db").is_dir()  # one shared example database
    doc = api.fuzz_document(report, api.implementation("planted:off_by_one_final_state"), "float32")
    assert json.loads(json.dumps(api.jsonable(doc)))["campaign"]["workers"] == 2


def test_worker_misuse_is_a_configuration_error(tmp_path):
    with pytest.raises(ConfigurationError, match="^workers: "):
        api.fuzz("numpy", "1s", workers=0, database=tmp_path)
    with pytest.raises(ConfigurationError, match="^workers: "):
        api.fuzz(lambda **kw: None, "1s", workers=2, database=tmp_path)
    with pytest.raises(ConfigurationError, match="^compile_budget: "):
        api.check("numpy", properties=["determinism"], compile_budget="soon")


def test_campaign_rows_append_to_one_json_list(tmp_path):
    path = tmp_path / "reports" / "campaigns.json"
    report = FuzzReport(cases=12, elapsed=90.0, compile_seconds=30.0)
    row = campaign_row(report, "fla-chunk", "bfloat16", "NVIDIA H100 80GB HBM3", date="2026-11-23")
    append_campaign(path, row)
    rows = append_campaign(path, dict(row, dtype="float32"))
    assert json.loads(path.read_text()) == rows and [r["dtype"] for r in rows] == ["bfloat16", "float32"]
    assert set(rows[0]) == {"impl", "dtype", "cases", "failures", "minutes", "device", "date"}
    assert rows[0]["minutes"] == 2.0 and rows[0]["failures"] == 0


def cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def test_cli_check_shows_compilation(tmp_path):
    out = cli(
        "check",
        "--impl",
        "tests.jit_like:jit_gdn",
        "--properties",
        "determinism,linearity",
        "--max-examples",
        "5",
        "--compile-budget",
        "4s",
        "--json",
        "r.json",
        cwd=tmp_path,
        env={"GDN_TEST_COMPILE_SECONDS": str(FAST)},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # Captured, not a terminal: no "compiling N shape classes" progress line; the closing lines say it.
    assert "compiling" not in out.stderr
    assert "; compile " in out.stdout and " of " in out.stdout.split("; compile ")[1]
    doc = json.loads((tmp_path / "r.json").read_text())  # the final document carries the compile plan too
    assert doc["status"] == "complete" and doc["compile"]["shape_classes"] and doc["seconds"] > 0


def test_cli_fuzz_writes_its_json_and_a_campaign_row(tmp_path):
    args = ["fuzz", "--impl", "numpy", "--budget", "3s", "--max-tokens", "128", "--database", str(tmp_path / "db")]
    for _ in range(2):
        out = cli(*args, "--json", "fuzz.json", "--campaigns", "reports/campaigns.json", cwd=tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr
    rows = json.loads((tmp_path / "reports" / "campaigns.json").read_text())
    assert len(rows) == 2 and rows[0]["impl"] == "numpy" and rows[0]["dtype"] == "float32"
    assert rows[0]["cases"] > 0 and rows[0]["device"]  # the CPU's name without a GPU
    assert json.loads((tmp_path / "fuzz.json").read_text())["campaign"]["cases"] == rows[1]["cases"]


# Compiling in worker processes ----------------------------------------------------------------------
WORKER_COST = 2.0  # seconds per new class in a worker test: well above a worker's start-up


@pytest.fixture
def jit_cache(tmp_path, monkeypatch):
    """``tests.jit_like``'s plug-ins cold in this process, at ``WORKER_COST`` per class, with an
    on-disk cache (the folder returned) that worker processes share with this one."""
    cache = tmp_path / "jit-cache"
    cache.mkdir()
    monkeypatch.setenv(jit_like.CACHE_ENV, str(cache))
    monkeypatch.setenv("GDN_TEST_COMPILE_SECONDS", str(WORKER_COST))
    monkeypatch.setattr(jit_like, "COMPILE_SECONDS", WORKER_COST)
    cold = [jit_like.SEEN, jit_like.jit_picky.seen, jit_like.jit_stuck.seen]
    for seen in cold:
        seen.clear()
    yield cache
    for seen in cold:
        seen.clear()


def test_a_cold_pool_compiles_in_about_one_class_time_with_workers(jit_cache):
    candidates = pool_candidates(Limits(dtype="float32"))[:16]
    seen = []
    plan = plan_shapes(resolve("tests.jit_like:jit_gdn"), candidates, 120, lambda *a: seen.append(a), workers=14)
    serial = len(candidates) * WORKER_COST
    print(f"\n{plan.describe()}")
    assert plan.classes == candidates and plan.workers == 14 and not plan.note and not plan.worker_errors
    assert plan.compile_seconds < serial / 2  # two probed classes, then the rest at once: not 16 x 2 s
    assert set(plan.parallel_seconds) == set(candidates[2:])
    assert all(s >= WORKER_COST * 0.9 for s in plan.parallel_seconds.values())  # each paid in its worker
    assert all(plan.class_seconds[c] < WORKER_COST / 2 for c in candidates[2:])  # and was free here
    assert "16 classes compiled in " in plan.describe() and "14 of them in 14 worker processes" in plan.describe()
    assert len(compiler_pids(jit_cache)) == 14 and not any(map(alive, compiler_pids(jit_cache)))
    assert seen[-1] == (16, 16, plan.compile_seconds)


def test_without_a_disk_cache_the_planner_falls_back_to_compiling_here(jit_cache, monkeypatch):
    monkeypatch.delenv(jit_like.CACHE_ENV)  # like a library that caches compiled kernels only in memory
    candidates = pool_candidates(Limits(dtype="float32"))
    plan = plan_shapes(resolve("tests.jit_like:jit_gdn"), candidates, 9, workers=8)
    assert plan.note is not None and "did not carry over to this process" in plan.note, plan.note
    assert plan.workers == 1 and plan.parallel() is None
    assert plan.classes == candidates[: len(plan.classes)] and MIN_CLASSES <= len(plan.classes) <= 5
    assert plan.compile_seconds < 9 + 4 * WORKER_COST  # the budget, and what the minimum pool forces
    assert not worker_children()


def test_a_worker_unsupported_class_is_left_out_and_a_failing_one_kept(jit_cache):
    candidates = pool_candidates(Limits(dtype="float32"))[:8]  # 3 is MHA (unsupported), 4 and 5 have K=60 (fail)
    plan = plan_shapes(resolve("tests.jit_like:jit_picky"), candidates, 60, workers=6)
    assert plan.classes == tuple(c for i, c in enumerate(candidates) if i != 3)
    assert len(plan.worker_errors) == 2 and all("ValueError: K=60 miscompiled" in e for e in plan.worker_errors)
    assert {ShapeClass(*k) for k in jit_like.jit_picky.seen} == {candidates[i] for i in (0, 1, 2, 6, 7)}  # here
    assert plan.workers == 6 and set(plan.parallel_seconds) == {candidates[i] for i in (2, 6, 7)}


def test_one_worker_or_an_unnamed_implementation_compiles_here(jit_cache, monkeypatch):
    monkeypatch.setattr(jit_like, "COMPILE_SECONDS", FAST)  # no worker: nothing to compare against
    candidates = pool_candidates(Limits(dtype="float32"))[:5]
    one = plan_shapes(resolve("tests.jit_like:jit_gdn"), candidates, 60, workers=1)
    assert one.classes == candidates and one.workers == 1 and not one.parallel_seconds and one.note is None
    assert not compiler_pids(jit_cache)  # no other process compiled anything
    monkeypatch.delenv(jit_like.CACHE_ENV)  # the same kernel as jit_gdn: cold again
    unnamed = jit_like.compiled_implementation(resolve("numpy-chunk"), seconds=FAST)
    plan = plan_shapes(unnamed, candidates, 60, workers=4)
    assert plan.classes == candidates and plan.workers == 1 and "handed in as a Python object" in (plan.note or "")
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.delenv(compile_workers.WORKERS_ENV, raising=False)
    assert compile_workers.default_workers(18) == 15 and compile_workers.default_workers(3) == 3
    monkeypatch.setenv(compile_workers.WORKERS_ENV, "1")
    assert compile_workers.default_workers(18) == 1


def test_ctrl_c_kills_every_worker(jit_cache):
    candidates = pool_candidates(Limits(dtype="float32"))[:10]

    def interrupt(done: int, planned: int, seconds: float) -> None:
        deadline = time.monotonic() + 60
        while len(compiler_pids(jit_cache)) < 4 and time.monotonic() < deadline:  # workers mid-compile
            time.sleep(0.05)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        plan_shapes(resolve("tests.jit_like:jit_gdn"), candidates, 60, interrupt, workers=8)
    pids = compiler_pids(jit_cache)
    assert len(pids) >= 4 and not any(map(alive, pids)) and not worker_children()


def test_a_worker_past_the_budget_is_killed_and_the_pool_stops_before_its_class(jit_cache, monkeypatch):
    monkeypatch.setenv("GDN_TEST_COMPILE_SECONDS", "1")
    monkeypatch.setattr(jit_like, "COMPILE_SECONDS", 1.0)
    candidates = pool_candidates(Limits(dtype="float32"))[:8]  # 4 and 5 (K=60) hang in jit_stuck
    plan = plan_shapes(resolve("tests.jit_like:jit_stuck"), candidates, 8, workers=6)
    assert plan.classes == candidates[:4] and plan.compile_seconds < 8 + 3
    pids = compiler_pids(jit_cache)
    assert len(pids) == 6 and not any(map(alive, pids)) and not worker_children()


def test_a_class_is_warmed_with_the_variants_the_properties_call():
    """The state in [V, K] layout and no final state compile apart in a Triton kernel: warming a
    class calls them too, and one the implementation does not support is skipped, not fatal."""
    from gdn_verify import implementations
    from gdn_verify.runners.compile import warm_class

    impl = implementations.resolve("numpy")
    impl.extra["compile_classes"] = True  # declared JIT-compiled: the variants are warmed too
    seen = []

    def recording(fn, refuse_v_first):
        def call(*args, **kw):
            seen.append((kw.get("state_v_first", False), kw.get("output_final_state")))
            if refuse_v_first and kw.get("state_v_first"):
                raise TypeError("got an unexpected keyword argument 'state_v_first'")
            return fn(*args, **kw)

        return call

    for refuse in (False, True):
        seen.clear()
        impl.forms = {name: recording(fn, refuse) for name, fn in implementations.resolve("numpy").forms.items()}
        warm_class(impl, ShapeClass(2, 4, 16, 8, "float32", initial_state=True))
        assert (True, True) in seen and (False, False) in seen and (False, True) in seen


def test_the_option_classes_are_warmed_with_the_option_variants_in_workers_of_their_own(monkeypatch):
    """in_kernel_gate and in_kernel_beta_sigmoid draw the pool's first OPTION_CLASSES classes with
    option keywords that compile apart in FLA; a declared JIT implementation's first classes get a
    worker job each that calls them (beside the probe), and warm_class makes exactly those calls."""
    from gdn_verify import implementations
    from gdn_verify.core.shapes import OPTION_CLASSES
    from gdn_verify.runners import compile as compile_module
    from gdn_verify.runners.compile import warm_class

    impl = implementations.resolve("numpy")
    impl.extra["compile_classes"] = True
    calls = []

    def recording(fn):
        def call(*args, **kw):
            calls.append(
                {
                    k: kw[k]
                    for k in ("use_gate_in_kernel", "dt_bias", "use_beta_sigmoid_in_kernel", "allow_neg_eigval")
                    if k in kw
                }
            )
            return fn(*args, **kw)

        return call

    impl.forms = {name: recording(fn) for name, fn in implementations.resolve("numpy").forms.items()}
    c = ShapeClass(2, 4, 16, 8, "float32", initial_state=True)
    warm_class(impl, c)
    assert not any(calls), calls  # without options: the plain call and its layout variants only
    calls.clear()
    warm_class(impl, c, options=True)
    gates = [x for x in calls if x.get("use_gate_in_kernel")]
    sigmoids = [x for x in calls if x.get("use_beta_sigmoid_in_kernel")]
    assert {x.get("dt_bias") is None for x in gates} == {True, False}
    assert {bool(x.get("allow_neg_eigval")) for x in sigmoids} == {True, False}

    started = []
    monkeypatch.setattr(compile_module, "_start_workers", lambda *a, **kw: (started.append((a, kw)), (None, None))[1])
    candidates = pool_candidates(Limits(dtype="float32"))[:6]
    impl.forms = implementations.resolve("numpy").forms
    compile_module.plan_shapes(impl, candidates, 60, workers=4)
    (args, kw), *_ = started
    first = list(candidates[:OPTION_CLASSES])
    assert list(args[1][:OPTION_CLASSES]) == first and list(args[4] if len(args) > 4 else kw["options"]) == first
