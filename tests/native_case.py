"""Random native-convention inputs in float64, shared by the oracle's CPU tests and the GPU kernels' tests.

Unit-norm keys (so runs without l2norm are stable), ``g = log U(0.5, 1)`` unless ``gate`` draws it,
``beta = U(0, 1)``, and a standard normal initial state per sequence when ``with_state``. The draws
come in that order from ``np.random.default_rng(seed)``, so a seed always gives the same problem.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def random_native_case(
    seed,
    B: int,
    T: int,
    H: int,
    HV: int,
    K: int,
    V: int,
    cu=None,
    with_state: bool = False,
    gate: Callable | None = None,
    v_first: bool = False,
) -> dict:
    """``q, k, v, g, beta, initial_state`` (state ``[N, HV, V, K]`` when ``v_first``, else ``[N, HV, K, V]``)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, H, K))
    k = rng.standard_normal((B, T, H, K))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((B, T, HV, V))
    g = np.log(rng.uniform(0.5, 1.0, (B, T, HV))) if gate is None else gate(rng, (B, T, HV))
    beta = rng.uniform(0.0, 1.0, (B, T, HV))
    N = B if cu is None else len(cu) - 1
    s0 = None
    if with_state:
        s0 = rng.standard_normal((N, HV, V, K) if v_first else (N, HV, K, V))
    return dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=s0)
