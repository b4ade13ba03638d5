"""The scale tier: a few large problems built to cross the limits at which GDN kernels really break.

Kernels that pass every small problem still ship bugs at scale (the release notes of FLA, vLLM,
FlashInfer and SGLang): a launch-grid dimension limited to 65535 that holds sequences x value
heads or chunks; pointer arithmetic in 32 bits that overflows past 2^31 elements (the base of a
later sample, the start of a later sequence, the per-chunk states of one long sequence, a state
index times its stride). :func:`plan` builds one problem per limit, as small as crossing it
allows; :class:`ScaleLimits` holds the limits, so that the tests drive the same code on CPU with
limits of a few elements.

Each case is judged three ways: every output and final state is finite; the probed sequences
(the first, the first past each limit, the last) at the first and last value head agree with the
float64 oracle within the tolerance model; and they agree, within twice that tolerance, with the
same kernel called on those sequences alone (for one long sequence: called on its two halves,
the first half's final state carried). Every case runs in a child process (``python -m
gdn_verify.runners.scale``): a launch error, an illegal address or a dead CUDA context is a
failure with the child's last words, and the run goes on with the next case. A case that does
not fit in the device's free memory is skipped, saying how much it needs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gdn_verify.core import arrays
from gdn_verify.core.implementation import ContractError, Implementation, Result, returned_pair
from gdn_verify.core.oracle import Oracle, problem_digest
from gdn_verify.core.problem import DTYPES, Problem
from gdn_verify.core.property import Measurement, Violation
from gdn_verify.core.verdict import compare, floating, oracle_and_tolerance

GRID_LIMIT = 65535  # gridDim.y and gridDim.z of a CUDA launch
OFFSET_LIMIT = 2**31  # elements an int32 offset can address
CACHE_ENV = "GDN_VERIFY_SCALE_CACHE"
SPLIT_FACTOR = 2.0  # both results within the tolerance of the oracle: within twice it of each other
MEMORY_MARGIN = 0.9  # of the free device memory a case may plan to use


@dataclass(frozen=True)
class ScaleLimits:
    """The limits the cases cross: launch-grid dimension, int32 offsets, FLA's chunk, head size."""

    grid: int = GRID_LIMIT
    offset: int = OFFSET_LIMIT
    chunk: int = 64
    head_dim: int = 128


