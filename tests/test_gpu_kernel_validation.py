"""``scripts/gpu-machine/gpu_kernel_validation.sh`` stays runnable: the ``gpu_session.sh`` phases it
calls exist, both parse, and ``scripts/compare_kernel_benches.py`` passes the committed numbers and
fails a slower or different run, a prefill row judged by its ratio to FLA in the same run (the median of
its interleaved rounds where it has them; on absolute time only where FLA's is missing). CPU only:
nothing here touches a GPU."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
GPU_MACHINE = SCRIPTS / "gpu-machine"


def test_validation_calls_only_existing_session_phases():
    session = (GPU_MACHINE / "gpu_session.sh").read_text()
    phases = set(re.findall(r"^    ([a-z0-9_]+)\)$", session, re.M))
    validation = (GPU_MACHINE / "gpu_kernel_validation.sh").read_text()
    called = {p for line in re.findall(r'gpu_session\.sh" ([a-z0-9_ ]+)', validation) for p in line.split()}
    assert called and called <= phases, called - phases
    for name in ("compare_kernel_benches.py", "bench_decode.py", "sanitize_decode.py", "sanitize_launches.py"):
        assert (SCRIPTS / name).is_file()


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("script", ["gpu_kernel_validation.sh", "gpu_session.sh", "gpu_peers.sh"])
def test_scripts_parse(script):
    result = subprocess.run(["bash", "-n", str(GPU_MACHINE / script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def _compare(out: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPTS / "compare_kernel_benches.py"), str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


@pytest.fixture
def committed_run(tmp_path):
    """A run directory holding the committed numbers themselves."""
    reports = ROOT / "reports"
    shutil.copy(
        reports / "2026-11-23-decode-validation" / "decode_bench_persistent_run2.json", tmp_path / "decode_bench.json"
    )
    shutil.copy(reports / "2026-11-23-chunk-prefill" / "bench.json", tmp_path / "prefill_bench.json")
    return tmp_path


def test_compare_passes_the_committed_numbers(committed_run):
    result = _compare(committed_run)
    assert result.returncode == 0, result.stdout
    assert "within the committed numbers" in result.stdout and "identical" in result.stdout


def test_compare_fails_a_slower_or_different_run(committed_run):
    prefill = json.loads((committed_run / "prefill_bench.json").read_text())
    prefill["prefill"][1]["ours_ms"] *= 1.2
    prefill["prefill_accuracy"][0]["ours_rel_rms"] *= 1.01
    (committed_run / "prefill_bench.json").write_text(json.dumps(prefill))
    decode = json.loads((committed_run / "decode_bench.json").read_text())
    decode[1]["variant_frac"]["wide-cs"] -= 0.05
    (committed_run / "decode_bench.json").write_text(json.dumps(decode))
    result = _compare(committed_run)
    assert result.returncode == 1, result.stdout
    fails = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 3, fails
    for row in prefill["prefill"]:
        row["device"] = "NVIDIA A100-SXM4-80GB"
    (committed_run / "prefill_bench.json").write_text(json.dumps(prefill))
    assert _compare(committed_run).returncode == 2


def _write_prefill(run: Path, prefill: dict) -> None:
    (run / "prefill_bench.json").write_text(json.dumps(prefill))


def _fails(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("FAIL")]


def test_compare_judges_prefill_by_the_ratio_to_fla(committed_run):
    """A row slower in absolute time with FLA slower alike (another machine of the same kind) passes;
    a row whose ratio ours / FLA got more than 5 % worse fails."""
    prefill = json.loads((committed_run / "prefill_bench.json").read_text())
    rows = prefill["prefill"]
    for key in ("ours_ms", "fla_ms"):  # both 10 % slower: the same ratio
        rows[3][key] *= 1.10
    _write_prefill(committed_run, prefill)
    result = _compare(committed_run)
    assert result.returncode == 0, result.stdout
    lines = [line for line in result.stdout.splitlines() if line.startswith(f"prefill {rows[3]['shape']:10s}")]
    assert lines[0].endswith("(1.000x): ok"), lines
    assert "absolute, information only: ours" in lines[1] and "(1.10x)" in lines[1], lines

    rows[4]["ours_ms"] *= 1.06  # ours 6 % slower, FLA as committed: the ratio 6 % worse
    _write_prefill(committed_run, prefill)
    result = _compare(committed_run)
    assert result.returncode == 1, result.stdout
    fails = _fails(result)
    assert len(fails) == 1 and f"prefill {rows[4]['shape']}: ours/FLA" in fails[0], fails


def test_compare_falls_back_to_absolute_time_without_fla(committed_run):
    prefill = json.loads((committed_run / "prefill_bench.json").read_text())
    row = prefill["prefill"][2]
    row["fla_ms"] = row["ratio"] = None
    row["ours_ms"] *= 1.03
    _write_prefill(committed_run, prefill)
    result = _compare(committed_run)
    assert result.returncode == 0, result.stdout
    assert "ok (no FLA time in this run: judged on absolute time)" in result.stdout
    row["ours_ms"] *= 1.03  # 6 % over the committed time in all
    _write_prefill(committed_run, prefill)
    result = _compare(committed_run)
    assert result.returncode == 1, result.stdout
    fails = _fails(result)
    assert len(fails) == 1 and "no FLA time in this run" in fails[0], fails


def test_compare_judges_a_row_timed_in_rounds_on_its_median_ratio(committed_run):
    """A run with interleaved rounds (``ratio_spread``) is judged on its ``ratio``, the median of the
    per-round ratios, not on ours_ms / fla_ms, and the spread is printed; the limit is unchanged."""
    prefill = json.loads((committed_run / "prefill_bench.json").read_text())
    rows = prefill["prefill"]
    row = rows[3]
    committed = row["ours_ms"] / row["fla_ms"]
    rounds = [committed * f for f in (0.95, 0.99, 1.0, 1.02, 1.12)]
    row.update(ratio=committed, ratio_rounds=rounds, ratio_spread=[min(rounds), max(rounds)])
    row["ours_ms"] *= 1.10  # the medians' quotient 10 % worse; the median round as committed
    _write_prefill(committed_run, prefill)
    result = _compare(committed_run)
    assert result.returncode == 0, result.stdout
    lines = [line for line in result.stdout.splitlines() if line.startswith(f"prefill {row['shape']:10s}")]
    assert lines[0].endswith("(1.000x): ok"), lines
    spread = f"ours/FLA over rounds {min(rounds):.3f}-{max(rounds):.3f}"
    assert spread in lines[1] and "judged on the median" in lines[1], lines

    row["ours_ms"] /= 1.10  # the medians' quotient as committed; the median round 6 % worse
    row["ratio"] = committed * 1.06
    _write_prefill(committed_run, prefill)
    result = _compare(committed_run)
    assert result.returncode == 1, result.stdout
    fails = _fails(result)
    assert len(fails) == 1 and f"prefill {row['shape']}: ours/FLA {committed * 1.06:.3f}" in fails[0], fails
    assert "limit 1.05" in fails[0]


def test_compare_judges_a_row_failing_on_event_time_on_its_kernels(committed_run):
    """Host time inside a varlen row's event window (both libraries read cu_seqlens on the host)
    moves the ratio; a profile whose kernel device times keep the committed ratio passes the row,
    one whose kernels got 6 % slower does not."""
    prefill = json.loads((committed_run / "prefill_bench.json").read_text())
    row = prefill["prefill"][3]
    row["ours_ms"] += 0.25  # the same host time added to both: the ratio moves towards 1
    row["fla_ms"] += 0.25
    _write_prefill(committed_run, prefill)
    assert _compare(committed_run).returncode == 1
    profile = json.loads((ROOT / "reports" / "2026-11-23-chunk-prefill" / "kernel-breakdown.json").read_text())
    (committed_run / "prefill_profile.json").write_text(json.dumps(profile))
    result = _compare(committed_run)
    assert result.returncode == 0, result.stdout
    assert f"prefill {row['shape']:10s}   kernel time ours/FLA" in result.stdout
    for entry in profile:
        if entry["shape"] == row["shape"] and entry["impl"] == "ours":
            entry["kernels_ms"] *= 1.06
    (committed_run / "prefill_profile.json").write_text(json.dumps(profile))
    result = _compare(committed_run)
    assert result.returncode == 1 and len(_fails(result)) == 1, result.stdout
