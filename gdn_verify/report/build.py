"""Make a report: run the experiments and the property suite on a validated request
(``request.py``) and write the directory (index.html, report.md, results.json, PNG figures,
error_map.npz)."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gdn_verify import implementations
from gdn_verify.report import environment, measurements
from gdn_verify.report.request import Options, gpu_usable


def run_properties(options: Options, step: Callable[[str], None], note: Callable[[str], None]) -> list[dict]:
    """The property suite per (implementation, dtype), as ``check --json`` rows with replay commands."""
    from gdn_verify.api import check

    rows = []
    for impl in options.impls:
        for dtype in options.dtypes:
            label = f"check {impl.name}, {dtype}"
            step(label)
            try:
                # The suite's longest T is the sweep's, at most 2048; set per row, where a value check
                # refuses (a sweep under 64 tokens) makes an error row, like the kernel raising.
                checks = options.checks.replace(dtype=dtype, max_tokens=min(options.sizes.max_tokens, 2048))
                result = check(
                    impl, **checks.keywords(), progress=lambda p, n, w, label=label: note(f"{label}: {p} ({n})")
                )
            except Exception as exc:  # noqa: BLE001 - the suite itself broke on this implementation
                rows.append(
                    dict(
                        impl=impl.name,
                        dtype=dtype,
                        results=[
                            dict(
                                name="(suite)",
                                status="error",
                                examples=0,
                                unsupported=0,
                                note=f"the property runner raised {type(exc).__name__}: {exc}",
                            )
                        ],
                    )
                )
                continue
            rows.append(dict(impl=impl.name, dtype=dtype, results=result.as_dict()["results"]))
    return rows


def summarize(results: dict, properties: list[dict]) -> list[dict]:
    """One row per (implementation, dtype): the numbers a kernel author compares first."""
    rows = []
    for e in results["error_vs_length"]:
        impl, dtype = e["impl"], e["dtype"]
        row = dict(impl=impl, dtype=dtype, error=e.get("error"))
        if e["lengths"]:
            floor = results["rounding_floor"][dtype]
            row.update(
                tokens=e["lengths"][-1],
                output_rms=e["output_rms"][-1],
                state=e["state"][-1],
                floor=floor["output_rms"][len(e["lengths"]) - 1],
                exponent=e.get("exponent"),
            )
            if row["output_rms"] is not None and row["floor"]:
                row["times_floor"] = row["output_rms"] / row["floor"]
        for d in results["distributions"]:
            if (d["impl"], d["dtype"]) == (impl, dtype):
                row.update(
                    correctly_rounded=d["ulp"]["correctly_rounded"],
                    median_ulp=d["ulp"]["median"],
                    p99_ulp=d["ulp"]["p99"],
                    max_ulp=d["ulp"]["max"],
                )
        for m in results["error_map"]["entries"]:
            if (m["impl"], m["dtype"]) == (impl, dtype) and "worst" in m:
                row["worst_token_error"] = m["worst"]["error"]
        for p in properties:
            if (p["impl"], p["dtype"]) == (impl, dtype):
                row["properties"] = {
                    s: sum(r["status"] == s for r in p["results"]) for s in ("passed", "failed", "unsupported", "error")
                }
        rows.append(row)
    return rows


def _json_ready(x: Any) -> Any:
    """NaN and inf become null (JSON has neither); NumPy scalars become Python numbers."""
    if isinstance(x, dict):
        return {str(k): _json_ready(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_ready(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, Path):
        return str(x)
    return x


def make_report(
    options: Options, argv: list[str] | None = None, progress: Callable[[float, str], None] | None = None
) -> dict:
    """Run everything and write the report directory; returns the results document.

    ``progress(fraction_done, label)`` is called as each step starts and within long ones.
    """
    from gdn_verify.report import figures, render

    oracle_name, oracle = implementations.choose_oracle("cupy" if gpu_usable() else "numpy")
    names = [impl.name for impl in options.impls]
    runner = measurements.Runner(options.impls, options.dtypes, options.sizes, options.checks.seed, oracle)
    total = runner.steps() + len(names) * len(options.dtypes)
    done = [0]

    def step(label: str) -> None:
        done[0] += 1
        if progress is not None:
            progress(min(done[0] / total, 1.0), label)

    def note(label: str) -> None:
        if progress is not None:
            progress(min(done[0] / total, 1.0), label)

    runner.step = step
    started = time.perf_counter()
    results, maps = runner.run()
    properties = run_properties(options, step, note)
    s = options.sizes
    doc = dict(
        environment=environment.capture(options.checks.seed, argv),
        config=dict(
            implementations=[dict(name=i.name, description=i.description, array=i.array) for i in options.impls],
            skipped=options.skipped,
            dtypes=options.dtypes,
            sizes=dataclasses.asdict(s),
            oracle=oracle_name,
            seed=options.checks.seed,
            max_examples=options.checks.max_examples,
            properties=options.checks.properties,
            chunk=measurements.CHUNK,
            decay_rates=measurements.decay_rates(s.HV).tolist(),
        ),
        summary=summarize(results, properties),
        **results,
        properties=properties,
    )
    doc["seconds"] = round(time.perf_counter() - started, 1)
    doc = _json_ready(doc)
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    paths = figures.draw_all(doc, maps, names, out)
    keys = sorted(maps)
    np.savez_compressed(
        out / "error_map.npz",
        names=np.array([f"{i} {d}" for i, d in keys]),
        **{f"errors_{n}": maps[k] for n, k in enumerate(keys)},
    )
    (out / "results.json").write_text(json.dumps(doc, indent=1, allow_nan=False))
    (out / "report.md").write_text(render.markdown(doc, [p.name for p in paths]))
    (out / "index.html").write_text(render.html(doc, [p.name for p in paths]))
    return doc
