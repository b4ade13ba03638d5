"""``gdn_verify.bench.ncu_text`` and ``scripts/ncu_summary.py`` on a CPU, against a real Nsight
Compute log (``tests/data/ncu_decode_h100.txt``, an H100 on 2026-11-23: three kernels at B = 64 and
1024, each announced after its launch) and a small log whose markers come before."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gdn_verify.bench import ncu_text

ROOT = Path(__file__).resolve().parent.parent
DECODE_LOG = ROOT / "tests" / "data" / "ncu_decode_h100.txt"


def test_a_real_log_gives_every_launch_with_its_figures_and_range():
    launches = ncu_text.parse(DECODE_LOG.read_text(), marker_after=True)
    assert [ncu_text.short_name(x["kernel"]) for x in launches] == [
        "recurrent_kernel", "decode_persistent_kernel", "copy16",
    ] * 2  # fmt: skip
    assert [x["range"] for x in launches] == [
        "B=64 wide-cs", "B=64 wide-cs-pf", "B=64 copy16", "B=1024 wide-cs", "B=1024 wide-cs-pf", "B=1024 copy16",
    ]  # fmt: skip
    first = ncu_text.summary(launches)["launches"][0]
    # the log's figures, read from its first launch's sections by hand
    assert first["grid"] == (4096, 1, 1) and first["block"] == (128, 1, 1)
    assert first["duration_us"] == pytest.approx(111.97) and first["dram_read_mb"] == pytest.approx(135.34)
    assert first["dram_write_mb"] == pytest.approx(113.81) and first["dram_pct"] == pytest.approx(66.40)
    assert first["compute_pct"] == pytest.approx(24.99) and first["achieved_occupancy_pct"] == pytest.approx(18.00)
    assert first["registers"] == 168 and first["issued_per_scheduler"] == pytest.approx(0.27)
    big = ncu_text.summary(launches)["launches"][3]  # B = 1024: ms and Gbyte, scaled to us and MB
    assert big["duration_us"] == pytest.approx(1690.0) and big["dram_read_mb"] == pytest.approx(2160.0)


STATE_LAUNCH = """\
range: ours/16/32 1x4096
==PROF== Profiling "gdn_fused_state_sm90_k128": 0%....50%....100% - 40 passes
  gdn_fused_state_sm90_k128 (2, 32, 1)x(192, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    Duration                         us       161.34
    L1/TEX Cache Throughput           %        44.10
    ----------------------- ----------- ------------
    Section: Scheduler Statistics
    ---------------------------- ----------- ------------
    Issued Warp Per Scheduler                        0.30
    No Eligible                            %        69.55
    ---------------------------- ----------- ------------
    Section: Launch Statistics
    -------------------------------- --------------- ---------------
    Registers Per Thread             register/thread             255
    Driver Shared Memory Per Block       Kbyte/block            1.02
    Dynamic Shared Memory Per Block      Kbyte/block          160.77
    -------------------------------- --------------- ---------------
    Section: Occupancy
    ------------------------------- ----------- ------------
    Theoretical Occupancy                     %         9.38
    Achieved Occupancy                        %         9.31
    ------------------------------- ----------- ------------
"""


def test_a_per_block_unit_scales_as_its_quantity_and_the_stall_figures_are_read():
    """Launch statistics give shared memory in ``Kbyte/block``; read as a bare unit it was divided
    by 1e3 once too often (160.77 KB printed as 0.2). Lines from the H200 log of 2026-11-28."""
    report = ncu_text.summary(ncu_text.parse(STATE_LAUNCH))
    (launch,) = report["launches"]
    assert launch["range"] == "ours/16/32 1x4096" and launch["registers"] == 255
    assert launch["dynamic_smem_kb"] == pytest.approx(160.77)
    assert launch["theoretical_occupancy_pct"] == pytest.approx(9.38)
    assert launch["achieved_occupancy_pct"] == pytest.approx(9.31)
    assert launch["no_eligible_pct"] == pytest.approx(69.55) and launch["l1tex_pct"] == pytest.approx(44.10)
    assert "| 9.3 (9.4) | 255 | 160.8 | 0.30 | 69.5 |" in ncu_text.markdown(report)


LOG_BEFORE = """\
==PROF== Connected to process 1 (/usr/bin/python3)
range: ours/16/32 8x2048$
==PROF== Profiling "gdn_fused_prep": 0%....50%....100% - 18 passes
==PROF== Profiling "gdn_fused_state_sm90_k128": 0%....50%....100% - 18 passes
range: flashinfer/16/32 8x2048$
==PROF== Profiling "kernel_cutlass_fused": 0%....50%....100% - 18 passes
==PROF== Disconnected from process 1
  gdn_fused_prep (2048, 32, 1)x(256, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    Duration                         us       300.50
    Compute (SM) Throughput           %        46.30
    ----------------------- ----------- ------------

  void gdn_fused_state_sm90_k128<true>(int) (256, 32, 1)x(192, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: Command line profiler metrics
    ---------------------- ----------- ------------
    Metric Name            Metric Unit Metric Value
    ---------------------- ----------- ------------
    gpu__time_duration.sum          ms         0.41
    dram__bytes_read.sum        Gbyte         1.10
    ---------------------- ----------- ------------

    Section: Memory Workload Analysis
    ---------------------- ----------- ------------
    Metric Name            Metric Unit Metric Value
    ---------------------- ----------- ------------
    Local Memory Spilling Request Overhead           %      no data
    ---------------------- ----------- ------------

  kernel_cutlass_fused_0 (64, 16, 1)x(512, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    Duration                         us       280.00
    ----------------------- ----------- ------------
"""


def test_markers_before_name_the_launches_after_them_and_ranges_sum():
    report = ncu_text.summary(ncu_text.parse(LOG_BEFORE))
    rows = report["launches"]
    assert [r["range"] for r in rows] == ["ours/16/32 8x2048$"] * 2 + ["flashinfer/16/32 8x2048$"]
    assert [r["kernel"] for r in rows] == ["gdn_fused_prep", "gdn_fused_state_sm90_k128", "kernel_cutlass_fused_0"]
    assert rows[1]["duration_us"] == pytest.approx(410.0) and rows[1]["dram_read_mb"] == pytest.approx(1100.0)
    assert rows[0]["dram_read_mb"] is None  # not collected for that launch
    ours, theirs = report["ranges"]
    assert ours["launches"] == 2 and ours["duration_us"] == pytest.approx(710.5)
    assert theirs["duration_us"] == pytest.approx(280.0) and "dram_read_mb" not in theirs
    text = ncu_text.markdown(report)
    assert "| ours/16/32 8x2048$ | 2 | 710.5 | 1100.0 | - |" in text


def test_the_script_writes_json_and_markdown(tmp_path):
    log = tmp_path / "prefill-ours.log"
    log.write_text(LOG_BEFORE)
    cmd = [sys.executable, str(ROOT / "scripts" / "ncu_summary.py"), str(tmp_path / "ncu"), str(log)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    doc = json.loads((tmp_path / "ncu.json").read_text())
    assert len(doc["prefill-ours.log"]["launches"]) == 3
    assert "## prefill-ours.log" in (tmp_path / "ncu.md").read_text()
    missing = subprocess.run(cmd[:-1] + [str(tmp_path / "nope.log")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no such file" in missing.stderr
