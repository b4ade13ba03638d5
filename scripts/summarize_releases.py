"""Join the release-matrix documents of a GPU session into one table per adapter.

    python scripts/summarize_releases.py DIR --out OUTDIR

DIR holds ``gdn-verify matrix --json`` documents (``scripts/gpu-machine/gpu_releases.sh`` writes
one per adapter and release, ``IMPL-VERSION.json``, and ``IMPL-VERSION-scale.json`` for the scale
tier) and, beside each, the children's own check documents (``IMPL-VERSION-VERSION.json``). Prints
one matrix table per adapter and tier (releases in version order) and writes ``releases.json``: per
adapter and tier, the matrix rows, and per failed property the child's failure message.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gdn_verify.report import matrix as matrix_report
from gdn_verify.runners.matrix import Cell, MatrixResult, Row


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in version.split("."))


def _row(d: dict) -> Row:
    # api.write_json writes a non-finite ratio as "inf" / "nan"; float() reads both back
    cells = {
        name: Cell(**{**c, "ratio": None if c["ratio"] is None else float(c["ratio"])})
        for name, c in d["properties"].items()
    }
    return Row(**{**d, "properties": cells})


def _failures(path: Path) -> dict[str, str]:
    """property -> the failure message of the child's check document at ``path`` (none: {})."""
    if not path.is_file():
        return {}
    doc = json.loads(path.read_text())
    out = {}
    for r in doc.get("results", []):
        failure = r.get("failure") or {}
        if r.get("status") not in ("passed", "unsupported") and (failure.get("message") or r.get("note")):
            out[r["name"]] = (failure.get("message") or r.get("note") or "")[:2000]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    groups: dict[tuple[str, str], list[tuple[dict, Path]]] = {}
    for path in sorted(args.dir.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a document being rewritten
        if not isinstance(doc, dict) or doc.get("kind") != "matrix":
            continue
        tier = "scale" if path.stem.endswith("-scale") else "default"
        groups.setdefault((doc["impl"], tier), []).append((doc, path))
    summary = []
    for (impl, tier), docs in sorted(groups.items()):
        first = docs[0][0]
        interpreted = bool(first["environment"].get("interpreter"))
        result = MatrixResult(impl, first["library"], [], first["check_args"], interpreted)
        failures = {}
        for doc, path in docs:
            for d in doc["rows"]:
                result.rows.append(_row(d))
                result.versions.append(d["version"])
                failures[d["version"]] = _failures(path.with_name(f"{path.stem}-{d['version']}.json"))
            missing = [v for v in doc["versions"] if v not in {r["version"] for r in doc["rows"]}]
            for v in missing:  # still running when packed
                result.rows.append(Row(v, "interrupted", reason=f"not finished ({doc['status']})"))
                result.versions.append(v)
        result.rows.sort(key=lambda r: _version_key(r.version))
        result.versions.sort(key=_version_key)
        print(f"## {impl} ({tier})")
        print("\n".join(matrix_report.table_lines(result)))
        print()
        summary.append(
            dict(
                impl=impl,
                tier=tier,
                check_args=result.check_args,
                device=next((r.device for r in result.rows if r.device), None),
                rows=[r.as_dict() for r in result.rows],
                failures=failures,
            )
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "releases.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
