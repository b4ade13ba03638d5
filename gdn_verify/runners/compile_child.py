"""A compile worker process: ``python -m gdn_verify.runners.compile_child REQUEST`` warms one unit.

The parent's :class:`~gdn_verify.runners.compile_workers.CompilePool` starts it with a JSON
request (the implementation's :class:`~gdn_verify.runners.compile_workers.ImplSpec`, the shape
class, which of its warm calls, the timeout, the parent's ``sys.path``); it re-creates the
implementation, warms the unit under a :class:`~gdn_verify.runners.guard.Guard` with
``runners.compile.try_warm`` and prints the outcome as one JSON line after ``RESULT_PREFIX``. A
module of its own so that the pool, which ``runners.compile`` imports, need not import
``runners.compile`` back: the child needs both, neither needs it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from gdn_verify.core.shapes import ShapeClass
from gdn_verify.runners.compile import try_warm
from gdn_verify.runners.compile_workers import RESULT_PREFIX, ImplSpec, error_text
from gdn_verify.runners.guard import Guard


def _exit_with_parent() -> None:
    sys.stdin.read()  # returns at end of file: the parent closed the pipe or died
    os._exit(3)


def compile_one(request: dict[str, Any]) -> dict[str, Any]:
    """A child's work: resolve the implementation and warm one unit (its class's warm calls numbered
    ``request["calls"]``; None or absent: all of them); the outcome as a dict."""
    start = time.perf_counter()
    spec = ImplSpec(**dict(request["impl"], forms=tuple(request["impl"]["forms"])))
    c = ShapeClass.from_dict(request["shape_class"])
    try:
        impl = spec.resolve()
    except Exception as exc:  # noqa: BLE001 - the parent compiles in its own process instead
        return dict(status="unresolvable", seconds=time.perf_counter() - start, error=error_text(exc))
    guard = Guard(request.get("timeout"))
    try:
        calls = request.get("calls")
        status, seconds, error = try_warm(guard.guarded(impl), c, bool(request.get("options")), calls)
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
