"""Compile every MAX graph the MAX adapters run, here on a CPU, for the GPU machine to load.

MAX 26.7.0 compiles a graph for a GPU it does not have (its virtual-device mode) and writes the
compiled artifact as a MEF file; ``GDN_VERIFY_MAX_MEFS=FOLDER`` makes the adapters load those
instead of compiling on the GPU machine (1 to 10 minutes per process there, H100 2026-11-28).
The folder holds MAX's manifest, one MEF per graph (the recurrence, and the verify and the fold
at ring lengths 2, 4 and 8, for float32 and bfloat16 pools, per geometry) and
``gdn_verify_max.json`` (MAX version, GPU architecture, host CPU target, geometries). Usage, with
MAX installed (``scripts/gpu-machine/README.md``, "MAX wheels")::

    PYTHONPATH=.:MAX_SITE python3 scripts/max_precompile.py OUT_DIR [--tensor-parallel 1,8] [--arch sm_90a]

Default geometries: MAX's Qwen3.5 layers whole (16 key heads, 32, 48, 64 value heads) and at
tensor parallelism 8 (2 key heads, 4, 6, 8 value heads), K = V = 128: the campaign's and the
check's shape pools in ``scripts/gpu-machine/gpu_max.sh``; and the derived calls the properties make on them
(``head_mapping`` repeats q and k to as many heads as v: 4/4 to 64/64), which would otherwise
compile on the GPU machine (the verify ring's ``head_mapping`` spent 468 s in the kernel there on
2026-11-27, most of it compiling).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gdn_verify.implementations import max_kernels  # noqa: E402 - after the path above
from gdn_verify.properties import strategies  # noqa: E402

# The derived calls of the properties (strategies.pool_classes' twins) whose geometry differs.
TWINS = (strategies.expanded_twin,)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="max_precompile.py")
    parser.add_argument("out", help="folder for the MEF files (created)")
    parser.add_argument("--tensor-parallel", default="1,8", help="comma-separated splits of the Qwen3.5 heads")
    parser.add_argument("--arch", default="sm_90a", help="GPU architecture (sm_90a: H100, H200)")
    parser.add_argument("--cpu", default="x86-64-v3", help="LLVM CPU of the host code (portable across x86-64 hosts)")
    args = parser.parse_args(argv)
    try:
        splits = [int(x) for x in args.tensor_parallel.split(",")]
        pools = [c for tp in splits for c in max_kernels.qwen35_classes("bfloat16", tensor_parallel=tp)]
        classes = pools + [twin(c) for c in pools for twin in TWINS]
    except ValueError as exc:
        parser.error(f"--tensor-parallel: {exc}")
    start = time.perf_counter()

    def progress(what: str) -> None:
        print(f"[{time.perf_counter() - start:6.0f} s] {what}", flush=True)

    n = max_kernels.precompile(args.out, classes, arch=args.arch, cpu=args.cpu, progress=progress)
    print(f"{n} graphs compiled into {args.out} in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
