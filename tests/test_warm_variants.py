"""Backward kernels compile per more than the shape class, and the pool warms each class with those
variants, so that the gradient properties compile nothing.

FlashQLA's TileLang kernels compile per scale, per ``dht`` given or not and per layout: the
adapter declares them (``implementations.flashqla.warm_variants``). On an H100 (2026-11-27)
``check --grad --impl flash-qla --dims 128`` had compiled the fused forward and backward again in
nearly every example of ``grad_matches_reference`` and ran out of time. FLA's backward compiles
per ``dht`` given or not (Triton) and, in TileLang on Hopper, per batch size: the default
``shapes.backward_variants`` (7 compiles inside a cold check's properties there, 2026-11-27).
``tests/jit_like.QlaLike`` and ``FlaLike`` record the compile keys those libraries would build, in NumPy.
"""

from __future__ import annotations

import time

from gdn_verify import api
from gdn_verify.core.shapes import COMPILED_SCALES, ShapeClass
from gdn_verify.implementations import flashqla
from gdn_verify.properties.strategies import EXPLICIT_SCALES, Limits, pool_candidates, problems
from gdn_verify.runners.check import RunSettings, run_check
from gdn_verify.runners.compile import MIN_CLASSES, warm_calls
from tests.jit_like import FlaLike, GradLike, QlaLike

LIMITS = Limits(dtype="float32", head_dims=(16,), max_tokens=1024)  # growth reaches the context-parallel path
# The pool is every candidate class whatever the machine's speed: a budget the stand-ins (no
# compile sleep, well under a second here) cannot spend. A budget they can spend made the pool,
# and so the draws, depend on the machine (a 2-core CI runner planned 4 classes, not 18).
BUDGET = 600.0
PROPERTIES = ("grad_matches_reference", "grad_varlen_equals_separate", "grad_determinism", "grad_error_growth")


def run_gradient_properties(fake: GradLike, tmp_path, examples: int = 4) -> list:
    """Plan a pool for ``fake`` (every candidate class), then run the gradient properties on it."""
    limits, plan = api.plan_limits(fake.impl, LIMITS, BUDGET, plans_dir=None)
    assert plan.classes is not None and len(plan.classes) == len(pool_candidates(LIMITS)) >= MIN_CLASSES
    fake.phase = "properties"
    catalogue = api.grad_catalogue(limits)
    settings = RunSettings(max_examples=examples, seed=7, cases_dir=tmp_path / "cases", timeout=None)
    return run_check(fake.impl, [catalogue[name] for name in PROPERTIES], settings)


def test_the_declared_variants_leave_the_gradient_properties_nothing_to_compile(tmp_path):
    start = time.perf_counter()
    fake = QlaLike(declared=True)
    results = run_gradient_properties(fake, tmp_path)
    assert [r.name for r in results] == list(PROPERTIES)
    assert all(r.status == "passed" and r.examples for r in results), [(r.name, r.status, r.note) for r in results]
    met = fake.met["properties"]
    assert any(key[6] == "row" for key in met) and any(key[0] == "fwd" and key[-1] for key in met)  # B == 1, and CP
    assert (
        len({key[-3] for key in met if key[0] == "fwd"}) > 1 and len({key[-1] for key in met if key[0] == "bwd"}) == 2
    )
    assert fake.new_keys() == []
    assert time.perf_counter() - start < 60


def test_without_the_declaration_the_properties_compile_new_variants(tmp_path):
    """The old behaviour (one warm call per class): the same run meets keys the pool never built."""
    fake = QlaLike(declared=False)
    run_gradient_properties(fake, tmp_path)
    new = fake.new_keys()
    assert new and {key[0] for key in new} == {"fwd", "bwd"}


