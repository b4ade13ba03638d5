"""Where a run's time goes: seconds per label (``kernel``, ``oracle``), each counted once.

A runner wraps a kernel call in ``timed(KERNEL)``; the library wraps its float64 oracle and
tolerance model in ``timed(ORACLE)``. Time is exclusive: a labelled span nested inside
another (an oracle implementation called as the kernel, say) counts to the innermost label
only, so the labels and the caller's remainder add up to the wall clock. The totals are per
thread (a guard's worker thread never times anything itself) and only grow; a runner takes a
:func:`snapshot` before and :func:`since` it after.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

KERNEL = "kernel"  # inside the implementation's calls: its launches, host code, autotuning, JIT compiles
ORACLE = "oracle"  # our float64 oracle and the tolerance model (conditioning by perturbation)

_local = threading.local()


def _state() -> tuple[list[list[float]], defaultdict[str, float]]:
    if not hasattr(_local, "stack"):
        _local.stack, _local.totals = [], defaultdict(float)
    return _local.stack, _local.totals


@contextmanager
def timed(label: str) -> Iterator[None]:
    """Count the time spent inside the block to ``label`` (less any labelled span inside it)."""
    stack, totals = _state()
    start = time.perf_counter()
    stack.append([0.0])  # seconds of labelled spans nested inside this one
    try:
        yield
    finally:
        (inner,) = stack.pop()
        elapsed = time.perf_counter() - start
        totals[label] += elapsed - inner
        if stack:
            stack[-1][0] += elapsed


def snapshot() -> dict[str, float]:
    """The seconds counted so far in this thread, per label."""
    return dict(_state()[1])


def since(before: dict[str, float]) -> dict[str, float]:
    """The seconds counted per label since ``before`` (a :func:`snapshot`)."""
    now = snapshot()
    return {label: now[label] - before.get(label, 0.0) for label in now if now[label] > before.get(label, 0.0)}
