"""Larger problems for ``fuzz``, and ``matches_reference`` against a pluggable (GPU) float64 oracle.

``check`` keeps problems small so the NumPy oracle is instant. A fuzz campaign can afford more:
on a GPU, T up to 64k, HV = 32 and K = V = 128 with the ``cupy-oracle`` implementation as the
float64 reference (the NumPy oracle would take minutes per example there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from gdn_verify import tolerance as tol
from gdn_verify.implementations import Implementation
from gdn_verify.problem import Problem
from properties import strategies as gs
from properties.checks import Measurement, Property, compare, run_checked


@dataclass(frozen=True)
class Sizes:
    """Upper limits of a campaign's problems."""

    max_len: int
    max_sequences: int
    head_ratios: tuple[int, ...]
    max_heads: int
    dims: tuple[int, ...]


CPU_SIZES = Sizes(max_len=512, max_sequences=8, head_ratios=(1, 2, 4), max_heads=4, dims=(1, 3, 16, 32, 60, 64))
GPU_SIZES = Sizes(max_len=65536, max_sequences=4, head_ratios=(1, 2, 4, 8), max_heads=4, dims=(64, 100, 128))


def large_problems(dtype: str, sizes: Sizes, gate_regimes=gs.GATE_REGIMES) -> st.SearchStrategy[Problem]:
    """``strategies.problems`` with the campaign's limits; on a GPU ``HV`` reaches 32, ``K = V = 128``."""
    heads = gs.head_counts(sizes.max_heads, sizes.head_ratios)
    dims = gs.head_dim(sizes.dims)
    # Long sequences are drawn with a bias to powers of two so the extremes are visited.
    lengths = st.sampled_from(tuple(2**i for i in range(17) if 2**i <= sizes.max_len))
    return st.tuples(heads, st.tuples(dims, dims), lengths).flatmap(
        lambda t: gs.problems(dtype=dtype, max_len=t[2], max_dim=max(t[1]), heads=st.just(t[0]),
                              gate_regimes=gate_regimes, max_sequences=sizes.max_sequences, state_layouts=True)
    )


def condition_with(oracle: Callable[[Problem], tuple], problem: Problem, reference: tuple, seed: int = 0) -> tol.Kappa:
    """``tolerance.condition`` with another float64 oracle (same perturbations and metrics)."""
    return tol.condition(problem, reference, seed, oracle_fn=oracle)


def oracle_from(impl: Implementation) -> Callable[[Problem], tuple]:
    """A float64 oracle ``problem -> (o, final_state)`` backed by an implementation (``cupy-oracle``).

    Like ``tolerance.oracle``, the state comes in the problem's layout.
    """

    def run(problem: Problem):
        result = impl.run(problem.replace(output_final_state=True))
        return np.asarray(result.o, np.float64), np.asarray(result.final_state, np.float64)

    return run


def matches_reference_with(oracle: Callable[[Problem], tuple]) -> Callable:
    """``matches_reference``'s check with ``oracle`` in place of the NumPy one."""

    def check(impl: Implementation, problem: Problem, params: dict) -> Measurement:
        o, state = oracle(problem)
        tolerance = tol.tolerance(problem, condition_with(oracle, problem, (o, state)))
        return compare(problem, run_checked(impl, problem), (o, state if problem.output_final_state else None),
                       tolerance)

    return check


def large_property(prop: Property, dtype_sizes: Sizes, oracle: Callable[[Problem], tuple] | None) -> Property:
    """``matches_reference`` and ``gate_extremes`` on large problems; other properties unchanged."""
    if prop.name not in ("matches_reference", "gate_extremes"):
        return prop
    regimes = gs.GATE_REGIMES if prop.name == "matches_reference" else ("none", "strong", "spikes", "strong_run")
    check = prop.check if oracle is None else matches_reference_with(oracle)
    return Property(prop.name, prop.summary + " (large sizes)",
                    lambda impl, dtype: large_problems(dtype, dtype_sizes, regimes).map(lambda p: (p, {})),
                    check, prop.max_examples)
