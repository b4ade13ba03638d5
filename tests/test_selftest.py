"""The selftest's shortcuts find what running every property in order finds.

``selftest.OPTION_BUGS`` lets a planted bug that only an in-kernel option reaches try the one
property that passes the option first. That is the same first failure only if (1) the bug is the
correct kernel on every call without its option and (2) no other property passes the option: both
are checked here, on the planted functions and on what every property actually passes.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from gdn_verify.core import gating
from gdn_verify.core.implementation import Implementation
from gdn_verify.core.verdict import OracleMemo, oracle_and_tolerance, remembered_oracles
from gdn_verify.implementations import numpy_impl, planted
from gdn_verify.properties import catalogue
from gdn_verify.properties.strategies import Limits
from gdn_verify.runners.check import RunSettings, run_property
from gdn_verify.runners.selftest import OPTION_BUGS, _in_order_for, run_selftest
from tests.test_oracle_speed import CORPUS


def _inputs(seed: int, varlen: bool) -> dict:
    rng = np.random.default_rng(seed)
    B, T, H, HV, K, V = (1, 70, 1, 2, 8, 8) if varlen else (2, 40, 2, 4, 16, 8)
    N = 3 if varlen else B
    return dict(
        q=rng.standard_normal((B, T, H, K)).astype(np.float32),
        k=rng.standard_normal((B, T, H, K)).astype(np.float32),
        v=rng.standard_normal((B, T, HV, V)).astype(np.float32),
        g=rng.standard_normal((B, T, HV)).astype(np.float32),
        beta=rng.standard_normal((B, T, HV)).astype(np.float32),
        initial_state=rng.standard_normal((N, HV, K, V)).astype(np.float32),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=np.array([0, 20, 33, 70]) if varlen else None,
    )


ALL_OPTIONS = dict(
    use_gate_in_kernel=True,
    A_log=np.array([-1.0, 0.5, 0.1, 2.0], np.float32),
    dt_bias=np.array([0.3, -0.2, 0.5, 1.0], np.float32),
    use_beta_sigmoid_in_kernel=True,
    allow_neg_eigval=True,
)


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("bug", sorted(OPTION_BUGS))
def test_an_option_bug_is_the_correct_kernel_without_its_option(bug, varlen):
    option = OPTION_BUGS[bug][0]
    kw = _inputs(7, varlen)
    HV = kw["v"].shape[2]
    options = {name: x[:HV] if isinstance(x, np.ndarray) else x for name, x in ALL_OPTIONS.items()}
    fn = planted.BUGS[bug][1]
    without = {name: x for name, x in options.items() if name != option}
    for chosen in ({}, without, {n: x for n, x in without.items() if n in ("use_gate_in_kernel", "A_log")}):
        for got, want in zip(fn(**kw, **chosen), numpy_impl.chunk_gated_delta_rule(**kw, **chosen)):
            np.testing.assert_array_equal(got, want)
    # and the option is what makes it a bug
    got, want = fn(**kw, **options), numpy_impl.chunk_gated_delta_rule(**kw, **options)
    assert not np.array_equal(got[0], want[0])


def test_only_its_property_passes_an_option_bugs_option(tmp_path):
    """Every forward property a planted native kernel takes part in, run on a kernel that records the
    options it is called with: an option bug's option reaches its property's calls and no other's."""
    passed: dict[str, set[str]] = {}
    current = [""]

    def recorder(**kw):
        passed.setdefault(current[0], set()).update(
            name for name in gating.OPTION_NAMES if kw.get(name) is not None and kw.get(name) is not False
        )
        return numpy_impl.chunk_gated_delta_rule(**kw)

    impl = Implementation("recorder", {"default": recorder})
    for name, prop in catalogue(Limits(dtype="float32")).items():
        current[0] = name
        result = run_property(prop, impl, RunSettings(max_examples=6, seed=1, cases_dir=tmp_path))
        assert result.status in ("passed", "unsupported"), (name, result.failure)
    for option, prop in OPTION_BUGS.values():
        assert option in passed[prop], (option, prop)
        assert [name for name, options in passed.items() if option in options] == [prop]


def test_an_option_bugs_property_runs_first_and_the_rest_keep_their_order():
    props = list(catalogue(Limits(dtype="float32")).values())
    names = [p.name for p in props]
    for bug, (_, first) in OPTION_BUGS.items():
        order = [p.name for p in _in_order_for(bug, props)]
        assert order == [first] + [n for n in names if n != first]
    assert [p.name for p in _in_order_for("gate_without_exp", props)] == names


def test_the_selftest_catches_an_option_bug_with_its_property(tmp_path):
    """With matches_reference listed first, gate_bias_ignored is still caught by in_kernel_gate, with
    its right cause, and every call it got passed the in-kernel gate: matches_reference never ran."""
    gated = []
    real = planted.implementation

    def implementation(bug):
        fn = real(bug).forms["default"]

        def recorded(**kw):
            gated.append(kw.get("use_gate_in_kernel") is True)
            return fn(**kw)

        return Implementation(f"planted:{bug}", {"default": recorded})

    bugs = SimpleNamespace(
        BUGS={"gate_bias_ignored": planted.BUGS["gate_bias_ignored"]},
        RIGHT_CAUSES={"gate_bias_ignored": planted.RIGHT_CAUSES["gate_bias_ignored"]},
        implementation=implementation,
    )
    all_props = catalogue(Limits(dtype="float32"))
    props = [all_props["matches_reference"], all_props["in_kernel_gate"]]
    (row,) = run_selftest(props, RunSettings(max_examples=20, seed=1, cases_dir=tmp_path), bugs=bugs)
    assert row.caught_by is not None and row.caught_by.name == "in_kernel_gate"
    assert row.cause_verdict == "right"
    assert gated and all(gated)


def test_remembered_oracles_give_the_same_results_and_only_within_the_context():
    problem = CORPUS["gva bfloat16 batched scale blas"]
    want_reference, want_bound = oracle_and_tolerance(problem)
    with remembered_oracles() as memo:
        assert isinstance(memo, OracleMemo)
        first = oracle_and_tolerance(problem)
        again = oracle_and_tolerance(problem.replace())  # an equal problem, another object
        assert memo.hits == 1
        with remembered_oracles() as inner:  # nested: the same memo
            assert inner is memo
            oracle_and_tolerance(problem.replace(scale=0.7))  # another problem: computed
            assert memo.hits == 1
    for reference, bound in (first, again):
        for got, want in zip(reference, want_reference):
            assert got.tobytes() == want.tobytes()
            assert not got.flags.writeable  # shared between callers
        assert bound.output_rms == want_bound.output_rms and bound.state == want_bound.state
    assert again[1].scales is not None and again[1].scales.of != id(problem)  # names its own problem
    oracle_and_tolerance(problem)
    assert memo.hits == 1  # outside the context nothing is remembered


def test_a_memo_keeps_to_its_budget():
    problems = [CORPUS["float32 saturated gate"], CORPUS["float32 no gates"], CORPUS["gva bfloat16 batched scale blas"]]
    with remembered_oracles(budget=1) as memo:
        for p in problems:
            oracle_and_tolerance(p)
        assert len(memo._items) == 1 and memo.size > memo.budget  # the last one stays
        oracle_and_tolerance(problems[0])
        assert memo.hits == 0
