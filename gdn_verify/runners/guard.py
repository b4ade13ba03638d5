"""Calling the kernel under test: a per-call timeout, the kernel's own traceback, argument misuse.

Every call of an implementation's form goes through a :class:`Guard`. The call runs in a worker
thread and the runner waits for it at most :meth:`Guard.limit` seconds:

- ``timeout`` (default :data:`DEFAULT_TIMEOUT`, 60 s) for a call of a *shape class* already seen
  (the same dtypes, head counts and sizes, flags and options: what a JIT compiler such as Triton
  or NVRTC specialises on; the batch and the number of tokens are not part of it);
- ``FIRST_CALL_FACTOR * timeout`` (10 min by default) for the first call of a new shape class,
  which compiles (FLA's chunked kernels took 20-40 s per new shape on an H100, autotuning longer);
- and never less than ``SLOWEST_FACTOR`` times the slowest already-compiled call seen so far,
  so that a kernel that is slow everywhere is not reported as hanging.

Why a thread: a watchdog cannot interrupt a call stuck in C (a CUDA synchronisation, a spinning
extension), and a subprocess per example would lose the GPU context and the compiled kernels.
A call that overruns is *abandoned*: the runner raises :class:`KernelTimeout` and goes on, while
the thread keeps running in the background (a daemon, so it does not keep the process alive).
While an abandoned call still runs, the device may be stuck: later calls get no compile
allowance (a stuck device would otherwise cost ten minutes per property), and the process may
need to exit to free it (:func:`abandoned_calls` says how many are still running). A kernel that
hangs while holding the GIL freezes the whole process; no in-process guard can help there.

An exception raised by the kernel is re-raised unchanged (the runners and
``Implementation.run`` classify it), and the guard keeps its traceback from the kernel's own
frames down (:meth:`Guard.kernel_traceback`). A ``TypeError`` raised while binding the arguments
(before any frame of the kernel ran) is argument misuse (:meth:`Guard.is_misuse`). One raised by
a ``raise`` in the implementation's library's own Python code is that library's refusal
(:meth:`Guard.refusal`), not a crash. Each call's backend is recorded (``gdn_verify.core.backends``)
in :attr:`Guard.calls`.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any

from gdn_verify.core import backends, environment, timing
from gdn_verify.core.implementation import Implementation

DEFAULT_TIMEOUT = 60.0
FIRST_CALL_FACTOR = 10.0
SLOWEST_FACTOR = 10.0
MAX_TRACEBACK_FRAMES = 20

_abandoned: list[threading.Thread] = []


def abandoned_calls() -> int:
    """How many timed-out kernel calls are still running in abandoned threads."""
    return sum(t.is_alive() for t in _abandoned)


class KernelTimeout(BaseException):
    """A kernel call overran its limit. A ``BaseException`` so that Hypothesis stops at once
    instead of shrinking, which would call the hung kernel again and again."""

    def __init__(self, message: str, seconds: float):
        super().__init__(message)
        self.seconds = seconds


def shape_class(args: tuple, kw: dict[str, Any]) -> tuple:
    """What a JIT compiler specialises on: dtypes, sizes after the batch and token axes, flags."""

    def key(x: Any) -> Any:
        shape = getattr(x, "shape", None)
        if shape is not None:
            return (str(getattr(x, "dtype", "")), tuple(shape)[2:] if len(shape) >= 3 else len(shape))
        if x is None or isinstance(x, (bool, str)):
            return x
        return type(x).__name__  # a number such as scale: its value is a runtime argument

    return tuple(key(a) for a in args) + tuple((name, key(value)) for name, value in sorted(kw.items()))


class _Worker:
    """One daemon thread running calls in turn; replaced by a fresh one when a call is abandoned."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="gdn-verify-kernel", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            fn, args, kw, box, done, declared = job
            with backends.recording() as record:
                try:
                    box["value"] = fn(*args, **kw)
                except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread as it is
                    box["error"] = exc
                    box["frames"] = traceback.extract_tb(exc.__traceback__)[1:]  # from the kernel's frame down
                box["ran"] = record.ran(declared, raised="error" in box)
            done.set()


