"""Chunked float64 oracle vs the token-by-token oracle, as a speed ratio on one machine.

Usage: python benchmarks/oracle_speed.py [--tokens 4096] [--heads 8] [--dim 128] [--repeat 3]

The target (issue 2) is a ratio of at least 10 at T=4096, H=HV=8, K=V=128 on a 2-core
machine. Both forms run on identical inputs, interleaved, and the median of each is used,
so machine noise affects both alike. It also prints their relative difference.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from gdn_verify.core.reference import chunk_gated_delta_rule, recurrent_gated_delta_rule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    T, H, D = args.tokens, args.heads, args.dim
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, T, H, D))
    k = rng.standard_normal((1, T, H, D))
    v = rng.standard_normal((1, T, H, D))
    g = np.log(rng.uniform(0.9, 1.0, (1, T, H)))
    beta = rng.uniform(0.0, 1.0, (1, T, H))
    kwargs = dict(use_qk_l2norm_in_kernel=True, output_final_state=True)
    times: dict[str, list[float]] = {"recurrent": [], "chunk": []}
    outputs = {}
    for _ in range(args.repeat):
        for name, fn in (("recurrent", recurrent_gated_delta_rule), ("chunk", chunk_gated_delta_rule)):
            start = time.perf_counter()
            outputs[name] = fn(q, k, v, g, beta, **kwargs)
            times[name].append(time.perf_counter() - start)
    rec, chk = statistics.median(times["recurrent"]), statistics.median(times["chunk"])
    diff = np.linalg.norm(outputs["chunk"][0] - outputs["recurrent"][0]) / np.linalg.norm(outputs["recurrent"][0])
    print(f"T={T} H=HV={H} K=V={D}, float64, median of {args.repeat}")
    print(f"token loop (recurrent oracle): {rec:8.3f} s")
    print(f"chunked oracle (C=64):         {chk:8.3f} s")
    print(f"speed ratio: {rec / chk:.1f}x (target >= 10x); relative difference {diff:.1e}")


if __name__ == "__main__":
    main()
