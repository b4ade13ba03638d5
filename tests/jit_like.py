"""A stand-in for a JIT-compiled kernel library: a correct (or planted-bug) implementation that
sleeps ``COMPILE_SECONDS`` the first time each process meets a new shape class, like Triton.

Class = (H, HV, K, V, dtype, varlen or not, initial state or not, l2norm or not). ``jit_gdn`` is a
``MODULE:FUNCTION`` plug-in (``tests.jit_like:jit_gdn``), so worker processes can import it.

With ``GDN_TEST_COMPILE_CACHE=<dir>`` the compiled classes are also kept on disk, like Triton's
cache: a marker file per class, so that a class compiled in one process is free in the others;
each process that compiles there also leaves ``compiling-<pid>`` (for tests of leftover processes).
``jit_picky`` and ``jit_stuck`` are plug-ins that refuse, fail or hang on some classes;
``jit_scaled`` compiles per scale too and declares its warm variants (split into compile units).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gdn_verify.core.implementation import Implementation
from gdn_verify.implementations import numpy_impl
from gdn_verify.runners.compile_workers import CHILD_MODULE

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


def compiling(
    fn: Callable, seen: set | None = None, seconds: float | None = None, key_of: Callable = class_key
) -> Callable:
    """``fn`` paying ``seconds`` for each class (``key_of`` a call) not yet in ``seen`` (its own set:
    one kernel's cache)."""
    seen = set() if seen is None else seen

    def call(*args, **kw):
        key = key_of(args, kw)
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


# Compile workers seen from the test process ---------------------------------------------------
def compiler_pids(cache: Path) -> set[int]:
    """Processes that compiled a class into ``cache`` (``tests.jit_like`` leaves ``compiling-<pid>``)."""
    return {int(p.name.split("-")[1]) for p in cache.glob("compiling-*")} - {os.getpid()}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def worker_children() -> list[int]:
    """This process's children that are compile workers (Linux: read from /proc)."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
            cmdline = (status.parent / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = next((int(line.split()[1]) for line in text.splitlines() if line.startswith("PPid:")), None)
        if ppid == os.getpid() and CHILD_MODULE.encode() in cmdline:
            found.append(int(status.parent.name))
    return found


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


# Warm calls that compile apart, as FlashQLA's per scale -------------------------------------------
SCALED_VARIANTS = 7  # warm calls beside a class's own (scale None): 8 per class
CALLS_LOG = "calls.log"  # in the disk cache: a line "<pid> <compile key>" per call of jit_scaled


def scaled_key(args: tuple, kw: dict) -> tuple:
    """``jit_scaled``'s compile key: the class and the scale (a compile-time argument, as in TileLang)."""
    return (*class_key(args, kw), kw.get("scale"))


def scaled_variants(example, backward: bool) -> list:
    """``jit_scaled``'s warm calls beside the class's own: the example at ``SCALED_VARIANTS`` scales."""
    return [(example.replace(scale=1.0 + i / 16), True) for i in range(1, SCALED_VARIANTS + 1)]


def _scaled(**kw):
    """Correct, except that a class with K=60 fails at the default scale (its own warm call) alone;
    each call is logged to ``CALLS_LOG`` when there is a disk cache."""
    directory = os.environ.get(CACHE_ENV)
    if directory:
        line = f"{os.getpid()} {'-'.join(map(str, scaled_key((), kw)))}\n"
        with open(Path(directory) / CALLS_LOG, "a") as f:  # one short append: whole lines across processes
            f.write(line)
    if np.shape(kw["q"])[3] == 60 and kw.get("scale") is None:
        raise ValueError("K=60 miscompiled at the default scale")
    return numpy_impl.chunk_gated_delta_rule(**kw)


jit_scaled = compiling(_scaled, key_of=scaled_key)
jit_scaled.warm_variants = scaled_variants  # type: ignore[attr-defined]


# FlashQLA-like: compile keys beyond the shape class ---------------------------------------------
# FlashQLA 0.1.3 on an H100 takes its intra-card context-parallel path for a B == 1 call in a
# training step from 9 chunks of 64 (implementations.flashqla.CP_TOKENS).
QLA_CP_CHUNKS = 9


class GradLike:
    """A NumPy stand-in for a JIT-compiled library's training call (``check --grad``): the forward
    and the backward of ``numpy-grad``, recording the compile keys ``keys_of(layout)`` says the
    library's kernels would be built for. ``layout`` holds the call's ``H, HV, K, V, dtype, B,
    lengths, varlen, state`` (initial state given), ``scale`` (resolved: None is ``K ** -0.5``)
    and ``dht`` (given or not). ``first[key]`` is the ``phase`` (set by the test) in which the key
    was first met, ``met[phase]`` every key met in it. An empty sequence is refused before any
    kernel, as FlashQLA does (``refuse_empty``)."""

    def __init__(self, keys_of: Callable[[dict], list[tuple]], extra: dict, name: str, refuse_empty: bool = True):
        from gdn_verify.implementations import numpy_grad

        self.first: dict[tuple, str] = {}
        self.met: dict[str, set[tuple]] = {}  # every key met, by phase
        self.phase = "warm"
        backward = numpy_grad.numpy_grad_backward()

        def call(
            q,
            k,
            v,
            g,
            beta,
            scale=None,
            initial_state=None,
            use_qk_l2norm_in_kernel=False,
            cu_seqlens=None,
            *,
            do,
            dht=None,
        ):
            B, T, H, K = np.shape(q)
            _, _, HV, V = np.shape(v)
            bounds = [0, T] if cu_seqlens is None else list(np.asarray(cu_seqlens))
            lengths = np.diff(bounds)
            if refuse_empty and (T == 0 or (lengths == 0).any()):
                raise NotImplementedError("FlashQLA refuses a call with an empty sequence")
            layout = dict(
                H=H,
                HV=HV,
                K=K,
                V=V,
                dtype=str(np.asarray(v).dtype),
                B=B,
                lengths=lengths,
                varlen=cu_seqlens is not None,
                state=initial_state is not None,
                scale=K**-0.5 if scale is None else float(scale),
                dht=dht is not None,
            )
            for key in keys_of(layout):
                self.first.setdefault(key, self.phase)
                self.met.setdefault(self.phase, set()).add(key)
            return backward(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel, cu_seqlens, do=do, dht=dht)

        self.impl = Implementation(
            name, {"chunk": numpy_impl.chunk_gated_delta_rule, "backward": call}, "numpy", name, "float32", extra
        )

    def new_keys(self) -> list[tuple]:
        """The keys first met outside the warm-up."""
        return [key for key, phase in self.first.items() if phase != "warm"]


def qla_keys(c: dict) -> list[tuple]:
    """FlashQLA 0.1.3's ``@tilelang.jit`` forward and backward (``implementations.flashqla.warm_variants``):
    ``("fwd", H, HV, K, V, dtype, layout, initial state, scale, final state stored, context parallel)``
    and ``("bwd", H, HV, K, V, dtype, layout, scale, dht given)``, where ``layout`` is ``"batched"``
    (B > 1), ``"row"`` (B == 1: FlashQLA's synthesized int32 ``cu_seqlens``) or ``"varlen"``."""
    layout = "varlen" if c["varlen"] else ("row" if c["B"] == 1 else "batched")
    cp = c["B"] == 1 and int(max(-(-c["lengths"] // 64))) >= QLA_CP_CHUNKS
    head = (c["H"], c["HV"], c["K"], c["V"], c["dtype"], layout)
    return [("fwd", *head, c["state"], c["scale"], c["dht"], cp), ("bwd", *head, c["scale"], c["dht"])]


class QlaLike(GradLike):
    """FlashQLA's training call (:func:`qla_keys`). ``declared``: with the adapter's declarations
    (``flashqla.declarations``), else those before them (``jit_compiled()``: FLA's way)."""

    def __init__(self, declared: bool = True):
        from gdn_verify.implementations import flashqla
        from gdn_verify.implementations.fla import jit_compiled

        super().__init__(qla_keys, flashqla.declarations() if declared else jit_compiled(), "qla-like")


def fla_keys(c: dict) -> list[tuple]:
    """FLA 0.6's backward on Hopper under Triton 3.6: the Triton kernels per class and whether
    the final state is stored and has a cotangent (``STORE_FINAL_STATE``,
    ``USE_FINAL_STATE_GRADIENT``), and TileLang's ``chunk_bwd_dqkwg`` per batch size (``B`` is a
    ``@tilelang.jit`` argument; a varlen call has B = 1 and its own ``IS_VARLEN`` kernel)."""
    head = (c["H"], c["HV"], c["K"], c["V"], c["dtype"], c["varlen"])
    return [("triton", *head, c["state"], c["dht"]), ("dqkwg", *head, c["B"])]


class FlaLike(GradLike):
    """FLA's training call (:func:`fla_keys`), declared as ``fla-chunk`` is (``jit_compiled()``)."""

    def __init__(self):
        from gdn_verify.implementations.fla import jit_compiled

        super().__init__(fla_keys, jit_compiled(), "fla-like", refuse_empty=False)
