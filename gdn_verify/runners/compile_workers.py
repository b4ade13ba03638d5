"""Compiling shape classes in child processes, so that a cold pool costs about its work over the workers.

Triton and TileLang keep compiled kernels (and autotuning results) in an on-disk cache shared by
the processes of a machine: a class compiled in a child is cheap in the parent afterwards. A child
(``python -m gdn_verify.runners.compile_child REQUEST``, :data:`CHILD_MODULE`) re-creates the
implementation from the arguments it was resolved by (:class:`ImplSpec`), warms one *unit* under a
guard and prints its :class:`Outcome` as one JSON line on stdout. This module is the parent's side
and imports neither the child nor ``runners.compile`` (which imports it). A unit is a class and some of its warm
calls (``runners.compile.class_calls``): a class whose implementation declares warm variants
that compile apart (FlashQLA: 12 calls for a batched class) is cut into several units
(:func:`split_units`), any other is one unit of all its calls. :class:`CompilePool` runs at most
``workers`` children at once, the units in the order of their classes, from a thread of its own
(so that a unit that ends while the parent is busy is replaced at once), and kills them all when
closed (the budget spent, Ctrl-C); a child whose parent dies exits as its stdin closes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import IO

from gdn_verify import implementations
from gdn_verify.core.implementation import BACKWARD_FORM, Implementation
from gdn_verify.core.shapes import ShapeClass
from gdn_verify.runners.workers import SINGLE_THREAD

WORKERS_ENV = "GDN_VERIFY_COMPILE_WORKERS"  # a number of worker processes; 1: compile in this process
MAX_WORKERS = 16
# The child's module, run by name: importing it here would import runners.compile, which imports this module.
CHILD_MODULE = "gdn_verify.runners.compile_child"
RESULT_PREFIX = "gdn-verify-compile: "  # marks the result line among whatever the kernel library prints
POLL_SECONDS = 0.05
STATUSES = ("compiled", "unsupported", "error", "timeout", "unresolvable", "died")
# Each worker runs about this many units or more: the units are cut that small, so that the last
# round leaves few workers idle, and no smaller, since every unit pays a process start-up (imports,
# a CUDA context, loading the kernels its calls share with the class's other calls).
UNIT_ROUNDS = 4

# A unit of compile work: a class and the numbers of its warm calls (None: all of them).
Unit = tuple[ShapeClass, tuple[int, ...] | None]


def default_workers(units: int) -> int:
    """``WORKERS_ENV`` if set, else one per unit of work (a class, or a part of its warm calls) up
    to the CPU cores less one (the parent's) and 16."""
    env = os.environ.get(WORKERS_ENV, "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    return max(1, min(units, (os.cpu_count() or 1) - 1, MAX_WORKERS))


def split_units(classes: Sequence[ShapeClass], calls: Mapping[ShapeClass, int], workers: int) -> list[Unit]:
    """The units of ``classes``, in their order: a class with ``calls[c]`` warm calls is cut into runs
    of consecutive calls of ``max(1, N // (UNIT_ROUNDS * workers))`` each (``N``: the calls of all
    classes, a class absent from ``calls`` counting one), so its own call (0) is in its first
    unit; a class absent from ``calls``, or with no more calls than that, is one unit of all its
    calls (``None``). 2 classes of 8 calls over 8 workers: 16 units of one call; FlashQLA's 10
    ``--grad --dims 128`` classes (80 calls) over 15: units of 1 call, 12 for a batched class."""
    total = sum(calls.get(c, 1) for c in classes)
    size = max(1, total // (UNIT_ROUNDS * max(1, workers)))
    units: list[Unit] = []
    for c in classes:
        n = calls.get(c, 1)
        if c not in calls or n <= size:
            units.append((c, None))
        else:
            units += [(c, tuple(range(i, min(i + size, n)))) for i in range(0, n, size)]
    return units


@dataclass(frozen=True)
class ImplSpec:
    """How a child re-creates an implementation: ``implementations.resolve``'s arguments, gradients
    or not (``with_backward``), and the forms it must come back with."""

    name: str
    array: str | None
    convention: str
    grad: bool
    forms: tuple[str, ...]

    @classmethod
    def of(cls, impl: Implementation) -> ImplSpec | None:
        """``impl``'s spec, or None when it was not resolved by name (a Python object, or one derived
        from a resolved implementation under another name)."""
        how = impl.extra.get("resolved_as")
        if not isinstance(how, dict) or how.get("name") != impl.name:
            return None
        return cls(
            impl.name, how.get("array"), how.get("convention", "native"), BACKWARD_FORM in impl.forms, tuple(impl.forms)
        )

    def resolve(self) -> Implementation:
        """The implementation again; raises when it resolves to other forms (not the same one)."""
        impl = implementations.resolve(self.name, self.array, self.convention)
        if self.grad:
            impl = implementations.with_backward(impl)
        if tuple(impl.forms) != self.forms:
            raise RuntimeError(f"{self.name} resolved to forms {list(impl.forms)}, not {list(self.forms)}")
        return impl


@dataclass(frozen=True)
class Outcome:
    """What the children did with a class (or one of them with a unit): ``status`` one of
    ``STATUSES``, its seconds (compiled: the warm-up's; otherwise the child's wall time; a class:
    the sum over its units, what it costs in one process) and the exception text or the child's
    last words. For a class of several units (``units``): the first unit's status (the class's own
    call), unless another unit timed out; ``wall`` the seconds from its first unit's start to its
    last one's end; ``error`` of a compiled class, what its other units died of (their calls then
    compile in the parent)."""

    status: str
    seconds: float
    error: str = ""
    units: int = 1
    wall: float | None = None


@dataclass
class _Child:
    proc: subprocess.Popen
    out: IO[str]
    err: IO[str]
    started: float


@dataclass
class _Unit:
    shape_class: ShapeClass
    calls: tuple[int, ...] | None  # None: all of the class's warm calls
    child: _Child | None = None
    outcome: Outcome | None = None
    started: float | None = None
    ended: float | None = None

    def describe(self) -> str:
        if self.calls is None:
            return "all warm calls"
        return f"warm calls {self.calls[0]}-{self.calls[-1]}" if len(self.calls) > 1 else f"warm call {self.calls[0]}"


class CompilePool:
    """Children compiling ``classes`` as units (:func:`split_units` of ``calls``, the number of warm
    calls of each class that may be split; at most ``workers`` children at once, in order); a
    child is started only before ``start_by`` (``time.monotonic()``; None: any time), unless its
    class was given to :meth:`require`."""

    def __init__(
        self,
        spec: ImplSpec,
        classes: Sequence[ShapeClass],
        workers: int,
        timeout: float | None = None,
        options: Sequence[ShapeClass] = (),
        calls: Mapping[ShapeClass, int] | None = None,
    ) -> None:
        self.spec, self.workers, self.timeout = spec, max(1, workers), timeout
        self.options = frozenset(options)  # classes warmed with the option variants too
        self.given = list(dict.fromkeys(classes))
        self.units = [_Unit(c, selection) for c, selection in split_units(self.given, calls or {}, self.workers)]
        self.pending = list(self.units)
        self.closed = False
        self.running: list[_Unit] = []
        self.done: dict[ShapeClass, Outcome] = {}  # the classes all of whose units ended
        self.start_by: float | None = None
        self.required: set[ShapeClass] = set()  # classes whose units start past start_by too
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        try:
            self.poll()
        except BaseException:  # Ctrl-C between two starts: the caller has no pool to close yet
            self.close()
            raise
        self._thread = threading.Thread(target=self._schedule, name="compile-pool", daemon=True)
        self._thread.start()

    def wait(self, c: ShapeClass, until: float | None = None) -> Outcome | None:
        """``c``'s outcome once all its units ended; None when they did not by ``until``
        (``time.monotonic()``) or one will not start (past ``start_by``, closed, or never given)."""
        while True:
            with self._lock:
                self.poll()
                if c in self.done:
                    return self.done[c]
                if c not in self.given or any(self._too_late(u) for u in self.pending if u.shape_class == c):
                    return None
                if not any(u.shape_class == c for u in self.running + self.pending):
                    return None  # closed before all its units ran
            if until is not None and time.monotonic() >= until:
                return None
            time.sleep(POLL_SECONDS)

    def poll(self) -> None:
        """Collect the children that ended; start pending units in the free slots."""
        with self._lock:
            for unit in list(self.running):
                assert unit.child is not None
                if unit.child.proc.poll() is not None:
                    self._finish(unit)
            for unit in list(self.pending):  # in order, those that may still start
                if len(self.running) >= self.workers or self.closed:
                    break
                if self._too_late(unit):
                    continue
                self.pending.remove(unit)
                unit.started = time.monotonic()
                try:
                    unit.child = self._start(unit)
                except OSError as exc:  # out of processes or memory: its calls compile in the parent
                    unit.outcome, unit.ended = (
                        Outcome("died", 0.0, f"the compile worker did not start: {exc}"),
                        unit.started,
                    )
                    self._settle(unit.shape_class)
                else:
                    self.running.append(unit)

    def close(self) -> None:
        """Kill every child still running (and what it started) and wait for it; start no more."""
        with self._lock:
            self.closed = True
            self.pending.clear()
            for unit in self.running:
                assert unit.child is not None
                _kill(unit.child.proc)
            for unit in list(self.running):
                assert unit.child is not None
                unit.child.proc.wait()
                self._finish(unit)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def require(self, classes: Sequence[ShapeClass]) -> None:
        """Start the units of ``classes`` past ``start_by`` too: the parent waits for them however
        long they take (the pool's first ``MIN_CLASSES``), and compiling one of them in the parent
        would cost its calls in a row."""
        with self._lock:
            self.required.update(classes)

    def _schedule(self) -> None:
        """The pool's thread: start units as others end, until closed (or nothing is left)."""
        while True:
            with self._lock:
                if self.closed or not (self.pending or self.running):
                    return
                self.poll()
            time.sleep(POLL_SECONDS)

    def _too_late(self, unit: _Unit) -> bool:
        if unit.shape_class in self.required:
            return False
        return self.start_by is not None and time.monotonic() >= self.start_by

    def _finish(self, unit: _Unit) -> None:
        assert unit.child is not None
        self.running.remove(unit)
        unit.outcome, unit.ended = self._outcome(unit.child), time.monotonic()
        self._settle(unit.shape_class)

    def _settle(self, c: ShapeClass) -> None:
        """``c``'s outcome in ``done`` once all its units ended (see :class:`Outcome`)."""
        units = [u for u in self.units if u.shape_class == c]
        if any(u.outcome is None for u in units):
            return
        outcomes = [u.outcome for u in units if u.outcome is not None]
        first, seconds = outcomes[0], sum(o.seconds for o in outcomes)
        if len(units) == 1:
            self.done[c] = first
            return
        starts = [u.started for u in units if u.started is not None]
        ends = [u.ended for u in units if u.ended is not None]
        wall = max(ends) - min(starts)
        hung = next((u for u in units[1:] if u.outcome is not None and u.outcome.status == "timeout"), None)
        if first.status == "compiled" and hung is not None and hung.outcome is not None:
            status, error = "timeout", f"{hung.describe()}: {hung.outcome.error}"
        elif first.status == "compiled":
            status = "compiled"
            error = "; ".join(
                f"{u.describe()}: {u.outcome.error}"
                for u in units[1:]
                if u.outcome is not None and u.outcome.status != "compiled"
            )
        else:
            status, error = first.status, first.error
        self.done[c] = Outcome(status, seconds, error, len(units), wall)

    def _start(self, unit: _Unit) -> _Child:
        c = unit.shape_class
        request = dict(
            impl=asdict(self.spec),
            shape_class=c.as_dict(),
            options=c in self.options,
            calls=None if unit.calls is None else list(unit.calls),
            timeout=self.timeout,
            path=[p for p in sys.path if isinstance(p, str)],
        )
        out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")  # files: no pipe to drain
        proc = subprocess.Popen(
            [sys.executable, "-m", CHILD_MODULE, json.dumps(request)],
            stdin=subprocess.PIPE,  # never written: its end at our exit tells the child to exit
            stdout=out,
            stderr=err,
            env={**os.environ, **SINGLE_THREAD},  # one compile per core, not a BLAS pool per child
            start_new_session=True,  # its own group: killed with the compilers it starts (ptxas, nvcc)
        )
        return _Child(proc, out, err, time.monotonic())

    def _outcome(self, child: _Child) -> Outcome:
        seconds = time.monotonic() - child.started
        child.out.seek(0)
        child.err.seek(0)
        stdout, stderr = child.out.read(), child.err.read()
        for f in (child.out, child.err):
            f.close()
        if child.proc.stdin is not None:
            child.proc.stdin.close()
        for line in reversed(stdout.splitlines()):
            if line.startswith(RESULT_PREFIX):
                d = json.loads(line[len(RESULT_PREFIX) :])
                return Outcome(d["status"], float(d["seconds"]), d.get("error", ""))
        code = child.proc.returncode
        how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        tail = "\n".join((stderr or stdout).strip().splitlines()[-6:])
        return Outcome("died", seconds, f"the compile worker died ({how})" + (f":\n{tail}" if tail else ""))


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def error_text(exc: BaseException, limit: int = 500) -> str:
    """``Type: message`` on one line, at most ``limit`` characters."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:limit]
