"""Shape classes: what a JIT-compiled kernel specialises on, so a new one costs a compile.

FLA's Triton kernels (and FlashInfer's CuTe DSL ones) compile one variant per head counts,
head sizes, dtype and the flags that select code paths (varlen, initial state, l2norm); a new
``T`` or batch size is free. A :class:`ShapeClass` names one such variant;
:meth:`ShapeClass.of` tells which one a problem belongs to and :meth:`ShapeClass.example`
builds a tiny problem of it (to compile it once, up front).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from gdn_verify.core.problem import DTYPES, Problem, dtype_name

# Kernel options (in-kernel gates, state_v_first, output_final_state=False) compile one more variant of
# every shape class they meet (a Triton constexpr each): with a shape pool the properties that pass
# them meet only its first classes (batched with a state; varlen with l2norm), and the planner warms
# those classes with the options too.
OPTION_CLASSES = 2
# The scales the strategies draw besides None (the kernel's default, 1/sqrt(K)).
EXPLICIT_SCALES = (1.0, 0.5, 0.125)
# What a kernel that compiles per scale value draws besides None instead (``Implementation.extra
# ["compile_scales"]``; FlashQLA's TileLang kernels take the scale as a compile-time argument, and
# ``implementations.flashqla.warm_variants`` warms each value drawn up front): each value is one
# more compile of its kernels per class and variant, and
# FlashQLA's cold pool of 4 classes with all of EXPLICIT_SCALES took 7 min 27 s on an H100
# (2026-11-27). One value exposes an ignored, squared or inverted scale as well as three, if it is
# neither 0, 1 nor 1/sqrt(K) for an integer K: 0.375 (3/8, exact in every dtype; K would be 7.1).
COMPILED_SCALES = (0.375,)
# The batch sizes the strategies draw for a batched problem (``properties.strategies.Limits``).
MAX_BATCH = 3


@dataclass(frozen=True, order=True)
class ShapeClass:
    """``(H, HV, K, V, dtype, varlen, initial_state, l2norm)``: one compiled variant of a kernel."""

    H: int
    HV: int
    K: int
    V: int
    dtype: str
    varlen: bool = False
    initial_state: bool = False
    l2norm: bool = False

    @classmethod
    def of(cls, problem: Problem) -> ShapeClass:
        """The class ``problem`` belongs to."""
        s = problem.shape
        return cls(
            s["H"],
            s["HV"],
            s["K"],
            s["V"],
            dtype_name(problem.dtype),
            problem.cu_seqlens is not None,
            problem.initial_state is not None,
            bool(problem.use_qk_l2norm_in_kernel),
        )

    def replace(self, **changes: Any) -> ShapeClass:
        return replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """Its fields by name (JSON: a stored plan, a compile worker's request)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> ShapeClass:
        """The class whose fields ``row`` holds (other keys, such as a stored plan's seconds, ignored)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in names})

    def describe(self) -> str:
        """``H=2 HV=4 K=128 V=100 bfloat16 varlen state l2norm`` (flags absent when off)."""
        flags = [
            "varlen" if self.varlen else "batched",
            *(["state"] if self.initial_state else []),
            *(["l2norm"] if self.l2norm else []),
        ]
        return f"H={self.H} HV={self.HV} K={self.K} V={self.V} {self.dtype} {' '.join(flags)}"

    def example(self, seed: int = 0, tokens: int = 70, batch: int = 2) -> Problem:
        """A tiny well-posed problem of this class (``tokens`` spans a 64-token chunk boundary;
        ``batch`` rows of ``tokens // 2`` for a batched class, two sequences for a varlen one)."""
        rng = np.random.default_rng(seed)
        if self.varlen:
            cu = np.array([0, tokens // 2, tokens], np.int64)
            B, T, N = 1, tokens, 2
        else:
            cu, B, T, N = None, batch, tokens // 2, batch
        k = rng.standard_normal((B, T, self.H, self.K))
        problem = Problem(
            q=rng.standard_normal((B, T, self.H, self.K)),
            k=k / np.linalg.norm(k, axis=-1, keepdims=True),
            v=rng.standard_normal((B, T, self.HV, self.V)),
            g=np.log(rng.uniform(0.9, 1.0, (B, T, self.HV))),
            beta=rng.uniform(0.0, 1.0, (B, T, self.HV)),
            initial_state=rng.standard_normal((N, self.HV, self.K, self.V)).astype(np.float32)
            if self.initial_state
            else None,
            use_qk_l2norm_in_kernel=self.l2norm,
            cu_seqlens=cu,
        )
        return problem.astype(DTYPES[self.dtype])


def variants(problem: Problem) -> list[Problem]:
    """Calls of ``problem``'s class that the properties also make and that a Triton kernel compiles
    apart (a constexpr each): the state in ``[V, K]`` layout (``matches_reference`` and
    ``gate_extremes`` draw it) and no final state (``output_contract``). On an H100 (2026-11-26)
    fla-chunk's cold check spent 273 s compiling variants inside the properties that the pool had
    not warmed, 3 s warm."""
    v_first = problem.replace(
        state_v_first=True,
        initial_state=None
        if problem.initial_state is None
        else np.ascontiguousarray(problem.initial_state.swapaxes(-1, -2)),
    )
    return [v_first, problem.replace(output_final_state=False)]


def backward_variants(problem: Problem) -> list[tuple[Problem, bool]]:
    """The backward calls of ``problem``'s class, beside ``(problem, True)`` (with a final-state
    cotangent), that the gradient properties also make and that a kernel may compile apart, as
    ``(problem, dht given)``: the same without a final-state cotangent (FLA's Triton constexprs
    ``USE_FINAL_STATE_GRADIENT`` and ``STORE_FINAL_STATE``), and, for a batched class, each other
    batch size the strategies draw, with and without one. FLA 0.6 runs ``chunk_bwd_dqkwg`` in
    TileLang on Hopper under Triton < 3.7.1, and that kernel takes ``B`` as a compile-time
    argument (``fla/ops/common/backends/tilelang/chunk_bwd.py:21-37``). On an H100 (2026-11-27)
    a cold ``check --grad --impl fla-chunk`` compiled it 7 times inside its properties."""
    calls = [(problem, False)]
    if problem.cu_seqlens is None:
        c = ShapeClass.of(problem)
        for batch in range(1, MAX_BATCH + 1):
            if batch != problem.shape["B"]:
                other = c.example(batch=batch)
                calls += [(other, True), (other, False)]
    return calls
