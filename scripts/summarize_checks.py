"""Fold the ``check --json`` documents of a GPU session into one JSON and a Markdown table.

    python scripts/summarize_checks.py DIR [DIR ...] --out reports/DATE-TOPIC [--label NAME=TEXT]

Each DIR holds ``check --json`` documents named ``GROUP-....json`` (``scripts/gpu-machine/gpu_checks.sh``
writes ``check-IMPL-DTYPE-SEED.json``, ``scripts/gpu-machine/gpu_scale.sh`` ``scale-IMPL.json``,
``guard-IMPL.json`` and ``memcheck-IMPL.json``); a later DIR's run of the same group,
implementation, pass (forward or backward), dtype and seed replaces an earlier one's (a rerun on
newer code), unless it did not finish and the earlier one did. Writes ``checks.json`` (one row per
run: pass, verdict, totals, per property the status, worst error / bound, failure message, kind,
named cause and ``--all-configs`` config, the backend tally, the ``all_configs`` summary and the
environment) and ``checks.md``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def row(path: Path, label: str) -> dict | None:
    """One run's row, or None for a JSON file that is not a check document."""
    doc = json.loads(path.read_text())
    if not isinstance(doc, dict) or doc.get("kind") != "check":
        return None
    props = []
    for r in doc["results"]:
        worst = r.get("worst") or {}
        ratio = float(worst["error"]) / float(worst["bound"]) if worst.get("bound") else None
        failure = r.get("failure") or {}
        props.append(
            dict(
                name=r["name"],
                status=r["status"],
                examples=r.get("examples"),
                seconds=r.get("seconds"),
                worst_ratio=ratio,
                note=r.get("note", ""),
                message=failure.get("message", ""),
                kind=failure.get("kind", ""),
                cause=failure.get("cause", ""),
                config=r.get("config"),
            )
        )
    return dict(
        group=path.stem.split("-")[0],
        impl=doc["impl"],
        dtype=doc["dtype"],
        seed=doc["seed"],
        grad=bool(doc.get("grad")),
        run=label,
        status=doc["status"],
        totals=doc["totals"],
        passed=doc["status"] == "complete"
        and doc["totals"].get("failed", 0) + doc["totals"].get("error", 0) + doc["totals"].get("timeout", 0) == 0,
        seconds=doc.get("seconds"),
        backend=doc.get("backend"),
        all_configs=doc.get("all_configs"),
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
        for path in sorted(d.glob("*.json")):
            r = row(path, labels.get(str(d), str(d)))
            if r is None:
                continue
            key = (r["group"], r["impl"], r["grad"], r["dtype"], r["seed"])  # a backward run is a run of its own
            old = rows.get(key)
            if old is None or r["status"] == "complete" or old["status"] != "complete":
                rows[key] = r  # an unfinished rerun keeps a finished run
    ordered = [rows[k] for k in sorted(rows)]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "checks.json").write_text(json.dumps(dict(runs=ordered), indent=1) + "\n")
    columns = (
        "group",
        "impl",
        "pass",
        "dtype",
        "seed",
        "verdict",
        "passed / failed / unsupported",
        "failures",
        "backend",
        "run",
    )
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
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
        ran_on = ", ".join(f"{name} {n}" for name, n in ((r["backend"] or {}).get("calls") or {}).items())
        mode = "backward" if r["grad"] else "forward"
        cells = (r["group"], r["impl"], mode, r["dtype"], r["seed"], verdict, counts, what, ran_on or "-", r["run"])
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    (args.out / "checks.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
