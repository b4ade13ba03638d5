"""Fold the ``check --json`` documents of a GPU session into one JSON and a Markdown table.

    python scripts/summarize_checks.py DIR [DIR ...] --out reports/DATE-TOPIC [--label NAME=TEXT]

Each DIR holds ``check-IMPL-DTYPE-SEED.json`` files (``scripts/gpu_checks.sh`` writes them); a later
DIR's run of the same implementation, dtype and seed replaces an earlier one's (a rerun on newer
code), unless it did not finish and the earlier one did. Writes ``checks.json`` (one row per run:
verdict, totals, per property the status, worst error / bound, failure message, kind and named
cause, and the environment) and ``checks.md``.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

NAME = re.compile(r"check-(?P<impl>.+)-(?P<dtype>bfloat16|float16|float32|float64)-(?P<seed>\d+)\.json$")


def row(path: Path, label: str) -> dict:
    doc = json.loads(path.read_text())
    m = NAME.search(path.name)
    assert m is not None
    props = []
    for r in doc["results"]:
        worst = r.get("worst") or {}
        ratio = worst["error"] / worst["bound"] if worst.get("bound") else None
        failure = r.get("failure") or {}
        props.append(
            dict(
                name=r["name"],
                status=r["status"],
                examples=r.get("examples"),
                worst_ratio=ratio,
                note=r.get("note", ""),
                message=failure.get("message", ""),
                kind=failure.get("kind", ""),
                cause=failure.get("cause", ""),
            )
        )
    return dict(
        impl=m["impl"],
        dtype=m["dtype"],
        seed=int(m["seed"]),
        run=label,
        status=doc["status"],
        totals=doc["totals"],
        passed=doc["status"] == "complete"
        and doc["totals"].get("failed", 0) + doc["totals"].get("error", 0) + doc["totals"].get("timeout", 0) == 0,
        seconds=doc.get("seconds"),
        environment=doc.get("environment"),
        properties=props,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--label", action="append", default=[], help="DIR=TEXT: what a directory's runs were")
    args = parser.parse_args()
    labels = dict(item.split("=", 1) for item in args.label)
    rows: dict[tuple, dict] = {}
    for d in args.dirs:
        for path in sorted(d.glob("check-*.json")):
            r = row(path, labels.get(str(d), str(d)))
            old = rows.get((r["impl"], r["dtype"], r["seed"]))
            if old is None or r["status"] == "complete" or old["status"] != "complete":
                rows[r["impl"], r["dtype"], r["seed"]] = r  # an unfinished rerun keeps a finished run
    ordered = [rows[k] for k in sorted(rows)]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "checks.json").write_text(json.dumps(dict(runs=ordered), indent=1) + "\n")
    lines = ["| impl | dtype | seed | verdict | passed / failed / unsupported | failures (kind; named cause) | run |"]
    lines.append("| --- | --- | --- | --- | --- | --- | --- |")
    for r in ordered:
        t = r["totals"]
        failed = [
            (p["kind"], p["cause"].split(" (")[0])
            for p in r["properties"]
            if p["status"] in ("failed", "error", "timeout")
        ]
        what = "; ".join(
            f"{failed.count(c)}x {c[0] or 'no kind'}, cause: {c[1] or 'none'}" for c in sorted(set(failed))
        )
        verdict = "incomplete" if r["status"] != "complete" else ("pass" if r["passed"] else "FAIL")
        counts = f"{t.get('passed', 0)} / {t.get('failed', 0)} / {t.get('unsupported', 0)}"
        lines.append(f"| {r['impl']} | {r['dtype']} | {r['seed']} | {verdict} | {counts} | {what} | {r['run']} |")
    (args.out / "checks.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
