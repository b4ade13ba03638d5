"""Gate parametrizations used by GDN kernels, in float64 NumPy.

Qwen3-Next, FlashInfer and FlashInfer-Bench pass raw gate inputs instead of the native
``(g, beta)``:  ``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)``.
"""

from __future__ import annotations

import numpy as np

SOFTPLUS_THRESHOLD = 20.0


def softplus(x, threshold: float = SOFTPLUS_THRESHOLD) -> np.ndarray:
    """``log(1 + exp(x))``, returning ``x`` itself above ``threshold`` like torch and FLA.

    ``log1p(exp(x))`` is exact to rounding for ``x <= threshold`` (no overflow, and for very
    negative ``x`` it returns ``exp(x)`` rather than 0); above it the two differ by < 2.1e-9.
    """
    x = np.asarray(x, dtype=np.float64)
    return np.where(x > threshold, x, np.log1p(np.exp(np.minimum(x, threshold))))


def sigmoid(x) -> np.ndarray:
    """``1 / (1 + exp(-x))`` without overflow for large ``|x|``."""
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def log_decay(A_log, a, dt_bias) -> np.ndarray:
    """``g = -exp(A_log) * softplus(a + dt_bias)``: ``A_log, dt_bias`` ``[HV]``, ``a`` ``[..., HV]``."""
    A_log = np.asarray(A_log, dtype=np.float64)
    a = np.asarray(a, dtype=np.float64)
    dt_bias = np.asarray(dt_bias, dtype=np.float64)
    return -np.exp(A_log) * softplus(a + dt_bias)


def gates_from_raw(A_log, a, dt_bias, b) -> tuple[np.ndarray, np.ndarray]:
    """Native ``(g, beta)`` from the raw gate inputs, both float64 shaped like ``a``."""
    return log_decay(A_log, a, dt_bias), sigmoid(b)
