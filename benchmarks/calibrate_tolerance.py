"""Calibration of the tolerance model: error / bound for correct and for state-rounding kernels.

Usage: python benchmarks/calibrate_tolerance.py

Runs the correct float32 NumPy implementations (token loop, chunk 16, chunk 64), the
production-style chunked ones (float32 chunk-local gate cumsum at C = 16, 32, 64, and the same
with a float64 cumsum), the planted kernel that rounds its state to bfloat16 every token and
the chunked kernel with TF32 products over a grid of lengths, gate regimes, input dtypes,
l2norm, initial-state sizes and key dims, and prints for each (implementation, dtype) the
largest ratio of measured error to the bound of ``gdn_verify.core.tolerance`` for each metric, and
the largest ratio to the uniform bound alone (without the algorithm-aware term for the float32
gate cumsum). Correct kernels must stay well below 1; the state-rounding and TF32 kernels must
land far above it with float32 inputs.
"""

from __future__ import annotations

import itertools

import numpy as np

from gdn_verify.core import tolerance as tl
from gdn_verify.core.oracle import numpy_oracle
from gdn_verify.core.problem import DTYPES, Problem
from gdn_verify.implementations import numpy_impl, planted
from gdn_verify.properties.strategies import gate_values

IMPLEMENTATIONS = {
    "recurrent": numpy_impl.recurrent_gated_delta_rule,
    "chunk16": lambda **kw: numpy_impl.chunk_gated_delta_rule(**kw, chunk_size=16),
    "chunk64": numpy_impl.chunk_gated_delta_rule,
    "fla16 (f32 cumsum)": lambda **kw: numpy_impl.chunk_fla_gated_delta_rule(**kw, chunk_size=16),
    "fla32 (f32 cumsum)": lambda **kw: numpy_impl.chunk_fla_gated_delta_rule(**kw, chunk_size=32),
    "fla64 (f32 cumsum)": numpy_impl.chunk_fla_gated_delta_rule,
    "fla64 (f64 cumsum)": lambda **kw: numpy_impl.chunk_fla_gated_delta_rule(**kw, cumsum_dtype=np.float64),
    "bf16_state (bug)": lambda **kw: planted.token_loop("bf16_state", **kw),
    "tf32 (bug)": lambda **kw: numpy_impl.chunk_fla_gated_delta_rule(**kw, tf32=True),
}


def problem(rng, T, regime, dtype, K, l2norm, state_scale, H=2, HV=4, V=16) -> Problem:
    k = rng.standard_normal((1, T, H, K))
    if not l2norm:
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
    state = None if state_scale is None else (rng.standard_normal((1, HV, K, V)) * state_scale).astype(np.float32)
    return Problem(
        rng.standard_normal((1, T, H, K)),
        k,
        rng.standard_normal((1, T, HV, V)),
        gate_values(rng, (1, T, HV), regime),
        rng.uniform(0, 1, (1, T, HV)),
        initial_state=state,
        use_qk_l2norm_in_kernel=l2norm,
    ).astype(DTYPES[dtype])


def main() -> None:
    rng = np.random.default_rng(1)
    worst: dict[tuple[str, str], np.ndarray] = {}
    grid = itertools.product(
        (64, 200),
        ("none", "mild", "moderate", "strong", "spikes", "mixed"),
        ("float32", "bfloat16", "float16"),
        (False, True),
        (None, 100.0),
        (4, 32, 128),
    )
    for T, regime, dtype, l2norm, state_scale, K in grid:
        p = problem(rng, T, regime, dtype, K, l2norm, state_scale)
        ref = numpy_oracle(p)
        bound = tl.tolerance(p, tl.condition(p, ref))
        for name, fn in IMPLEMENTATIONS.items():
            o, s = fn(**p.kwargs())
            e = tl.measure(o, s, ref[0], ref[1], p)
            ratios = np.array(
                [getattr(e, m) / getattr(bound, m) for m in tl.METRICS]
                + [max(getattr(e, m) / bound.uniform(m) for m in tl.METRICS)]
            )
            worst[name, dtype] = np.maximum(worst.get((name, dtype), 0.0), ratios)
    print(
        f"{'implementation':<18} {'dtype':<9} {'output_rms':>10} {'output_token':>12} {'state':>9}  (error / bound)"
        f"  {'uniform':>9} (max error / uniform bound)"
    )
    for (name, dtype), r in sorted(worst.items()):
        print(f"{name:<18} {dtype:<9} {r[0]:>10.3g} {r[1]:>12.3g} {r[2]:>9.3g}  {r[3]:>22.3g}")


if __name__ == "__main__":
    main()
