"""What a property is: its definition as the runners see it (:class:`Property`), the measurement
a check returns (:class:`Measurement`: the worst error and the bound it was held to) and the
:class:`Violation` it raises. The comparison that produces them is ``gdn_verify.core.verdict``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gdn_verify.core.implementation import Implementation
from gdn_verify.core.problem import Problem


@dataclass(frozen=True)
class Measurement:
    """The worst error and the bound it was held to. ``uniform``: the uniform model's part of
    ``bound`` (``bound`` adds the algorithm-aware term); ``note``: one line when an error lies
    between the two, naming the rounding that puts it there. ``parts``: each compared part's
    ``(error, bound)`` where there are several (a backward's gradients), the worst being the whole's."""

    error: float
    bound: float
    detail: str = ""
    uniform: float | None = None
    note: str = ""
    parts: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.ratio_of(self.error, self.bound)

    @staticmethod
    def ratio_of(error: float, bound: float) -> float:
        """``error / bound``: 0 for no error, infinite for an error over a zero bound."""
        return error / bound if bound > 0 else (0.0 if error == 0 else float("inf"))

    @property
    def uniform_ratio(self) -> float:
        """Error over the uniform bound (``ratio`` where there is no algorithm-aware term)."""
        if self.uniform is None:
            return self.ratio
        return self.ratio_of(self.error, self.uniform)


class Violation(AssertionError):
    def __init__(self, message: str, measurement: Measurement | None = None):
        super().__init__(message)
        self.measurement = measurement


def _applies(impl: Implementation) -> str | None:
    return None


@dataclass(frozen=True)
class Property:
    """A named property as the runners see it: configured once, then drawn and checked.

    ``strategy(impl)`` is a Hypothesis strategy of ``(problem, params)``; ``check(impl, problem,
    params)`` returns a :class:`Measurement` or raises :class:`Violation` (``NotImplementedError``
    from the implementation means unsupported); ``unsupported_by(impl)`` is a reason, or None
    when the property applies. ``form`` is the form it calls: ``"native"`` or ``"spec"``.
    """

    name: str
    summary: str
    strategy: Callable[[Implementation], Any]
    check: Callable[[Implementation, Problem, dict], Measurement]
    max_examples: int = 40
    unsupported_by: Callable[[Implementation], str | None] = _applies
    form: str = "native"
