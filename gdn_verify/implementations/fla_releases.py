"""FLA's GDN entry points release by release: the table of conventions, and probes for the rest.

flash-linear-attention has shipped ``chunk_gated_delta_rule`` and ``fused_recurrent_gated_delta_rule``
(``fla.ops.gated_delta_rule``) since 0.1; from 0.3.2 the ops live in the ``fla-core``
distribution. Their conventions changed on the way, and users run what their stack pins, so the
adapters (``gdn_verify.implementations.fla``) read the installed release (:func:`installed`), take
its row of :data:`TABLE` (:func:`row`) and build each call from it. A release no row covers (a
newer one, a dev build) is probed on small known problems (:func:`probe`); what neither settles
is a one-line ConfigurationError, never a verdict caused by our own mismatch.

Each row was read from the release's source and checked under Triton's interpreter against the
float64 oracle (``tests/test_fla_releases.py`` probes every release it is given and compares).
Common to every release: inputs ``[B, T, H, K]`` (``head_first=False``), ``g`` the log of the
decay, ``cu_seqlens`` an int64 LongTensor with batch 1, and an ``input_guard`` that makes every
tensor contiguous before the kernels see it.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from gdn_verify.core.implementation import ConfigurationError

# The distributions that have held ``fla/ops``, newest first: fla-core (>= 0.3.2), and
# flash-linear-attention itself before (from 0.3.2 a meta-package depending on fla-core).
DISTRIBUTIONS = ("fla-core", "flash-linear-attention")
ENTRY_POINTS = {"chunk": "chunk_gated_delta_rule", "recurrent": "fused_recurrent_gated_delta_rule"}
GATE_OPTIONS = frozenset({"use_gate_in_kernel", "A_log", "dt_bias"})
BETA_OPTIONS = frozenset({"use_beta_sigmoid_in_kernel", "allow_neg_eigval"})
LAYOUT_KEYWORDS = ("state_v_first", "transpose_state_layout")


@dataclass(frozen=True)
class EntryPoint:
    """How one release's entry point is called.

    ``head_first``: it has a ``head_first`` keyword, which the adapter passes as False (0.1
    defaults it to True: ``[B, H, T, K]`` inputs); ``layout``: the keyword that makes the state
    v-first ``[N, HV, V, K]`` (None: k-first ``[N, HV, K, V]`` only); ``gva``: the kernel takes
    more value heads than query heads (HV a multiple of H); ``float32``: float32 inputs accepted;
    ``options``: the in-kernel gate keywords it honours (``Implementation.run``'s options).
    """

    head_first: bool
    layout: str | None
    gva: bool
    float32: bool
    options: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Release:
    """The conventions of the releases ``first`` to ``last`` (inclusive) of ``dist``.

    ``ops_only``: its ``fla/__init__.py`` imports ``fla.layers`` (and so transformers), so the
    ops are imported without running it; ``stages``: the chunked stage functions exist with the
    signatures ``fla.FlaStaged`` calls (``replay --diagnose``).
    """

    first: str
    last: str
    dist: str
    ops_only: bool
    chunk: EntryPoint
    recurrent: EntryPoint
    stages: bool = False
    notes: str = ""  # what a probe found (for a probed release)

    def entry(self, form: str) -> EntryPoint:
        return self.chunk if form == "chunk" else self.recurrent


def _entry(head_first: bool, layout: str | None, gva: bool, float32: bool, options=frozenset()) -> EntryPoint:
    return EntryPoint(head_first, layout, gva, float32, frozenset(options))


GATES = GATE_OPTIONS | BETA_OPTIONS
# fmt: off
TABLE: tuple[Release, ...] = (
    #        first    last     dist                      ops_only  chunk: head_first, layout, gva, float32, options
    # 0.1: head_first defaults to True in both; chunk asserts q is not float32 (and scale > 0).
    Release("0.1",   "0.1.2", "flash-linear-attention", True,
            chunk=_entry(True, None, False, False), recurrent=_entry(True, None, False, True)),
    Release("0.2.0", "0.2.1", "flash-linear-attention", True,
            chunk=_entry(True, None, False, False), recurrent=_entry(True, None, False, True)),
    # 0.2.2: fused_recurrent loses its head_first keyword.
    Release("0.2.2", "0.2.2", "flash-linear-attention", True,
            chunk=_entry(True, None, False, False), recurrent=_entry(False, None, False, True)),
    # 0.3.0: fused_recurrent gains GVA (and gk, gv before beta in its positional order).
    Release("0.3.0", "0.3.1", "flash-linear-attention", True,
            chunk=_entry(True, None, False, False), recurrent=_entry(False, None, True, True)),
    # 0.3.2: the ops move to fla-core, whose fla/__init__.py imports no layers.
    Release("0.3.2", "0.3.2", "fla-core", False,
            chunk=_entry(True, None, False, False), recurrent=_entry(False, None, True, True)),
    # 0.4.0: chunk drops head_first (now swallowed by **kwargs and ignored) and its float32 assert.
    Release("0.4.0", "0.4.1", "fla-core", False,
            chunk=_entry(False, None, False, True), recurrent=_entry(False, None, True, True)),
    # 0.4.2: transpose_state_layout=True reads and writes a v-first state.
    Release("0.4.2", "0.4.2", "fla-core", False,
            chunk=_entry(False, "transpose_state_layout", False, True),
            recurrent=_entry(False, "transpose_state_layout", True, True)),
    # 0.5.0: chunk gains GVA; both the in-kernel gate (chunk's through **kwargs).
    Release("0.5.0", "0.5.0", "fla-core", False,
            chunk=_entry(False, "transpose_state_layout", True, True, GATE_OPTIONS),
            recurrent=_entry(False, "transpose_state_layout", True, True, GATE_OPTIONS)),
    # 0.5.1: transpose_state_layout renamed state_v_first (the old name still accepted); the
    # in-kernel beta sigmoid.
    Release("0.5.1", "0.6.0", "fla-core", False,
            chunk=_entry(False, "state_v_first", True, True, GATES),
            recurrent=_entry(False, "state_v_first", True, True, GATES), stages=True),
)
# fmt: on


def parse(version: str) -> tuple[int, ...] | None:
    """``"0.4.2"`` -> ``(0, 4, 2)``; None for anything but dot-separated integers (a dev build)."""
    if not re.fullmatch(r"\d+(\.\d+)*", version.strip()):
        return None
    parts = tuple(int(p) for p in version.strip().split("."))
    return parts + (0,) * (3 - len(parts))


def row(version: str, table: tuple[Release, ...] | None = None) -> Release | None:
    """The row of ``table`` (:data:`TABLE` as it is at the call) covering ``version``, or None
    (a release the table does not know)."""
    v = parse(version)
    if v is None:
        return None
    for r in TABLE if table is None else table:
        first, last = parse(r.first), parse(r.last)
        if first is not None and last is not None and first <= v <= last:
            return r
    return None


def installed() -> tuple[str, str, Path]:
    """``(distribution, version, folder)`` of the ``fla`` package an import would load.

    The version is the distribution's metadata; a ``fla/__init__.py`` declaring another
    ``__version__`` (a source checkout ahead of the metadata) wins, since that is the code that
    runs. ConfigurationError when there is no ``fla`` package.
    """
    try:
        spec = importlib.util.find_spec("fla")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ConfigurationError("impl", "FLA is not installed (pip install fla-core==0.6.0): no module named 'fla'")
    folder = Path(locations[0])
    init = folder / "__init__.py"
    declared = None
    if init.is_file():
        match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", init.read_text(), re.M)
        declared = match.group(1) if match else None
    for dist in DISTRIBUTIONS:
        try:
            meta = importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        if declared is None or meta.version == declared:
            return dist, meta.version, folder
    if declared is None:
        raise ConfigurationError("impl", f"FLA at {folder} has no distribution metadata and no __version__")
    return "fla", declared, folder


def _stub_package(name: str, folder: Path) -> None:
    """``name`` in ``sys.modules`` as a package over ``folder`` whose ``__init__.py`` is not run."""
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = [str(folder)]
    sys.modules[name] = importlib.util.module_from_spec(spec)


def load(folder: Path, ops_only: bool | None) -> dict[str, Callable[..., Any]]:
    """The release's entry points by form (``chunk``, ``recurrent``).

    ``ops_only`` (flash-linear-attention <= 0.3.1, whose ``fla/__init__.py`` imports the layers
    and transformers): ``fla``, ``fla.ops`` and ``fla.modules`` become bare packages over their
    folders, so only ``fla.ops.gated_delta_rule`` and what it imports run. None (a release no
    row covers): the plain import, then the bare packages if that import fails.
    """
    if ops_only and "fla" not in sys.modules:
        for name in ("fla", "fla.ops", "fla.modules"):
            _stub_package(name, folder.joinpath(*name.split(".")[1:]))
    try:
        module = importlib.import_module("fla.ops.gated_delta_rule")
    except ImportError:
        if ops_only is not None:
            raise
        for name in [m for m in sys.modules if m == "fla" or m.startswith("fla.")]:
            del sys.modules[name]
        return load(folder, True)
    return {form: getattr(module, name) for form, name in ENTRY_POINTS.items()}


# ---- probes --------------------------------------------------------------------------------
# A probe runs the installed entry point on a small problem whose competing hypotheses (a
# k-first or v-first state, a log or linear gate, GVA or not) predict outputs that differ by
# O(1) of the output's scale, and takes the hypothesis the kernel's output is within MATCH of
# (relative to the largest reference value) provided every other is beyond APART. These decide
# what the call means; the verdict on the kernel's accuracy stays with ``check``. MATCH covers a
# float16 kernel on 40 tokens (relative errors ~1e-3); APART leaves a factor of 5 to the
# hypotheses' own spread.
MATCH = 0.05
APART = 0.25
PROBE = dict(T=40, K=32, V=32)  # T != H, so a [B, H, T, K] reading of the inputs cannot match


class Unsettled(Exception):
    """No hypothesis matched the probe's output (or more than one did)."""


def _problem(rng: np.random.Generator, H: int, HV: int, dtype: Any) -> dict[str, Any]:
    T, K, V = PROBE["T"], PROBE["K"], PROBE["V"]
    k = rng.standard_normal((1, T, H, K))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    return dict(
        q=rng.standard_normal((1, T, H, K)).astype(dtype),
        k=k.astype(dtype),
        v=rng.standard_normal((1, T, HV, V)).astype(dtype),
        g=np.log(rng.uniform(0.6, 0.99, (1, T, HV))).astype(dtype),
        beta=rng.uniform(0.2, 0.9, (1, T, HV)).astype(dtype),
        # far from symmetric: a transposed reading changes the outputs by O(1)
        initial_state=(rng.standard_normal((1, HV, K, V)) * 2).astype(np.float32),
    )


def _reference(p: dict[str, Any], v_first: bool, g: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The oracle's ``(o, final)`` when the kernel reads the state array v-first (or k-first)."""
    from gdn_verify.core import reference

    state = p["initial_state"].swapaxes(-1, -2) if v_first else p["initial_state"]
    o, final = reference.recurrent_gated_delta_rule(
        p["q"], p["k"], p["v"], p["g"] if g is None else g, p["beta"], initial_state=state, output_final_state=True
    )
    assert final is not None
    return o, final.swapaxes(-1, -2) if v_first else final


def _relative(out: tuple[np.ndarray, np.ndarray], ref: tuple[np.ndarray, np.ndarray]) -> float:
    scale = max(float(np.max(np.abs(r))) for r in ref) or 1.0
    return max(float(np.max(np.abs(np.asarray(o, np.float64) - r))) for o, r in zip(out, ref)) / scale


def _pick(out: tuple[np.ndarray, np.ndarray], hypotheses: dict[str, tuple[np.ndarray, np.ndarray]]) -> str:
    errors = {name: _relative(out, ref) for name, ref in hypotheses.items()}
    near = [name for name, e in errors.items() if e <= MATCH]
    far = [name for name, e in errors.items() if e > APART]
    if len(near) != 1 or len(far) != len(errors) - 1:
        shown = ", ".join(f"{n} {e:.2g}" for n, e in errors.items())
        raise Unsettled(f"relative errors against each hypothesis: {shown}")
    return near[0]


class _Caller:
    """Calls an entry point on NumPy probe problems (torch tensors on ``device``)."""

    def __init__(self, fn: Callable[..., Any], device: str):
        import torch

        self.torch, self.fn, self.device = torch, fn, device
        self.params = inspect.signature(fn).parameters

    def __call__(self, p: dict[str, Any], **extra: Any) -> tuple[np.ndarray, np.ndarray]:
        t = {n: self.torch.from_numpy(np.ascontiguousarray(x)).to(self.device) for n, x in p.items()}
        if "head_first" in self.params:
            extra["head_first"] = False
        o, final = self.fn(
            q=t["q"],
            k=t["k"],
            v=t["v"],
            g=t["g"].float(),
            beta=t["beta"],
            initial_state=t["initial_state"],
            output_final_state=True,
            **extra,
        )
        return o.float().cpu().numpy(), final.float().cpu().numpy()


def probe_entry(fn: Callable[..., Any], device: str, notes: list[str] | None = None, seed: int = 0) -> EntryPoint:
    """The conventions of one entry point, found by running it on ``device`` (see MATCH / APART).

    Raises :class:`Unsettled` naming what was probed when the outputs match no hypothesis;
    appends to ``notes`` what a settled probe found worth saying (why GVA is unsupported).
    """
    notes = [] if notes is None else notes
    import torch

    call = _Caller(fn, device)
    rng = np.random.default_rng(seed)
    head_first = "head_first" in call.params
    try:  # float32 inputs: refused (an assert) or accepted
        p = _problem(rng, 1, 1, np.float32)
        out = call(p)
        float32 = True
    except (AssertionError, RuntimeError, ValueError, NotImplementedError, TypeError):
        float32 = False
        p = _problem(rng, 1, 1, np.float16)
        out = call(p)
    dtype = np.float32 if float32 else np.float16
    layouts = {"k-first": _reference(p, False), "v-first": _reference(p, True)}
    try:
        read = _pick(out, layouts)
    except Unsettled as exc:
        linear = np.exp(p["g"].astype(np.float64)).astype(dtype)
        try:  # a kernel taking the decay itself (not its log) matches when handed exp(g)
            _pick(call({**p, "g": linear}), {"linear gate": _reference(p, False)})
        except Unsettled:
            raise Unsettled(f"state read k-first or v-first with a log-space gate: {exc}") from None
        raise Unsettled("the gate is linear (the decay itself), not its log as g is") from None
    if read != "k-first":
        raise Unsettled("the default state layout is v-first; the adapters expect k-first")
    layout = None
    for keyword in LAYOUT_KEYWORDS:
        if keyword in call.params:
            try:
                read = _pick(
                    call(p, **{keyword: True}), {"k-first": _reference(p, False), "v-first": _reference(p, True)}
                )
            except Unsettled as exc:
                raise Unsettled(f"{keyword}=True: {exc}") from None
            if read != "v-first":
                raise Unsettled(f"{keyword}=True still reads the state k-first")
            layout = keyword
            break
    # GVA: refused, or run and matched. Releases without it run HV = 2 H silently, reading past
    # the query heads (NaN or O(1) errors from 0.1 to 0.4.2's chunk), indistinguishable from a
    # GVA bug, so a mismatch is recorded in ``notes`` and HV > H reported unsupported.
    gva = True
    q = _problem(rng, 1, 2, dtype)
    try:
        out = call(q)
    except (AssertionError, RuntimeError, ValueError, IndexError, torch.cuda.OutOfMemoryError) as exc:
        gva = False
        notes.append(f"HV = 2 H refused ({type(exc).__name__})")
    else:
        try:
            _pick(out, {"GVA (HV = 2 H)": _reference(q, False)})
        except Unsettled as exc:
            gva = False
            notes.append(f"HV = 2 H runs but matches no GVA reading ({exc})")
    options = frozenset(k for k in GATE_OPTIONS | BETA_OPTIONS if k in call.params)
    if not GATE_OPTIONS <= options:
        options -= GATE_OPTIONS
    return EntryPoint(head_first=head_first, layout=layout, gva=gva, float32=float32, options=options)


def probe(fns: dict[str, Callable[..., Any]], dist: str, version: str, device: str) -> Release:
    """A row for a release :data:`TABLE` lacks, from probing each entry point; ConfigurationError
    (one line: the release and what was probed) when a probe is not settled."""
    entries, notes = {}, []
    for form, fn in fns.items():
        found: list[str] = []
        try:
            entries[form] = probe_entry(fn, device, found)
            notes += [f"{ENTRY_POINTS[form]}: {n}" for n in found]
        except Unsettled as exc:
            what = "state layout (k-first, v-first), log or linear gate, GVA (HV = 2 H)"
            raise ConfigurationError(
                "impl",
                f"FLA {version} ({dist}) is newer or other than the releases gdn-verify knows; probing "
                f"{ENTRY_POINTS[form]} ({what}) did not settle its conventions: {exc}",
            ) from None
    return Release(version, version, dist, False, entries["chunk"], entries["recurrent"], notes="; ".join(notes))


def probed_fields(entry: EntryPoint) -> dict[str, Any]:
    """What a probe can establish about an entry point (options passed through ``**kwargs``
    cannot be seen in a signature)."""
    return {f.name: getattr(entry, f.name) for f in fields(entry) if f.name != "options"}
