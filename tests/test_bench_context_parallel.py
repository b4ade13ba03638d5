"""``scripts/bench_context_parallel.py`` on a CPU: its options, the segment count read from a
``chunk.last_kernels`` label, the Markdown of the committed H100 sweep, and exit 2 without a device."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
SWEEP = ROOT / "reports" / "2026-11-27-context-parallel" / "cp_sweep.json"


def _load(name: str) -> ModuleType:
    """``scripts/NAME.py`` as a module."""
    spec = importlib.util.spec_from_file_location(f"{name}_script", ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _script() -> ModuleType:
    return _load("bench_context_parallel")


def test_options_restrict_the_layouts_and_lengths():
    bench = _script()
    args = bench.parse(["out"])
    assert args.layouts == bench.LAYOUTS and args.tokens == bench.TOKENS
    args = bench.parse(["out", "--layouts", "2/8,8/16", "--tokens", "8192,65536"])
    assert args.layouts == ((2, 8), (8, 16)) and args.tokens == (8192, 65536)
    for bad in (["--layouts", "2-8"], ["--layouts", "0/8"], ["--tokens", "8k"], ["--tokens", "-1"]):
        with pytest.raises(SystemExit) as stop:
            bench.parse(["out", *bad])
        assert stop.value.code == 2


def test_segments_from_the_launchers_label():
    bench = _script()
    assert bench.segments_of("fused wgmma sm_90a, context-parallel x 8") == 8
    assert bench.segments_of("fused wgmma sm_90a") == 1
    assert bench.segments_of(None) is None


def test_markdown_of_the_h100_sweep():
    bench = _script()
    doc = dict(device="NVIDIA H100 80GB HBM3", date="2026-11-27", versions={"torch": "2.11.0+cu130"})
    doc["rows"] = json.loads(SWEEP.read_text())
    lines = bench.render(doc).splitlines()
    assert "NVIDIA H100 80GB HBM3; 2026-11-27; torch 2.11.0+cu130." in lines
    rows = [line for line in lines if line.startswith("| 2/8 | 65536 ")]
    assert rows == ["| 2/8 | 65536 | 3.115 | 4.546 | 2.709 | 1.905 | 2.518 | 3.653 | 8 | 1.923 | 8 | 0.62 |"]
    assert "| 16/32 | 8192 | 0.585 | 1.020 | 1.110 | 1.259 | 1.500 | 2.251 | off | 0.581 | off | 0.99 |" in lines
    # a J left out of its row (the launcher refused it) and a row without the auto call
    partial = bench.format_row({"H": 2, "HV": 8, "T": 1024, "False": 0.1, "2": 0.3})
    assert partial == "| 2/8 | 1024 | 0.100 | 0.300 | - | - | - | - | off | - | - | - |"


def test_no_device_exits_2_with_one_line(monkeypatch, capsys, tmp_path):
    bench = _script()
    monkeypatch.setattr(bench, "device_problem", lambda: "no CUDA device visible")
    assert bench.main([str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA device visible" in err
    assert not (tmp_path / "out").exists()


def test_a_row_times_its_modes_in_alternating_rounds_and_skips_a_refused_j(monkeypatch):
    """Fake launcher and clock: J = 32 is refused (left out of the row), every other mode is timed
    in each round, in forward order in even rounds and reversed in odd ones, and the auto call's
    label is kept."""
    from types import SimpleNamespace

    from gdn_verify.bench import prefill

    script = _script()
    order = []

    def launch(context_parallel, **_):
        if context_parallel == 32:
            raise ValueError("context_parallel: too many segments")
        chunk.last_kernels = "fused wgmma sm_90a" + (", context-parallel x 8" if context_parallel is None else "")
        order.append(context_parallel)

    chunk = SimpleNamespace(chunk_gated_delta_rule=launch, last_kernels=None)
    torch = SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda: None))
    monkeypatch.setattr(script, "inputs", lambda torch, H, HV, T: {})

    def fake_time_ms(fn, sync, warmup, reps):
        fn()
        return {False: 2.0, None: 1.0}.get(order[-1], 1.5)

    monkeypatch.setattr(prefill, "_time_ms", fake_time_ms)
    row = script.measure_row(torch, chunk, 2, 8, 8192)
    timed = [m for m in script.MODES if m != 32]
    assert set(row) == {"H", "HV", "T", "auto_label", *(str(m) for m in timed)}
    assert row["False"] == 2.0 and row["None"] == 1.0 and row["2"] == 1.5
    assert row["auto_label"].endswith("context-parallel x 8")
    rounds = order[len(timed) :]  # after one first call of each mode
    assert len(rounds) == prefill.ROUNDS * len(timed)
    for i in range(prefill.ROUNDS):
        assert rounds[i * len(timed) : (i + 1) * len(timed)] == (timed if i % 2 == 0 else timed[::-1])


# scripts/fit_context_parallel.py -------------------------------------------------------------------
def _fit_script() -> ModuleType:
    return _load("fit_context_parallel")


def test_the_fit_recovers_the_constants_of_timings_the_model_made():
    """Times made by the model itself with known (a, b, d, e), over the sweep's layouts and lengths
    (H100 waves): the fit returns those constants, and its choices are the measured best."""
    from cupy_kernels.chunk_plan import CP_GAIN

    fit = _fit_script()
    truth = np.array([2.6e-3, 1.5e-3, 0.3, 0.05])  # ms: a full pass's step, an output-free one's, fixed, per segment
    rows = []
    for H, HV in ((2, 8), (8, 16), (16, 32)):
        for T in (8192, 16384, 32768, 65536, 131072):
            row = {"H": H, "HV": HV, "T": T}
            passes = fit.passes_of(row, 132, (9, 0))
            row["False"] = float(fit.features(row, 1, passes) @ truth)
            row.update({str(J): float(fit.features(row, J, passes) @ truth) for J in (2, 4, 8, 16, 32)})
            rows.append(row)
    all_passes = [fit.passes_of(r, 132, (9, 0)) for r in rows]
    np.testing.assert_allclose(fit.fit(rows, all_passes, full_passes=False), truth, rtol=1e-9)
    lines = fit.report(rows, all_passes, truth)
    assert "worst modelled time 0.0% off the measured" in lines
    choices = lines[lines.index("| --- | ---: | --- | --- | ---: |") + 1 :]
    for row, line in zip(rows, choices, strict=True):
        times = fit.measured(row)
        gain = times[1] / min(times.values())  # the best split's speed-up over off (1: off is best)
        assert line.endswith("| 1.00 |") if gain >= CP_GAIN else "| off | 1." in line, (line, gain)
    assert sum(line.endswith("| 1.00 |") and "| off |" not in line for line in choices) >= 3  # splits chosen
    held = fit.fit(rows, all_passes, full_passes=True)
    assert held[0] == held[1] and not np.allclose(held, truth)  # three full passes cannot fit these times


def test_the_fit_of_the_committed_sweep_reproduces_the_fixed_cost_in_use():
    """Three full passes (the model as fitted on 2026-11-27): the fixed cost comes out at the
    constant in use (105 chunk steps), within 5 %."""
    from cupy_kernels.chunk_plan import CP_FIXED_STEPS

    fit = _fit_script()
    rows = fit.rows_of(SWEEP)
    all_passes = [fit.passes_of(r, 132, (9, 0)) for r in rows]
    a, _, d, _ = fit.fit(rows, all_passes, full_passes=True)
    assert abs(d / a / CP_FIXED_STEPS - 1) < 0.05
