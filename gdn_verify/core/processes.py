"""One pool of spawned worker processes for the float64 oracles, kept for a whole check.

The oracles and tolerance models (``verdict.oracles_and_tolerances``, ``grad_tolerance``'s
``grad_references_and_tolerances``) split a long problem into independent, seeded tasks and run
them side by side. Starting a spawned process costs about a second (Python, NumPy and
gdn_verify's imports), so the pool is created on first use and kept: a check of 60 examples pays
for it once, not 60 times. It is shut down at exit, when a task's wait is interrupted or the pool
breaks, and by :func:`shutdown` (a runner calls it after its last property).

Spawn, not fork: the calling process may hold a CUDA context. Tasks must be pure functions of
their arguments (NumPy, seeded), so that a result is the same, bitwise, wherever it ran.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import multiprocessing
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

_lock = threading.Lock()
_pool: concurrent.futures.ProcessPoolExecutor | None = None
_size = 0


def cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def pool(workers: int) -> concurrent.futures.Executor:
    """The shared pool of ``workers`` processes (a pool of another size is replaced)."""
    global _pool, _size
    with _lock:
        if _pool is not None and _size != workers:
            _pool.shutdown(wait=True, cancel_futures=True)
            _pool = None
        if _pool is None:
            context = multiprocessing.get_context("spawn")  # not fork: this process may hold CUDA
            _pool, _size = concurrent.futures.ProcessPoolExecutor(workers, mp_context=context), workers
        return _pool


def shutdown() -> None:
    """Stop the shared pool's processes, if any (the next use starts a new one)."""
    global _pool
    with _lock:
        if _pool is not None:
            _pool.shutdown(wait=True, cancel_futures=True)
            _pool = None


atexit.register(shutdown)


class Tasks:
    """Tasks submitted to the shared pool (``workers`` > 1) or run here one by one when their
    results are asked for (``workers`` = 1: the serial path, in the same order of results).

    ``submit`` returns a handle whose ``result()`` gives the task's value (a future in the pool);
    the caller submits everything it can first (longest first bounds the wall clock), then
    collects. Within ``with Tasks(...)``, an exception or an interrupt cancels the tasks submitted
    here that have not started (the shared pool's next user does not wait behind them), and a
    broken or interrupted pool is shut down (not reused)."""

    def __init__(self, workers: int):
        self.executor = pool(workers) if workers > 1 else None
        self.submitted: list[concurrent.futures.Future] = []

    def submit(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.executor is None:
            return _Deferred(function, args, kwargs)
        self.submitted.append(self.executor.submit(function, *args, **kwargs))
        return self.submitted[-1]

    def __enter__(self) -> Tasks:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is not None and self.executor is not None:
            for future in self.submitted:
                future.cancel()
            if isinstance(value, concurrent.futures.process.BrokenProcessPool) or not isinstance(value, Exception):
                shutdown()  # broken, or interrupted (KeyboardInterrupt): the workers may be gone


class _Deferred:
    """A task run here when its result is first asked for (the serial path)."""

    def __init__(self, function: Callable[..., Any], args: tuple, kwargs: dict):
        self.call: tuple | None = (function, args, kwargs)
        self.value: Any = None

    def result(self) -> Any:
        if self.call is not None:
            function, args, kwargs = self.call
            self.call = None
            self.value = function(*args, **kwargs)
        return self.value


def workers_for(sizes: Sequence[int], threshold: int, workers: int | None) -> int:
    """How many processes to use for tasks of these ``sizes`` (a measure of each one's cost):
    ``workers`` when given (1: here), else the CPUs when the sizes add up to ``threshold`` or more,
    else 1 (a problem this small is done before a process would have started)."""
    if workers is not None:
        return max(1, workers)
    return cpus() if sum(sizes) >= threshold else 1
