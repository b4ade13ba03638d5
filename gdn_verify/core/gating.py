"""Gate parametrizations used by GDN kernels, in float64 NumPy.

Qwen3-Next, FlashInfer and FlashInfer-Bench pass raw gate inputs instead of the native
``(g, beta)``:  ``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)``.
"""

from __future__ import annotations

import numpy as np

SOFTPLUS_THRESHOLD = 20.0
# Where a native gate needs an infinite raw one (g = 0, beta = 0 or 1) the raw gate is clamped
# here: exp(200) overflows and exp(-200) underflows in float32, so a float32 kernel computes the
# exact gate from it (docs: gdn_verify/implementations/flashinfer.py's module docstring).
RAW_LIMIT = 200.0
# FLA 0.6's in-kernel gate keywords (in_kernel_gates' parameters after g and beta).
OPTION_NAMES = ("use_gate_in_kernel", "A_log", "dt_bias", "use_beta_sigmoid_in_kernel", "allow_neg_eigval")


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


def in_kernel_gates(
    g,
    beta,
    use_gate_in_kernel: bool = False,
    A_log=None,
    dt_bias=None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Native float64 ``(g, beta)`` from FLA 0.6's in-kernel gate options.

    ``use_gate_in_kernel``: ``g`` is the raw gate input ``a`` and the decay is
    ``-exp(A_log) * softplus(a + dt_bias)`` (``A_log`` required, ``dt_bias`` optional, both ``[HV]``).
    ``use_beta_sigmoid_in_kernel``: ``beta`` holds logits and becomes ``sigmoid(beta)``, or
    ``2 * sigmoid(beta)`` in ``[0, 2)`` with ``allow_neg_eigval`` (which needs the sigmoid option).
    """
    if use_gate_in_kernel:
        if A_log is None:
            raise ValueError("A_log: required when use_gate_in_kernel=True")
        g = log_decay(A_log, g, np.zeros(np.shape(A_log)) if dt_bias is None else dt_bias)
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("allow_neg_eigval: requires use_beta_sigmoid_in_kernel=True")
    if use_beta_sigmoid_in_kernel:
        beta = sigmoid(beta) * (2.0 if allow_neg_eigval else 1.0)
    return np.asarray(g, np.float64), np.asarray(beta, np.float64)


def float32_gates(g, beta, **options) -> tuple:
    """``(g, beta)`` as a float32 kernel holds them after FLA's in-kernel gate ``options``
    (:func:`in_kernel_gates`' keywords; rounded to float32); the inputs themselves without one."""
    if not any(options.get(name) for name in ("use_gate_in_kernel", "use_beta_sigmoid_in_kernel", "allow_neg_eigval")):
        return g, beta
    native = in_kernel_gates(g, beta, **options)
    return native[0].astype(np.float32), native[1].astype(np.float32)


def options_from_params(params: dict) -> dict:
    """FLA's in-kernel option keywords from a case's JSON-ready ``params`` (``A_log``, ``dt_bias``
    ``[HV]`` lists, ``beta_logits``, ``allow_neg_eigval``); arrays as float32. Empty without them."""
    options: dict = {
        name: np.asarray(params[name], np.float32) for name in ("A_log", "dt_bias") if params.get(name) is not None
    }
    if "A_log" in options:
        options["use_gate_in_kernel"] = True
    if params.get("beta_logits"):
        options["use_beta_sigmoid_in_kernel"] = True
        if params.get("allow_neg_eigval"):
            options["allow_neg_eigval"] = True
    return options


def raw_decay_input(lib, g):
    """``a`` with ``-softplus(a) = g``, clamped at :data:`RAW_LIMIT` (``g`` float64, NumPy or torch)."""
    y = lib.clip(-g, float(np.log1p(np.exp(-RAW_LIMIT))), None)  # -g >= softplus(-RAW_LIMIT)
    return y + lib.log(-lib.expm1(-y))  # softplus^-1(y), stable for large and tiny y


def raw_beta_input(lib, beta):
    """``b`` with ``sigmoid(b) = beta``, clamped at :data:`RAW_LIMIT` (``beta`` float64, NumPy or torch)."""
    p = lib.clip(beta, float(1.0 / (1.0 + np.exp(RAW_LIMIT))), 1.0 - 2.0**-53)
    return lib.clip(lib.log(p) - lib.log1p(-p), -RAW_LIMIT, RAW_LIMIT)


def raw_gates(lib, g, beta):
    """``(a, b)`` with ``-softplus(a) = g`` and ``sigmoid(b) = beta``, clamped at :data:`RAW_LIMIT`.

    ``g``, ``beta`` float64 arrays of the array module ``lib`` (NumPy or torch), any shape; the
    encoding with ``A_log = 0``, ``dt_bias = 0`` that the raw-gate adapters hand over.
    """
    return raw_decay_input(lib, g), raw_beta_input(lib, beta)


def through_raw_gates(
    g, beta, dtype, g_is_raw: bool = False, beta_is_raw: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The gates a kernel computes from ``(g, beta)`` handed over as raw gates in ``dtype``.

    :func:`raw_gates` encodes them, ``a`` and ``b`` are rounded to ``dtype`` (the model dtype an
    adapter passes them in), and ``g' = -softplus(a)``, ``beta' = sigmoid(b)`` are computed in
    float64 and returned as float32 ``[..]`` arrays of ``g``'s shape. Where a raw gate sits at its
    clamp the gate is kept as it was (exactly 0, or beta exactly 0 or 1: a float32 kernel gets
    those exactly). Applied again it returns the same values: the encoded ``a`` of ``g'`` rounds
    back to the same ``dtype`` value.

    ``g_is_raw`` / ``beta_is_raw``: the caller's ``g`` is already the raw ``a`` (FLA's
    ``use_gate_in_kernel``) / ``beta`` the logits ``b`` (``use_beta_sigmoid_in_kernel``); such an
    input goes over as it is, only rounded to ``dtype``, and comes back so (float32), not encoded.
    """
    g64, beta64 = np.asarray(g, np.float64), np.asarray(beta, np.float64)
    a = g64 if g_is_raw else raw_decay_input(np, g64)
    b = beta64 if beta_is_raw else raw_beta_input(np, beta64)
    a_in, b_in = (x.astype(dtype).astype(np.float64) for x in (a, b))
    g_seen = a_in if g_is_raw else np.where(a_in <= -RAW_LIMIT, g64, log_decay(0.0, a_in, 0.0))
    beta_seen = b_in if beta_is_raw else np.where(np.abs(b_in) >= RAW_LIMIT, beta64, sigmoid(b_in))
    return g_seen.astype(np.float32), beta_seen.astype(np.float32)
