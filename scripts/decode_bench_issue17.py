"""Decode bench for issue 17: B = 1, 64, 256, 1024 (T = 1, H = 16, HV = 32, K = V = 128, fp32 state,
l2norm in kernel), ours vs FLA (when importable) vs the copy ceiling, in one process.

Writes ``OUT/decode_bench.json`` (the rows of ``gdn_verify.bench.decode_bench``) and
``OUT/decode_bench.md`` (its table plus the issue's two goals, met or not, with the numbers).
Usage: ``python3 scripts/decode_bench_issue17.py OUT``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GOAL_FRACTION = 0.90  # of the copy ceiling, at B >= 64
GOAL_B1_US = 10.0  # DecodeStep, Python call to result


def main(out: str) -> int:
    from gdn_verify.bench import decode as bench

    rows = bench.decode_bench(batches=(1, 64, 256, 1024))
    Path(out, "decode_bench.json").write_text(json.dumps(rows, indent=1, default=str))
    lines = [bench.format_table(rows), "", "Issue 17 goals:", ""]
    for r in rows:
        if r["batch"] >= 64:
            best = max([r["ours_frac"], *r.get("variant_frac", {}).values()])
            verdict = "met" if best >= GOAL_FRACTION else "NOT met"
            lines.append(f"- B = {r['batch']}: best of ours / variants {best:.0%} of the copy ceiling "
                         f"(goal {GOAL_FRACTION:.0%}): {verdict}")  # fmt: skip
        if "step_host_us" in r:
            verdict = "met" if r["step_host_us"] <= GOAL_B1_US else "NOT met"
            lines.append(f"- B = 1: DecodeStep call to result {r['step_host_us']:.1f} us (goal {GOAL_B1_US:.0f} us): "
                         f"{verdict}")  # fmt: skip
    text = "\n".join(lines) + "\n"
    Path(out, "decode_bench.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
