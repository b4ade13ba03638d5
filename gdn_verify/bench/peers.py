"""Prefill beside every peer that loads: ours (context parallelism auto and off), FLA, FlashInfer
(``use_cp`` off and auto), FlashQLA and vLLM's FLA copy, side by side in one run, with the physical
floor of each row (:mod:`gdn_verify.bench.floor`).

Per row (:func:`rows`: H q-k heads, HV value heads, K = V = 128, ``sequences x length`` tokens):

- inputs: :func:`prefill._inputs`'s bf16 q, k, v and beta, float32 log-space g, packed with
  ``B = 1`` and ``cu_seqlens`` on every call (int64; vLLM's int32, its ``query_start_loc``), a
  single sequence included (as serving engines call prefill), the final state written, all under
  ``torch.inference_mode()`` (a serving forward; ``inference_mode=False`` turns it off);
- each peer's conversion to its own convention (:func:`load_peer`; e.g. FlashInfer's linear-space
  ``alpha = exp(g)`` and packed ``[T, H, K]`` tensors) runs once per row, outside the timed call,
  and so do the host-side hints a serving engine computes once per batch and passes (FlashInfer's
  ``max_seqlen``, FLA's ``cu_seqlens_cpu``, vLLM's ``chunk_indices`` and ``chunk_offsets``, each
  only where the peer's signature has it; a cell names the hints it got);
- the first call of each peer (compile, autotune) runs alone; a peer that raises there, or later,
  gets that row's cell as the one-line error, and the bench goes on with the others (a CUDA
  context that no longer synchronizes ends the run after writing the row);
- time: :func:`prefill.interleave` over all peers that ran, ``rounds`` rounds of ``reps // rounds``
  CUDA-event repetitions each (``warmup`` calls before the first round, one before each later
  one): the median over rounds, and the ratio to ours as the median of the per-round ratios
  (peer / ours: above 1 is slower than ours);
- floor: ``time / floor`` against the datasheet floor and against the floor at the bandwidth of a
  1 GiB device copy measured at the start of the run (:func:`copy_bandwidth`);
- extra memory: :func:`prefill._peak_bytes` (torch's peak plus CuPy's pool, beyond the inputs);
- accuracy: relative RMS of the output and the final state against the float64 oracle on sampled
  value heads (the first and the last; one, the last, where two would pass
  :data:`ORACLE_TOKEN_HEADS`: the 262144-token rows; the row says so).

Nothing GPU-related is imported until a function runs: the row plan and the loaders' reasons are
testable on a CPU. ``scripts/bench_peers.py`` drives it and writes the JSON and the tables
(:mod:`gdn_verify.bench.peer_table`).
"""

from __future__ import annotations

import datetime
import gc
import hashlib
import importlib.metadata
import inspect
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gdn_verify.bench import floor, prefill
from gdn_verify.bench.peer_table import format_row
from gdn_verify.bench.prefill import one_line

# The five rows of prefill.CASES at H = 16, HV = 32, then the Qwen3.5 tensor-parallel head layouts of
# issue 29 (q-k heads / value heads per GPU; 2/8 is the 16/64 model at TP 8) at four shapes.
STANDARD_LAYOUT = (16, 32)
QWEN35_LAYOUTS = ((2, 8), (4, 8), (8, 16), (16, 32), (16, 64))
QWEN35_SHAPES = ((1, 4096), (1, 65536), (8, 2048), (64, 512))
# One sequence of 262144 tokens in two layouts: 2/8 (16/64 at TP 8), the fewest heads per GPU, where one long
# sequence leaves most SMs idle without context parallelism (the case CP kernels exist for), and
# 16/64, the most work per GPU (the whole model's heads on one GPU: the longest time and the
# largest memory, v and o 4 GiB each). Last in the plan: a kernel that breaks the CUDA context
# there loses no other row.
LONG_TOKENS = 262144
LONG_LAYOUTS = ((2, 8), (16, 64))
# Token-heads the float64 oracle scores per row (about 15 us each on one CPU core): two value heads
# where that fits, else one.
ORACLE_TOKEN_HEADS = 2**18
# The peers, in table order; OPTIONAL ones run only when named.
PEERS = ("ours", "ours-cp-off", "fla", "flashinfer", "flashinfer-cp", "flashqla", "vllm")
OPTIONAL_PEERS = ("flashinfer-cp-on",)
REFERENCE = "ours"


