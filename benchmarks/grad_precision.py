"""The gradient tolerance model's margins: correct NumPy backwards and planted gradient bugs.

Usage: python benchmarks/grad_precision.py [--seeds 1,2,3] [--dtypes float32,float16,bfloat16]
       [--cases a,b] [--out DIR]

For every problem regime of :data:`CASES` (gates from none to saturated spikes, beta near 0 and 1,
GVA, varlen with a padded tail, the in-kernel l2norm, with and without an initial state and a
final-state cotangent, T from 16 to 512), every input dtype and seed, it computes the float64
gradients and their bounds (``core.grad_tolerance``) and, per gradient, error / bound of

- the correct models ``numpy-grad`` and ``numpy-grad16`` (``implementations/numpy_grad.py``):
  the worst ratio over all gradients and examples (goal: at most 0.5);
- every planted bug (``implementations/planted_grad.py``), on the examples of its regime
  (``planted_grad.REGIMES``: where the bug changes the gradients): the smallest of the per-example
  worst ratios (goal: at least 3); ``nondeterministic_dk`` is judged by determinism (two calls
  compared bitwise), not by the tolerance: n/a.

Writes ``DIR/grad_precision.json`` (every example) and ``DIR/grad_precision.md`` (the table).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

from gdn_verify.core import environment
from gdn_verify.core import grad_tolerance as gtol
from gdn_verify.core.gradients import cotangents
from gdn_verify.core.problem import Problem
from gdn_verify.implementations import planted_grad
from gdn_verify.implementations.numpy_grad import MODELS, numpy_grad_implementation
from gdn_verify.properties.strategies import beta_values, gate_values, unit_rows

DTYPES = ("float32", "float16", "bfloat16")
ALLOWED_GOAL, PLANTED_GOAL = 0.5, 3.0
DEFAULTS = dict(
    B=2, T=100, H=1, HV=2, K=16, V=16, gates="mild", beta="random", l2norm=False, h0="random", dht=True, lengths=None
)
# name -> changes to DEFAULTS. "lengths" makes a varlen call (B = 1) and "tail" pads it past cu_seqlens[-1].
CASES: dict[str, dict] = {
    "mild": dict(),
    "none": dict(gates="none"),
    "moderate": dict(gates="moderate"),
    "strong": dict(gates="strong"),
    "spikes": dict(gates="spikes", T=130),
    "strong_run": dict(gates="strong_run", T=130),
    "mixed": dict(gates="mixed"),
    "tiny": dict(gates="tiny"),
    "retention": dict(gates="retention"),
    "beta_near0": dict(beta="near0"),
    "beta_near1": dict(beta="near1"),
    "gva_l2norm": dict(H=2, HV=4, l2norm=True, gates="moderate"),
    "gva4_l2norm_mild": dict(H=1, HV=4, l2norm=True),
    "varlen_tail": dict(B=1, lengths=(0, 37, 70, 130), tail=9),
    "varlen_strong": dict(B=1, lengths=(5, 66, 100), tail=3, gates="strong"),
    "no_state_no_dht": dict(h0=None, dht=False, gates="moderate"),
    "state_no_dht": dict(dht=False, gates="mild"),
    "large_state": dict(h0="large"),
    "short": dict(B=3, T=16),
    "wide_l2norm": dict(B=1, T=128, H=2, HV=2, K=64, V=64, l2norm=True),
    "long": dict(B=1, T=512, K=32, V=32),
    "long_strong": dict(B=1, T=512, K=32, V=32, gates="strong"),
}
MEMORY = ("none", "mild", "tiny", "retention")  # gates that keep what was written
DECAYING = ("moderate", "strong")  # every exp(g) well below 1
# Saturated gates (-1e4, or a run of -20..-40) inside a retained memory: a chunk's gate cumsum reaches
# 1e3..1e4, and the forward's float32 gate-cumsum term (tolerance.C_GATE u_fp32 kappa_gate, for a
# random walk of gate shifts of u |cumsum| per token) puts every gradient's bound at several percent,
# float32 included: a bug smaller than that is not visible there. Reported apart ("saturated").
SATURATED = ("spikes", "mixed", "strong_run")


def build(spec: dict, dtype: str, seed: int) -> Problem:
    """The problem of one case: unit keys (raw normal keys under l2norm), normal q and v."""
    s = {**DEFAULTS, **spec}
    rng = np.random.default_rng([seed, sum(map(ord, str(sorted(spec.items()))))])
    H, HV, K, V = s["H"], s["HV"], s["K"], s["V"]
    cu = None
    if s["lengths"] is not None:
        cu = np.concatenate([[0], np.cumsum(s["lengths"])]).astype(np.int64)
        B, T = 1, int(cu[-1]) + s.get("tail", 0)
    else:
        B, T = s["B"], s["T"]
    N = B if cu is None else len(cu) - 1
    q = rng.standard_normal((B, T, H, K))
    k = rng.standard_normal((B, T, H, K)) if s["l2norm"] else unit_rows(rng, (B, T, H, K))
    v = rng.standard_normal((B, T, HV, V))
    g = gate_values(rng, (B, T, HV), s["gates"])
    if s["beta"] == "near0":
        beta = 10.0 ** rng.uniform(-4, -1, (B, T, HV))
    elif s["beta"] == "near1":
        beta = 1.0 - 10.0 ** rng.uniform(-4, -1, (B, T, HV))
    else:
        beta = beta_values(rng, (B, T, HV))
    if s["gates"] == "retention" and T:  # writes up to a random token, then only reads
        beta[:, int(rng.integers(1, max(2, T // 3))) :] = 0.0
    h0 = None
    if s["h0"] is not None:
        h0 = (rng.standard_normal((N, HV, K, V)) * (100.0 if s["h0"] == "large" else 1.0)).astype(np.float32)
    problem = Problem(q, k, v, g, beta, initial_state=h0, use_qk_l2norm_in_kernel=s["l2norm"], cu_seqlens=cu)
    return problem.astype(np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype))


def needs_met(bug: str, spec: dict, dtype: str) -> bool:
    """Whether a case has what ``bug`` needs to change the gradients at all (``planted_grad.REGIMES``)."""
    s = {**DEFAULTS, **spec}
    longest = max(s["lengths"]) if s["lengths"] is not None else s["T"]
    needs = {
        "dht": s["dht"],
        "no_dht": not s["dht"],
        "h0": s["h0"] is not None,
        "l2norm": s["l2norm"],
        "gva": s["HV"] > s["H"],
        "varlen_tail": s.get("tail", 0) > 0,
        "long": longest > 64,
        "float32": dtype == "float32",
        "determinism": True,
        "gated": s["gates"] not in ("none",),
    }
    return all(needs[need] for need in planted_grad.REGIMES[bug])


def in_regime(bug: str, spec: dict, dtype: str) -> bool:
    """Whether ``bug`` changes the gradients of a case (``planted_grad.REGIMES``) by more than a
    correct kernel may err there (saturated gates excluded: :data:`SATURATED`)."""
    s = {**DEFAULTS, **spec}
    if s["gates"] in SATURATED and bug not in ("varlen_tail_unwritten", "nondeterministic_dk"):
        return False
    ok = needs_met(bug, spec, dtype)
    if bug in ("dbeta_uses_v", "dk_doubled"):  # a memory that survives to be read
        ok = ok and s["gates"] in MEMORY
    if bug == "dv_missing_beta":
        ok = ok and s["beta"] != "near1"
    if bug in ("dg_wrt_decay", "dh0_undecayed"):
        ok = ok and s["gates"] in DECAYING
    if bug == "dg_chunk_end_missing":  # a 100x initial state sets dg's scale, the missing term is ~4% of it
        ok = ok and s["h0"] != "large"
    if bug == "chunk_boundary_decay_missing":  # every boundary token decays (exp(g) ~ 0)
        ok = ok and s["gates"] == "strong"
    if bug == "dg_cumsum16":  # dg not swamped by the float32 scan term of saturated gates
        ok = ok and s["gates"] in MEMORY + ("moderate",)
    return ok


def ratios(problem: Problem, grads: dict, reference: dict, tolerance: gtol.GradTolerance) -> tuple[float, str]:
    """The worst error / bound over the gradients, and which gradient."""
    errors = gtol.grad_errors(problem, grads, reference, tolerance)
    out = {n: (e / tolerance.bounds[n] if not math.isnan(e) else math.inf) for n, e in errors.items()}
    worst = max(out, key=lambda n: out[n])
    return out[worst], worst


def run_example(case: str, dtype: str, seed: int) -> dict:
    spec = CASES[case]
    problem = build(spec, dtype, seed)
    do, dht = cotangents(problem, seed, {**DEFAULTS, **spec}["dht"])
    start = time.perf_counter()
    reference, tolerance = gtol.grad_reference_and_tolerance(problem, do, dht, seed=seed)
    seconds = time.perf_counter() - start
    record: dict = dict(case=case, dtype=dtype, seed=seed, tolerance_seconds=round(seconds, 2), models={}, bugs={})
    record["bounds"] = tolerance.bounds
    for name in MODELS:
        grads = numpy_grad_implementation(name).run_backward(problem, do, dht)
        record["models"][name] = ratios(problem, grads.grads, reference, tolerance)
    for bug in planted_grad.BUGS:
        impl = planted_grad.implementation(bug)
        grads = impl.run_backward(problem, do, dht)
        entry = dict(zip(("ratio", "gradient"), ratios(problem, grads.grads, reference, tolerance)))
        entry["in_regime"] = in_regime(bug, spec, dtype)
        entry["saturated"] = {**DEFAULTS, **spec}["gates"] in SATURATED and needs_met(bug, spec, dtype)
        if bug == "nondeterministic_dk":
            again = impl.run_backward(problem, do, dht)
            entry["differs"] = any(
                a is not None and np.asarray(a).tobytes() != np.asarray(b).tobytes()
                for a, b in zip(grads.grads.values(), again.grads.values())
            )
        record["bugs"][bug] = entry
    return record


def summarize(records: list[dict], dtypes: list[str]) -> dict:
    out: dict = {"models": {}, "bugs": {}}
    for name in MODELS:
        for dtype in dtypes:
            mine = [
                (r["models"][name][0], r["models"][name][1], r["case"], r["seed"])
                for r in records
                if r["dtype"] == dtype
            ]
            worst = max(mine, default=(0.0, "", "", 0))
            out["models"].setdefault(name, {})[dtype] = dict(
                worst=worst[0], gradient=worst[1], case=worst[2], seed=worst[3], examples=len(mine)
            )
    for bug in planted_grad.BUGS:
        for dtype in dtypes:
            mine = [r for r in records if r["dtype"] == dtype and r["bugs"][bug]["in_regime"]]
            cell: dict = dict(examples=len(mine))
            if bug == "nondeterministic_dk":
                cell["differs"] = sum(r["bugs"][bug]["differs"] for r in mine)
                cell["worst_within"] = max((r["bugs"][bug]["ratio"] for r in mine), default=None)
            elif mine:
                least = min(mine, key=lambda r: r["bugs"][bug]["ratio"])
                cell.update(
                    smallest=least["bugs"][bug]["ratio"],
                    gradient=least["bugs"][bug]["gradient"],
                    case=least["case"],
                    seed=least["seed"],
                )
            saturated = [
                r["bugs"][bug]["ratio"] for r in records if r["dtype"] == dtype and r["bugs"][bug]["saturated"]
            ]
            cell["smallest_saturated"] = min(saturated, default=None)
            out["bugs"].setdefault(bug, {})[dtype] = cell
    return out


def fmt(x) -> str:
    if x is None:
        return ""
    return "inf" if x == math.inf else f"{x:.3g}"


def markdown(summary: dict, dtypes: list[str], command: str, examples: int) -> str:
    lines = [
        "# Gradient tolerance: correct backwards and planted bugs, error / bound",
        "",
        f"Generated by `{command}` (CPU, NumPy; {examples} examples). Each example is one problem of a case "
        "(`CASES` in the script), one dtype and one seed, with its own seeded cotangents; a ratio is the "
        "largest error / bound over the six gradients. Correct models: the worst ratio over every example "
        f"(goal: at most {ALLOWED_GOAL}). Planted bugs: the smallest worst-ratio over the examples of the "
        f"bug's regime (goal: at least {PLANTED_GOAL}); `inf` is NaN/unwritten padding. The last column "
        f"gives, per dtype, the smallest ratio of each bug on the saturated-gate cases ({', '.join(SATURATED)}) "
        "that have what the bug needs (`needs_met`), which no regime includes: there the float32 chunk-local "
        "gate cumsum of a correct chunked kernel already errs by percents (the forward's algorithm-aware term), "
        "and only larger bugs show.",
        "",
        "| model | kind | " + " | ".join(dtypes) + " | goal | saturated gates |",
        "| --- | --- | " + " | ".join("---" for _ in dtypes) + " | --- | --- |",
    ]
    for name, cells in summary["models"].items():
        worst = max(c["worst"] for c in cells.values())
        row = " | ".join(f"{fmt(cells[d]['worst'])} ({cells[d]['gradient']}, {cells[d]['case']})" for d in dtypes)
        lines.append(f"| {name} | correct | {row} | {'ok' if worst <= ALLOWED_GOAL else 'SHORT'} | (included) |")
    for bug, cells in summary["bugs"].items():
        if bug == "nondeterministic_dk":
            row = " | ".join(f"n/a (determinism: {cells[d]['differs']}/{cells[d]['examples']} differ)" for d in dtypes)
            lines.append(f"| {bug} | planted | {row} | n/a | |")
            continue
        parts, smallest = [], math.inf
        for d in dtypes:
            c = cells[d]
            if c["examples"] == 0:
                parts.append("n/a (no example in regime)")
                continue
            smallest = min(smallest, c["smallest"])
            parts.append(f"{fmt(c['smallest'])} ({c['gradient']}, {c['case']}; {c['examples']} ex.)")
        verdict = "ok" if smallest >= PLANTED_GOAL else "SHORT"
        saturated = " / ".join(fmt(cells[d]["smallest_saturated"]) for d in dtypes)
        lines.append(f"| {bug} | planted | {' | '.join(parts)} | {verdict} | {saturated} |")
    lines += ["", "Bugs and their regimes (`planted_grad.REGIMES`, refined in the script's `in_regime`):", ""]
    lines += [
        f"- `{bug}`: {description}; regime: {', '.join(planted_grad.REGIMES[bug]) or 'any'}"
        for bug, (description, _) in planted_grad.BUGS.items()
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--out", type=Path, default=Path("reports/2026-11-27-grad-precision"))
    args = parser.parse_args(argv)
    cases, dtypes = args.cases.split(","), args.dtypes.split(",")
    unknown = [c for c in cases if c not in CASES] + [d for d in dtypes if d not in DTYPES]
    if unknown:
        print(f"unknown case or dtype: {', '.join(unknown)}", file=sys.stderr)
        return 2
    jobs = [(c, d, int(s)) for d in dtypes for c in cases for s in args.seeds.split(",")]
    records = []
    start = time.perf_counter()
    for i, job in enumerate(jobs):
        record = run_example(*job)
        records.append(record)
        worst_model = max(r[0] for r in record["models"].values())
        print(
            f"[{i + 1}/{len(jobs)} {time.perf_counter() - start:.0f}s] {job[0]} {job[1]} seed {job[2]}: "
            f"correct models <= {worst_model:.3g} (tolerance {record['tolerance_seconds']}s)",
            file=sys.stderr,
            flush=True,
        )
    summary = summarize(records, dtypes)
    command = "python benchmarks/grad_precision.py" + "".join(
        f" --{k} {v}" for k, v in (("seeds", args.seeds), ("dtypes", args.dtypes)) if v != parser.get_default(k)
    )
    if args.cases != parser.get_default("cases"):
        command += f" --cases {args.cases}"
    args.out.mkdir(parents=True, exist_ok=True)
    document = dict(
        generated_by="benchmarks/grad_precision.py",
        command=command,
        arguments=vars(args) | {"out": str(args.out)},
        environment=environment.describe(),
        seconds=round(time.perf_counter() - start, 1),
        goals=dict(correct_at_most=ALLOWED_GOAL, planted_at_least=PLANTED_GOAL),
        cases={name: {**DEFAULTS, **spec} for name, spec in CASES.items() if name in cases},
        summary=summary,
        examples=records,
    )
    (args.out / "grad_precision.json").write_text(json.dumps(document, indent=1, default=str) + "\n")
    text = markdown(summary, dtypes, command, len(records))
    (args.out / "grad_precision.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
