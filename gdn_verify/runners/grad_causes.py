"""Named causes for gradient failures: which known mistake reproduces a backward's gradients.

The counterpart of ``causes`` for the backward form. On the minimal failing problem,
:func:`explain` reruns the backward with the failing cotangents and compares its gradients
with those of each *gradient error model*: the planted gradient bugs of
``implementations.planted_grad`` (each one switch of the float32 NumPy backward: a gradient
dropped or doubled, taken through the wrong gate convention, a chunk-boundary term missing, a
16-bit ``dg`` accumulation, ...) and, for one gradient alone, a plain scaling of the exact one
(dropped: 0, doubled: 2, sign flipped: -1). A model *explains* the failure when, on every
gradient over its bound, the error against the model is at most ``causes.REPRODUCES`` of the
error against the oracle; it is named only when it also explains the same problem under a
fresh pair of cotangents and on two fresh examples of the failing shape class (``causes.
fresh_examples``, one of them longer), and predicts no failure the backward does not have there:
a model that coincides with the bug on one draw, or on a degenerate minimal example, is not named.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from gdn_verify.core import grad_tolerance as gtol
from gdn_verify.core.gradients import cotangents
from gdn_verify.core.implementation import GRADIENTS, Implementation
from gdn_verify.core.problem import Problem
from gdn_verify.core.property import Measurement
from gdn_verify.implementations import planted_grad
from gdn_verify.runners.causes import CONTRADICTS, MAX_TOKENS, REPRODUCES, Cause, fresh_examples

# 16-bit accumulations are precision losses; every other model is a logic error.
PRECISION_MODELS = ("dg_cumsum16",)
# Exact scalings of one gradient, named when nothing else explains the failure.
SCALINGS = {0.0: "is dropped (zero where the exact gradient is not)", 2.0: "is doubled", -1.0: "has its sign flipped"}
SCALING_SLACK = 0.05  # a fitted factor within this of 0, 2 or -1 is that scaling


@dataclass(frozen=True)
class GradModel:
    """One known mistake as a functional backward (NumPy, the native call's keywords plus ``do``,
    ``dht``), returning the six gradients in order."""

    name: str
    cause: str
    run: Callable[..., tuple]
    kind: str = "logic error"


def _models() -> tuple[GradModel, ...]:
    models = []
    for name, (description, fn) in planted_grad.BUGS.items():
        if not planted_grad.RIGHT_CAUSES.get(name):
            continue  # caught by exact contracts (padding, determinism): no numeric signature
        kind = "precision loss" if name in PRECISION_MODELS else "logic error"
        models.append(GradModel(name, description, fn, kind))
    return tuple(models)


MODELS: tuple[GradModel, ...] = _models()


@dataclass(frozen=True)
class _Observation:
    grads: dict
    reference: dict
    tolerance: gtol.GradTolerance
    against_oracle: dict[str, float]
    kwargs: dict
    do: np.ndarray
    dht: np.ndarray | None

    @property
    def failing(self) -> list[str]:
        return [n for n, e in self.against_oracle.items() if e > self.tolerance.bounds[n]]


def _observe(impl: Implementation, problem: Problem, seed: int, with_dht: bool) -> _Observation:
    do, dht = cotangents(problem, seed, with_dht)
    result = impl.run_backward(problem, do, dht)
    reference, tolerance = gtol.grad_reference_and_tolerance(problem, do, dht, grad_dtypes=result.dtypes)
    kwargs = problem.backward_kwargs()
    errors = gtol.grad_errors(problem, result.grads, reference, tolerance)
    return _Observation(result.grads, reference, tolerance, errors, kwargs, do, dht)


def _run(model: GradModel, obs: _Observation) -> dict:
    return dict(zip(GRADIENTS, model.run(**obs.kwargs, do=obs.do, dht=obs.dht)))


def _reproduces(problem: Problem, obs: _Observation, model_grads: Mapping) -> float | None:
    """The worst ratio (error against the model over error against the oracle) on the failing
    gradients, when each is at most REPRODUCES; None otherwise, or when the model predicts a
    failure (beyond CONTRADICTS times the bound) of a gradient the backward gets right."""
    against = gtol.grad_errors(problem, obs.grads, model_grads, obs.tolerance)
    failing = obs.failing
    if not failing:
        model_error = gtol.grad_errors(problem, model_grads, obs.reference, obs.tolerance)
        worst = max((model_error[n] / obs.tolerance.bounds[n] for n in model_error), default=0.0)
        return 0.0 if worst <= CONTRADICTS else None
    ratios = [against.get(n, np.inf) / obs.against_oracle[n] for n in failing]
    return max(ratios) if max(ratios) <= REPRODUCES else None


def _scaling(problem: Problem, obs: _Observation) -> str | None:
    """``"dk is doubled ..."`` when the one failing gradient is the exact one times 0, 2 or -1."""
    if len(obs.failing) != 1:
        return None
    [name] = obs.failing
    x, ref = np.asarray(obs.grads[name], np.float64), np.asarray(obs.reference[name], np.float64)
    energy = float((ref * ref).sum())
    if energy == 0 or not np.isfinite(x).all():
        return None
    alpha = float((x * ref).sum()) / energy
    for factor, text in SCALINGS.items():
        if abs(alpha - factor) > SCALING_SLACK:
            continue
        residual = gtol.grad_errors(problem, {name: x}, {name: factor * ref}, obs.tolerance).get(name, np.inf)
        if residual <= REPRODUCES * obs.against_oracle[name]:
            return (
                f"{name} {text} (fitted factor {alpha:.3g}; {name} error {residual:.3g} against {factor:g} "
                f"times the exact {name}, {obs.against_oracle[name]:.3g} against the exact one)"
            )
    return None


def explain(impl: Implementation, problem: Problem, params: dict, measurement: Measurement | None) -> Cause:
    """The likely cause of a gradient failure on the minimal ``problem`` (an empty :class:`Cause`
    when none is identified; never raises: finding a cause must not cost the verdict)."""
    if measurement is None or measurement.bound <= 0 or "cotangent_seed" not in params:
        return Cause()  # exact contracts (padding, determinism) and non-numeric failures
    if problem.lengths.sum() > MAX_TOKENS:
        return Cause()
    try:
        with np.errstate(all="ignore"):
            return _explain(impl, problem, params)
    except Exception:  # noqa: BLE001 - see the docstring
        return Cause()


def _explain(impl: Implementation, problem: Problem, params: dict) -> Cause:
    seed, with_dht = params["cotangent_seed"], params["with_dht"]
    obs = _observe(impl, problem, seed, with_dht)
    if not obs.failing:
        return Cause()
    # Evidence: the same problem under fresh cotangents, and other examples of its shape class (one
    # longer), on which mistakes that coincide on a degenerate minimal example (T = 0) part.
    others = [(problem, seed + 1)] + [(p, seed + 2 + i) for i, p in enumerate(fresh_examples(problem, params, 2))]
    evidence = [(p, _observe(impl, p, s, with_dht)) for p, s in others]
    found = []
    for model in MODELS:
        first = _reproduces(problem, obs, _run(model, obs))
        if first is not None and all(_reproduces(p, o, _run(model, o)) is not None for p, o in evidence):
            found.append((first, model))
    if found:
        ratio, model = min(found, key=lambda f: f[0])
        alike = [m.name for _, m in found if m is not model]
        how = "exactly" if ratio == 0 else f"to {100 * ratio:.3g}% of its error against the exact gradients"
        text = (
            f"{model.cause} (the float32 backward with this mistake reproduces {', '.join(obs.failing)} {how}, "
            f"here and on {len(evidence)} other draws)"
        )
        if alike:
            text += f"; indistinguishable here from: {', '.join(alike)}"
        return Cause(text, model.name, model.kind, 1)
    scaled = _scaling(problem, obs)
    if scaled is not None:
        return Cause(scaled, "scaling", "logic error", 1)
    return Cause()