class Guard:
    """Runs an implementation's calls with a timeout; one per run, so that it learns which shape
    classes have compiled and how long a compiled call takes. ``timeout=None``: wait forever."""

    def __init__(self, timeout: float | None = DEFAULT_TIMEOUT):
        self.timeout = timeout
        self.seen: set[tuple] = set()
        self.slowest = 0.0  # slowest call of an already-compiled shape class, in seconds
        self.kernel_error: BaseException | None = None  # the last exception the kernel raised
        self.kernel_frames: traceback.StackSummary | None = None
        self.calls: list[backends.Ran] = []  # the backend of each call that ran somewhere (backends.Ran), in order
        self._worker: _Worker | None = None

    def guarded(self, impl: Implementation) -> Implementation:
        """``impl`` with every form called through this guard (its backend recorded: ``extra["backend"]``
        names it where the adapter declares one backend throughout; a NumPy implementation's is
        ``numpy``)."""
        declared = impl.extra.get("backend", "numpy" if impl.array == "numpy" else None)
        declared = declared if isinstance(declared, str) else None
        return dataclasses.replace(impl, forms={name: self.wrap(fn, declared) for name, fn in impl.forms.items()})

    def wrap(self, fn: Callable, declared: str | None = None) -> Callable:
        def call(*args: Any, **kw: Any) -> Any:
            return self.call(fn, args, kw, declared)

        call.__wrapped__ = fn  # type: ignore[attr-defined]
        return call

    def limit(self, key: tuple) -> float | None:
        """Seconds the call of shape class ``key`` may take (None: no limit)."""
        if self.timeout is None or self.timeout <= 0:
            return None
        limit = max(self.timeout, SLOWEST_FACTOR * self.slowest)
        if key not in self.seen and not abandoned_calls():
            limit = max(limit, FIRST_CALL_FACTOR * self.timeout)
        return limit

    def call(self, fn: Callable, args: tuple, kw: dict[str, Any], declared: str | None = None) -> Any:
        """``fn(*args, **kw)`` in the worker thread, its backend recorded (``declared``: the adapter's
        one backend, if any) in :attr:`calls`."""
        with timing.timed(timing.KERNEL):
            return self._call(fn, args, kw, declared)

    def _call(self, fn: Callable, args: tuple, kw: dict[str, Any], declared: str | None) -> Any:
        key = shape_class(args, kw)
        allowance = key not in self.seen and not abandoned_calls()
        limit = self.limit(key)
        if self._worker is None:
            self._worker = _Worker()
        box: dict[str, Any] = {}
        done = threading.Event()
        start = time.perf_counter()
        self._worker.jobs.put((fn, args, kw, box, done, declared))
        if not done.wait(limit):
            _abandoned.append(self._worker.thread)
            self._worker = None
            if key in self.seen:
                compiled = ""
            elif allowance:
                compiled = " (the first call of this shape class: compile allowance included)"
            else:
                compiled = " (no compile allowance while an earlier timed-out call still runs)"
            raise KernelTimeout(f"the kernel call did not return within {limit:.3g}s{compiled}", limit)
        seconds = time.perf_counter() - start
        if box["ran"] is not None:
            self.calls.append(box["ran"])
        if key in self.seen:
            self.slowest = max(self.slowest, seconds)
        self.seen.add(key)
        if "error" in box:
            self.kernel_error, self.kernel_frames = box["error"], box["frames"]
            raise box["error"]
        return box["value"]

    def close(self) -> None:
        """Stop the worker thread and wait for it to end (an abandoned one runs on).

        Waiting matters on a GPU: a thread that ran CUDA work and is still alive when the
        interpreter shuts down can abort the process after every result was printed (seen with
        ``check --impl cupy`` on an H100, 2026-11-23: exit 134, "terminate called without an
        active exception"; that this join cures it is not yet confirmed on a GPU).
        """
        if self._worker is not None:
            self._worker.jobs.put(None)
            self._worker.thread.join(timeout=10)
            self._worker = None

    def origin(self, exc: BaseException) -> BaseException | None:
        """The kernel's exception when ``exc`` is it or was raised from it, else None."""
        seen = set()
        while exc is not None and id(exc) not in seen:
            if exc is self.kernel_error:
                return exc
            seen.add(id(exc))
            exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
        return None

    def is_misuse(self, exc: BaseException) -> bool:
        """A ``TypeError`` from binding the arguments: raised before any frame of the kernel ran."""
        return (
            isinstance(exc, TypeError)
            and exc is self.kernel_error
            and not self.kernel_frames
            and "argument" in str(exc)
        )

    def refusal(self, exc: BaseException, impl: Implementation) -> str | None:
        """ "<library> refused: <message>" when the kernel's exception ``exc`` was raised by the
        implementation's library's own Python code (:func:`library_of`), else None. Decided by where the
        innermost frame of its traceback lies, never by its message: an exception from the library's
        runtime (Triton, torch, CUDA) or from the adapter is no refusal. One exception of Triton's is
        named too: a library's kernel that Triton cannot compile ("<library>'s kernel does not compile
        with the installed Triton X: ..."), a release built for another Triton."""
        if exc is not self.kernel_error:
            return None
        library, modules = library_of(impl)
        if library is not None and _compile_error(exc):
            # Triton could not compile one of the library's kernels: a release built for another Triton
            # (vLLM 0.10.2 under Triton 3.6: "N marked as constexpr and listed in do_not_specialize")
            last = next((line.strip() for line in reversed(str(exc).splitlines()) if line.strip()), "")
            triton = environment.triton_version()
            return f"{library}'s kernel does not compile with the installed Triton {triton}: {last}"
        module = _innermost_module(exc.__traceback__)
        if library is None or module is None or not any(module == m or module.startswith(m + ".") for m in modules):
            return None
        return f"{library} refused: {str(exc) or type(exc).__name__}"

    def kernel_traceback(self, exc: BaseException) -> str | None:
        """The traceback of the kernel's exception ``exc``, from its own frames down (the last
        ``MAX_TRACEBACK_FRAMES``)."""
        if exc is not self.kernel_error or self.kernel_frames is None:
            return None
        frames = list(self.kernel_frames)
        lines = ["Traceback (the kernel's frames):\n"]
        if len(frames) > MAX_TRACEBACK_FRAMES:
            lines.append(f"  ... {len(frames) - MAX_TRACEBACK_FRAMES} frames above\n")
            frames = frames[-MAX_TRACEBACK_FRAMES:]
        lines += traceback.format_list(frames)
        lines += traceback.format_exception_only(type(exc), exc)
        return "".join(lines).rstrip()


def _compile_error(exc: BaseException) -> bool:
    """Whether ``exc`` is Triton's ``CompilationError`` (by its class, without importing Triton)."""
    return any(c.__name__ == "CompilationError" and c.__module__.startswith("triton") for c in type(exc).__mro__)


def library_of(impl: Implementation) -> tuple[str | None, tuple[str, ...]]:
    """The third-party library ``impl``'s adapter calls and the modules (with their submodules) that
    are its code: ``extra["library"]``, with ``extra["library_modules"]`` where its modules are
    named otherwise; ``(None, ())`` when none is declared. Never guessed: a plug-in's own function
    raising is the kernel's error (its author's code), not a library declining the call."""
    declared = impl.extra.get("library")
    if not isinstance(declared, str):
        return None, ()
    return declared, (declared, *impl.extra.get("library_modules", ()))


def _innermost_module(tb: TracebackType | None) -> str | None:
    """The module of the frame where the exception was raised (``__name__`` in its globals)."""
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    name = tb.tb_frame.f_globals.get("__name__")
    return name if isinstance(name, str) else None
