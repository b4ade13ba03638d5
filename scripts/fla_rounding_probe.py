"""FLA's chunked kernel against the float64 oracle and the precision contract's 16-bit model, directly.

An independent computation, outside the check pipeline (no Hypothesis, no tolerance model), for
two questions about FLA 0.6's ``chunk_gated_delta_rule`` in 16 bits:

1. Is its error with ``use_qk_l2norm_in_kernel=True`` exactly the error of FLA run on q and k
   l2-normalised in float32 and rounded to the input dtype beforehand (its l2norm stage writes
   them in the input dtype)? And, given ``--case`` (the ``head_mapping`` case of 2026-11-23), is
   that call the same as its ``H = HV`` expansion (bitwise)?
2. How close is FLA to ``gdn_verify.implementations.precision``'s ``fla16`` model (FLA's
   algorithm with every allowed 16-bit rounding)? Per case: FLA's and the model's relative RMS
   error against the oracle, and FLA's distance from the model relative to its distance from
   the oracle.

    python scripts/fla_rounding_probe.py --cases 200 --out DIR [--case CASE.npz]   (GPU, FLA installed)

The 2026-11-23 case is kept in git history, not in the tree:
``git show c0320a6:reports/2026-11-23/issue14-logs/head_mapping-896bf1fae2.npz > head_mapping-896bf1fae2.npz``.
Results of 2026-11-25: ``reports/2026-11-23-fla-compile-planning/README.md`` (the correction at its end).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from gdn_verify.core import environment
from gdn_verify.core.conventions import l2norm
from gdn_verify.core.oracle import numpy_oracle
from gdn_verify.core.problem import DTYPES, Problem
from gdn_verify.implementations.precision import BY_NAME


def fla(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    def t(x):
        return None if x is None else torch.from_numpy(np.ascontiguousarray(x)).cuda()

    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[problem.dtype.name]

    def inp(x):
        return torch.from_numpy(np.asarray(x, np.float32)).to(dtype).cuda()

    o, s = chunk_gated_delta_rule(
        q=inp(problem.q),
        k=inp(problem.k),
        v=inp(problem.v),
        g=inp(problem.g),
        beta=inp(problem.beta),
        scale=problem.scale,
        initial_state=t(problem.initial_state),
        output_final_state=True,
        use_qk_l2norm_in_kernel=problem.use_qk_l2norm_in_kernel,
        cu_seqlens=None if problem.cu_seqlens is None else t(problem.cu_seqlens).long(),
    )
    torch.cuda.synchronize()
    return o.float().cpu().numpy(), s.float().cpu().numpy()


def rel(a: np.ndarray, b: np.ndarray) -> float:
    den = float(np.linalg.norm(b))
    return float(np.linalg.norm(np.asarray(a, np.float64) - b)) / den if den else 0.0


def random_problem(rng: np.random.Generator, dtype: str, varlen: bool) -> Problem:
    H, HV, K, V = 2, 4, 128, int(rng.choice([64, 100, 128]))
    if varlen:
        lengths = rng.integers(1, 200, size=int(rng.integers(2, 6)))
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        B, T = 1, int(cu[-1])
    else:
        B, T, cu = int(rng.integers(1, 3)), int(rng.integers(1, 300)), None
    N = B if cu is None else len(cu) - 1
    regime = rng.choice(["zero", "mild", "tiny"])
    g = {
        "zero": np.zeros((B, T, HV)),
        "mild": np.log(rng.uniform(0.9, 1.0, (B, T, HV))),
        "tiny": -(10.0 ** rng.uniform(-4, -2.5, (B, T, HV))),
    }[regime]
    state = rng.standard_normal((N, HV, K, V)).astype(np.float32) if rng.uniform() < 0.5 else None
    return Problem(
        q=rng.standard_normal((B, T, H, K)) * rng.uniform(0.1, 3.0),
        k=rng.standard_normal((B, T, H, K)) * rng.uniform(0.1, 3.0),
        v=rng.standard_normal((B, T, HV, V)),
        g=g,
        beta=rng.uniform(0, 1, (B, T, HV)),
        initial_state=state,
        cu_seqlens=cu,
        use_qk_l2norm_in_kernel=True,
        notes=dict(gate_regime=str(regime)),
    ).astype(DTYPES[dtype])


def prenormalized(problem: Problem) -> Problem:
    """q and k normalised in float32 and rounded to the input dtype; l2norm off."""
    q, k = (l2norm(np.asarray(x, np.float32)).astype(problem.dtype) for x in (problem.q, problem.k))
    return problem.replace(q=q, k=k, use_qk_l2norm_in_kernel=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--dtypes", default="bfloat16,float16")
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--case", type=Path, help="a saved head_mapping case: compare it with its H = HV expansion")
    args = parser.parse_args()
    report: dict = dict(environment=environment.describe("torch"), date=time.strftime("%Y-%m-%d"))
    if args.case is not None:
        p, _ = Problem.load(args.case)
        heads = np.arange(p.v.shape[2]) // (p.v.shape[2] // p.q.shape[2])
        o, s = fla(p)
        oe, se = fla(p.replace(q=p.q[:, :, heads], k=p.k[:, :, heads]))
        ref_o, _ = numpy_oracle(p)
        block = np.linalg.norm(o - ref_o, axis=-1) / np.maximum(np.linalg.norm(ref_o, axis=-1), 1e-30)
        t, h = np.unravel_index(np.argmax(block.reshape(-1, block.shape[-1])), block.reshape(-1, block.shape[-1]).shape)
        report["head_mapping_case"] = dict(
            case=str(args.case),
            problem=p.describe(),
            gva_equals_expansion_bitwise=bool(np.array_equal(o, oe) and np.array_equal(s, se)),
            output_rel_rms_vs_oracle=rel(o, ref_o),
            worst_token_head=[int(t), int(h)],
            worst_token_rel_error=float(block.reshape(-1, block.shape[-1])[t, h]),
            worst_token_exact_norm=float(np.linalg.norm(ref_o.reshape(-1, *ref_o.shape[2:])[t, h])),
            typical_token_exact_norm=float(np.sqrt(np.mean(np.sum(ref_o**2, axis=-1)))),
        )
        print(json.dumps(report["head_mapping_case"], indent=1), flush=True)
    model = BY_NAME["fla16"].run
    rows = []
    for dtype in args.dtypes.split(","):
        rng = np.random.default_rng(20261125)
        for i in range(args.cases):
            p = random_problem(rng, dtype, varlen=bool(i % 2))
            ref_o, ref_s = numpy_oracle(p)
            o, s = fla(p)
            o2, s2 = fla(prenormalized(p))
            mo, ms = model(**p.kwargs())
            mo, ms = np.asarray(mo, np.float64), np.asarray(ms, np.float64)
            rows.append(
                dict(
                    dtype=dtype,
                    varlen=bool(i % 2),
                    T=int(p.q.shape[1]),
                    V=int(p.v.shape[3]),
                    gates=p.notes.get("gate_regime", ""),
                    initial_state=p.initial_state is not None,
                    l2norm_equals_prenormalized_bitwise=bool(np.array_equal(o, o2) and np.array_equal(s, s2)),
                    fla_output_error=rel(o, ref_o),
                    prenormalized_output_error=rel(o2, ref_o),
                    model_output_error=rel(mo, ref_o),
                    fla_to_model_output=rel(o, mo),
                    fla_state_error=rel(s, ref_s),
                    model_state_error=rel(ms, ref_s),
                    fla_to_model_state=rel(s, ms),
                )
            )
        mine = [r for r in rows if r["dtype"] == dtype]
        summary = dict(
            dtype=dtype,
            cases=len(mine),
            l2norm_equals_prenormalized_bitwise=sum(r["l2norm_equals_prenormalized_bitwise"] for r in mine),
            fla_output_error_median=float(np.median([r["fla_output_error"] for r in mine])),
            model_output_error_median=float(np.median([r["model_output_error"] for r in mine])),
            fla_over_model_output_error_max=float(
                max(r["fla_output_error"] / max(r["model_output_error"], 1e-30) for r in mine)
            ),
            fla_state_error_median=float(np.median([r["fla_state_error"] for r in mine])),
            model_state_error_median=float(np.median([r["model_state_error"] for r in mine])),
            fla_over_model_state_error_max=float(
                max(r["fla_state_error"] / max(r["model_state_error"], 1e-30) for r in mine)
            ),
        )
        report.setdefault("summary", []).append(summary)
        print(json.dumps(summary), flush=True)
    report["cases"] = rows
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fla_rounding_probe.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
