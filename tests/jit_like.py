"""A stand-in for a JIT-compiled kernel library: a correct (or planted-bug) implementation that
sleeps ``COMPILE_SECONDS`` the first time each process meets a new shape class, like Triton.

Class = (H, HV, K, V, dtype, varlen or not, initial state or not, l2norm or not). ``jit_gdn`` is a
``MODULE:FUNCTION`` plug-in (``tests.jit_like:jit_gdn``), so worker processes can import it.

With ``GDN_TEST_COMPILE_CACHE=<dir>`` the compiled classes are also kept on disk, like Triton's
cache: a marker file per class, so that a class compiled in one process is free in the others;
each process that compiles there also leaves ``compiling-<pid>`` (for tests of leftover processes).
``jit_picky`` and ``jit_stuck`` are plug-ins that refuse, fail or hang on some classes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gdn_verify.core.implementation import Implementation
from gdn_verify.implementations import numpy_impl

COMPILE_SECONDS = float(os.environ.get("GDN_TEST_COMPILE_SECONDS", "3"))
CACHE_ENV = "GDN_TEST_COMPILE_CACHE"
STUCK_SECONDS = 600.0


def class_key(args: tuple, kw: dict) -> tuple:
    """The compile class of a call in the native or the speculative-decoding convention."""
    q = kw["q"] if "q" in kw else args[0]
    v = kw["v"] if "v" in kw else args[2]
    spec = len(args) > 5 or "state_pool" in kw
    varlen = spec or kw.get("cu_seqlens") is not None
    state = spec or kw.get("initial_state") is not None
    B, T, H, K = np.shape(q)
    return (
        H,
        np.shape(v)[2],
        K,
        np.shape(v)[3],
        str(np.asarray(v).dtype),
        varlen,
        state,
        bool(kw.get("use_qk_l2norm_in_kernel", False)),
    )


def _marker(kernel: str, key: tuple) -> Path | None:
    """The kernel's class's file in the on-disk cache (None: no disk cache; read per call, for tests to set)."""
    directory = os.environ.get(CACHE_ENV)
    return Path(directory) / "-".join(["class", kernel, *map(str, key)]) if directory else None


def compiling(fn: Callable, seen: set | None = None, seconds: float | None = None) -> Callable:
    """``fn`` paying ``seconds`` for each class not yet in ``seen`` (its own set: one kernel's cache)."""
    seen = set() if seen is None else seen

    def call(*args, **kw):
        key = class_key(args, kw)
        if key not in seen:
            marker = _marker(getattr(fn, "__name__", "kernel"), key)
            if marker is None or not marker.exists():
                if marker is not None:
                    marker.parent.mkdir(parents=True, exist_ok=True)
                    (marker.parent / f"compiling-{os.getpid()}").touch()
                time.sleep(COMPILE_SECONDS if seconds is None else seconds)
                if marker is not None:
                    marker.touch()
            seen.add(key)
        return fn(*args, **kw)

    call.seen = seen  # type: ignore[attr-defined]
    return call


def compiled_implementation(impl: Implementation, seconds: float | None = None) -> Implementation:
    """``impl`` with every form wrapped by :func:`compiling` (one class cache per form)."""
    forms = {name: compiling(fn, seconds=seconds) for name, fn in impl.forms.items()}
    extra = {k: v for k, v in impl.extra.items() if k != "compile_classes"}  # undeclared: the probe must learn it
    return Implementation(impl.name + "+jit", forms, impl.array, impl.description, impl.default_dtype, extra)


SEEN: set = set()
jit_gdn = compiling(numpy_impl.chunk_gated_delta_rule, SEEN)


def _picky(**kw):
    """No MHA (H == HV): unsupported; K=60 fails (a miscompiled kernel, say); the rest correct."""
    if np.shape(kw["q"])[2] == np.shape(kw["v"])[2]:
        raise NotImplementedError("H == HV")
    if np.shape(kw["q"])[3] == 60:
        raise ValueError("K=60 miscompiled")
    return numpy_impl.chunk_gated_delta_rule(**kw)


def _stuck(**kw):
    """Hangs on K=60 (a compile that never ends), correct elsewhere."""
    if np.shape(kw["q"])[3] == 60:
        time.sleep(STUCK_SECONDS)
    return numpy_impl.chunk_gated_delta_rule(**kw)


jit_picky = compiling(_picky)
jit_stuck = compiling(_stuck)
