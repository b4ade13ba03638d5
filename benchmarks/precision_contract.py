"""The precision contract's margins: each rounding model x input dtype, worst error / bound.

Usage: python benchmarks/precision_contract.py [--examples N] [--seeds 1,2,3] [--models a,b]
       [--dtypes float32,float16,bfloat16] [--workers W] [--out DIR]

Runs every model of ``gdn_verify.implementations.precision`` (allowed roundings, forbidden ones,
TF32) through the properties that compare with the float64 oracle, ``N`` generated examples per
property and seed (no shrinking: the ratio of every example counts), and writes ``DIR/contract.json``
and ``DIR/contract.md``: per model and dtype the largest error / bound over every property and seed,
per property, and the largest growth exponent of ``error_growth`` against its bound (0.75).
Goal: allowed models below 0.5, forbidden ones above 3.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import hypothesis
from hypothesis import HealthCheck, Phase, given, settings

from gdn_verify.core import environment
from gdn_verify.core.property import Violation
from gdn_verify.implementations import from_callable
from gdn_verify.implementations.precision import BY_NAME, MODELS
from gdn_verify.properties import Limits, catalogue
from gdn_verify.properties.native import GROWTH_BOUND, growth_measurement, growth_points

PROPERTIES = ("matches_reference", "gate_extremes", "state_continuation", "error_growth")
DTYPES = ("float32", "float16", "bfloat16")
ALLOWED_GOAL, FORBIDDEN_GOAL = 0.5, 3.0


def run_cell(model: str, dtype: str, prop_name: str, seed: int, examples: int) -> dict:
    """Worst error / bound of one model on one property (and the growth exponent for error_growth)."""
    impl = from_callable(BY_NAME[model].run, "numpy", name=model)
    prop = catalogue(Limits(dtype=dtype))[prop_name]
    ratios: list[float] = []
    exponents: list[float] = []

    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        verbosity=hypothesis.Verbosity.quiet,
    )
    @given(prop.strategy(impl))
    def run(case):
        problem, params = case
        try:
            if prop_name == "error_growth":
                points = growth_points(impl, problem, params["lengths"], strict=False)
                ratios.append(max((m.ratio for _, m, _ in points), default=0.0))
                if params.get("regime") != "retention":  # judged at each length only (check_error_growth)
                    exponents.append(growth_measurement(problem, points).error)
                return
            measurement = prop.check(impl, problem, params)
        except Violation as exc:
            measurement = exc.measurement
        except NotImplementedError:
            return
        except Exception:  # noqa: BLE001 - a model that raises (NaN carried into the next call) fails
            measurement = None
        ratios.append(math.inf if measurement is None else measurement.ratio)

    start = time.perf_counter()
    hypothesis.seed(seed)(run)()
    return dict(
        model=model,
        dtype=dtype,
        property=prop_name,
        seed=seed,
        examples=len(ratios),
        worst=max(ratios, default=0.0),
        growth_exponent=max(exponents, default=None) if exponents else None,
        seconds=round(time.perf_counter() - start, 1),
    )


def summarize(cells: list[dict]) -> list[dict]:
    """Per model and dtype: the worst ratio over properties and seeds, and per property."""
    rows = []
    for model in MODELS:
        for dtype in DTYPES:
            mine = [c for c in cells if c["model"] == model.name and c["dtype"] == dtype]
            if not mine:
                continue
            per_property = {p: max((c["worst"] for c in mine if c["property"] == p), default=None) for p in PROPERTIES}
            exponents = [c["growth_exponent"] for c in mine if c["growth_exponent"] is not None]
            worst = max(c["worst"] for c in mine)
            identity = dtype in model.identity_for
            if model.allowed is True:
                verdict = "ok" if worst < ALLOWED_GOAL else "SHORT"
            elif identity:
                verdict = "n/a (identity)"
            else:
                verdict = "ok" if worst > FORBIDDEN_GOAL else "SHORT"
            kind = {True: "allowed", False: "forbidden", None: "named loss"}[model.allowed]
            rows.append(
                dict(
                    model=model.name,
                    kind=kind,
                    description=model.description,
                    dtype=dtype,
                    worst=worst,
                    per_property=per_property,
                    growth_exponent=max(exponents) if exponents else None,
                    examples=sum(c["examples"] for c in mine),
                    verdict=verdict if model.allowed is not None else "",
                )
            )
    return rows


def markdown(rows: list[dict], args: argparse.Namespace) -> str:
    head = [
        "# Precision contract: worst error / bound",
        "",
        f"Generated by `python benchmarks/precision_contract.py --examples {args.examples} --seeds "
        f"{args.seeds}` (CPU, NumPy). Each cell: the largest error / bound over every example of the "
        "property and every seed (no shrinking); `error_growth` counts its per-length comparisons, and "
        f"its growth exponent (fitted on the none and mild regimes; retention is judged at each length) is "
        f"listed apart (bound {GROWTH_BOUND}; a random walk, as correct kernels make, is 0.5). "
        "Goal: allowed models below 0.5, forbidden ones above 3.",
        "",
        "| model | kind | dtype | worst | " + " | ".join(PROPERTIES) + " | growth exp. | goal |",
        "| --- | --- | --- | --- | " + " | ".join("---" for _ in PROPERTIES) + " | --- | --- |",
    ]

    def fmt(x):
        return "" if x is None else ("inf" if x == math.inf else f"{x:.3g}")

    for r in rows:
        cells = " | ".join(fmt(r["per_property"][p]) for p in PROPERTIES)
        head.append(
            f"| {r['model']} | {r['kind']} | {r['dtype']} | {fmt(r['worst'])} | {cells} | "
            f"{fmt(r['growth_exponent'])} | {r['verdict']} |"
        )
    head += ["", "Models:", ""] + [f"- `{m.name}`: {m.description}" for m in MODELS]
    return "\n".join(head) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=40)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--models", default=",".join(m.name for m in MODELS))
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--properties", default=",".join(PROPERTIES))
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("reports/2026-11-25-precision-contract"))
    args = parser.parse_args(argv)
    unknown = [m for m in args.models.split(",") if m not in BY_NAME]
    if unknown:
        print(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(BY_NAME)}", file=sys.stderr)
        return 2
    jobs = [
        (model, dtype, prop, int(seed), args.examples)
        for model in args.models.split(",")
        for dtype in args.dtypes.split(",")
        for prop in args.properties.split(",")
        for seed in args.seeds.split(",")
    ]
    cells: list[dict] = []
    start = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        for cell in pool.map(run_cell, *zip(*jobs)):
            cells.append(cell)
            print(
                f"[{len(cells)}/{len(jobs)} {time.perf_counter() - start:.0f}s] {cell['model']} {cell['dtype']} "
                f"{cell['property']} seed {cell['seed']}: worst {cell['worst']:.3g}",
                file=sys.stderr,
                flush=True,
            )
    rows = summarize(cells)
    args.out.mkdir(parents=True, exist_ok=True)
    document = dict(
        generated_by="benchmarks/precision_contract.py",
        arguments=vars(args) | {"out": str(args.out)},
        environment=environment.describe(),
        goals=dict(allowed_below=ALLOWED_GOAL, forbidden_above=FORBIDDEN_GOAL, growth_bound=GROWTH_BOUND),
        rows=rows,
        cells=cells,
    )
    (args.out / "contract.json").write_text(json.dumps(document, indent=1, default=str) + "\n")
    (args.out / "contract.md").write_text(markdown(rows, args))
    print(markdown(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