def test_flashqla_warms_every_scale_dht_and_layout_of_a_class():
    """12 backward calls for a batched class (2 scales x dht or not x B > 1, B == 1 and a
    context-parallel length), 4 for a varlen one; forward: 2 scales x the class's 3 variants x 2."""
    impl = QlaLike().impl
    batched = ShapeClass(2, 4, 128, 128, "bfloat16", initial_state=True).example()
    varlen = ShapeClass(2, 4, 128, 128, "bfloat16", varlen=True).example()
    calls = [(batched, True), *warm_calls(impl, batched, True)]
    assert len(calls) == 12 and len({(p.scale, d, p.shape["B"], p.shape["T"]) for p, d in calls}) == 12
    assert {p.scale for p, _ in calls} == {None, *COMPILED_SCALES}
    assert {(p.shape["B"], p.shape["T"]) for p, _ in calls} == {(2, 35), (1, 35), (1, flashqla.CP_TOKENS)}
    assert len(warm_calls(impl, varlen, True)) == 3 and len(warm_calls(impl, varlen, False)) == 5
    assert len(warm_calls(impl, batched, False)) == 11
    assert flashqla.class_key(ShapeClass(2, 4, 128, 128, "bfloat16", l2norm=True)) == ShapeClass(
        2, 4, 128, 128, "bfloat16"
    )
    undeclared = QlaLike(declared=False).impl  # FLA's way: no dht, and the other batch sizes
    assert len(warm_calls(undeclared, batched, True)) == 5 and len(warm_calls(undeclared, batched, False)) == 2


def scales_drawn(limits: Limits) -> set:
    """The scales 60 problems drawn within ``limits`` have."""
    from hypothesis import HealthCheck, given, settings

    seen = set()

    @settings(max_examples=60, database=None, suppress_health_check=list(HealthCheck), deadline=None)
    @given(problems(limits))
    def draw(problem):
        seen.add(problem.scale)

    draw()
    return seen


def test_a_kernel_compiled_per_scale_draws_only_the_scales_its_pool_warms():
    """FlashQLA declares ``compile_scales``: the planned limits draw None and ``COMPILED_SCALES``
    only (each value drawn is a compile per class and variant), and the shapes line and JSON say
    so; an implementation without the declaration keeps every explicit scale."""
    assert all(s not in (0.0, 1.0) and all(abs(s - K**-0.5) > 1e-3 for K in range(1, 513)) for s in COMPILED_SCALES)
    drawn = {}
    for declared in (True, False):
        fake = QlaLike(declared=declared)
        limits, plan = api.plan_limits(fake.impl, LIMITS, BUDGET, plans_dir=None)
        assert limits.scales == (COMPILED_SCALES if declared else EXPLICIT_SCALES)
        assert (plan.scales is not None) == declared
        assert ("explicit scale 0.375 only" in plan.describe()) == declared
        assert api._plan_dict(plan, 0.0)["compile"].get("scales") == ([0.375] if declared else None)
        drawn[declared] = scales_drawn(limits)
    assert drawn[True] == {None, *COMPILED_SCALES}
    assert drawn[False] - {None} and drawn[False] - {None} <= set(EXPLICIT_SCALES)


def test_flas_backward_is_warmed_without_dht_and_at_every_batch_size(tmp_path, monkeypatch):
    """``shapes.backward_variants``: after the pool, FLA's gradient properties meet no Triton variant
    (dht given or not) and no TileLang ``chunk_bwd_dqkwg`` batch size the pool did not build; without
    those variants (the warm-up before, one call per class) the same run meets new ones."""
    from gdn_verify.core import shapes

    batched = ShapeClass(2, 4, 64, 64, "float32", initial_state=True).example()
    calls = [(batched, True), *warm_calls(FlaLike().impl, batched, True)]
    batches = range(1, shapes.MAX_BATCH + 1)
    assert {(p.shape["B"], d) for p, d in calls} == {(b, d) for b in batches for d in (True, False)}
    varlen = ShapeClass(2, 4, 64, 64, "float32", varlen=True).example()
    assert warm_calls(FlaLike().impl, varlen, True) == [(varlen, False)]

    fake = FlaLike()
    results = run_gradient_properties(fake, tmp_path)
    assert all(r.status == "passed" and r.examples for r in results), [(r.name, r.status, r.note) for r in results]
    met = fake.met["properties"]
    assert len({key[-1] for key in met if key[0] == "dqkwg"}) >= 2  # several batch sizes met
    assert {key[-1] for key in met if key[0] == "triton"} == {True, False}  # dht given and not
    assert fake.new_keys() == []

    monkeypatch.setattr("gdn_verify.runners.compile.backward_variants", lambda problem: [])
    before = FlaLike()
    run_gradient_properties(before, tmp_path)
    assert {key[0] for key in before.new_keys()} == {"triton", "dqkwg"}
