"""Every JSON document the tool emits validates against the published schema (gdn_verify/schema)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gdn_verify import api
from gdn_verify.implementations import planted
from gdn_verify.runners.check import RunSettings, run_property
from gdn_verify.runners.selftest import Planted

jsonschema = pytest.importorskip("jsonschema")  # test-only; a bare GPU image may lack it

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads(api.SCHEMA_PATH.read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def validate(doc: dict, ref: str | None = None) -> dict:
    """``doc`` after a JSON round trip (as a reader sees it), validated (against ``$defs/ref`` if given)."""
    doc = json.loads(json.dumps(api.jsonable(doc), allow_nan=False))
    if ref is None:
        VALIDATOR.validate(doc)
    else:
        part = {"$schema": SCHEMA["$schema"], "$defs": SCHEMA["$defs"], "$ref": f"#/$defs/{ref}"}
        jsonschema.Draft202012Validator(part).validate(doc)
    return doc


def test_the_schema_is_valid_draft_2020_12_and_packaged():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert SCHEMA["properties"]["schema_version"]["const"] == api.SCHEMA_VERSION
    assert api.SCHEMA_PATH.parent.parent == ROOT / "gdn_verify"
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "schema/*.json" in data["gdn_verify"]


def test_check_documents_validate(tmp_path):
    passed = api.check("numpy", properties=["determinism", "matches_reference"], max_examples=3, seed=1)
    failed = api.check(
        "planted:off_by_one_final_state", properties=["matches_reference"], seed=3, cases_dir=tmp_path / "cases"
    )
    for result in (passed, failed):
        for status in api.RUN_STATUSES:
            doc = validate(result.as_dict(status, ["gdn-verify", "check"]))
            assert doc["status"] == status
    doc = validate(failed.as_dict())
    assert doc["kind"] == "check" and doc["schema_version"] == "1.0" and doc["totals"]["failed"] == 1
    failure = doc["results"][0]["failure"]
    assert Path(failure["case"]).is_absolute() and failure["replay"].startswith("gdn-verify replay /")
    assert doc["results"][0]["worst"]["bound"] > 0 and "uniform_bound" in doc["results"][0]["worst"]
    env = doc["environment"]
    assert {"gdn-verify", "numpy", "hypothesis"} <= set(env["packages"]) and env["device"] is None
    with pytest.raises(jsonschema.ValidationError):
        validate({**doc, "kind": "bench"})
    with pytest.raises(jsonschema.ValidationError):
        bad = json.loads(json.dumps(doc))
        bad["results"][0]["status"] = "broken"
        validate(bad)


def test_report_property_rows_share_the_definition():
    result = api.check("numpy", properties=["determinism"], max_examples=2, seed=1)
    validate(dict(impl="numpy", dtype="float32", results=result.as_dict()["results"]), "report_properties_row")
    suite_error = dict(name="(suite)", status="error", examples=0, unsupported=0, note="the runner raised X")
    validate(dict(impl="numpy", dtype="float32", results=[suite_error]), "report_properties_row")


def test_fuzz_json_validates(tmp_path):
    out = tmp_path / "f.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "fuzz", "--impl", "planted:off_by_one_final_state", "--budget", "4s",
         "--properties", "matches_reference,determinism", "--json", str(out), "--database", str(tmp_path / "db")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=os.environ,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    doc = validate(json.loads(out.read_text()))
    assert doc["kind"] == "fuzz" and doc["status"] == "complete"
    assert doc["campaign"]["cases"] > 0 and doc["totals"]["failed"] == 1
    assert {r["name"] for r in doc["results"]} == {"matches_reference", "determinism"}


def test_selftest_documents_validate(tmp_path):
    rows = []
    for bug in list(planted.BUGS)[:2]:
        start = time.perf_counter()
        r = run_property(
            api.catalogue_for(planted.implementation(bug))["matches_reference"],
            planted.implementation(bug),
            RunSettings(max_examples=20, seed=1, cases_dir=tmp_path),
        )
        rows.append(
            Planted(bug, planted.BUGS[bug][0], r if r.status == "failed" else None, time.perf_counter() - start)
        )
    rows.append(Planted("missed_one", "a bug nobody caught", None, 0.1))
    rows.append(Planted("no_bug_here", "the identity on these inputs", None, 0.0, not_applicable="why"))
    doc = validate(api.selftest_document(rows, "float32", seed=1))
    totals = doc["totals"]
    assert doc["kind"] == "selftest" and totals["bugs"] == 4 and totals["not_applicable"] == 1
    assert totals["missed"] == 3 - totals["caught"] and totals["missed"] >= 1
    assert doc["bugs"][-1]["not_applicable"] == "why" and doc["bugs"][-1]["cause"] == "n/a"


def test_selftest_json_is_written_as_bugs_are_checked(tmp_path):
    out = tmp_path / "s.json"
    proc = subprocess.Popen(
        [sys.executable, "-u", str(ROOT / "cli.py"), "selftest", "--max-examples", "5", "--seed", "1",
         "--json", str(out)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.lstrip().startswith(("caught", "MISSED")):
                break
        doc = validate(json.loads(out.read_text()))  # already there, after the first bug
        assert doc["status"] == "running" and len(doc["bugs"]) >= 1
    finally:
        proc.kill()
        proc.communicate()


def test_non_finite_numbers_become_strings():
    assert api.jsonable({"a": [math.inf, -math.inf, math.nan, 1.5]}) == {"a": ["inf", "-inf", "nan", 1.5]}
    validate({"error": math.inf, "bound": 1e-5}, "measurement")


def test_a_gradient_check_reports_each_gradients_worst_example():
    result = api.check("numpy-grad", grad=True, properties=["grad_matches_reference"], max_examples=4, seed=1)
    row = validate(result.as_dict())["results"][0]
    parts, worst = row["worst_by_part"], row["worst"]
    assert {"dq", "dk", "dv", "dg", "dbeta"} <= set(parts) <= {"dq", "dk", "dv", "dg", "dbeta", "dh0"}
    assert all(0 <= p["ratio"] <= 1 and p["bound"] > 0 for p in parts.values())
    # the worst example's worst part is the largest ratio over all parts and examples
    assert max(p["ratio"] for p in parts.values()) == pytest.approx(worst["error"] / worst["bound"])
    # and each part's entry is at least that part's ratio in the worst example
    for name, text in (x.split(" ") for x in worst["detail"].split(", ")):
        e, b = (float(v) for v in text.split("/"))
        assert parts[name]["ratio"] >= e / b * (1 - 1e-2)
