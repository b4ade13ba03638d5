"""FLA's real chunked and recurrent kernels, two releases apart, under Triton's interpreter on the CPU.

Each release runs in a child process of its own (two releases of ``fla`` cannot share one), from
``gdn_verify.runners.releases.site`` (its cache, ``$GDN_VERIFY_RELEASES``; wheels from
``$GDN_VERIFY_WHEELS`` when that folder holds them, else the package index). The child runs a
reduced ``check`` (K = V = 32, two examples a property, a fixed seed) of ``fla-chunk`` and
``fla-recurrent`` in float32 and float16, and calls each adapter once on a problem of each kind
the release lacks (float32 for 0.1's chunk, GVA, a v-first state), which must be refused as
unsupported. The expectations are the releases' own facts, written here independently of
``fla_releases.TABLE``: a wrong row makes a check fail or a refusal disappear.

0.1 is the oldest release with GDN (``head_first=True`` by default, no GVA, no float32 chunk, a
k-first state only); 0.6.0 the newest (GVA, ``state_v_first``, float32 everywhere).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the interpreter tests need torch (pip install -e '.[test]')")
pytest.importorskip("triton", reason="the interpreter tests need Triton (pip install -e '.[test]')")
pytest.importorskip("einops", reason="FLA's kernels import einops (pip install einops)")

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.interpreter  # real kernels under the interpreter: .ci/run runs them after the rest

# The child: a reduced check of each (impl, dtype, properties), then each refusal asked for.
CHILD = r"""
import json, sys, time, warnings
warnings.filterwarnings("ignore")
import numpy as np
from gdn_verify import api
from gdn_verify.core.problem import Problem
from gdn_verify.implementations import registry

job = json.loads(sys.argv[1])
out = {"checks": {}, "refusals": {}, "descriptions": {}, "seconds": {}}
for name, dtype, props in job["checks"]:
    start = time.perf_counter()
    r = api.check(name, dtype=dtype, properties=props, seed=1, max_examples=2, dims=[32], plans_dir=None,
                  cases_dir=job["cases"], timeout=None)
    out["checks"][f"{name} {dtype}"] = {p.name: [p.status, p.note] for p in r.results}
    out["seconds"][f"{name} {dtype}"] = round(time.perf_counter() - start, 1)

def problem(dtype, H=1, HV=1, v_first=False):
    rng = np.random.default_rng(0)
    T, K = 8, 32
    return Problem(q=rng.standard_normal((1, T, H, K)).astype(dtype), k=rng.standard_normal((1, T, H, K)).astype(dtype),
                   v=rng.standard_normal((1, T, HV, K)).astype(dtype), g=-np.ones((1, T, HV), dtype),
                   beta=np.full((1, T, HV), 0.5, dtype), initial_state=np.zeros((1, HV, K, K), np.float32),
                   state_v_first=v_first)

kinds = {"float32": problem(np.float32), "gva": problem(np.float16, 1, 2), "v_first": problem(np.float16, v_first=True)}
for name, kind in job["refusals"]:
    impl = registry.resolve(name)
    out["descriptions"][name] = impl.description
    try:
        impl.run(kinds[kind])
        out["refusals"][f"{name} {kind}"] = "ran"
    except NotImplementedError as exc:
        out["refusals"][f"{name} {kind}"] = f"unsupported: {exc}"
print("RESULT " + json.dumps(out))
"""


def release_site(version: str):
    """The FLA release's folder (fetched into the cache once), or skip saying why."""
    try:
        from gdn_verify.runners import releases
    except ImportError as exc:
        pytest.skip(f"gdn_verify.runners.releases is missing: {exc}")
    wheels = os.environ.get("GDN_VERIFY_WHEELS")
    try:
        return releases, releases.site("fla", version, Path(wheels) if wheels else None)
    except releases.ReleaseError as exc:
        pytest.skip(f"FLA {version} cannot be fetched: {exc}")


