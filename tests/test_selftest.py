"""The selftest's shortcuts find what running every property in order finds: the oracle's results
remembered across planted bugs are the ones computed afresh."""

from __future__ import annotations

from gdn_verify.core.verdict import OracleMemo, oracle_and_tolerance, remembered_oracles
from tests.test_oracle_speed import CORPUS


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