@dataclass(frozen=True)
class ScaleCase:
    """One large problem: ``lengths`` (varlen, ``B == 1``) or ``B x T`` rows; the sequences probed."""

    name: str
    crosses: str
    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int
    lengths: tuple[int, ...] | None = None
    initial_state: bool = False
    probes: tuple[int, ...] = ()
    halves: bool = False  # one sequence: the split call is its two halves

    @property
    def num_sequences(self) -> int:
        return self.B if self.lengths is None else len(self.lengths)

    @property
    def tokens(self) -> int:
        return self.B * self.T

    def device_bytes(self, dtype: str, chunk: int) -> int:
        """What the call needs on the device, with a chunked kernel's intermediates (float32
        per-chunk states, three token-by-head float32 stages), inputs and outputs included."""
        size = np.dtype(DTYPES[dtype]).itemsize
        t, n = self.tokens, self.num_sequences
        chunks = sum(-(-length // chunk) for length in (self.lengths or (self.T,) * self.B))
        inputs = t * (2 * self.H * self.K + self.HV * (self.V + 2)) * size
        states = (2 if self.initial_state else 1) * n * self.HV * self.K * self.V * 4
        stages = chunks * self.HV * self.K * self.V * 4 + 3 * t * self.HV * max(self.K, self.V) * 4
        return inputs + t * self.HV * self.V * size + states + stages

    def describe(self) -> str:
        layout = f"varlen, {self.num_sequences} sequences" if self.lengths is not None else f"B={self.B}"
        return (
            f"{self.name}: {layout}, {self.tokens} tokens, H={self.H} HV={self.HV} K={self.K} V={self.V}"
            f"{', initial state' if self.initial_state else ''}; crosses {self.crosses}"
        )


def plan(limits: ScaleLimits = ScaleLimits(), seed: int = 0) -> list[ScaleCase]:
    """The cases, each just past its limit (sizes for the defaults in the comments, D = 128)."""
    grid, offset, chunk, D = limits.grid, limits.offset, limits.chunk, limits.head_dim
    H, HV = 4, 16
    per_state = HV * D * D
    # decode: 8194 requests x 16 heads = 131104 blocks; states of 8194 x 16 x 128 x 128 = 2.1e9 elements
    n = max(grid // HV, offset // per_state) + 2
    past_grid, past_offset = grid // HV + 1, offset // per_state + 1
    rng = np.random.default_rng(seed)
    short = tuple(int(x) for x in rng.integers(1, chunk + 1, n))
    # 64 samples of 16704 tokens x 16 heads x 128: the last sample starts at 2.2e9 elements
    samples = 64
    T = -(-offset // ((samples - 1) * HV * D)) + chunk
    past_sample = -(-offset // (T * HV * D))
    long_T = (offset // per_state + 2) * chunk  # 8194 chunks x 16 x 128 x 128 per-chunk states
    return [
        ScaleCase(
            "decode_batch",
            f"{n} requests x {HV} value heads past the launch-grid limit {grid}; initial and final "
            f"states past {offset} elements",
            n, 1, H, HV, D, D, initial_state=True, probes=_probes(0, past_grid, past_offset, n - 1),
        ),
        ScaleCase(
            "varlen_many_short",
            f"{n} sequences of 1-{chunk} tokens x {HV} value heads past {grid}; states past {offset} elements",
            1, sum(short), H, HV, D, D, lengths=short, initial_state=True,
            probes=_probes(0, past_grid, past_offset, n - 1),
        ),
        ScaleCase(
            "many_chunks",
            f"{grid + 2} chunks of {chunk} tokens in one sequence, past the launch-grid limit {grid}",
            1, (grid + 2) * chunk, 1, 1, D, D, probes=(0,), halves=True,
        ),
        ScaleCase(
            "batch_offset",
            f"the base of samples {past_sample}.. past {offset} elements of q, k, v and o",
            samples, T, HV, HV, D, D, probes=_probes(0, past_sample, samples - 1),
        ),
        ScaleCase(
            "varlen_offset",
            f"the start of sequences {past_sample}.. past {offset} elements of q, k, v and o",
            1, samples * T, HV, HV, D, D, lengths=(T,) * samples, probes=_probes(0, past_sample, samples - 1),
        ),
        ScaleCase(
            "long_sequence",
            f"per-chunk states of one sequence ({long_T // chunk} chunks x {HV} x {D} x {D}) past {offset} elements",
            1, long_T, H, HV, D, D, probes=(0,), halves=True,
        ),
    ]  # fmt: skip


def _probes(*indices: int) -> tuple[int, ...]:
    return tuple(sorted(set(indices)))


# ---- in the child: build, call, judge ------------------------------------------------------------


class _Device:
    """Random inputs made where the implementation's arrays live (NumPy, or torch on its device)."""

    def __init__(self, kind: str, seed: int):
        self.kind = kind
        if kind == "numpy":
            self.rng = np.random.default_rng(seed)
            return
        if kind != "torch":
            raise NotImplementedError(f"the scale tier makes its problems as NumPy or torch arrays, not {kind}")
        import torch

        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.gen = torch.Generator(device=self.device).manual_seed(seed)

    def _dtype(self, name: str) -> Any:
        return DTYPES[name] if self.kind == "numpy" else getattr(self.torch, name)

    def normal(self, shape: tuple[int, ...], dtype: str, scale: float = 1.0) -> Any:
        if self.kind == "numpy":
            return (scale * self.rng.standard_normal(shape)).astype(self._dtype(dtype))
        x = self.torch.randn(shape, generator=self.gen, device=self.device, dtype=self._dtype(dtype))
        return x.mul_(scale) if scale != 1.0 else x

    def uniform(self, shape: tuple[int, ...], low: float, high: float, dtype: str) -> Any:
        if self.kind == "numpy":
            return self.rng.uniform(low, high, shape).astype(self._dtype(dtype))
        x = self.torch.rand(shape, generator=self.gen, device=self.device, dtype=self.torch.float32)
        return x.mul_(high - low).add_(low).to(self._dtype(dtype))

    def index(self, values: np.ndarray) -> Any:
        return values if self.kind == "numpy" else self.torch.from_numpy(values).to(self.device)

    def cat(self, parts: list[Any], axis: int) -> Any:
        return np.concatenate(parts, axis) if self.kind == "numpy" else self.torch.cat(parts, axis)

    def contract(self, name: str, x: Any, want: tuple[int, ...]) -> str | None:
        """What is wrong with a returned ``x`` that should be an array of this device's kind, of
        shape ``want`` and floating point (None: nothing): the checks below read it on the device."""
        kind = "NumPy" if self.kind == "numpy" else f"torch ({self.device})"
        if x is None:
            return f"{name} is None, expected a {kind} array of shape {want}"
        if self.kind == "numpy":
            ok = isinstance(x, np.ndarray)
        else:
            ok = isinstance(x, self.torch.Tensor) and x.device.type == self.device
        if not ok:
            where = f" on {x.device}" if type(x).__module__.startswith(("torch", "cupy")) else ""
            return (
                f"{name} is a {type(x).__module__}.{type(x).__name__}{where}, expected a {kind} array of shape {want}"
            )
        if tuple(x.shape) != want:
            return f"{name} has shape {tuple(x.shape)}, expected {want}"
        if not (x.dtype.is_floating_point if self.kind == "torch" else floating(x)):
            return f"{name} has dtype {x.dtype}, expected a floating-point dtype"
        return None

    def all_finite(self, x: Any) -> bool:
        if x is None:
            return True
        if self.kind == "numpy":
            return bool(np.isfinite(np.asarray(x, np.float32)).all())
        return bool(self.torch.isfinite(x).all().item())

    def sync(self) -> None:
        if self.kind == "torch" and self.device == "cuda":
            self.torch.cuda.synchronize()

    def free_bytes(self) -> int | None:
        if self.kind == "torch" and self.device == "cuda":
            return int(self.torch.cuda.mem_get_info()[0])
        return None


def make_inputs(case: ScaleCase, dtype: str, dev: _Device) -> dict[str, Any]:
    """The case's arguments in the native convention: unit-scale q, k, v; gates in [-0.02, 0]
    (a memory of about a hundred tokens, so a wrong state shows in the outputs); beta in
    [0.1, 0.9]; a random initial state; q and k normalised in the kernel."""
    B, T, H, HV, K, V = case.B, case.T, case.H, case.HV, case.K, case.V
    cu = None if case.lengths is None else np.concatenate([[0], np.cumsum(case.lengths)]).astype(np.int64)
    return dict(
        q=dev.normal((B, T, H, K), dtype),
        k=dev.normal((B, T, H, K), dtype),
        v=dev.normal((B, T, HV, V), dtype),
        g=dev.uniform((B, T, HV), -0.02, 0.0, dtype),
        beta=dev.uniform((B, T, HV), 0.1, 0.9, dtype),
        scale=None,
        initial_state=dev.normal((case.num_sequences, HV, K, V), "float32", 0.1) if case.initial_state else None,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=None if cu is None else dev.index(cu),
    )


def _bounds(case: ScaleCase) -> np.ndarray:
    if case.lengths is None:
        return np.arange(case.B + 1, dtype=np.int64) * case.T
    return np.concatenate([[0], np.cumsum(case.lengths)]).astype(np.int64)


def _flat(x: Any) -> Any:
    """``[B, T, ...]`` as ``[B * T, ...]`` (a view)."""
    return x.reshape((x.shape[0] * x.shape[1],) + tuple(x.shape[2:]))


def _host(x: Any) -> np.ndarray:
    out = arrays.to_numpy(x)
    assert out is not None
    return out


def _pairs(case: ScaleCase) -> list[tuple[int, int]]:
    """(sequence, value head) pairs judged against the oracle: each probe at the first and last head."""
    return [(n, h) for n in case.probes for h in sorted({0, case.HV - 1})]


def sub_problem(case: ScaleCase, kw: dict[str, Any], pairs: list[tuple[int, int]]) -> Problem:
    """The probed (sequence, value head) pairs as one varlen problem with one head (``H = HV = 1``)."""
    bounds, group = _bounds(case), case.HV // case.H
    parts: dict[str, list[np.ndarray]] = {name: [] for name in ("q", "k", "v", "g", "beta")}
    states = []
    for n, h in pairs:
        s, e = bounds[n], bounds[n + 1]
        for name, head in (("q", h // group), ("k", h // group), ("v", h), ("g", h), ("beta", h)):
            parts[name].append(_host(_flat(kw[name])[s:e, head]))
        if kw["initial_state"] is not None:
            states.append(_host(kw["initial_state"][n, h]))
    lengths = [bounds[n + 1] - bounds[n] for n, _ in pairs]
    fields = {name: np.concatenate(p)[None, :, None] for name, p in parts.items()}  # one head: H = HV = 1
    return Problem(
        **fields,
        scale=None,
        initial_state=np.stack(states)[:, None] if states else None,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
    )


def take_pairs(o: Any, state: Any, pairs: list[tuple[int, int]], bounds: np.ndarray) -> Result:
    """The pairs' rows of a kernel's outputs (sequence ``n`` spans flat tokens ``bounds[n]..bounds[n + 1]``),
    in :func:`sub_problem`'s layout."""
    rows = [_host(_flat(o)[bounds[n] : bounds[n + 1], h]) for n, h in pairs]
    got_state = None if state is None else np.stack([_host(state[n, h]) for n, h in pairs])[:, None]
    return Result(np.concatenate(rows)[None, :, None], got_state, None, None)


def _split(case: ScaleCase, kw: dict[str, Any], call: Callable, dev: _Device, pairs) -> Result:
    """The same kernel on the probed sequences alone (one long sequence: its two halves)."""
    if case.halves:
        mid = case.T // 2
        first = dict(kw, **{name: kw[name][:, :mid] for name in ("q", "k", "v", "g", "beta")})
        o1, s1 = call(first)
        second = dict(kw, **{name: kw[name][:, mid:] for name in ("q", "k", "v", "g", "beta")}, initial_state=s1)
        o2, s2 = call(second)
        return take_pairs(dev.cat([o1, o2], 1), s2, [(0, h) for _, h in pairs], _bounds(case))
    bounds = _bounds(case)
    probes = list(case.probes)
    initial = kw["initial_state"]
    sub = dict(kw, initial_state=None if initial is None else initial[dev.index(np.array(probes))])
    if case.lengths is None:
        picked = dev.index(np.array(probes))
        sub.update({name: kw[name][picked] for name in ("q", "k", "v", "g", "beta")})
        local = np.arange(len(probes) + 1, dtype=np.int64) * case.T
    else:
        take = np.concatenate([np.arange(bounds[n], bounds[n + 1]) for n in probes])
        picked = dev.index(take)
        sub.update({name: _flat(kw[name])[picked][None] for name in ("q", "k", "v", "g", "beta")})
        local = np.concatenate([[0], np.cumsum([bounds[n + 1] - bounds[n] for n in probes])]).astype(np.int64)
        sub["cu_seqlens"] = dev.index(local)
    o, state = call(sub)
    where = {n: i for i, n in enumerate(probes)}
    return take_pairs(o, state, [(where[n], h) for n, h in pairs], local)


def expected_shapes(kw: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ``o`` ``[B, T, HV, V]`` and k-first final state ``[N, HV, K, V]`` a call on ``kw`` returns."""
    B, T, _, K = kw["q"].shape
    HV, V = kw["v"].shape[2:]
    N = B if kw["cu_seqlens"] is None else len(kw["cu_seqlens"]) - 1
    return (B, T, HV, V), (N, HV, K, V)


def checked_call(fn: Callable, dev: _Device) -> Callable[[dict[str, Any]], tuple[Any, Any]]:
    """``fn`` called on a case's arguments, its return held to the output contract before anything
    reads it: a pair, each an array of the inputs' kind (on their device), of the expected shape,
    floating point. Anything else is a :class:`Violation` (``output contract: ...``) naming what came
    back and what was expected, never an error in the indexing that follows."""

    def call(kw: dict[str, Any]) -> tuple[Any, Any]:
        try:
            o, state = returned_pair(fn(**kw))
        except ContractError as exc:
            raise Violation(f"output contract: {exc}") from None
        want_o, want_s = expected_shapes(kw)
        bad = [x for x in (dev.contract("o", o, want_o), dev.contract("final_state", state, want_s)) if x]
        if bad:
            raise Violation("output contract: " + "; ".join(bad))
        return o, state

    return call


def _probe_case(case: ScaleCase, H: int) -> ScaleCase:
    """``case``'s shape class (heads, sizes, layout, initial state) at a few tokens: what its own
    first call compiles, so a probe costs a JIT kernel no extra compilation."""
    if case.lengths is None:
        return dataclasses.replace(case, B=2, T=2, H=H, probes=(0,), halves=False)
    return dataclasses.replace(case, B=1, T=3, H=H, lengths=(1, 2), probes=(0,), halves=False)


def missing_gva(
    impl: Implementation, case: ScaleCase, dtype: str, dev: _Device, call: Callable[[dict[str, Any]], Any]
) -> str | None:
    """Why ``impl`` cannot run ``case``'s grouped value heads (``HV`` a multiple ``> 1`` of ``H``), or
    None when it can (or the case has none). A declaration ``impl.extra["gva"]`` (True or False)
    decides; otherwise a first call on :func:`_probe_case` does: GVA is missing when that call raises
    or breaks the output contract (old FLA releases return ``[B, T, H, V]``) while the same call with
    ``H = HV`` does not. When both fail, GVA is not the reason: the case runs as planned."""
    if case.H == case.HV:
        return None
    declared = impl.extra.get("gva")
    if declared is not None:
        return None if declared else 'it declares no GVA (extra["gva"] = False)'

    def attempt(H: int) -> str | None:
        try:
            call(make_inputs(_probe_case(case, H), dtype, dev))
        except Violation as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - NotImplementedError or any other refusal
            return f"raised {type(exc).__name__}: {exc}"
        return None

    why = attempt(case.H)
    if why is None or attempt(case.HV) is not None:
        return None
    return f"H={case.H}, HV={case.HV} {why}" if why.startswith("raised") else f"with H={case.H}, HV={case.HV}: {why}"


def adapted_to_gva(case: ScaleCase, why: str) -> ScaleCase:
    """``case`` with ``H = HV``: the same tokens, value heads and state elements, so the same launch
    grids and int32 offsets are crossed (q and k grow by HV / H), saying so in ``crosses``."""
    return dataclasses.replace(
        case, H=case.HV, crosses=f"{case.crosses}; adapted: H = HV = {case.HV}, the kernel has no GVA ({why})"
    )


def _where(pairs: list[tuple[int, int]]) -> str:
    return "probed sequences (sub-problem index: sequence, value head): " + ", ".join(
        f"{i}: ({n}, {h})" for i, (n, h) in enumerate(pairs)
    )


def cached_reference(problem: Problem, oracle: Oracle) -> tuple[tuple, Any]:
    """``oracle_and_tolerance(problem, oracle)``, kept in ``$GDN_VERIFY_SCALE_CACHE`` (a directory)
    when set: every implementation of one input kind and dtype meets the same inputs (they come
    from the seed), so the oracle and condition estimate of a case (minutes for
    ``scale_many_chunks``) are paid once per machine, not once per implementation."""
    folder = os.environ.get(CACHE_ENV)
    if not folder:
        return oracle_and_tolerance(problem, oracle)
    path = Path(folder) / f"{problem_digest(problem)}.pickle"
    if path.exists():
        with path.open("rb") as f:
            return pickle.load(f)
    value = oracle_and_tolerance(problem, oracle)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with tmp.open("wb") as f:
        pickle.dump(value, f)
    tmp.replace(path)
    return value


# The cases one launch of a token-per-step adapter still crosses: a step holds one token of every
# running sequence, so only the sequence count (the grid) and the state pool (its offsets) grow.
TOKEN_STEP_CASES = ("decode_batch", "varlen_many_short")


def per_token_launches(impl: Implementation, case: ScaleCase) -> str | None:
    """Why ``case`` crosses nothing in ``impl``'s launches, or None. An adapter declaring
    ``extra["token_steps"]`` launches its kernel once per token step with that step's rows copied
    into fresh tensors (FlashInfer's decode, vLLM's packed decode), so a long sequence or a token
    past 2^31 elements reaches no limit of a launch, and the case would cost a launch per token."""
    if not impl.extra.get("token_steps") or case.name in TOKEN_STEP_CASES:
        return None
    steps = case.T if case.lengths is None else max(case.lengths)
    return (
        f'{impl.name} launches its kernel once per token step, each step\'s rows copied (extra["token_steps"]): '
        f"this case ({case.crosses}) reaches no limit of one launch, and would take {steps} launches"
    )


def run_case(
    impl: Implementation, case: ScaleCase, dtype: str, oracle: Oracle, seed: int = 0, free_bytes: int | None = None
) -> dict[str, Any]:
    """Build, call and judge one case in this process; the outcome as a JSON-able dict."""
    if (why := per_token_launches(impl, case)) is not None:
        return dict(case=case.name, crosses=case.crosses, describe=case.describe(), seconds={}, status="unsupported",
                    message=why)  # fmt: skip
    dev = _Device(impl.array, seed)
    call = checked_call(impl.forms[impl.default_form], dev)
    why = missing_gva(impl, case, dtype, dev, call)
    if why is not None:
        case = adapted_to_gva(case, why)
    out: dict[str, Any] = dict(case=case.name, crosses=case.crosses, describe=case.describe(), seconds={})
    if why is not None:
        out["adapted"] = f"H = HV = {case.HV}: {why}"
    need = case.device_bytes(dtype, ScaleLimits().chunk)
    free = dev.free_bytes() if free_bytes is None else free_bytes
    if free is not None and need > MEMORY_MARGIN * free:
        return dict(out, status="skipped", message=f"needs about {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free")
    clock = time.perf_counter()
    kw = make_inputs(case, dtype, dev)
    dev.sync()
    out["seconds"]["inputs"] = round(time.perf_counter() - clock, 2)
    clock = time.perf_counter()
    try:
        o, state = call(kw)
        dev.sync()
    except NotImplementedError as exc:
        return dict(out, status="unsupported", message=str(exc) or type(exc).__name__)
    except Violation as exc:
        return dict(out, status="failed", message=str(exc), worst=None)
    out["seconds"]["call"] = round(time.perf_counter() - clock, 2)
    pairs = _pairs(case)
    try:
        for name, x in (("o", o), ("final_state", state)):
            if not dev.all_finite(x):
                raise Violation(f"{name} holds NaN or Inf")
        clock = time.perf_counter()
        problem = sub_problem(case, kw, pairs)
        got = take_pairs(o, state, pairs, _bounds(case))
        reference, tolerance = cached_reference(problem, oracle)
        out["seconds"]["oracle"] = round(time.perf_counter() - clock, 2)
        try:
            m = compare(problem, got, reference, tolerance)
        except Violation as exc:
            raise Violation(f"against the float64 oracle: {exc}; {_where(pairs)}", exc.measurement) from None
        clock = time.perf_counter()
        split = _split(case, kw, call, dev, pairs)
        out["seconds"]["split"] = round(time.perf_counter() - clock, 2)
        what = "its two halves" if case.halves else "the probed sequences alone"
        split64 = (np.asarray(split.o, np.float64), split.final_state)
        try:
            s = compare(problem, got, split64, tolerance, SPLIT_FACTOR, what=f"same kernel on {what}")
        except Violation as exc:
            raise Violation(f"against the same kernel on {what}: {exc}; {_where(pairs)}", exc.measurement) from None
    except Violation as exc:
        m_fail = exc.measurement
        return dict(out, status="failed", message=str(exc), worst=None if m_fail is None else asdict(m_fail))
    return dict(out, status="passed", message="", worst=asdict(m), split=asdict(s))


# ---- in the parent: one child per case ------------------------------------------------------------


@dataclass
class ScaleOutcome:
    """One case's verdict: passed, failed (a wrong result, an exception, a dead child), timeout,
    skipped (does not fit), unsupported (the implementation raised NotImplementedError)."""

    case: str
    status: str
    message: str
    describe: str
    seconds: float
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def worst(self) -> Measurement | None:
        w = self.detail.get("worst")
        return None if not w else Measurement(**w)


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_scale(
    impl_name: str,
    dtype: str,
    *,
    array: str | None = None,
    convention: str = "native",
    limits: ScaleLimits = ScaleLimits(),
    cases: list[str] | None = None,
    seed: int = 0,
    timeout: float | None = None,
    on_case: Callable[[ScaleOutcome], None] | None = None,
    on_start: Callable[[ScaleCase], None] | None = None,
) -> list[ScaleOutcome]:
    """Each case of :func:`plan` in a child process; ``cases`` narrows them by name; ``timeout``:
    seconds a child may take (inputs, calls, oracle; None: no limit)."""
    chosen = [c for c in plan(limits, seed) if cases is None or c.name in cases]
    outcomes = []
    for case in chosen:
        if on_start is not None:
            on_start(case)
        outcomes.append(_run_child(impl_name, dtype, array, convention, limits, case.name, seed, timeout, case))
        if on_case is not None:
            on_case(outcomes[-1])
    return outcomes


def _run_child(impl_name, dtype, array, convention, limits, name, seed, timeout, case) -> ScaleOutcome:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result_path = Path(tmp) / "result.json"
        spec = dict(
            impl=impl_name, dtype=dtype, array=array, convention=convention, limits=asdict(limits), case=name, seed=seed
        )
        command = [sys.executable, "-m", "gdn_verify.runners.scale", json.dumps(spec), str(result_path)]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=os.environ.copy())
        except subprocess.TimeoutExpired as exc:
            text = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            return ScaleOutcome(
                name, "timeout", f"did not finish in {exc.timeout:.0f} s\n{_tail(text)}", case.describe(), exc.timeout
            )
        seconds = time.perf_counter() - start
        if result_path.exists():
            d = json.loads(result_path.read_text())
            return ScaleOutcome(name, d["status"], d["message"], d["describe"], seconds, d)
    how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
    return ScaleOutcome(
        name, "failed", f"the call died ({how}):\n{_tail(proc.stderr or proc.stdout)}", case.describe(), seconds
    )


def _kernel_frames(exc: BaseException, frames: int = 6) -> str:
    """The innermost frames of ``exc``'s traceback: the launch that failed, in the kernel's own files."""
    return "".join(traceback.format_list(traceback.extract_tb(exc.__traceback__)[-frames:])).rstrip()


def _child(spec_text: str, result_path: str) -> None:
    from gdn_verify.implementations import choose_oracle, resolve

    spec = json.loads(spec_text)
    impl = resolve(spec["impl"], spec["array"], spec["convention"])
    limits = ScaleLimits(**spec["limits"])
    case = next(c for c in plan(limits, spec["seed"]) if c.name == spec["case"])
    _, oracle = choose_oracle(impl.array)
    try:
        result = run_case(impl, case, spec["dtype"], oracle, spec["seed"])
    except Exception as exc:  # noqa: BLE001 - any exception of the kernel is the verdict
        result = dict(
            case=case.name,
            describe=case.describe(),
            status="failed",
            message=f"{type(exc).__name__}: {exc}",
            traceback=_kernel_frames(exc),
        )
    Path(result_path).write_text(json.dumps(result, default=float))


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
    sys.stdout.flush()
    os._exit(0)  # a CUDA context left broken must not hang the exit
