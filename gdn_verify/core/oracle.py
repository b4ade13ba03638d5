"""The float64 oracle a check compares against: a callable ``problem -> (o, final_state)``.

``numpy_oracle`` is the default (``gdn_verify.core.reference``: the token loop for short
sequences, the chunked form beyond ``RECURRENT_ORACLE_MAX_TOKENS``); ``from_implementation``
wraps a float64 implementation (the GPU recurrence ``cupy-oracle``) for problems too large for
NumPy. ``gdn_verify.implementations.choose_oracle`` is the one place that picks between them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from gdn_verify.core.conventions import Packed, export_state, pack, unpack_output
from gdn_verify.core.problem import Problem
from gdn_verify.core.reference import (
    chunk_core,
    chunk_gated_delta_rule,
    recurrent_core,
    recurrent_gated_delta_rule,
    stack_packed,
)

if TYPE_CHECKING:
    from gdn_verify.core.implementation import Implementation

Oracle = Callable[[Problem], tuple[np.ndarray, np.ndarray]]

# Longest sequence for which the token loop is the oracle; beyond it the chunked form (equal to
# it within 1e-13, both checked against mpmath) is several times faster, which is what lets
# error_growth reach 64k tokens.
RECURRENT_ORACLE_MAX_TOKENS = 512
# The chunk size of the chunked oracle.
ORACLE_CHUNK = 64
# Most state elements (all copies together) that numpy_oracle_stacked runs in one token loop.
STACK_BUDGET = 1 << 24


def pack_problem(problem: Problem, pad: int = 1) -> Packed:
    """``problem`` packed in float64 with l2norm applied (the k-first state), as the oracle packs it."""
    kw = problem.kwargs()
    kw.pop("output_final_state")
    kw["state_v_first"] = problem.state_v_first
    return pack(**kw, dtype=np.float64, pad_to_multiple=pad)


def problem_digest(problem: Problem) -> str:
    """A digest of everything the oracle and the tolerance read from ``problem`` (its arrays with their
    dtypes and shapes, and its flags; not ``notes``)."""
    h = hashlib.sha256()
    for name in ("q", "k", "v", "g", "beta", "initial_state", "cu_seqlens"):
        x = getattr(problem, name)
        h.update(
            name.encode()
            + (b"-" if x is None else str((x.dtype, x.shape)).encode() + np.ascontiguousarray(x).tobytes())
        )
    h.update(
        repr(
            (problem.scale, problem.use_qk_l2norm_in_kernel, problem.output_final_state, problem.state_v_first)
        ).encode()
    )
    return h.hexdigest()


def token_loop(problem: Problem) -> bool:
    """Whether :func:`numpy_oracle` runs ``problem`` as the token loop (``reference.recurrent_core``)."""
    return problem.lengths.max(initial=0) <= RECURRENT_ORACLE_MAX_TOKENS


def numpy_oracle(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """Float64 outputs ``(o [B, T, HV, V], final_state)``, the state always computed, in the problem's layout."""
    kw = problem.kwargs()
    kw["output_final_state"] = True
    kw["state_v_first"] = problem.state_v_first
    if token_loop(problem):
        o, state = recurrent_gated_delta_rule(**kw)
    else:
        o, state = chunk_gated_delta_rule(**kw, chunk_size=ORACLE_CHUNK)
    assert state is not None  # output_final_state=True
    return o, state


def numpy_oracle_with_norms(problem: Problem) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """``numpy_oracle(problem)`` and, from the same run (token loop or chunked form), the state's
    Frobenius norm after each token, ``[N, L, HV]`` in the packed layout of :func:`pack_problem`
    (what ``tolerance.natural_scales`` needs)."""
    if token_loop(problem):
        p = pack_problem(problem)
        norms = np.empty(p.v.shape[:3])
        o, S = recurrent_core(p, norms)
    else:
        p = pack_problem(problem, ORACLE_CHUNK)
        norms = np.empty(p.v.shape[:3])
        o, S = chunk_core(p, ORACLE_CHUNK, norms=norms)
        norms = norms[:, : problem.lengths.max()]  # without the padding to a multiple of the chunk size
    return (unpack_output(p, o), export_state(p, S)), norms


def numpy_oracle_stacked(problems: list[Problem]) -> list[tuple[np.ndarray, np.ndarray]]:
    """``[numpy_oracle(x) for x in problems]``, bitwise, for problems of one shape and sequence lengths
    in the token-loop regime: their sequences run stacked along N in one token loop (up to
    ``STACK_BUDGET`` state elements at a time), each with its own ``scale``."""
    parts = [pack_problem(x) for x in problems]
    N, HV, K, V = parts[0].initial_state.shape
    per_call = max(1, STACK_BUDGET // (N * HV * K * V))
    out = []
    for first in range(0, len(parts), per_call):
        group = parts[first : first + per_call]
        scale = np.repeat([x.scale for x in group], N)
        o, S = recurrent_core(stack_packed(group), scale=scale)
        out += [
            (unpack_output(x, o[i * N : (i + 1) * N]), export_state(x, S[i * N : (i + 1) * N]))
            for i, x in enumerate(group)
        ]
    return out


def from_implementation(impl: Implementation) -> Oracle:
    """An oracle backed by a float64 implementation (``cupy-oracle``); the state in the problem's layout."""

    def run(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
        result = impl.run(problem.replace(output_final_state=True))
        return np.asarray(result.o, np.float64), np.asarray(result.final_state, np.float64)

    return run