def run_release(version: str, job: dict, tmp_path: Path) -> tuple[dict, str, float]:
    """Run the child on FLA ``version``: its JSON, its output and its seconds."""
    releases, site = release_site(version)
    env = {**releases.child_env(site), "TRITON_INTERPRET": "1"}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps({**job, "cases": str(tmp_path)})],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    seconds = time.perf_counter() - start
    text = done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, text[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT ")), text, seconds


def statuses(result: dict) -> dict[str, dict[str, str]]:
    return {run: {p: status for p, (status, _) in props.items()} for run, props in result["checks"].items()}


def test_fla_0_6_0_passes_a_reduced_check_in_float32_and_float16(tmp_path):
    # GVA is a convention, not a precision: head_mapping (HV up to 4 H, the slowest) in float16 only;
    # inputs_read_exactly holds 16-bit inputs to the exact result
    expected = {
        "float32": ["matches_reference", "state_layout"],
        "float16": ["matches_reference", "state_layout", "head_mapping", "inputs_read_exactly"],
    }
    checks = [[name, dtype, props] for name in ("fla-chunk", "fla-recurrent") for dtype, props in expected.items()]
    result, text, seconds = run_release("0.6.0", {"checks": checks, "refusals": []}, tmp_path)
    print(f"FLA 0.6.0: {seconds:.0f} s ({result['seconds']})")
    for run, props in statuses(result).items():
        assert props == dict.fromkeys(expected[run.split()[1]], "passed"), (run, result)


def test_fla_0_1_passes_what_it_supports_and_refuses_the_rest(tmp_path):
    checks = [["fla-chunk", "float16", ["matches_reference"]]]
    checks += [["fla-recurrent", dtype, ["matches_reference"]] for dtype in ("float32", "float16")]
    refusals = [["fla-chunk", "float32"]] + [[n, k] for n in ("fla-chunk", "fla-recurrent") for k in ("gva", "v_first")]
    result, text, seconds = run_release("0.1", {"checks": checks, "refusals": refusals}, tmp_path)
    print(f"FLA 0.1: {seconds:.0f} s ({result['seconds']})")
    for run, props in statuses(result).items():
        assert props == {"matches_reference": "passed"}, (run, result)
    for what, outcome in result["refusals"].items():
        assert outcome.startswith("unsupported: ") and "FLA 0.1's" in outcome, (what, outcome)
    assert result["descriptions"]["fla-chunk"].startswith("FLA 0.1 chunk_gated_delta_rule")
    assert result["descriptions"]["fla-recurrent"].startswith("FLA 0.1 fused_recurrent_gated_delta_rule")
    assert result["refusals"]["fla-chunk float32"] == (
        "unsupported: FLA 0.1's chunk_gated_delta_rule refuses float32 inputs"
    )


CORRUPT = r"""
import json, sys, warnings
from dataclasses import replace
warnings.filterwarnings("ignore")
from gdn_verify import api
from gdn_verify.implementations import fla_releases as R

row = R.row("0.1")
field, value = sys.argv[1], json.loads(sys.argv[2])
bad = replace(row, chunk=replace(row.chunk, **{field: value}), recurrent=replace(row.recurrent, **{field: value}))
R.TABLE = tuple(bad if r is row else r for r in R.TABLE)
r = api.check("fla-chunk", dtype="float16", properties=[sys.argv[4]], seed=1, max_examples=2, dims=[32],
              plans_dir=None, cases_dir=sys.argv[3], timeout=None)
print("RESULT " + json.dumps({p.name: p.status for p in r.results}))
"""


@pytest.mark.parametrize(
    "field, value, prop", [("head_first", False, "matches_reference"), ("gva", True, "head_mapping")]
)
def test_a_corrupted_row_makes_the_check_of_its_release_fail(tmp_path, field, value, prop):
    """0.1's row with no head_first keyword (0.1 then reads [B, H, T, K]) or with GVA (0.1 then
    reads past its query heads): the reduced check that passes with the true row fails."""
    releases, site = release_site("0.1")
    env = {**releases.child_env(site), "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", CORRUPT, field, json.dumps(value), str(tmp_path), prop],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (done.stdout + done.stderr)[-3000:]
    assert json.loads(lines[-1].removeprefix("RESULT ")) == {prop: "failed"}
