"""Moving problem arrays between NumPy and the array type an implementation takes.

NumPy (bfloat16 via ``ml_dtypes``), torch (CUDA when available, else CPU) and CuPy; GPU
libraries are imported only when asked for.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gdn_verify.core.problem import DTYPES

ARRAY_KINDS = ("numpy", "torch", "cupy")


class ArrayKindUnavailable(RuntimeError):
    """The array library (or a GPU for it) is not usable here."""


def _torch():
    try:
        import torch
    except ImportError as exc:
        raise ArrayKindUnavailable("torch arrays need PyTorch (pip install '.[torch]')") from exc
    return torch


def _cupy():
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise ArrayKindUnavailable("cupy arrays need a CUDA GPU; none is visible")
    except ImportError as exc:
        raise ArrayKindUnavailable("cupy arrays need CuPy (pip install '.[cuda13]' or '.[cuda12]')") from exc
    except ArrayKindUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - CUDA driver errors come in many types
        raise ArrayKindUnavailable(f"cupy arrays: no usable CUDA GPU ({exc})") from exc
    return cupy


def check_kind(kind: str) -> None:
    """Raise :class:`ArrayKindUnavailable` unless arrays of ``kind`` can be made here."""
    if kind not in ARRAY_KINDS:
        raise ArrayKindUnavailable(f"unknown array kind {kind!r}; choose from {', '.join(ARRAY_KINDS)}")
    if kind == "torch":
        _torch()
    elif kind == "cupy":
        _cupy()


def to_kind(x: np.ndarray | None, kind: str) -> Any:
    """``x`` as an array of ``kind`` with the same dtype (bfloat16 included for torch)."""
    if x is None or kind == "numpy":
        return x
    if kind == "torch":
        torch = _torch()
        device = "cuda" if torch.cuda.is_available() else "cpu"
        if x.dtype == DTYPES["bfloat16"]:
            # contiguous, like every other dtype: kernels may refuse strided inputs (a property's views)
            return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(device=device, dtype=torch.bfloat16)
        return torch.from_numpy(np.ascontiguousarray(x)).to(device)
    cupy = _cupy()
    if x.dtype == DTYPES["bfloat16"]:
        raise NotImplementedError("CuPy has no bfloat16 arrays; use torch arrays for bfloat16")
    return cupy.asarray(np.ascontiguousarray(x))


def to_numpy(x: Any) -> np.ndarray | None:
    """A NumPy array of a NumPy, torch or CuPy array, keeping its dtype (bfloat16 included): a copy
    for device arrays, the same memory for a NumPy array or a CPU torch tensor (outputs are copied
    by ``implementation.host_array``)."""
    if x is None or isinstance(x, np.ndarray):
        return x
    module = type(x).__module__
    if module.startswith("torch"):
        torch = _torch()
        x = x.detach()
        if x.dtype == torch.bfloat16:
            return x.float().cpu().numpy().astype(DTYPES["bfloat16"])
        return x.cpu().numpy()
    if module.startswith("cupy"):
        return x.get()
    return np.asarray(x)