@dataclass(frozen=True)
class Row:
    """One bench row: ``sequences`` of ``length`` tokens, ``H`` q-k heads, ``HV`` value heads."""

    H: int
    HV: int
    sequences: int
    length: int
    K: int = 128
    V: int = 128

    @property
    def key(self) -> str:
        """``"H/HV SxL"``, e.g. ``"2/8 1x65536"``: the row's identity in JSON files and merges."""
        return f"{self.H}/{self.HV} {self.sequences}x{self.length}"

    @property
    def tokens(self) -> int:
        return self.sequences * self.length

    @property
    def lengths(self) -> list[int]:
        return [self.length] * self.sequences


def rows() -> list[Row]:
    """The row plan: the five rows of ``prefill.CASES``, Qwen3.5's layouts x :data:`QWEN35_SHAPES` (those already
    among the five once), then the :data:`LONG_TOKENS` rows."""
    plan = [Row(*STANDARD_LAYOUT, s, L) for s, L in prefill.CASES]
    for H, HV in QWEN35_LAYOUTS:
        plan += [r for r in (Row(H, HV, s, L) for s, L in QWEN35_SHAPES) if r not in plan]
    return plan + [Row(H, HV, 1, LONG_TOKENS) for H, HV in LONG_LAYOUTS]


def select_rows(plan: Sequence[Row], patterns: Sequence[str] | None) -> list[Row]:
    """The rows of ``plan`` whose key (``"H/HV SxL"``) matches any of the regular expressions
    ``patterns`` (``re.search``); all of them for None or an empty list."""
    if not patterns:
        return list(plan)
    compiled = [re.compile(p) for p in patterns]
    return [r for r in plan if any(c.search(r.key) for c in compiled)]


def peer_names(text: str | None) -> list[str]:
    """A comma-separated peer list (None: :data:`PEERS`), checked against the known names."""
    names = list(PEERS) if text is None else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in LOADERS]
    if unknown:
        raise ValueError(f"unknown peers {unknown}: choose from {', '.join(LOADERS)}")
    return names


def oracle_heads(row: Row) -> tuple[list[int], str | None]:
    """The value heads the oracle scores on ``row`` and, where fewer than two, why."""
    both = sorted({0, row.HV - 1})
    if len(both) * row.tokens <= ORACLE_TOKEN_HEADS:
        return both, None
    return [row.HV - 1], (
        f"float64 oracle on one value head ({row.HV - 1}, the last) of {row.HV}: {row.tokens} tokens x 2 heads "
        f"would pass the {ORACLE_TOKEN_HEADS} token-heads a row may spend"
    )


class PeerUnavailable(Exception):
    """A peer that cannot run here, with the reason (a missing keyword, kernel or folder)."""


@dataclass
class Peer:
    """A loaded peer. ``prepare(x, row)`` converts :func:`prefill._inputs`'s tensors to the peer's
    convention (untimed) and returns the zero-argument call that is timed; ``result(raw, row)``
    turns that call's return value into ``(o [1, T, HV, V], final_state [N, HV, K, V])`` (untimed);
    ``describe(row)``, after a call, says which kernel path ran (None: not known)."""

    name: str
    version: str
    convention: str
    prepare: Callable[[dict, Row], Callable[[], Any]]
    result: Callable[[Any, Row], tuple[Any, Any]]
    describe: Callable[[Row], str | None] = lambda row: None
    hints: tuple[str, ...] = ()

    def __call__(self, x: dict, row: Row) -> tuple[Any, Any]:
        """``(o, final_state)`` in our convention for inputs ``x`` of ``row``."""
        return self.result(self.prepare(x, row)(), row)


def _version(*distributions: str) -> str:
    """``"name version"`` of each installed distribution among ``distributions``."""
    found = []
    for dist in distributions:
        try:
            found.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return ", ".join(found) or "version unknown"


def _parameters(fn: Callable) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature: pass no optional keyword
        return {}


def _as_is(raw: Any, row: Row) -> tuple[Any, Any]:
    return raw[0], raw[1]


