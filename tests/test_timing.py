"""Where a check's time goes: exclusive labelled spans, per property and for the whole check."""

from __future__ import annotations

import json
import time

import pytest

from gdn_verify import api, console, implementations
from gdn_verify.core import environment, timing
from gdn_verify.runners.check import SPLIT_LABELS


def test_nested_spans_count_to_the_innermost_label_and_add_up_to_the_wall_clock():
    before = timing.snapshot()
    start = time.perf_counter()
    with timing.timed("outer"):
        time.sleep(0.05)
        with timing.timed("inner"):
            time.sleep(0.1)
    wall = time.perf_counter() - start
    spent = timing.since(before)
    assert spent["inner"] == pytest.approx(0.1, abs=0.05)
    assert spent["outer"] == pytest.approx(0.05, abs=0.05)
    assert spent["outer"] + spent["inner"] == pytest.approx(wall, abs=1e-3)


def _slow(fn, seconds: float):
    def call(*args, **kw):
        time.sleep(seconds)
        return fn(*args, **kw)

    return call


def test_a_checks_split_names_the_kernels_time_and_adds_up(tmp_path):
    impl = implementations.resolve("numpy")
    impl.forms = {name: _slow(fn, 0.02) for name, fn in impl.forms.items()}
    result = api.check(impl, properties=["matches_reference", "determinism"], max_examples=5, seed=3)
    for r in result.results:
        assert set(r.split) <= {*SPLIT_LABELS, "ours"}
        assert sum(r.split.values()) == pytest.approx(r.seconds, rel=0.02, abs=0.01)
        assert r.split["kernel"] >= 0.02 * r.examples  # at least one slow call per example
    ref = result["matches_reference"]
    assert ref.split["oracle"] > 0  # the float64 oracle and the tolerance model, timed apart
    split = result.time_split()
    assert list(split)[-1] == "ours"
    assert split["kernel"] == pytest.approx(sum(r.split["kernel"] for r in result.results))
    doc = result.as_dict()
    assert doc["time_split"] == {k: round(v, 2) for k, v in split.items()}
    assert doc["results"][0]["split"] == {k: round(v, 2) for k, v in result.results[0].split.items()}


def test_the_cli_prints_the_split_and_writes_it(tmp_path, capsys):
    from cli import main

    out = tmp_path / "c.json"
    code = main(["check", "--impl", "numpy", "--properties", "determinism", "--max-examples", "3", "--json", str(out)])
    assert code == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("time: "))
    assert "ours" in line and " s of " in line  # labels under half a second are left out of the line
    assert line.endswith("before it (Python's start, imports, the command line)")
    assert set(json.loads(out.read_text())["time_split"]) >= {"kernel", "ours"}  # the JSON keeps them all


def test_a_check_records_the_seconds_before_it_began():
    """The wall clock a user sees is the check's seconds plus the process's start and imports
    before it (22 s of fla-chunk's on an H100, 2026-11-27): the JSON carries both."""
    before = environment.process_seconds()
    assert before is not None and before > 0  # Linux: /proc is there
    time.sleep(0.05)
    assert environment.process_seconds() >= before + 0.04  # it counts up, in seconds
    result = api.check("numpy", properties=["determinism"], max_examples=2, seed=1)
    assert result.startup_seconds is not None and result.startup_seconds >= before
    assert result.as_dict()["startup_seconds"] == round(result.startup_seconds, 1)
    line = console.format_time_split(result.time_split(), result.seconds, result.startup_seconds)
    assert line.endswith("before it (Python's start, imports, the command line)")
