"""The raw-gate encoding and the gates a kernel computes from raw gates rounded to a 16-bit dtype."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_verify.core import gating
from gdn_verify.core.problem import DTYPES


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_through_raw_gates_is_the_rounding_and_a_fixed_point(dtype):
    rng = np.random.default_rng(0)
    g = np.concatenate([[0.0, -1e-6, -60.0, -1e4], -rng.exponential(0.5, 200)]).astype(np.float32)
    beta = np.concatenate([[0.0, 1.0, 0.5, 1e-3], rng.uniform(0, 1, 200)]).astype(np.float32)
    g2, beta2 = gating.through_raw_gates(g, beta, DTYPES[dtype])
    assert g2.dtype == beta2.dtype == np.float32 and g2.shape == g.shape
    # exact where the raw gate sits at its clamp: no decay, beta exactly 0 or 1
    assert g2[0] == 0.0 and beta2[0] == 0.0 and beta2[1] == 1.0
    # within the round trip's bound for the dtype's unit roundoff u (flashinfer's module doc)
    u = float(np.finfo(DTYPES[dtype]).eps) / 2 if dtype != "bfloat16" else 2.0**-8
    g64, b64 = g.astype(np.float64), beta.astype(np.float64)
    assert np.all(np.abs(g2 - g64) <= u * (np.abs(g64) + 0.28) + 1e-6 * np.abs(g64))
    assert np.all(np.abs(beta2 - b64) <= 0.224 * u + 1e-7)
    changed = np.count_nonzero(g2 != g)
    assert (changed > 100) == (dtype != "float32")  # 16 bits move most gates; float32 next to none
    # applying it again changes nothing: the oracle of a replayed case is the same
    g3, beta3 = gating.through_raw_gates(g2, beta2, DTYPES[dtype])
    assert np.array_equal(g3, g2) and np.array_equal(beta3, beta2)
