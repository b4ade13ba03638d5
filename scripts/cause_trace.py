"""Why a named cause is (or is not) named: each error model's verdict on every evidence example.

For an implementation and dtype, builds the minimal-looking problem ``B=1 T=1 H=2 HV=4 K=128
V=100`` (zero gates, no initial state) or loads a saved case, then prints, for the models asked
(default: the TF32 ones), how each explains the minimal example and each fresh example of
``gdn_verify.runners.causes`` (pointwise ratio, blocks, or correlation and size), whether it is
consistent there, and the cause ``explain`` names in the end.

    python scripts/cause_trace.py --impl fla-chunk --dtype float32 [--case CASE.npz] [--models a,b]
"""

from __future__ import annotations

import argparse

import numpy as np

from gdn_verify import api
from gdn_verify.core.problem import DTYPES, Problem
from gdn_verify.core.property import Measurement
from gdn_verify.runners import causes


def default_problem(dtype: str) -> Problem:
    rng = np.random.default_rng(0)
    return Problem(
        q=rng.standard_normal((1, 1, 2, 128)),
        k=rng.standard_normal((1, 1, 2, 128)) / np.sqrt(128),
        v=rng.standard_normal((1, 1, 4, 100)),
        g=np.zeros((1, 1, 4)),
        beta=rng.uniform(0.2, 0.9, (1, 1, 4)),
    ).astype(DTYPES[dtype])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--case")
    parser.add_argument("--models", default="tf32_products,tf32_inputs")
    args = parser.parse_args()
    impl = api.implementation(args.impl)
    problem = Problem.load(args.case)[0] if args.case else default_problem(args.dtype)
    models = [m for m in causes.MODELS if m.name in args.models.split(",")]
    examples = [("minimal", problem)] + [(f"fresh {i}", p) for i, p in enumerate(causes.fresh_examples(problem, {}))]
    for label, p in examples:
        obs = causes.observe(impl, causes.probes(p, {}, "matches_reference")[0])
        if obs is None:
            print(f"{label}: the call raised or returned wrong shapes")
            continue
        errs = obs.against_oracle
        print(f"{label}: T={p.q.shape[1]} failing={obs.failing} against oracle {errs}")
        for m in models:
            finding = causes.judge(m, obs) if obs.failing else None
            detail = (
                "-"
                if finding is None
                else (
                    f"reproduction {finding.reproduction:.3g} correlation {finding.correlation} where {finding.where!r}"
                )
            )
            print(f"   {m.name:16s} consistent={causes.consistent(m, obs)} explains: {detail}")
    cause = causes.explain(impl, problem, {}, "matches_reference", "error > tolerance", Measurement(1.0, 1e-9))
    print(f"named: {cause.model or '(none)'}  kind: {cause.kind}\n  {cause.text}")


if __name__ == "__main__":
    main()
