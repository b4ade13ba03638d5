"""Which backend ran each call of an implementation: the proof users ask for that nothing fell back.

Around one call, :func:`recording` learns the backend from three sources, most specific first:

- the adapter: a form calls :func:`note` with the name of the path it took (our CuPy kernels:
  the chunk plan's path and context parallelism); an implementation that is one backend
  throughout declares it instead (``Implementation.extra["backend"]``, a name);
- FLA's dispatch (FLA >= 0.6, ``fla.backends``): the ``backend_type`` of each registered backend
  whose implementation ran, and each one that declined the call with its reason; hooked only
  when ``fla.backends`` is already imported (nothing is imported here);
- Triton: the names of the ``@triton.jit`` kernels launched (``JITFunction.run``, and
  ``InterpretedFunction.run`` under ``TRITON_INTERPRET=1``); a call that launched Triton kernels
  and nothing more specific ran on ``triton``.

The hooks are installed once, on the first recorded call after their library was imported, and
cost one global look-up per launch. The record is the process's, not the thread's: torch runs a
CUDA backward on its own device threads, whose launches count for the call being recorded (the
guard runs one call at a time; a timed-out call still running in the background may add its
launches to a later call's record). A hook that cannot be installed never fails a call:
the call's backend is then ``unknown`` with the reason (:attr:`Ran.why`).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

# Names ``check --backend`` accepts, with what each means (docs/commands.md lists them).
BACKENDS = {
    "numpy": "a NumPy implementation on the host (ours, the planted bugs, a NumPy plug-in)",
    "triton": "Triton kernels (FLA's default path, vLLM, a user's own @triton.jit kernel)",
    "flash_qla": "FLA's FlashQLA backend (FLA >= 0.6 dispatch)",
    "tilelang": "FLA's TileLang backend (FLA >= 0.6 dispatch)",
    "triton_ascend": "FLA's Ascend backend (FLA >= 0.6 dispatch)",
    "gluon": "FLA's Gluon backend (FLA >= 0.6 dispatch)",
    "intracard_cp": "FLA's intra-card context-parallel backend (FLA >= 0.6 dispatch)",
    "cupy-three-kernel": "our CuPy chunked kernel, three-kernel path",
    "cupy-fused": "our CuPy chunked kernel, fused mma.sync path",
    "cupy-wgmma": "our CuPy chunked kernel, fused wgmma path (sm_90a)",
    "cupy-context-parallel": "our CuPy chunked kernel split into context-parallel segments (with a fused path)",
    "cupy-recurrent": "our CuPy recurrent kernel",
    "cupy-spec": "our CuPy speculative-decoding kernel",
    "flashinfer": "FlashInfer's CuTe DSL prefill without context parallelism (use_cp=False)",
    "flashinfer-cp": "FlashInfer's context-parallel prefill (use_cp=True)",
    "flashinfer-decode": "FlashInfer's pretranspose decode kernels (v-major state)",
    "flashinfer-decode-bf16": "FlashInfer's bfloat16-state decode kernels",
    "flashinfer-decode-kmajor": "FlashInfer's k-major decode kernels",
    "flashinfer-mtp": "FlashInfer's speculative-verify (MTP) kernels",
}
UNKNOWN = "unknown"
# What a call without tokens that an adapter answers without the kernel ran on (a token-per-step
# adapter has no step to launch); not a fallback, whatever ``--backend`` asks for.
NO_KERNEL = "no-kernel"
# The FLA module holding its dispatch registry, and the class whose methods are hooked.
FLA_DISPATCH = ("fla.backends", "BaseBackend")
# Triton's launchers: (module, class) whose ``run`` launches one kernel.
TRITON_LAUNCHERS = (("triton.runtime.jit", "JITFunction"), ("triton.runtime.interpreter", "InterpretedFunction"))
_HOOKED = "_gdn_verify_hooked"

_active: _Record | None = None  # the record of the call running now
_install_lock = threading.Lock()
_install_failures: dict[str, str] = {}


@dataclass(frozen=True)
class Ran:
    """The backend one call ran on.

    ``names``: most specific first (``("cupy-fused", "cupy-context-parallel")``, ``("flash_qla",)``,
    ``("triton",)``, ``("unknown",)``); ``kernels``: the Triton kernels launched, in first-launch
    order; ``declined``: ``"flash_qla declined: <reason>"`` for each FLA backend that declined it;
    ``why``: why the backend is unknown (empty otherwise).
    """

    names: tuple[str, ...]
    kernels: tuple[str, ...] = ()
    declined: tuple[str, ...] = ()
    why: str = ""

    @property
    def label(self) -> str:
        """``names`` joined by "+": what a call is counted under."""
        return "+".join(self.names)

    def ran_on(self, name: str) -> bool:
        """Whether the call ran on ``name``; a call that launched nothing (:data:`NO_KERNEL`) ran on none
        other either, so it counts as no fallback."""
        return name in self.names or self.names == (NO_KERNEL,)

    def mismatch(self, name: str) -> str:
        """Why this call is not a run on ``name``: "ran on triton, not flash_qla (fallback; ...)"."""
        text = f"ran on {self.label}, not {name}"
        detail = "; ".join(self.declined) or self.why
        return f"{text} (fallback{': ' + detail if detail else ''})"


@dataclass
class _Record:
    noted: list[str] = field(default_factory=list)
    dispatched: list[str] = field(default_factory=list)
    declined: list[str] = field(default_factory=list)
    kernels: dict[str, None] = field(default_factory=dict)  # an ordered set

    def ran(self, declared: str | None = None, raised: bool = False) -> Ran | None:
        """The call's :class:`Ran`; None for a call that raised before anything ran (no launch, no
        dispatch, nothing noted): it ran on no backend, and is not counted. Never raises."""
        try:
            return self._ran(declared, raised)
        except Exception as exc:  # noqa: BLE001 - recording must never break a check
            return Ran((UNKNOWN,), why=f"recording failed ({type(exc).__name__}: {exc})")

    def _ran(self, declared: str | None, raised: bool) -> Ran | None:
        kernels, declined = tuple(self.kernels), tuple(dict.fromkeys(self.declined))
        if raised and not (kernels or self.noted or self.dispatched):
            return None
        for names in (self.noted, self.dispatched, [declared] if declared else []):
            if names:
                return Ran(tuple(dict.fromkeys(names)), kernels, declined)
        if kernels:
            return Ran(("triton",), kernels, declined)
        why = "; ".join(f"{k}: {v}" for k, v in _install_failures.items()) or (
            "no Triton launch, FLA dispatch or adapter declaration seen"
        )
        return Ran((UNKNOWN,), kernels, declined, why)


def note(*names: str) -> None:
    """Say, from inside an implementation's call, which backend it ran, most specific first
    (a no-op when not recording)."""
    record = _active
    if record is not None:
        record.noted.extend(names)


@contextlib.contextmanager
def recording() -> Iterator[_Record]:
    """Record the backend of what runs inside the block; ``.ran(declared)`` after."""
    global _active
    install()
    outer, record = _active, _Record()
    _active = record
    try:
        yield record
    finally:
        _active = outer


def install() -> None:
    """Hook Triton's launchers and FLA's dispatch where they are imported and not yet hooked; never
    raises (a failure is kept and said as the reason a backend is unknown)."""
    try:
        for module, cls in TRITON_LAUNCHERS:
            _hook(getattr(sys.modules.get(module), cls, None), "run", _triton_run)
        module, cls = FLA_DISPATCH
        base = getattr(sys.modules.get(module), cls, None)
        for backend in _with_subclasses(base) if isinstance(base, type) else ():
            _hook(backend, "get_implementation", _fla_implementation)
            _hook(backend, "verify", _fla_verify)
    except Exception as exc:  # noqa: BLE001 - recording must never break a check
        _install_failures["install"] = f"{type(exc).__name__}: {exc}"


def _with_subclasses(cls: type) -> list[type]:
    """``cls`` and its subclasses, depth first (a backend may override the hooked methods)."""
    found, stack = [], [cls]
    while stack:
        c = stack.pop()
        found.append(c)
        stack += c.__subclasses__()
    return found


def _hook(target: Any, method: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace ``target.method`` (where ``target`` defines it itself) by ``make(original)``, once."""
    if target is None or method not in target.__dict__ or getattr(target.__dict__[method], _HOOKED, False):
        return
    with _install_lock:
        try:
            original = target.__dict__[method]
            if getattr(original, _HOOKED, False) or isinstance(original, (staticmethod, classmethod)):
                return
            hooked = make(original)
            setattr(hooked, _HOOKED, True)
            setattr(target, method, hooked)
        except Exception as exc:  # noqa: BLE001 - recording must never break a check
            where = f"{target.__module__}.{target.__qualname__}.{method}"
            _install_failures[where] = f"cannot hook ({type(exc).__name__}: {exc})"


