"""Compiling shape classes in child processes, so that a cold pool costs about its slowest class.

Triton and TileLang keep compiled kernels (and autotuning results) in an on-disk cache shared by
the processes of a machine: a class compiled in a child is cheap in the parent afterwards. A child
(``python -m gdn_verify.runners.compile_workers REQUEST``) re-creates the implementation from the
arguments it was resolved by (:class:`ImplSpec`), warms one class under a :class:`Guard` and
prints its :class:`Outcome` as one JSON line on stdout. :class:`CompilePool` runs at most
``workers`` children at once, in the order given, and kills them all when closed (the budget
spent, Ctrl-C); a child whose parent dies exits as its stdin closes.
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
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import IO, Any

from gdn_verify import implementations
from gdn_verify.core.implementation import BACKWARD_FORM, Implementation
from gdn_verify.core.shapes import ShapeClass
from gdn_verify.runners.guard import Guard
from gdn_verify.runners.workers import SINGLE_THREAD

WORKERS_ENV = "GDN_VERIFY_COMPILE_WORKERS"  # a number of worker processes; 1: compile in this process
MAX_WORKERS = 16
RESULT_PREFIX = "gdn-verify-compile: "  # marks the result line among whatever the kernel library prints
POLL_SECONDS = 0.05
STATUSES = ("compiled", "unsupported", "error", "timeout", "unresolvable", "died")


def default_workers(classes: int) -> int:
    """``WORKERS_ENV`` if set, else one per class up to the CPU cores less one (the parent's) and 16."""
    env = os.environ.get(WORKERS_ENV, "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    return max(1, min(classes, (os.cpu_count() or 1) - 1, MAX_WORKERS))


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
    """What a child did with its class: ``status`` one of ``STATUSES``, its seconds (compiled: the
    warm-up's; otherwise the child's wall time) and the exception text or the child's last words."""

    status: str
    seconds: float
    error: str = ""


@dataclass
class _Child:
    proc: subprocess.Popen
    out: IO[str]
    err: IO[str]
    started: float


class CompilePool:
    """Children compiling ``classes`` (one each, at most ``workers`` at once, in order); a child
    is started only before ``start_by`` (``time.monotonic()``; None: any time)."""

    def __init__(
        self,
        spec: ImplSpec,
        classes: Sequence[ShapeClass],
        workers: int,
        timeout: float | None = None,
        options: Sequence[ShapeClass] = (),
    ) -> None:
        self.spec, self.workers, self.timeout = spec, max(1, workers), timeout
        self.options = frozenset(options)  # classes warmed with the option variants too
        self.given = list(dict.fromkeys(classes))
        self.pending = list(self.given)
        self.closed = False
        self.running: dict[ShapeClass, _Child] = {}
        self.done: dict[ShapeClass, Outcome] = {}
        self.start_by: float | None = None
        try:
            self.poll()
        except BaseException:  # Ctrl-C between two starts: the caller has no pool to close yet
            self.close()
            raise

    def wait(self, c: ShapeClass, until: float | None = None) -> Outcome | None:
        """``c``'s outcome once its child ends; None when it did not end by ``until``
        (``time.monotonic()``) or will not start (past ``start_by``, or never given)."""
        while True:
            self.poll()
            if c in self.done:
                return self.done[c]
            if c not in self.running and (c not in self.pending or self._too_late()):
                return None
            if until is not None and time.monotonic() >= until:
                return None
            time.sleep(POLL_SECONDS)

    def poll(self) -> None:
        """Collect the children that ended; start pending ones in the free slots."""
        for c, child in list(self.running.items()):
            if child.proc.poll() is not None:
                del self.running[c]
                self.done[c] = self._outcome(child)
        while self.pending and len(self.running) < self.workers and not self._too_late():
            c = self.pending.pop(0)
            try:
                self.running[c] = self._start(c)
            except OSError as exc:  # out of processes or memory: this class compiles in the parent
                self.done[c] = Outcome("died", 0.0, f"the compile worker did not start: {exc}")

    def close(self) -> None:
        """Kill every child still running (and what it started) and wait for it; start no more."""
        self.closed = True
        self.pending.clear()
        for child in self.running.values():
            _kill(child.proc)
        for c, child in list(self.running.items()):
            child.proc.wait()
            self.done[c] = self._outcome(child)
        self.running.clear()

    def _too_late(self) -> bool:
        return self.start_by is not None and time.monotonic() >= self.start_by

    def _start(self, c: ShapeClass) -> _Child:
        request = dict(
            impl=asdict(self.spec),
            shape_class=c.as_dict(),
            options=c in self.options,
            timeout=self.timeout,
            path=[p for p in sys.path if isinstance(p, str)],
        )
        out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")  # files: no pipe to drain
        proc = subprocess.Popen(
            [sys.executable, "-m", __name__, json.dumps(request)],
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


# The child ---------------------------------------------------------------------------------------
def _exit_with_parent() -> None:
    sys.stdin.read()  # returns at end of file: the parent closed the pipe or died
    os._exit(3)


def error_text(exc: BaseException, limit: int = 500) -> str:
    """``Type: message`` on one line, at most ``limit`` characters."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:limit]


def compile_one(request: dict[str, Any]) -> dict[str, Any]:
    """A child's work: resolve the implementation and warm one class; the outcome as a dict."""
    from gdn_verify.runners.compile import try_warm  # imported here: compile.py imports this module

    start = time.perf_counter()
    spec = ImplSpec(**dict(request["impl"], forms=tuple(request["impl"]["forms"])))
    c = ShapeClass.from_dict(request["shape_class"])
    try:
        impl = spec.resolve()
    except Exception as exc:  # noqa: BLE001 - the parent compiles in its own process instead
        return dict(status="unresolvable", seconds=time.perf_counter() - start, error=error_text(exc))
    guard = Guard(request.get("timeout"))
    try:
        status, seconds, error = try_warm(guard.guarded(impl), c, bool(request.get("options")))
    finally:
        guard.close()
    if seconds is None:  # not compiled: the child's time until then
        return dict(status=status, seconds=time.perf_counter() - start, error=error)
    return dict(status=status, seconds=seconds)


def main(argv: Sequence[str]) -> None:
    request = json.loads(argv[0])
    sys.path.extend(p for p in request.get("path", []) if p not in sys.path)  # plug-ins the parent imports
    threading.Thread(target=_exit_with_parent, daemon=True).start()
    try:
        result = compile_one(request)
    except KeyboardInterrupt:
        os._exit(130)
    print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.stderr.flush()
    os._exit(0)  # an abandoned kernel thread or a broken CUDA context must not hang the exit
