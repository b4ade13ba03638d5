"""Judging a backward: its gradients' contract and their errors against the float64 gradients.

The counterpart of ``verdict`` for the functional backward (``Implementation.run_backward``):
:func:`run_backward_checked` turns a wrong output into a :class:`Violation`,
:func:`gradient_contract_violations` states the shapes and dtypes, and :func:`compare_gradients`
holds every gradient to ``grad_tolerance`` and names the worst one, its block and its size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from gdn_verify.core import grad_tolerance as gtol
from gdn_verify.core.implementation import GRADIENTS, ContractError, Gradients, Implementation
from gdn_verify.core.problem import Problem
from gdn_verify.core.property import Measurement, Violation


def expected_shapes(problem: Problem) -> dict[str, tuple[int, ...] | None]:
    """The shape each gradient must have (None: must be None, no initial state)."""
    s = problem.shape
    h0 = None if problem.initial_state is None else tuple(np.shape(problem.initial_state))
    return dict(
        dq=(s["B"], s["T"], s["H"], s["K"]),
        dk=(s["B"], s["T"], s["H"], s["K"]),
        dv=(s["B"], s["T"], s["HV"], s["V"]),
        dg=(s["B"], s["T"], s["HV"]),
        dbeta=(s["B"], s["T"], s["HV"]),
        dh0=h0,
    )


def gradient_contract_violations(grads: Gradients, problem: Problem) -> list[str]:
    """Shapes, presence and dtypes of the six gradients: each shaped like its input, in the input
    dtype or float32 (``dh0`` float32), ``dh0`` present exactly when an initial state was given."""
    input_dtype = np.dtype(problem.dtype).name
    problems = []
    for name, want in expected_shapes(problem).items():
        x, dtype = grads.grads[name], grads.dtypes[name]
        if want is None:
            if x is not None:
                problems.append(f"{name} returned although there is no initial state")
            continue
        if x is None:
            problems.append(f"{name} is None" + (" although an initial state was given" if name == "dh0" else ""))
        elif tuple(np.shape(x)) != want:
            problems.append(f"{name} has shape {tuple(np.shape(x))}, expected {want}")
        elif dtype not in ({"float32"} if name == "dh0" else {input_dtype, "float32"}):
            allowed = "float32" if name == "dh0" else f"the input dtype {input_dtype} or float32"
            problems.append(f"{name} has dtype {dtype}, expected {allowed}")
    return problems


def run_backward_checked(
    impl: Implementation, problem: Problem, do: np.ndarray, dht: np.ndarray | None, options: dict | None = None
) -> Gradients:
    """``impl.run_backward`` with its contract checked: a wrong count, shape or dtype is a
    :class:`Violation` (``gradient contract: ...``), not a crash."""
    try:
        grads = impl.run_backward(problem, do, dht, options)
    except ContractError as exc:
        raise Violation(f"gradient contract: {exc}") from None
    problems = gradient_contract_violations(grads, problem)
    if problems:
        raise Violation("gradient contract: " + "; ".join(problems))
    return grads


def block_label(problem: Problem, name: str, index: tuple[int, ...]) -> str:
    """``sequence n value head h`` (``q/k head`` for dq and dk) for a block index ``(n, h)``."""
    n, h = index
    return f"sequence {n} {'q/k' if name in gtol.QK_GRADIENTS else 'value'} head {h}"


def nonfinite(grads: Mapping[str, Any], against: Mapping[str, Any], tolerance: gtol.GradTolerance) -> str | None:
    """The first gradient with NaN or Inf where ``against`` is finite, as a message, or None; an
    infinity where the exact value overflows the returned dtype is the right rounding, not one,
    and a gradient whose bound is infinite (an allowed 16-bit intermediate out of range) is not
    judged."""
    for name in GRADIENTS:
        x, ref = grads.get(name), against.get(name)
        if x is None or ref is None or np.isinf(tolerance.bounds.get(name, 0.0)):
            continue  # an infinite bound: an allowed rounding overflows the input dtype (RANGE_TEXT)
        bad = ~np.isfinite(np.asarray(x, np.float64)) & np.isfinite(np.asarray(ref, np.float64))
        bad &= ~gtol.expected_infinite(tolerance, name, x, ref)
        if bad.any():
            return f"non-finite {name} values (NaN/Inf) at {int(bad.sum())} of {bad.size} entries"
    return None


def compare_gradients(
    problem: Problem,
    grads: Mapping[str, Any],
    against: Mapping[str, Any],
    tolerance: gtol.GradTolerance,
    factor: float = 1.0,
    what: str = "oracle",
) -> Measurement:
    """Every gradient present in both within ``factor`` times its bound; the :class:`Measurement`
    is the worst gradient's (error and bound of the one with the largest ratio), its detail every
    gradient's ratio. Raises :class:`Violation` naming the gradient and its worst block."""
    message = nonfinite(grads, against, tolerance)
    if message is not None:
        raise Violation(f"{message} where the {what} is finite")
    errors = gtol.grad_errors(problem, grads, against, tolerance)
    if not errors:
        return Measurement(0.0, 0.0, "no gradient to compare")
    ratios = {n: e / (factor * tolerance.bounds[n]) if tolerance.bounds[n] > 0 else np.inf for n, e in errors.items()}
    worst = max(ratios, key=lambda n: ratios[n])
    parts = {n: (errors[n], factor * tolerance.bounds[n]) for n in errors}
    detail = ", ".join(f"{n} {e:.3g}/{b:.3g}" for n, (e, b) in parts.items())
    m = Measurement(*parts[worst], detail, parts=parts)
    failing = [n for n in errors if ratios[n] > 1]
    if failing:
        blocks = gtol.grad_block_errors(problem, grads, against, tolerance)[worst]
        n, h = (int(i) for i in np.unravel_index(int(np.argmax(blocks)), blocks.shape))
        where = block_label(problem, worst, (n, h))
        others = f" (also {', '.join(failing[1:])})" if len(failing) > 1 else ""
        raise Violation(
            f"{worst} off the {what} by {errors[worst]:.3g}, bound {factor * tolerance.bounds[worst]:.3g}, "
            f"worst in {where}{others}",
            m,
        )
    return m
