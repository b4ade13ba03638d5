"""How long the float64 gradient oracle takes on long problems: NumPy on the CPU, CuPy on a GPU.

The problem of issue-style size: one sequence of T tokens, H = 16 query/key heads, HV = 32 value
heads, K = V = 128, an initial state and a final-state cotangent (Qwen3-Next's layout). The
adjoint's work is linear in T (two forward passes and one reverse pass over the tokens, in
segments of about sqrt(T) recomputed states), so the CPU's time at 64k tokens is extrapolated from
two shorter runs, whose ratio shows the linearity; the GPU runs 64k tokens itself, and a shorter
problem on both checks that they agree. Writes JSON (argv[1]) and prints one line per run.

    python3 scripts/grad_oracle_timing.py OUT.json [CPU_T,CPU_T2 [GPU_T]]
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

import numpy as np

from gdn_verify.core.gradients import recurrent_gated_delta_rule_backward

H, HV, K, V = 16, 32, 128, 128


def problem(T: int, seed: int = 0) -> tuple[tuple, dict]:
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((1, T, H, K), dtype=np.float32)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    args = (
        rng.standard_normal((1, T, H, K), dtype=np.float32),
        k,
        rng.standard_normal((1, T, HV, V), dtype=np.float32),
        np.log(rng.uniform(0.9, 1.0, (1, T, HV))).astype(np.float32),
        rng.uniform(0.0, 1.0, (1, T, HV)).astype(np.float32),
        None,
        rng.standard_normal((1, HV, K, V), dtype=np.float32),
    )
    kw = dict(
        do=rng.standard_normal((1, T, HV, V), dtype=np.float32),
        dht=rng.standard_normal((1, HV, K, V), dtype=np.float32),
    )
    return args, kw


def timed(T: int, array_module=None) -> tuple[float, dict]:
    args, kw = problem(T)
    if array_module is not None:
        array_module.cuda.Device().synchronize()
    start = time.perf_counter()
    grads = recurrent_gated_delta_rule_backward(*args, **kw, array_module=array_module)
    return time.perf_counter() - start, grads


def main() -> None:
    out = sys.argv[1]
    cpu_ts = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1024,2048").split(",")]
    gpu_t = int(sys.argv[3]) if len(sys.argv) > 3 else 65536
    doc: dict = dict(
        shape=dict(B=1, H=H, HV=HV, K=K, V=V, initial_state=True, dht=True),
        host=dict(cpus=os.cpu_count(), processor=platform.processor(), numpy=np.__version__),
        cpu=[],
        gpu=[],
    )
    numpy_grads = {}  # the first length's, which CuPy's are compared with
    for T in cpu_ts:
        seconds, grads = timed(T)
        if not numpy_grads:
            numpy_grads = grads
        doc["cpu"].append(dict(T=T, seconds=round(seconds, 2)))
        print(f"numpy T={T}: {seconds:.1f} s ({T / seconds:.0f} tokens/s)", flush=True)
    a, b = doc["cpu"][0], doc["cpu"][-1]
    per_token = b["seconds"] / b["T"]
    doc["cpu_linearity"] = round((b["seconds"] / a["seconds"]) / (b["T"] / a["T"]), 3)  # 1: linear in T
    doc["cpu_extrapolated_65536_seconds"] = round(per_token * 65536, 0)
    print(f"numpy at 65536 tokens, extrapolated: {per_token * 65536 / 60:.0f} min", flush=True)
    try:
        import cupy
    except ImportError:
        cupy = None
    if cupy is not None:
        doc["gpu_device"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        doc["cupy"] = cupy.__version__
        timed(64, cupy)  # CuPy's kernels compile on first use
        T = cpu_ts[0]
        seconds, got = timed(T, cupy)
        want = numpy_grads
        worst = max(
            float(np.abs(got[n] - w).max() / max(np.abs(w).max(), 1e-300)) for n, w in want.items() if w is not None
        )
        doc["gpu"].append(dict(T=T, seconds=round(seconds, 2), max_relative_difference_to_numpy=worst))
        print(f"cupy T={T}: {seconds:.1f} s, largest difference to NumPy {worst:.1e} of the largest entry", flush=True)
        seconds, _ = timed(gpu_t, cupy)
        doc["gpu"].append(dict(T=gpu_t, seconds=round(seconds, 2)))
        print(f"cupy T={gpu_t}: {seconds:.1f} s ({gpu_t / seconds:.0f} tokens/s)", flush=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