def _triton_run(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def run(self: Any, *args: Any, **kw: Any) -> Any:
        record = _active
        if record is not None and not kw.get("warmup"):
            record.kernels[str(getattr(self, "__name__", None) or getattr(self.fn, "__name__", "?"))] = None
        return original(self, *args, **kw)

    return run


def _fla_implementation(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def get_implementation(self: Any, function_name: str) -> Any:
        found = original(self, function_name)
        record = _active
        if record is not None and found is not None:
            record.dispatched.append(str(getattr(self, "backend_type", type(self).__name__)))
        return found

    return get_implementation


def _fla_verify(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def verify(self: Any, function_name: str, *args: Any, **kw: Any) -> Any:
        verdict = original(self, function_name, *args, **kw)
        record = _active
        if record is not None and isinstance(verdict, tuple) and verdict and not verdict[0]:
            reason = verdict[1] if len(verdict) > 1 else None
            record.declined.append(f"{getattr(self, 'backend_type', '?')} declined: {reason or 'no reason given'}")
        return verdict

    return verify


def cupy_chunk_names(label: str) -> tuple[str, ...]:
    """Our chunked kernel's backend names from ``cupy_kernels.chunk.last_kernels`` (the
    ``ChunkPlan.label`` of the call, then ", context-parallel x J" where it split sequences)."""
    plan, _, rest = label.partition(", context-parallel")
    if plan == "three-kernel":
        names = ["cupy-three-kernel"]
    elif plan.startswith("fused wgmma"):
        names = ["cupy-wgmma"]
    elif plan.startswith("fused mma.sync"):
        names = ["cupy-fused"]
    else:
        return (UNKNOWN,)
    return (*names, "cupy-context-parallel") if rest else tuple(names)


@dataclass
class Tally:
    """Calls per backend over many calls (a property's, a run's), with the Triton kernels seen."""

    calls: Counter[str] = field(default_factory=Counter)
    kernels: dict[str, None] = field(default_factory=dict)
    declined: dict[str, None] = field(default_factory=dict)
    unknown_why: str = ""

    def add(self, ran: Iterable[Ran]) -> Tally:
        for r in ran:
            self.calls[r.label] += 1
            self.kernels.update(dict.fromkeys(r.kernels))
            self.declined.update(dict.fromkeys(r.declined))
            self.unknown_why = self.unknown_why or r.why
        return self

    def merge(self, other: Tally) -> Tally:
        self.calls.update(other.calls)
        self.kernels.update(other.kernels)
        self.declined.update(other.declined)
        self.unknown_why = self.unknown_why or other.unknown_why
        return self

    def describe(self) -> str:
        """One line: "triton (3 kernels: a, b, c)", "flash_qla 40 calls, triton 2 calls", ""."""
        if not self.calls:
            return ""
        parts = []
        for label, n in self.calls.most_common():
            text = label + (f" ({self.unknown_why})" if label == UNKNOWN and self.unknown_why else "")
            parts.append(text if len(self.calls) == 1 else f"{text} {n} call{'s' * (n > 1)}")
        line = ", ".join(parts)
        if self.kernels:
            k = len(self.kernels)
            line += f" ({k} Triton kernel{'s' * (k > 1)}: {', '.join(self.kernels)})"
        if self.declined:
            line += f"; {'; '.join(self.declined)}"
        return line

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = dict(calls=dict(self.calls.most_common()), kernels=list(self.kernels))
        if self.declined:
            d["declined"] = list(self.declined)
        if self.unknown_why and UNKNOWN in self.calls:
            d["unknown_why"] = self.unknown_why
        return d
