"""``fuzz``: budgets, a clean campaign, and a planted bug found, saved and replayed first."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gdn_verify.api import fuzz
from gdn_verify.core.implementation import ConfigurationError
from gdn_verify.implementations.numpy_impl import recurrent_gated_delta_rule
from gdn_verify.runners.fuzz import parse_budget


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("30m", 1800), ("1h", 3600), ("1.5h", 5400), (" 2m ", 120)])
def test_budget_parsing(text, seconds):
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["", "30", "m", "-5m", "0s", "10d", "1h30m", "abc"])
def test_bad_budgets_are_configuration_errors(text):
    with pytest.raises(ConfigurationError, match="^budget: "):
        parse_budget(text)


def test_misuse_is_a_configuration_error(tmp_path):
    with pytest.raises(ConfigurationError, match="^properties: "):
        fuzz("numpy", "1s", properties=["bogus"], database=tmp_path)
    with pytest.raises(ConfigurationError, match="^dtype: "):
        fuzz("numpy", "1s", dtype="int8", database=tmp_path)


def test_correct_implementation_survives_a_short_campaign(tmp_path):
    lines = []
    start = time.monotonic()
    report = fuzz(
        "numpy",
        "10s",
        database=tmp_path / "db",
        cases_dir=tmp_path / "cases",
        max_tokens=256,
        seed=11,
        progress=lambda rep, name: lines.append(rep.status_line(name)),
    )
    took = time.monotonic() - start
    assert not report.failures, [f.failure.message for f in report.failures]
    assert report.cases > 20 and report.rounds >= 1
    assert 9 < took < 30  # spends the budget, overruns by at most a fraction of it
    assert lines and lines[-1].startswith("[fuzz]") and f"cases {report.cases}" in lines[-1]
    assert not (tmp_path / "cases").exists()


def test_planted_bug_is_found_saved_and_replayed_first(tmp_path):
    db, cases = str(tmp_path / "db"), str(tmp_path / "cases")
    kw = dict(database=db, cases_dir=cases, properties=["matches_reference"])
    seen = []
    first = fuzz("planted:off_by_one_final_state", "5s", on_result=seen.append, **kw)
    assert [f.name for f in first.failures] == ["matches_reference"] == [r.name for r in seen]
    case = first.failures[0].failure.case_path
    assert case is not None and Path(case).is_file() and case.suffix == ".npz"
    assert any(Path(db).rglob("*"))  # the example database was written
    second = fuzz("planted:off_by_one_final_state", "5s", **kw)
    assert second.failures and second.first_failure_case == 1  # the saved example is replayed first


def test_no_example_starts_once_the_budget_is_spent(tmp_path):
    """A round sized from fast examples must not run past the budget when calls turn slow.

    Like a JIT kernel meeting a variant it has not compiled: every call of the first round costs
    milliseconds, every later one 0.4 s. The second round, sized from the first, asks for many
    examples per property; before ``RunSettings.deadline`` that overran a 6 s budget by several
    seconds. Now the campaign ends within one slow example of the budget (plus bookkeeping). Two
    properties that call no oracle: an oracle's time varies by seconds between examples of the
    same property on a loaded machine (a varlen pack of 377 tokens took 15 s on two busy cores).
    """
    slow = []

    def slowing(q, k, v, g, beta, **kw):
        if slow:
            slow.append(None)
            time.sleep(0.4)
        return recurrent_gated_delta_rule(q, k, v, g, beta, **kw)

    def progress(report, name):
        if report.rounds >= 1 and not slow:
            slow.append(None)

    budget = 6.0
    start = time.monotonic()
    report = fuzz(
        slowing,
        budget,
        database=tmp_path / "db",
        cases_dir=tmp_path / "cases",
        max_tokens=64,
        seed=5,
        progress=progress,
        properties=["determinism", "output_contract"],
    )
    took = time.monotonic() - start
    assert len(slow) > 1, "no call of a second round: the test proves nothing"
    assert not report.failures, [f.failure.message for f in report.failures]
    assert took < budget + 2.0, f"{took:.1f} s for a {budget:.0f} s budget"


def test_the_budget_is_a_deadline_for_the_whole_campaign(tmp_path):
    """No example starts that would end past the budget, were it as long as the longest its property took.

    From the campaign's first example on (the shape planning before it stays quick), every kernel
    call takes 1 s, so a ``determinism`` example (two calls) 2 s. With 3 s left after the first round
    a second-round example fits, a second does not: before, it started anyway and ended 1 s past a
    5 s budget (``fuzz --budget 1m`` ran 71 s). Now the campaign ends within the budget, and no
    earlier than one example before it.
    """
    armed = []

    def slow(q, k, v, g, beta, **kw):
        if armed:
            time.sleep(1.0)
        return recurrent_gated_delta_rule(q, k, v, g, beta, **kw)

    budget, margin = 5.0, 0.5  # margin: Hypothesis's drawing, the shape planning and the bookkeeping
    start = time.monotonic()
    report = fuzz(
        slow,
        budget,
        properties=["determinism"],
        database=tmp_path / "db",
        cases_dir=tmp_path / "cases",
        max_tokens=64,
        seed=5,
        progress=lambda report, name: armed.append(True),
    )
    took = time.monotonic() - start
    assert not report.failures, [f.failure.message for f in report.failures]
    assert report.cases >= 3, "fewer than two slow examples: the test proves nothing"
    assert budget - 2.0 - margin < took <= budget + margin, f"{took:.1f} s for a {budget:.0f} s budget"


def test_the_worst_includes_a_failure_and_says_so(tmp_path):
    """A failing property's minimal example is over its bound: the worst of the campaign, marked
    failed. Before, the worst was over the passing examples only (``worst 0.0152 of bound`` beside
    ``1 failures``)."""
    report = fuzz(
        "planted:off_by_one_final_state",
        "5s",
        properties=["matches_reference", "determinism"],
        database=tmp_path / "db",
        cases_dir=tmp_path / "cases",
        seed=3,
    )
    (failed,) = report.failures
    assert report.worst is not None and report.worst == (failed.name, failed.failure.measurement)
    assert report.worst[1].ratio > 1 and report.worst_failed
    assert report.describe_worst() == f"{report.worst[1].ratio:.3g} of bound (matches_reference, failed)"
    assert "worst " + report.describe_worst() in report.status_line("determinism")


def test_a_passing_worst_is_not_marked_failed(tmp_path):
    report = fuzz("numpy", "2s", properties=["matches_reference"], database=tmp_path / "db", seed=3)
    assert report.worst is not None and not report.failures and not report.worst_failed
    assert report.describe_worst() == f"{report.worst[1].ratio:.3g} of bound (matches_reference)"
