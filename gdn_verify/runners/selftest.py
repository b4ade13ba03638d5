"""Selftest: every planted bug must be caught by some property.

The bugs come from a module like ``gdn_verify.implementations.planted`` (the forward's, the
default) or ``planted_grad`` (the backward's): ``BUGS`` (name -> description and callable),
``RIGHT_CAUSES`` (name -> the cause models that name it rightly) and ``implementation(bug)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gdn_verify.core.implementation import Implementation
from gdn_verify.core.property import Property
from gdn_verify.core.verdict import remembered_oracles
from gdn_verify.implementations import planted
from gdn_verify.runners.check import PropertyResult, RunSettings, run_property
from gdn_verify.runners.guard import Guard

# Planted bugs that change a result only on calls passing one of FLA's in-kernel options: the option,
# and the one property whose calls pass it (``native.check_in_kernel_options``; no other property
# passes options). Every other property calls such a bug exactly as the correct NumPy implementation,
# so it passes them as that does: the selftest runs the named property first, and the others in their
# order only if it passes, which finds the same first failure. (``tests/test_selftest.py`` checks both
# halves.) Before, each of the two ran the eleven properties before its own first: 7 of the selftest's
# 8 minutes on a 2-core CPU (2026-12-04).
OPTION_BUGS: dict[str, tuple[str, str]] = {
    "gate_bias_ignored": ("dt_bias", "in_kernel_gate"),
    "neg_eigval_ignored": ("allow_neg_eigval", "in_kernel_beta_sigmoid"),
}


class PlantedBugs(Protocol):
    """What :func:`run_selftest` needs of a planted-bug module."""

    BUGS: dict[str, tuple[str, Any]]
    RIGHT_CAUSES: dict[str, tuple[str, ...]]

    def implementation(self, bug: str) -> Implementation: ...


@dataclass
class Planted:
    """One planted bug's outcome: the first property that failed on it (None: missed).

    ``right_causes``: the cause models that name it rightly (None: ``planted.RIGHT_CAUSES``'s);
    ``impl``: the planted implementation that ran (None: ``planted:BUG``); ``not_applicable``: why
    the bug is no bug on this dtype's inputs (then it did not run).
    """

    bug: str
    description: str
    caught_by: PropertyResult | None
    seconds: float
    right_causes: tuple[str, ...] | None = None
    impl: Implementation | None = None
    not_applicable: str = ""

    @property
    def cause_verdict(self) -> str:
        """The named cause against the right causes: "right", "wrong", "none" (silent), or "n/a"
        (not applicable: not run)."""
        if self.not_applicable:
            return "n/a"
        f = None if self.caught_by is None else self.caught_by.failure
        if f is None or not f.cause_model:
            return "none"
        right = planted.RIGHT_CAUSES.get(self.bug, ()) if self.right_causes is None else self.right_causes
        # a cause named with its exact look-alikes is right when one of them is
        return "right" if set(f.named_causes) & set(right) else "wrong"

    @property
    def margin(self) -> float | None:
        """How far over its bound the minimal failing example was (error / bound); None if not numeric."""
        r = self.caught_by
        m = None if r is None or r.failure is None else r.failure.measurement
        return None if m is None or not m.bound else m.ratio


def run_selftest(
    properties: list[Property],
    run: RunSettings,
    on_bug: Callable[[Planted], None] | None = None,
    bugs: PlantedBugs = planted,
    not_applicable: Mapping[str, str] | None = None,
) -> list[Planted]:
    """Check each of ``bugs``' planted bugs against ``properties`` in order, stopping at the first
    that does not pass (failed, or the bug made the kernel raise or hang); an :data:`OPTION_BUGS` bug
    tries its property first, which finds the same first failure. ``not_applicable``: the bugs that
    are no bug on the inputs' dtype, with the reason; they are listed, not run.

    The oracle's results are remembered across bugs (``verdict.remembered_oracles``): with one seed a
    property draws the same examples for every bug until one fails, so the properties a bug passes
    before the one that catches it cost their kernel calls, not their oracles, after the first bug."""
    with remembered_oracles():
        return _run_bugs(properties, run, on_bug, bugs, not_applicable or {})


def _run_bugs(
    properties: list[Property],
    run: RunSettings,
    on_bug: Callable[[Planted], None] | None,
    bugs: PlantedBugs,
    skip: Mapping[str, str],
) -> list[Planted]:
    rows = []
    for bug, (description, _) in bugs.BUGS.items():
        right = tuple(bugs.RIGHT_CAUSES.get(bug, ()))
        if bug in skip:
            row = Planted(bug, description, None, 0.0, right, not_applicable=skip[bug])
        else:
            impl = bugs.implementation(bug)
            start = time.perf_counter()
            caught = _first_failure(_in_order_for(bug, properties), impl, run)
            row = Planted(bug, description, caught, time.perf_counter() - start, right, impl)
        rows.append(row)
        if on_bug is not None:
            on_bug(row)
    return rows


def _in_order_for(bug: str, properties: list[Property]) -> list[Property]:
    """``properties`` in the order to try on ``bug``: an :data:`OPTION_BUGS` bug's property first."""
    first = OPTION_BUGS.get(bug, ("", ""))[1]
    return sorted(properties, key=lambda p: p.name != first)  # stable: the others keep their order


def _first_failure(properties: list[Property], impl: Implementation, run: RunSettings) -> PropertyResult | None:
    """The first of ``properties`` that ``impl`` does not pass (failed, raised or hung), or None."""
    guard = Guard(run.timeout)
    try:
        for prop in properties:
            result = run_property(prop, impl, run, guard=guard)
            if result.status in ("failed", "error", "timeout"):
                return result
        return None
    finally:
        guard.close()
