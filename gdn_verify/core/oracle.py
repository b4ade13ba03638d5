"""The float64 oracle a check compares against: a callable ``problem -> (o, final_state)``.

``numpy_oracle`` is the default (``gdn_verify.core.reference``: the token loop for short
sequences, the chunked form beyond ``RECURRENT_ORACLE_MAX_TOKENS``); ``from_implementation``
wraps a float64 implementation (the GPU recurrence ``cupy-oracle``) for problems too large for
NumPy. ``gdn_verify.implementations.choose_oracle`` is the one place that picks between them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from gdn_verify.core.problem import Problem
from gdn_verify.core.reference import chunk_gated_delta_rule, recurrent_gated_delta_rule

if TYPE_CHECKING:
    from gdn_verify.core.implementation import Implementation

Oracle = Callable[[Problem], tuple[np.ndarray, np.ndarray]]

# Longest sequence for which the token loop is the oracle; beyond it the chunked form (equal to
# it within 1e-13, both checked against mpmath) is several times faster, which is what lets
# error_growth reach 64k tokens.
RECURRENT_ORACLE_MAX_TOKENS = 512


def numpy_oracle(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """Float64 outputs ``(o [B, T, HV, V], final_state)``, the state always computed, in the problem's layout."""
    kw = problem.kwargs()
    kw["output_final_state"] = True
    kw["state_v_first"] = problem.state_v_first
    form = (
        chunk_gated_delta_rule
        if problem.lengths.max(initial=0) > RECURRENT_ORACLE_MAX_TOKENS
        else recurrent_gated_delta_rule
    )
    o, state = form(**kw)
    assert state is not None  # output_final_state=True
    return o, state


def from_implementation(impl: Implementation) -> Oracle:
    """An oracle backed by a float64 implementation (``cupy-oracle``); the state in the problem's layout."""

    def run(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
        result = impl.run(problem.replace(output_final_state=True))
        return np.asarray(result.o, np.float64), np.asarray(result.final_state, np.float64)

    return run