def _k_last(raw: Any, row: Row) -> tuple[Any, Any]:
    """A ``[N, HV, V, K]`` final state as our ``[N, HV, K, V]`` (a view)."""
    return raw[0], raw[1].transpose(-1, -2)


def sources_digest(folder: Path) -> str:
    """sha256 (12 hex digits) of the kernel sources in ``folder`` (``*.py``, ``*.cu``, ``*.cuh``, by
    name): which kernels ran, where the checkout has no ``.git``."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.suffix in (".py", ".cu", ".cuh")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def _ours(cp_off: bool) -> Peer:
    from cupy_kernels import chunk

    fn = chunk.chunk_gated_delta_rule
    has_cp = "context_parallel" in _parameters(fn)
    if cp_off and not has_cp:
        raise PeerUnavailable(
            "cupy_kernels.chunk.chunk_gated_delta_rule has no context_parallel keyword: ours runs once, as 'ours'"
        )
    kw: dict[str, Any] = {"context_parallel": False if cp_off else None} if has_cp else {}

    def prepare(x: dict, row: Row) -> Callable[[], Any]:
        args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
        cu = x["cu"].cpu()  # the offsets on the host, as FLA's cu_seqlens_cpu: no synchronizing read per call
        return lambda: fn(*args, output_final_state=True, cu_seqlens=cu, **kw)

    mode = "context_parallel=False" if cp_off else ("context_parallel=None (auto)" if has_cp else "no CP keyword")
    return Peer(
        "ours-cp-off" if cp_off else "ours",
        f"cupy_kernels sources {sources_digest(Path(chunk.__file__).parent)}",
        f"cupy_kernels.chunk.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens int64 on the host, {mode}): "
        "our convention",
        prepare,
        _as_is,
        describe=lambda row: chunk.last_kernels or None,
    )


def _fla() -> Peer:
    from gdn_verify.implementations.fla import cache_triton_autotuning

    # FLA 0.6 hands chunk_gated_delta_rule to FlashQLA when that imports (its dispatch reads the
    # variable on the first call): off, so that the column is FLA's own kernels.
    os.environ.setdefault("FLA_FLASH_QLA", "0")
    cache_triton_autotuning()
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fn

    hints = ("cu_seqlens_cpu",) if "cu_seqlens_cpu" in _parameters(fn) else ()

    def prepare(x: dict, row: Row) -> Callable[[], Any]:
        args = dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], cu_seqlens=x["cu"])
        if hints:
            args["cu_seqlens_cpu"] = x["cu"].cpu()
        return lambda: fn(**args, output_final_state=True)

    return Peer(
        "fla",
        _version("fla-core", "flash-linear-attention"),
        "fla.ops.gated_delta_rule.chunk_gated_delta_rule: our convention (log-space g, [N, HV, K, V] state); "
        f"FLA_FLASH_QLA={os.environ['FLA_FLASH_QLA']}, FLA_INTRACARD_CP={os.environ.get('FLA_INTRACARD_CP', 'unset')}",
        prepare,
        _as_is,
        hints=hints,
    )


def _flashinfer(mode: str) -> Peer:
    """``mode``: ``"off"`` (``use_cp=False``), ``"auto"`` (FlashInfer's own choice; ``use_cp=True``
    where this FlashInfer has no ``"auto"``) or ``"on"`` (``use_cp=True``)."""
    import torch
    from flashinfer.gdn_prefill import chunk_gated_delta_rule as fn

    params = _parameters(fn)
    if "cu_seqlens" not in params:  # keywords unknown: use_cp could not be set, nor known to be absent
        raise PeerUnavailable("cannot read the signature of flashinfer.gdn_prefill.chunk_gated_delta_rule")
    kw: dict[str, Any] = {"backend": "flashinfer"} if "backend" in params else {}
    if mode == "off":
        if "use_cp" in params:
            kw["use_cp"] = False
    elif "use_cp" not in params:
        raise PeerUnavailable(
            "flashinfer.gdn_prefill.chunk_gated_delta_rule has no use_cp: no context-parallel prefill"
        )
    else:
        has_auto = isinstance(params["use_cp"].default, str)
        kw["use_cp"] = "auto" if mode == "auto" and has_auto else True
    hints = ("max_seqlen",) if "max_seqlen" in params else ()

    def prepare(x: dict, row: Row) -> Callable[[], Any]:
        T, H, HV = row.tokens, row.H, row.HV
        args = dict(
            q=x["q"].reshape(T, H, row.K),
            k=x["k"].reshape(T, H, row.K),
            v=x["v"].reshape(T, HV, row.V),
            g=x["g"].reshape(T, HV).double().exp().float().contiguous(),  # alpha: the decay in linear space
            beta=x["beta"].reshape(T, HV).float().contiguous(),
            cu_seqlens=x["cu"],
            output_final_state=True,
            **kw,
        )
        if hints:
            args["max_seqlen"] = row.length
        return lambda: fn(**args)

    def result(raw: Any, row: Row) -> tuple[Any, Any]:
        return raw[0].reshape(1, row.tokens, row.HV, row.V), raw[1].transpose(-1, -2)

    def fixed(row: Row) -> str | None:
        return f"use_cp={kw.get('use_cp')!r}"

    describe = _flashinfer_auto_choice(torch) if kw.get("use_cp") == "auto" else fixed
    name = {"off": "flashinfer", "auto": "flashinfer-cp", "on": "flashinfer-cp-on"}[mode]
    return Peer(
        name,
        _version("flashinfer-python", "nvidia-cutlass-dsl", "apache-tvm-ffi"),
        "flashinfer.gdn_prefill.chunk_gated_delta_rule("
        + ", ".join(f"{k}={v!r}" for k, v in kw.items())
        + "): packed [T, H, K] q, k, v; alpha = exp(g) and beta float32 [T, HV]; int64 cu_seqlens; "
        "[N, HV, V, K] state",
        prepare,
        result,
        describe=describe,
        hints=hints,
    )


def _flashinfer_auto_choice(torch) -> Callable[[Row], str | None]:
    """What ``use_cp="auto"`` picks for a row, from FlashInfer's own host heuristic (N x HV work
    items against the SM count); a describer returning None where that helper is not there."""
    try:
        from flashinfer.gdn_kernels.delta_rule_dsl.varlen_helper import should_use_cp_host
        from flashinfer.utils import get_compute_capability, get_device_name, get_device_sm_count
    except Exception:  # noqa: BLE001 - another FlashInfer's layout: the choice stays unknown
        return lambda row: None

    def describe(row: Row) -> str | None:
        device = torch.device("cuda", torch.cuda.current_device())
        try:
            picks = should_use_cp_host(
                row.sequences * row.HV,
                get_device_sm_count(device),
                get_device_name(device),
                device_capability=get_compute_capability(device),
            )
        except Exception:  # noqa: BLE001 - another FlashInfer's helper: the choice stays unknown
            return None
        return f"use_cp='auto': {'context-parallel' if picks else 'non-CP'} kernel (FlashInfer's heuristic)"

    return describe


def _flashqla() -> Peer:
    from flash_qla import chunk_gated_delta_rule as fn

    def prepare(x: dict, row: Row) -> Callable[[], Any]:
        args = dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], cu_seqlens=x["cu"])
        return lambda: fn(**args, output_final_state=True)

    return Peer(
        "flashqla",
        _version("flash-qla", "tilelang", "apache-tvm-ffi"),
        "flash_qla.chunk_gated_delta_rule: FLA's convention (float32 log-space g, int64 cu_seqlens, "
        "[N, HV, K, V] state), its default auto_cp=True",
        prepare,
        _as_is,
    )


def _vllm() -> Peer:
    from gdn_verify.implementations.fla import cache_triton_autotuning
    from gdn_verify.implementations.vllm import PRIVATE, load_ops

    cache_triton_autotuning()
    ops = load_ops()
    fn = ops.chunk_gated_delta_rule
    params = _parameters(fn)
    index = sys.modules.get(f"{PRIVATE}.ops.index")
    makers: dict[str, Callable[..., Any]] = {}
    for name in ("chunk_indices", "chunk_offsets"):
        make = getattr(index, f"prepare_{name}", None)
        if name in params and make is not None:
            makers[name] = make

    def prepare(x: dict, row: Row) -> Callable[[], Any]:
        cu = x["cu"].int()  # vLLM's query_start_loc is int32
        args = dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], cu_seqlens=cu)
        for name, make in makers.items():  # its metadata builder makes them once per batch
            args[name] = make(cu, 64)
        return lambda: fn(**args, output_final_state=True)

    manifest = Path(ops.root) / "MANIFEST.txt"
    version = manifest.read_text().splitlines()[0].lstrip("# ") if manifest.is_file() else f"ops at {ops.root}"
    return Peer(
        "vllm",
        version,
        "vLLM's chunk_gated_delta_rule (FLA's convention, int32 cu_seqlens, [N, HV, V, K] state)",
        prepare,
        _k_last,
        hints=tuple(makers),
    )


LOADERS: dict[str, Callable[[], Peer]] = {
    "ours": lambda: _ours(cp_off=False),
    "ours-cp-off": lambda: _ours(cp_off=True),
    "fla": _fla,
    "flashinfer": lambda: _flashinfer("off"),
    "flashinfer-cp": lambda: _flashinfer("auto"),
    "flashinfer-cp-on": lambda: _flashinfer("on"),
    "flashqla": _flashqla,
    "vllm": _vllm,
}


def load_peer(name: str) -> tuple[Peer | None, str | None]:
    """``(peer, None)``, or ``(None, reason)``: the one-line error its import or setup raised."""
    try:
        return LOADERS[name](), None
    except PeerUnavailable as exc:
        return None, str(exc)
    except Exception as exc:  # noqa: BLE001 - any import or setup failure is the reason it did not load
        return None, one_line(exc)


def copy_bandwidth(torch, nbytes: int = 2**30, reps: int = 10) -> dict[str, Any]:
    """A device-to-device copy of ``nbytes``, timed like the kernels (:func:`prefill._time_ms`): the
    framework copy (``copy_``, ``cudaMemcpyAsync``) and the decode bench's SM copy kernel (where
    CuPy loads); ``gbps`` is the faster, bytes read + written per second / 1e9."""
    from gdn_verify.bench.decode import _sm_copy

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    gbps = {}
    result: dict[str, Any] = dict(bytes=nbytes)
    ms = prefill._time_ms(lambda: dst.copy_(src), torch.cuda.synchronize, 3, reps)
    gbps["framework_gbps"] = 2 * nbytes / ms / 1e6
    try:
        import cupy

        copy = _sm_copy(cupy)
        ms = prefill._time_ms(lambda: copy(src.data_ptr(), dst.data_ptr(), nbytes), torch.cuda.synchronize, 3, reps)
        gbps["sm_gbps"] = 2 * nbytes / ms / 1e6
    except Exception as exc:  # noqa: BLE001 - no CuPy: the framework copy alone
        result["sm_error"] = one_line(exc)
    result.update(gbps, gbps=max(gbps.values()))
    return result


def library_versions() -> dict[str, str]:
    """Installed versions of torch, Triton, CuPy, NumPy and every peer's distributions."""
    from gdn_verify.core.environment import package_versions

    versions = package_versions()
    for dist in ("flash-qla", "tilelang", "apache-tvm-ffi", "nvidia-cutlass-dsl", "cuda-bindings"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


class _ContextLost(Exception):
    pass


def _alive(torch) -> bool:
    try:
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001 - a sticky CUDA error: every later call would fail too
        return False


def _warnings(caught: list) -> list[str]:
    return sorted({str(w.message).strip().splitlines()[0][:200] for w in caught if str(w.message).strip()})


def measure_row(
    row: Row,
    peers: dict[str, Peer],
    torch,
    floor_row: dict,
    warmup: int = 3,
    reps: int = prefill.REPS,
    rounds: int = prefill.ROUNDS,
    seed: int = 0,
    gates: str = "fast",
) -> tuple[dict[str, dict], str | None]:
    """Every peer on ``row``: ``({peer: cell}, None)``, or with the reason the CUDA context was lost
    (the cells of the peers not run then say so). A cell: ``ms``, ``rounds``, ``ratio`` (peer /
    ours, median of the per-round ratios), ``ratio_rounds``, ``ratio_spread``, ``ours_ms``,
    ``floor_ratio`` and ``floor_copy_ratio`` (time / floor), ``peak_bytes``, ``o_rel_rms``,
    ``state_rel_rms``, ``kernels``, ``hints``, ``warnings``, ``memory_error`` / ``accuracy_error``
    (where that step raised); or ``error`` and ``stage`` (``"first call"``, ``"timing"``) alone."""
    x = prefill._inputs(torch, row.sequences, row.length, row.H, row.HV, row.K, row.V, seed, torch.bfloat16, gates)
    cells: dict[str, dict] = {name: {"hints": list(peer.hints)} if peer.hints else {} for name, peer in peers.items()}
    calls: dict[str, Callable[[], Any]] = {}

    def failed(name: str, stage: str, error: str) -> None:
        """A peer's error at ``stage``: before its time is taken, the cell is the error and the peer
        runs no more this row; after (memory, accuracy), the time stands and ``<stage>_error`` says
        what is missing."""
        if stage in ("memory", "accuracy"):
            cells[name][f"{stage}_error"] = error
        else:
            cells[name].update(error=error, stage=stage)
            calls.pop(name, None)
        if not _alive(torch):
            raise _ContextLost(f"the CUDA context was lost ({name}, {stage}: {error})")

    try:
        for name, peer in peers.items():
            try:
                call = peer.prepare(x, row)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    out = call()
                    torch.cuda.synchronize()
                del out
                calls[name] = call
                if caught:
                    cells[name]["warnings"] = _warnings(caught)
            except Exception as exc:  # noqa: BLE001 - this peer's cell only
                failed(name, "first call", one_line(exc))
        reference = REFERENCE if REFERENCE in calls else None
        timing = prefill.interleave_calls(calls, torch.cuda.synchronize, warmup, reps, rounds, reference, catch=True)
        ours_ms = timing.get(REFERENCE, {}).get("ms")
        datasheet, copy = floor_row.get("datasheet"), floor_row.get("copy")
        for name, t in timing.items():
            if "error" in t:
                failed(name, "timing", t["error"])
                continue
            cells[name].update(t, ours_ms=ours_ms)
            cells[name]["floor_ratio"] = t["ms"] / datasheet["floor_ms"] if datasheet else None
            cells[name]["floor_copy_ratio"] = t["ms"] / copy["floor_ms"] if copy else None
        for name, call in list(calls.items()):
            try:
                cells[name]["peak_bytes"] = prefill._peak_bytes(torch, call)
            except Exception as exc:  # noqa: BLE001
                failed(name, "memory", one_line(exc))
        heads, _ = oracle_heads(row)
        refs = None
        try:
            refs = prefill._oracle_reference(x, heads, row.H, row.HV) if calls else {}
        except Exception as exc:  # noqa: BLE001 - no accuracy this row, the times stand
            for name in list(calls):
                failed(name, "accuracy", f"float64 oracle: {one_line(exc)}")
        if refs is not None:
            for name, call in list(calls.items()):
                try:
                    o, s = peers[name].result(call(), row)
                    cells[name]["kernels"] = peers[name].describe(row)
                    cells[name]["o_rel_rms"], cells[name]["state_rel_rms"] = prefill._errors_against(refs, o, s)
                    del o, s
                except Exception as exc:  # noqa: BLE001
                    failed(name, "accuracy", one_line(exc))
    except _ContextLost as lost:
        for cell in cells.values():
            if not cell.keys() - {"hints", "warnings"}:
                cell.update(error="not run: the CUDA context was lost earlier in this row", stage="not run")
        return cells, str(lost)
    finally:
        del x
    return cells, None


def bench(
    plan: Sequence[Row],
    peer_names: Sequence[str],
    on_start: Callable[[dict], int] | None = None,
    on_row: Callable[[dict], Any] | None = None,
    progress: Callable[[str], Any] | None = print,
    skip: frozenset[str] = frozenset(),
    warmup: int = 3,
    reps: int = prefill.REPS,
    rounds: int = prefill.ROUNDS,
    seed: int = 0,
    inference_mode: bool = True,
    gates: str = "fast",
) -> dict:
    """Run ``peer_names`` on every row of ``plan`` whose key is not in ``skip``; returns the run's
    ``meta`` (device, date, versions, the peers loaded and why the others did not, the copy
    bandwidth, the settings, ``stopped`` when the run ended early).

    ``on_start(meta)`` is called once the peers are loaded and returns the run's index (0 without
    it); ``on_row(row)`` after each row (write the JSON there: a run cut short keeps its finished
    rows). A row: ``key``, ``layout``, ``H``, ``HV``, ``K``, ``V``, ``sequences``, ``length``,
    ``tokens``, ``plan_index``, ``run``, ``floor`` (:func:`floor.row_floor`), ``heads``,
    ``oracle_note``, ``wall_s``, ``cells`` (:func:`measure_row`; each cell also has ``run``).
    """
    import torch

    say = progress or (lambda _msg: None)
    if not torch.cuda.is_available():
        raise RuntimeError("the peer bench needs a CUDA device; torch sees none")
    device = torch.cuda.get_device_name()
    peers: dict[str, Peer] = {}
    not_loaded: dict[str, str] = {}
    for name in peer_names:
        peer, reason = load_peer(name)
        if peer is None:
            not_loaded[name] = reason or "unknown"
            say(f"{name}: did not load: {reason}")
        else:
            peers[name] = peer
            say(f"{name}: {peer.version}; {peer.convention}")
    copy = copy_bandwidth(torch)
    say(f"device copy: {copy['gbps']:.0f} GB/s (bytes read + written)")
    peak = floor.device_peak(device)
    meta = dict(
        device=device,
        date=datetime.date.today().isoformat(),
        started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        versions=dict(library_versions(), cuda_runtime=str(torch.version.cuda)),
        peers={n: dict(version=p.version, convention=p.convention, hints=list(p.hints)) for n, p in peers.items()},
        not_loaded=not_loaded,
        copy=copy,
        peak=None if peak is None else dict(name=peak.name, flops=peak.flops, bandwidth=peak.bandwidth),
        settings=dict(
            dtype="bfloat16",
            K=128,
            V=128,
            chunk=floor.CHUNK,
            cu_seqlens="every call (B = 1 packed, int64; vLLM int32)",
            inference_mode=inference_mode,
            warmup=warmup,
            reps=reps,
            rounds=rounds,
            seed=seed,
            gates=gates,
            oracle_token_heads=ORACLE_TOKEN_HEADS,
        ),
        env={k: os.environ.get(k) for k in ("FLA_FLASH_QLA", "FLA_INTRACARD_CP", "TRITON_CACHE_AUTOTUNING")},
        requested=list(peer_names),
    )
    run = on_start(meta) if on_start else 0
    if not peers:
        meta["stopped"] = "no peer loaded"
        say(f"stopped: {meta['stopped']}")
        return meta
    full = {r.key: i for i, r in enumerate(rows())}  # plan_index: the row's place in the whole plan
    todo = [(full.get(r.key, len(full) + i), r) for i, r in enumerate(plan) if r.key not in skip]
    for done, (index, row) in enumerate(todo, 1):
        start = time.perf_counter()
        floor_row = floor.row_floor(row.lengths, row.H, row.HV, row.K, row.V, device, copy["gbps"])
        heads, note = oracle_heads(row)
        with torch.inference_mode(inference_mode):
            cells, lost = measure_row(row, peers, torch, floor_row, warmup, reps, rounds, seed, gates)
        for cell in cells.values():
            cell["run"] = run
        record = dict(
            key=row.key,
            layout=f"{row.H}/{row.HV}",
            H=row.H,
            HV=row.HV,
            K=row.K,
            V=row.V,
            sequences=row.sequences,
            length=row.length,
            tokens=row.tokens,
            plan_index=index,
            run=run,
            floor=floor_row,
            heads=heads,
            oracle_note=note,
            wall_s=round(time.perf_counter() - start, 1),
            cells=cells,
        )
        if on_row:
            on_row(record)
        say(f"[{done}/{len(todo)}] {format_row(record, list(peers))}")
        gc.collect()
        torch.cuda.empty_cache()
        if lost:
            meta["stopped"] = f"after row {row.key}: {lost}"
            say(f"stopped: {meta['stopped']}")
            break
    return meta
