"""Fit the context-parallel cost model (``cupy_kernels/chunk_plan.py``) to the timings of
``scripts/bench_context_parallel.py``, and say what the fitted model would choose.

The model prices a call in chunk steps: one pass over J segments costs its waves (CTAs over the
resident CTAs) times the chunks per segment, and a split call adds a fixed cost and one per
segment. In milliseconds, with the output pass's step ``a``, an output-free pass's step ``b`` (the
B and M passes where the state kernel has forms without output), ``d`` fixed and ``e`` per segment::

    off:  a W_1 C                    J >= 2:  a W_o P + b (W_b + W_m) P + d + e J      (P = ceil(C / J))

Linear in (a, b, d, e), fitted by least squares on relative error (each row divided by its
measured time), over every forced J and off of every row; ``--full-passes`` holds b = a (the model
as it is: three full passes). The constants follow as ``CP_FIXED_STEPS = d / a``, ``CP_SCAN_STEPS =
e / a`` and the output-free pass's weight ``b / a``. The waves come from the plans the launcher would
take (``chunk_plan.select_plan``, ``context_parallel_passes``) for ``--sms`` and ``--capability``
(an H100 or H200 by default), no GPU needed. Per row: the measured times, the fitted model's, and
the J it would choose among those measured (its least modelled time, if that beats off by
``CP_GAIN``) against the measured best.

    python scripts/fit_context_parallel.py reports/2026-11-27-context-parallel/cp_sweep.json --full-passes
    python scripts/fit_context_parallel.py OUT_DIR/context_parallel.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cupy_kernels.chunk_plan import CP_GAIN, context_parallel_passes, select_plan

C = 64
K = V = 128


def waves(ctas: int, slots: int, segments: int) -> int:
    return -(-(segments * ctas) // slots)


def rows_of(path: Path) -> list[dict]:
    """The rows of a bench document (``{"rows": [...]}``) or of a bare list of rows."""
    doc = json.loads(path.read_text())
    return doc["rows"] if isinstance(doc, dict) else doc


def passes_of(row: dict, sms: int, capability: tuple[int, int]) -> tuple[int, int, int, int]:
    HV = row["HV"]
    plan = select_plan("bfloat16", C, K, V, 1, HV, True, None, None, None, None, sms, capability)
    plan_m = select_plan("bfloat16", C, K, K, 1, HV, True, None, True, None, None, sms, capability)
    return context_parallel_passes(plan, plan_m, 1, HV, K, V, sms, capability)


def features(row: dict, J: int, passes: tuple[int, int, int, int]) -> np.ndarray:
    """The coefficients of (a, b, d, e) in the modelled time of ``row`` at J segments (1: off)."""
    ctas, slots, ctas_m, slots_m = passes
    chunks = -(-row["T"] // C)
    if J == 1:
        return np.array([waves(ctas, slots, 1) * chunks, 0.0, 0.0, 0.0])
    per = -(-chunks // J)
    quiet = waves(ctas, slots, J) + waves(ctas_m, slots_m, J)
    return np.array([waves(ctas, slots, J) * per, quiet * per, 1.0, float(J)])


def measured(row: dict) -> dict[int, float]:
    """``{J: ms}`` of a row: off as J = 1, every forced J."""
    out = {1: row["False"]} if row.get("False") is not None else {}
    out.update({int(k): v for k, v in row.items() if k.isdigit() and v is not None})
    return out


def fit(rows: list[dict], all_passes: list, full_passes: bool) -> np.ndarray:
    """``(a, b, d, e)`` in ms; with ``full_passes`` b is held equal to a."""
    A, y = [], []
    for row, passes in zip(rows, all_passes, strict=True):
        for J, ms in measured(row).items():
            f = features(row, J, passes)
            if full_passes:
                f = np.array([f[0] + f[1], f[2], f[3]])
            A.append(f / ms)
            y.append(1.0)
    x, *_ = np.linalg.lstsq(np.array(A), np.array(y), rcond=None)
    return np.array([x[0], x[0], x[1], x[2]]) if full_passes else x


def report(rows: list[dict], all_passes: list, x: np.ndarray) -> list[str]:
    a, b, d, e = x
    lines = [
        f"step a = {a * 1000:.3f} us; output-free pass weight b / a = {b / a:.3f}; "
        f"CP_FIXED_STEPS = d / a = {d / a:.1f}; CP_SCAN_STEPS = e / a = {e / a:.1f}",
        "",
        "| H/HV | T | J | measured ms | model ms | error |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    worst = 0.0
    choices = []
    for row, passes in zip(rows, all_passes, strict=True):
        times = measured(row)
        model = {J: float(features(row, J, passes) @ x) for J in times}
        for J, ms in times.items():
            err = model[J] / ms - 1
            worst = max(worst, abs(err))
            lines.append(f"| {row['H']}/{row['HV']} | {row['T']} | {'off' if J == 1 else J} | {ms:.3f} | "
                         f"{model[J]:.3f} | {err:+.1%} |")  # fmt: skip
        split = min((J for J in model if J > 1), key=lambda J: model[J], default=1)
        choice = split if split > 1 and model[split] * CP_GAIN <= model.get(1, np.inf) else 1
        best = min(times, key=lambda J: times[J])
        choices.append(
            f"| {row['H']}/{row['HV']} | {row['T']} | {'off' if best == 1 else best} | "
            f"{'off' if choice == 1 else choice} | {times[choice] / times[best]:.2f} |"
        )
    lines += ["", f"worst modelled time {worst:.1%} off the measured", ""]
    lines += [
        "| H/HV | T | measured best | fitted model's choice | its time / best |",
        "| --- | ---: | --- | --- | ---: |",
    ]
    return lines + choices


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", type=Path, nargs="+", help="bench_context_parallel.py documents (or row lists)")
    parser.add_argument("--full-passes", action="store_true", help="hold b = a: three full passes (the model today)")
    parser.add_argument("--sms", type=int, default=132)
    parser.add_argument("--capability", default="9.0", help="MAJOR.MINOR (9.0: H100, H200)")
    args = parser.parse_args(argv)
    try:
        capability = tuple(int(p) for p in args.capability.split("."))
        rows = [r for path in args.json for r in rows_of(path)]
    except (OSError, ValueError, KeyError) as exc:
        print(f"fit_context_parallel: {exc}", file=sys.stderr)
        return 2
    all_passes = [passes_of(row, args.sms, (capability[0], capability[1])) for row in rows]
    print("\n".join(report(rows, all_passes, fit(rows, all_passes, args.full_passes))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
