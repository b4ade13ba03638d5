"""``fuzz``: budgets, a clean campaign, and a planted bug found, saved and replayed first."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from gdn_verify.runners.fuzz import main, parse_budget, run_fuzz
from gdn_verify.implementations import ConfigurationError


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("30m", 1800), ("1h", 3600), ("1.5h", 5400), (" 2m ", 120)])
def test_budget_parsing(text, seconds):
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["", "30", "m", "-5m", "0s", "10d", "1h30m", "abc"])
def test_bad_budgets_are_configuration_errors(text):
    with pytest.raises(ConfigurationError, match="--budget"):
        parse_budget(text)


def test_misuse_is_a_configuration_error(tmp_path):
    with pytest.raises(ConfigurationError, match="--properties"):
        run_fuzz("numpy", "1s", properties="bogus", database=str(tmp_path))
    with pytest.raises(ConfigurationError, match="--dtype"):
        run_fuzz("numpy", "1s", dtype="int8", database=str(tmp_path))


def test_correct_implementation_survives_a_short_campaign(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    report = run_fuzz("numpy", "10s", database=str(tmp_path / "db"), cases=str(tmp_path / "cases"), max_tokens=256,
                      seed=11, out=out, progress=err)
    took = time.monotonic() - start
    assert not report.failures, out.getvalue()
    assert report.cases > 20 and report.rounds >= 1
    assert 9 < took < 30  # spends the budget, overruns by at most a fraction of it
    assert "[fuzz]" in err.getvalue() and "cases" in err.getvalue()
    assert not (tmp_path / "cases").exists()


def test_planted_bug_is_found_saved_and_replayed_first(tmp_path):
    db, cases = str(tmp_path / "db"), str(tmp_path / "cases")
    kw = dict(database=db, cases=cases, properties="matches_reference")
    out = io.StringIO()
    first = run_fuzz("planted:off_by_one_final_state", "5s", out=out, progress=io.StringIO(), **kw)
    assert [f.prop for f in first.failures] == ["matches_reference"]
    case = first.failures[0].case_path
    assert case is not None and Path(case).is_file() and case.suffix == ".npz"
    assert f"python cli.py replay {case} --impl planted:off_by_one_final_state" in out.getvalue()
    assert any(Path(db).rglob("*"))  # the example database was written
    second = run_fuzz("planted:off_by_one_final_state", "5s", out=io.StringIO(),
                      progress=io.StringIO(), **kw)
    assert second.failures and second.first_failure_case == 1  # the saved example is replayed first
    assert main("planted:off_by_one_final_state", "2s", out=io.StringIO(), progress=io.StringIO(), **kw) == 1
