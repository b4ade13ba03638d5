"""Compile every candidate shape class of a JIT-compiled implementation, in parallel processes.

A cold compile cache makes ``check`` and ``fuzz`` plan a small pool (FLA's chunked kernel: 25-55 s
per class on one core). Compiling all candidates here first, ``PROCESSES`` at a time, fills the
cache (Triton's: ``TRITON_CACHE_DIR``) so that the runs after it plan the full pool from a warm
cache: what issue 14's two-GPU scaling measurement needs, so that 1 and 2 workers start alike.

    python scripts/warm_pool.py --impl fla-chunk --dtype bfloat16,float16 --processes 16
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from gdn_verify import api
from gdn_verify.core.shapes import ShapeClass
from gdn_verify.properties.strategies import Limits, pool_candidates
from gdn_verify.runners.compile import warm_class


def _compile(impl: str, classes: list[ShapeClass]) -> list[tuple[str, float | str]]:
    implementation = api.implementation(impl)
    done: list[tuple[str, float | str]] = []
    for c in classes:
        try:
            done.append((c.describe(), warm_class(implementation, c)))
        except Exception as exc:  # noqa: BLE001 - reported, the properties will meet it again
            done.append((c.describe(), f"{type(exc).__name__}: {exc}"[:200]))
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="fla-chunk")
    parser.add_argument("--dtype", default="bfloat16", help="one dtype, or several separated by commas")
    parser.add_argument("--processes", type=int, default=8)
    args = parser.parse_args()
    candidates = [c for dtype in args.dtype.split(",") for c in pool_candidates(Limits(dtype=dtype))]
    shares = [candidates[i :: args.processes] for i in range(args.processes)]
    start = time.perf_counter()
    print(f"compiling {len(candidates)} classes of {args.impl} {args.dtype} in {args.processes} processes", flush=True)
    with ProcessPoolExecutor(args.processes) as pool:
        jobs = [pool.submit(_compile, args.impl, share) for share in shares if share]
        for job in as_completed(jobs):
            for name, cost in job.result():
                took = f"{cost:.1f} s" if isinstance(cost, float) else cost
                print(f"  {name}: {took}  ({time.perf_counter() - start:.0f} s)", flush=True)
    print(f"done in {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
