"""Reports: run the experiments and the property suite for several implementations and write a
self-contained report directory (index.html, report.md, results.json, PNG figures).

``measurements`` (the experiments: error vs length, distributions, error map, gate and beta
sweeps), ``error`` statistics come from ``gdn_verify.core.error_stats``, ``figures`` and
``render`` (PNG, Markdown, HTML), ``environment`` (versions and device). :func:`options`
validates a request, :func:`make_report` runs it and writes the directory.

Sizes: on a machine with a usable CUDA GPU (and without ``--quick``) H=4, HV=8, K=V=128 and
T up to 16384, with the float64 GPU recurrence (``cupy-oracle``) as the oracle; otherwise
K=V=32 and T up to 1024 with the NumPy oracle. Implementations that cannot run here are
listed as skipped with the reason; the report is made for the rest.
"""

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
from gdn_verify.core import arrays
from gdn_verify.core.problem import DTYPES
from gdn_verify.implementations import ConfigurationError, Implementation
from gdn_verify.report import environment, measurements

GPU_DEFAULTS = ("cupy-chunk", "cupy-recurrent", "fla-chunk", "fla-recurrent")
CPU_DEFAULTS = ("numpy", "numpy-recurrent")
DEFAULT_DTYPES = ("float32", "bfloat16")
DEFAULT_OUT = Path(".gdn_verify") / "reports"  # --out's default folder, relative to where the command runs


def gpu_usable() -> bool:
    """A CUDA GPU is visible to CuPy or to torch."""
    for kind in ("cupy", "torch"):
        try:
            arrays.check_kind(kind)
        except arrays.ArrayKindUnavailable:
            continue
        if kind == "cupy":
            return True
        import torch

        return bool(torch.cuda.is_available())
    return False


def resolve_all(names: list[str] | None, array: str | None) -> tuple[list[Implementation], list[dict]]:
    """``(implementations, skipped)``; a name nobody knows is misuse, one that cannot run here is skipped."""
    defaulted = not names
    names = list(dict.fromkeys(names or GPU_DEFAULTS))
    impls, skipped = [], []
    for name in names:
        if name not in implementations.names() and ":" not in name:
            raise ConfigurationError(
                "impl", f"{name!r}: unknown; choose from {', '.join(implementations.names())} or MODULE:FUNCTION"
            )
        try:
            impls.append(implementations.resolve(name, array if ":" in name else None))
        except ConfigurationError as exc:
            skipped.append(dict(impl=name, reason=str(exc)))
    if defaulted and not impls:
        impls = [implementations.resolve(name) for name in CPU_DEFAULTS]
    if not impls:
        raise ConfigurationError(
            "impl", "no implementation can run here (" + "; ".join(f"{s['impl']}: {s['reason']}" for s in skipped) + ")"
        )
    return impls, skipped


@dataclasses.dataclass
class Options:
    impls: list[Implementation]
    skipped: list[dict]
    dtypes: list[str]
    sizes: measurements.Sizes
    seed: int
    out: Path
    max_examples: int
    properties: list[str] | None  # None: every property that applies
    head_dims: tuple[int, ...] | None = None


def options(
    impls: list[str] | None = None,
    *,
    array: str | None = None,
    dtypes: list[str] | None = None,
    out: str | Path | None = None,
    max_tokens: int | None = None,
    seed: int = 0,
    quick: bool = False,
    max_examples: int | None = None,
    properties: list[str] | None = None,
    dims: tuple[int, ...] | None = None,
) -> Options:
    """Validate a report request; raises :class:`ConfigurationError` naming the argument."""
    from gdn_verify.properties import NAMES

    dtypes = list(dict.fromkeys(dtypes or DEFAULT_DTYPES))
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise ConfigurationError("dtypes", f"{bad[0]!r}: choose from {', '.join(DTYPES)}")
    if max_tokens is not None and not 16 <= max_tokens <= 1 << 20:
        raise ConfigurationError("max_tokens", f"{max_tokens}: must be between 16 and 1048576")
    if max_examples is not None and max_examples < 1:
        raise ConfigurationError("max_examples", f"{max_examples}: must be at least 1")
    unknown = [n for n in properties or () if n not in NAMES]
    if unknown or properties == []:
        raise ConfigurationError(
            "properties", f"unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(NAMES)}"
        )
    resolved, skipped = resolve_all(impls, array)
    sizes = measurements.FULL if not quick and gpu_usable() else measurements.SMALL
    if max_tokens is not None:
        sizes = dataclasses.replace(sizes, max_tokens=max_tokens)
    # By default under .gdn_verify/ (git-ignored, beside the cases and plans): reports/ is tracked,
    # and every run left an untracked folder there.
    out = Path(out) if out else DEFAULT_OUT / time.strftime("report-%Y%m%d-%H%M%S", time.gmtime())
    if out.exists() and not out.is_dir():
        raise ConfigurationError("out", f"{out}: exists and is not a directory")
    return Options(
        resolved,
        skipped,
        dtypes,
        sizes,
        seed,
        out,
        max_examples or (10 if quick else 20),
        list(properties) if properties else None,
        dims,
    )


def run_properties(options: Options, step: Callable[[str], None], note: Callable[[str], None]) -> list[dict]:
    """The property suite per (implementation, dtype), as ``check --json`` rows with replay commands."""
    from gdn_verify.api import check

    rows = []
    for impl in options.impls:
        for dtype in options.dtypes:
            label = f"check {impl.name}, {dtype}"
            step(label)
            try:
                result = check(
                    impl,
                    dtype=dtype,
                    properties=options.properties,
                    seed=options.seed,
                    max_examples=options.max_examples,
                    dims=options.head_dims,
                    max_tokens=min(options.sizes.max_tokens, 2048),
                    cases_dir=options.out / "cases",
                    progress=lambda p, n, w, label=label: note(f"{label}: {p} ({n})"),
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
    runner = measurements.Runner(options.impls, options.dtypes, options.sizes, options.seed, oracle)
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
        environment=environment.capture(options.seed, argv),
        config=dict(
            implementations=[dict(name=i.name, description=i.description, array=i.array) for i in options.impls],
            skipped=options.skipped,
            dtypes=options.dtypes,
            sizes=dataclasses.asdict(s),
            oracle=oracle_name,
            seed=options.seed,
            max_examples=options.max_examples,
            properties=options.properties,
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
