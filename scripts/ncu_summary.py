"""Nsight Compute text logs as one table per log: each profiled launch's time, DRAM bytes,
throughputs, occupancy, registers and shared memory, attributed to the range the program announced
(``gdn_verify.bench.ncu_text``), then per-range totals. Writes ``OUT.json`` and ``OUT.md``. CPU::

    python3 scripts/ncu_summary.py OUT LOG [LOG ...] [--marker-after]

``--marker-after``: the program printed each marker after its launch (``profile_decode_ncu.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gdn_verify.bench import ncu_text  # noqa: E402 - after the path above


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="ncu_summary.py")
    parser.add_argument("out", help="path without suffix: OUT.json and OUT.md are written")
    parser.add_argument("logs", nargs="+", help="ncu text logs")
    parser.add_argument("--marker-after", action="store_true", help="markers follow their launches")
    args = parser.parse_args(argv)
    reports, text = {}, []
    for log in args.logs:
        path = Path(log)
        if not path.is_file():
            print(f"ncu_summary.py: {log}: no such file", file=sys.stderr)
            return 2
        report = ncu_text.summary(ncu_text.parse(path.read_text(errors="replace"), args.marker_after))
        if not report["launches"]:
            print(f"ncu_summary.py: {log}: no profiled launch in it (not an ncu text log?)", file=sys.stderr)
        reports[path.name] = report
        text += [f"## {path.name}", "", ncu_text.markdown(report)]
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(reports, indent=1) + "\n")
    out.with_suffix(".md").write_text("\n".join(text))
    launches = sum(len(r["launches"]) for r in reports.values())
    print(f"{out.with_suffix('.json')}, {out.with_suffix('.md')}: {launches} launches")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
