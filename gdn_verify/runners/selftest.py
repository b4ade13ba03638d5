"""Selftest: every planted bug (``gdn_verify.implementations.planted``) must be caught by some property."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gdn_verify.core.verdict import Property
from gdn_verify.implementations import planted
from gdn_verify.runners.check import PropertyResult, RunSettings, run_property
from gdn_verify.runners.guard import Guard


@dataclass
class Planted:
    """One planted bug's outcome: the first property that failed on it (None: missed)."""

    bug: str
    description: str
    caught_by: PropertyResult | None
    seconds: float

    @property
    def cause_verdict(self) -> str:
        """The named cause against ``planted.RIGHT_CAUSES``: "right", "wrong", or "none" (silent)."""
        f = None if self.caught_by is None else self.caught_by.failure
        if f is None or not f.cause_model:
            return "none"
        return "right" if f.cause_model in planted.RIGHT_CAUSES.get(self.bug, ()) else "wrong"

    @property
    def margin(self) -> float | None:
        """How far over its bound the minimal failing example was (error / bound); None if not numeric."""
        r = self.caught_by
        m = None if r is None or r.failure is None else r.failure.measurement
        return None if m is None or not m.bound else m.ratio


def run_selftest(
    properties: list[Property], run: RunSettings, on_bug: Callable[[Planted], None] | None = None
) -> list[Planted]:
    """Check each planted bug against ``properties`` in order, stopping at the first that does not
    pass (failed, or the bug made the kernel raise or hang)."""
    rows = []
    for bug, (description, _) in planted.BUGS.items():
        impl = planted.implementation(bug)
        start = time.perf_counter()
        caught = None
        guard = Guard(run.timeout)
        try:
            for prop in properties:
                result = run_property(prop, impl, run, guard=guard)
                if result.status in ("failed", "error", "timeout"):
                    caught = result
                    break
        finally:
            guard.close()
        row = Planted(bug, description, caught, time.perf_counter() - start)
        rows.append(row)
        if on_bug is not None:
            on_bug(row)
    return rows
