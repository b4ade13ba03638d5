"""A GDN problem instance in the native convention, with saving, loading and a short summary."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

DTYPES: dict[str, np.dtype] = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}
INPUT_FIELDS = ("q", "k", "v", "g", "beta")


def dtype_name(dtype) -> str:
    return np.dtype(dtype).name


@dataclass(frozen=True)
class Problem:
    """Inputs of one call in FLA's convention, as NumPy arrays.

    ``q, k`` ``[B, T, H, K]``, ``v`` ``[B, T, HV, V]``, ``g, beta`` ``[B, T, HV]`` in the input
    dtype (bfloat16 via ``ml_dtypes``); ``initial_state`` float32 ``[N, HV, K, V]`` (or
    ``[N, HV, V, K]`` with ``state_v_first``) or None; ``cu_seqlens`` int64 ``[N + 1]`` or None.
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    g: np.ndarray
    beta: np.ndarray
    scale: float | None = None
    initial_state: np.ndarray | None = None
    output_final_state: bool = True
    use_qk_l2norm_in_kernel: bool = False
    cu_seqlens: np.ndarray | None = None
    state_v_first: bool = False
    notes: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def dtype(self) -> np.dtype:
        return self.v.dtype

    @property
    def shape(self) -> dict[str, int]:
        B, T, H, K = self.q.shape
        return dict(B=B, T=T, H=H, HV=self.v.shape[2], K=K, V=self.v.shape[3], N=self.num_sequences)

    def state_shape(self, v_first: bool | None = None) -> tuple[int, int, int, int]:
        """The state's shape: ``[N, HV, V, K]`` v-first, else ``[N, HV, K, V]`` (``v_first`` None:
        the problem's own ``state_v_first``)."""
        s = self.shape
        v_first = self.state_v_first if v_first is None else v_first
        return (s["N"], s["HV"], s["V"], s["K"]) if v_first else (s["N"], s["HV"], s["K"], s["V"])

    @property
    def num_sequences(self) -> int:
        return self.q.shape[0] if self.cu_seqlens is None else len(self.cu_seqlens) - 1

    @property
    def bounds(self) -> np.ndarray:
        """``[N + 1]`` offsets of each sequence in the flattened ``B * T`` token axis."""
        if self.cu_seqlens is not None:
            return np.asarray(self.cu_seqlens, np.int64)
        B, T = self.q.shape[:2]
        return np.arange(B + 1, dtype=np.int64) * T

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.bounds)

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the native call (``state_v_first`` only when set)."""
        kw = dict(
            q=self.q,
            k=self.k,
            v=self.v,
            g=self.g,
            beta=self.beta,
            scale=self.scale,
            initial_state=self.initial_state,
            output_final_state=self.output_final_state,
            use_qk_l2norm_in_kernel=self.use_qk_l2norm_in_kernel,
            cu_seqlens=self.cu_seqlens,
        )
        if self.state_v_first:
            kw["state_v_first"] = True
        return kw

    def backward_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the functional backward less the cotangents ``do`` and ``dht``
        (no ``output_final_state``: ``dht`` says whether there is a final state)."""
        kw = self.kwargs()
        del kw["output_final_state"]
        kw.pop("state_v_first", None)
        return kw

    def replace(self, **changes) -> Problem:
        return replace(self, **changes)

    def tokens(self, start: int, end: int, initial_state: Any = "keep") -> Problem:
        """Tokens ``[start, end)`` of every batch row as a call of its own that returns its final state.

        ``initial_state``: the state to start from (default: the problem's own).
        """
        state = self.initial_state if isinstance(initial_state, str) else initial_state
        return self.replace(
            **{name: getattr(self, name)[:, start:end] for name in INPUT_FIELDS},
            initial_state=state,
            output_final_state=True,
        )

    def take(self, index: np.ndarray, cu_seqlens: np.ndarray, initial_state: np.ndarray | None) -> Problem:
        """A varlen call (``B == 1``) of the flat ``B * T`` tokens ``index``, packed by ``cu_seqlens``."""
        fields = {}
        for name in INPUT_FIELDS:
            x = getattr(self, name)
            fields[name] = x.reshape((1, -1) + x.shape[2:])[:, np.asarray(index, np.int64)]
        return self.replace(
            **fields, cu_seqlens=np.asarray(cu_seqlens, np.int64), initial_state=initial_state, output_final_state=True
        )

    def sequence(self, n: int) -> Problem:
        """Sequence ``n`` (of a varlen pack or a batch) as a call of its own, from its own initial state."""
        start, end = self.bounds[n], self.bounds[n + 1]
        state = None if self.initial_state is None else self.initial_state[n : n + 1]
        return self.take(np.arange(start, end), np.array([0, end - start]), state).replace(
            output_final_state=self.output_final_state
        )

    def astype(self, dtype) -> Problem:
        """The same problem with ``q, k, v, g, beta`` rounded to ``dtype``."""
        return self.replace(**{name: getattr(self, name).astype(dtype) for name in INPUT_FIELDS})

    def describe(self) -> str:
        """One paragraph: shapes, lengths, flags and the gate values that matter."""
        s = self.shape
        g = np.asarray(self.g, np.float64)
        beta = np.asarray(self.beta, np.float64)
        parts = [
            f"B={s['B']} T={s['T']} H={s['H']} HV={s['HV']} K={s['K']} V={s['V']} dtype={dtype_name(self.dtype)}",
            f"lengths={self.lengths.tolist()}" + (" (cu_seqlens)" if self.cu_seqlens is not None else " (batched)"),
            (f"g in [{g.min():.4g}, {g.max():.4g}]" if g.size else "g: none")
            + f" ({int((g <= -20).sum())} strong <= -20, {int((g == 0).sum())} zero)",
            (f"beta in [{beta.min():.3g}, {beta.max():.3g}]" if beta.size else "beta: none"),
            f"scale={self.scale!r} l2norm={self.use_qk_l2norm_in_kernel}",
            "initial_state="
            + ("None" if self.initial_state is None else f"norm {np.linalg.norm(self.initial_state):.3g}"),
        ]
        if self.state_v_first:
            parts.append("state_v_first=True")
        if not self.output_final_state:
            parts.append("output_final_state=False")
        return "; ".join(parts)

    def save(self, path: str | Path, **metadata: Any) -> Path:
        """Write the problem to ``.npz`` (bfloat16 stored as its bits) with JSON metadata."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {name: getattr(self, name) for name in INPUT_FIELDS}
        arrays = {n: (a.view(np.uint16) if a.dtype == DTYPES["bfloat16"] else a) for n, a in arrays.items()}
        if self.initial_state is not None:
            arrays["initial_state"] = self.initial_state
        if self.cu_seqlens is not None:
            arrays["cu_seqlens"] = np.asarray(self.cu_seqlens, np.int64)
        meta = dict(
            dtype=dtype_name(self.dtype),
            scale=self.scale,
            output_final_state=self.output_final_state,
            use_qk_l2norm_in_kernel=self.use_qk_l2norm_in_kernel,
            state_v_first=self.state_v_first,
            metadata=metadata,
        )
        np.savez_compressed(path, meta=np.array(json.dumps(meta)), **arrays)
        return path

    @classmethod
    def load(cls, path: str | Path) -> tuple[Problem, dict[str, Any]]:
        """Read a problem saved by :meth:`save`; returns ``(problem, metadata)``."""
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            dtype = DTYPES[meta["dtype"]]
            inputs = {n: data[n].view(dtype) if data[n].dtype == np.uint16 else data[n] for n in INPUT_FIELDS}
            problem = cls(
                **inputs,
                scale=meta["scale"],
                initial_state=data["initial_state"] if "initial_state" in data else None,
                cu_seqlens=data["cu_seqlens"] if "cu_seqlens" in data else None,
                output_final_state=meta["output_final_state"],
                use_qk_l2norm_in_kernel=meta["use_qk_l2norm_in_kernel"],
                state_v_first=meta["state_v_first"],
            )
        return problem, meta["metadata"]
