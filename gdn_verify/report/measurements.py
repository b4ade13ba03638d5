"""The measurements behind a report: error against length, error distributions, the error map
of a varlen pack, and error against gate strength and beta, for several implementations on
identical inputs.

Inputs are drawn once from a seeded NumPy generator in float64 in the native convention and
rounded to each dtype; every implementation of a dtype sees the same rounded inputs, and the
float64 oracle runs on those rounded inputs, so an error is the implementation's own.
Results are JSON-ready dicts (NaN where an output was not finite); the per-token error maps
are returned as arrays beside them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gdn_verify.core import error_stats
from gdn_verify.core import tolerance as tol
from gdn_verify.core.implementation import Implementation
from gdn_verify.core.oracle import Oracle
from gdn_verify.core.problem import DTYPES, Problem

CHUNK = 64  # the chunk size of the kernels under study; its boundaries are marked on the error map
GATE_SWEEP = (0.0, -0.001, -0.01, -0.1, -1.0, -3.0, -10.0, -20.0, -40.0, -60.0)
SPIKE = -1e4  # saturated single tokens, the last point of the gate sweep
BETA_SWEEP = (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0)


@dataclass(frozen=True)
class Sizes:
    """Problem sizes: heads ``H, HV``, head dims ``K, V``, the longest ``T`` of the length sweep,
    the sequence lengths of the varlen pack behind the error map, and ``T`` of the gate/beta sweeps."""

    name: str
    H: int
    HV: int
    K: int
    V: int
    max_tokens: int
    pack_lengths: tuple[int, ...]
    sweep_tokens: int


# Pack lengths mix 1-token sequences, C-1, C, C+1, multiples and ragged tails, so chunk and
# sequence boundaries fall everywhere relative to each other.
FULL = Sizes("full", 4, 8, 128, 128, 16384, (1000, 1, 777, 64, 2000, 63, 129, 33), 1024)
SMALL = Sizes("small", 4, 8, 32, 32, 1024, (100, 1, 130, 64, 63, 200, 65), 256)


def sweep_lengths(max_tokens: int) -> list[int]:
    """64, 128, ... doubling up to ``max_tokens``, which is always the last length."""
    lengths = [T for T in (64 * 2**i for i in range(20)) if T < max_tokens]
    return lengths + [max_tokens]


def decay_rates(HV: int) -> np.ndarray:
    """``[HV]`` per value head decay rates, log-spaced 1e-4 .. 0.3 (memory ~10^4 down to ~3 tokens),
    like the spread of ``exp(A_log)`` across a real model's heads."""
    return np.logspace(-4, np.log10(0.3), HV)


def make_problem(
    rng: np.random.Generator,
    sizes: Sizes,
    lengths: list[int] | None = None,
    T: int | None = None,
    g: np.ndarray | float | None = None,
    beta: np.ndarray | float | None = None,
    initial_state: bool = False,
) -> Problem:
    """A float64 problem with ``B = 1``: one sequence of ``T`` tokens, or a varlen pack of ``lengths``.

    q, k standard normal with ``use_qk_l2norm_in_kernel`` (how models call the kernel), v
    standard normal, ``g`` per-head decays (see :func:`decay_rates`) unless given, ``beta``
    uniform in [0, 1] unless given, a standard normal float32 initial state when asked.
    """
    total = sum(lengths) if lengths is not None else T
    H, HV, K, V = sizes.H, sizes.HV, sizes.K, sizes.V
    q = rng.standard_normal((1, total, H, K))
    k = rng.standard_normal((1, total, H, K))
    v = rng.standard_normal((1, total, HV, V))
    if g is None:
        g = -decay_rates(HV) * rng.uniform(0.5, 1.5, (1, total, HV))
    beta = rng.uniform(0.0, 1.0, (1, total, HV)) if beta is None else beta
    g = np.broadcast_to(np.asarray(g, np.float64), (1, total, HV)).copy()
    beta = np.broadcast_to(np.asarray(beta, np.float64), (1, total, HV)).copy()
    cu = None if lengths is None else np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    N = 1 if lengths is None else len(lengths)
    state = rng.standard_normal((N, HV, K, V)).astype(np.float32) if initial_state else None
    return Problem(q, k, v, g, beta, initial_state=state, use_qk_l2norm_in_kernel=True, cu_seqlens=cu)


def oracle_prefixes(oracle: Oracle, problem: Problem, lengths: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Oracle output over all ``lengths[-1]`` tokens and the final state after each prefix length.

    The sequence is run in segments between consecutive lengths, each starting from the float64
    state the previous one ended with: one pass yields every prefix's final state.
    """
    outputs, states, state, start = [], [], problem.initial_state, 0
    for end in lengths:
        part = problem.tokens(start, end, state)
        o, state = oracle(part)
        outputs.append(o)
        states.append(state)
        start = end
    return np.concatenate(outputs, axis=1), states


def _finite_or_none(x: float) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def _failure(exc: BaseException) -> str:
    if isinstance(exc, NotImplementedError):
        return f"unsupported: {exc}"
    return f"raised {type(exc).__name__}: {exc}"


Step = Callable[[str], None]


class Runner:
    """Runs every experiment for ``impls`` x ``dtypes`` on one seed; ``step(label)`` reports progress."""

    def __init__(
        self,
        impls: list[Implementation],
        dtypes: list[str],
        sizes: Sizes,
        seed: int,
        oracle: Oracle,
        step: Step | None = None,
    ):
        self.impls, self.dtypes, self.sizes, self.seed, self.oracle = impls, dtypes, sizes, seed, oracle
        self.step = step or (lambda label: None)
        self.lengths = sweep_lengths(sizes.max_tokens)

    def steps(self) -> int:
        """Number of ``step`` calls :meth:`run` makes (for a progress bar)."""
        per_dtype = 2 + len(GATE_SWEEP) + 1 + len(BETA_SWEEP)  # oracle calls
        per_impl = len(self.lengths) + 2 + len(GATE_SWEEP) + 1 + len(BETA_SWEEP)
        return len(self.dtypes) * (per_dtype + len(self.impls) * per_impl)

    def _rng(self, stream: int) -> np.random.Generator:
        # One stream per experiment so that changing one experiment leaves the others' inputs alone.
        return np.random.default_rng([self.seed, stream])

    def run(self) -> tuple[dict, dict[tuple[str, str], np.ndarray]]:
        """``(results, error maps)``: JSON-ready sections and ``{(impl, dtype): [tokens, HV]}`` arrays."""
        growth = make_problem(self._rng(1), self.sizes, T=self.lengths[-1])
        pack = make_problem(self._rng(2), self.sizes, lengths=list(self.sizes.pack_lengths), initial_state=True)
        results = dict(
            error_vs_length=[],
            rounding_floor={},
            distributions=[],
            gate_sweep=self._sweep_header("g"),
            beta_sweep=self._sweep_header("beta"),
            error_map=dict(lengths=list(self.sizes.pack_lengths), chunk=CHUNK, entries=[]),
        )
        maps: dict[tuple[str, str], np.ndarray] = {}
        for dtype in self.dtypes:
            self._length_sweep(growth.astype(DTYPES[dtype]), dtype, results)
            self._error_map(pack.astype(DTYPES[dtype]), dtype, results, maps)
            for axis in ("g", "beta"):
                self._gate_beta_sweep(axis, dtype, results)
        return results, maps

    # 1 and 2: error against length; distributions at the longest length -----------------------
    def _length_sweep(self, problem: Problem, dtype: str, results: dict) -> None:
        self.step(f"oracle, {dtype}, T={self.lengths[-1]}")
        ref_o, ref_states = oracle_prefixes(self.oracle, problem, self.lengths)
        results["rounding_floor"][dtype] = dict(
            lengths=self.lengths,
            output_rms=[
                error_stats.rounding_floor(ref_o[:, :T], DTYPES[dtype], np.array([0, T])) for T in self.lengths
            ],
        )
        for impl in self.impls:
            entry = dict(impl=impl.name, dtype=dtype, lengths=[], output_rms=[], output_token=[], state=[])
            results["error_vs_length"].append(entry)
            try:
                for T, ref_state in zip(self.lengths, ref_states):
                    self.step(f"{impl.name}, {dtype}, T={T}")
                    part = problem.tokens(0, T)
                    out = impl.run(part)
                    errors = tol.measure(out.o, out.final_state, ref_o[:, :T], ref_state, part)
                    entry["lengths"].append(T)
                    for name in ("output_rms", "output_token", "state"):
                        entry[name].append(_finite_or_none(getattr(errors, name)))
                entry["exponent"] = error_stats.growth_exponent(entry["lengths"], entry["output_rms"])
                entry["output_dtype"] = out.o_dtype
                self.step(f"{impl.name}, {dtype}, distributions")
                results["distributions"].append(self._distribution(impl, dtype, out.o, ref_o))
            except Exception as exc:  # noqa: BLE001 - a failing kernel is a finding, not a crash
                entry["error"] = _failure(exc)

    def _distribution(self, impl: Implementation, dtype: str, o: np.ndarray, ref: np.ndarray) -> dict:
        o = np.asarray(o)
        if o.dtype.kind != "f" and o.dtype != DTYPES["bfloat16"]:
            o = o.astype(np.float64)
        return dict(
            impl=impl.name,
            dtype=dtype,
            output_dtype=o.dtype.name,
            tokens=int(ref.shape[1]),
            relative_error=error_stats.relative_error_histogram(error_stats.elementwise_relative_error(o, ref)),
            ulp=error_stats.ulp_statistics(o, ref),
        )

    # 3: where the error is ----------------------------------------------------------------------
    def _error_map(self, problem: Problem, dtype: str, results: dict, maps: dict) -> None:
        self.step(f"oracle, {dtype}, varlen pack")
        ref_o, _ = self.oracle(problem)
        bounds = problem.bounds
        starts = np.repeat(bounds[:-1], np.diff(bounds))  # sequence start of every token
        position = np.arange(bounds[-1]) - starts  # token position within its sequence
        for impl in self.impls:
            self.step(f"{impl.name}, {dtype}, varlen pack")
            entry = dict(impl=impl.name, dtype=dtype)
            results["error_map"]["entries"].append(entry)
            try:
                out = impl.run(problem)
            except Exception as exc:  # noqa: BLE001
                entry["error"] = _failure(exc)
                continue
            errors = tol.token_errors(out.o, ref_o, bounds)
            maps[(impl.name, dtype)] = errors
            flat = np.nan_to_num(errors, nan=np.inf)
            t, h = np.unravel_index(np.argmax(flat), flat.shape)
            per_token = errors.mean(axis=1)
            in_chunk = position % CHUNK
            entry.update(
                worst=dict(
                    error=_finite_or_none(errors[t, h]),
                    token=int(t),
                    head=int(h),
                    sequence=int(np.searchsorted(bounds, t, side="right") - 1),
                    position=int(position[t]),
                ),
                mean=_finite_or_none(np.mean(errors)),
                # Mean over heads and tokens at each position within a chunk: a boundary bug peaks at 0 or C-1.
                by_position_in_chunk=[
                    _finite_or_none(np.mean(per_token[in_chunk == i])) if np.any(in_chunk == i) else None
                    for i in range(CHUNK)
                ],
            )

    # 4: error against gate strength and beta ----------------------------------------------------
    def _sweep_header(self, axis: str) -> dict:
        if axis == "g":
            labels = [f"{g:g}" for g in GATE_SWEEP] + [f"spikes {SPIKE:g}"]
        else:
            labels = [f"{b:g}" for b in BETA_SWEEP]
        return dict(
            axis=axis,
            labels=labels,
            values=list(GATE_SWEEP) + [SPIKE] if axis == "g" else list(BETA_SWEEP),
            tokens=self.sizes.sweep_tokens,
            rounding_floor={},
            entries=[],
        )

    def _sweep_problems(self, axis: str) -> list[Problem]:
        T, HV = self.sizes.sweep_tokens, self.sizes.HV
        problems = []
        if axis == "g":
            for i, g in enumerate(GATE_SWEEP):
                problems.append(make_problem(self._rng(10 + i), self.sizes, T=T, g=g, initial_state=True))
            rng = self._rng(10 + len(GATE_SWEEP))
            g = -decay_rates(HV) * rng.uniform(0.5, 1.5, (1, T, HV))
            g[:, rng.choice(T, size=max(1, T // 16), replace=False)] = SPIKE  # every head at once
            problems.append(make_problem(rng, self.sizes, T=T, g=g, initial_state=True))
        else:
            for i, beta in enumerate(BETA_SWEEP):
                problems.append(make_problem(self._rng(30 + i), self.sizes, T=T, beta=beta, initial_state=True))
        return problems

    def _gate_beta_sweep(self, axis: str, dtype: str, results: dict) -> None:
        section = results["gate_sweep" if axis == "g" else "beta_sweep"]
        problems = [p.astype(DTYPES[dtype]) for p in self._sweep_problems(axis)]
        refs = []
        for label, p in zip(section["labels"], problems):
            self.step(f"oracle, {dtype}, {axis}={label}")
            refs.append(self.oracle(p))
        section["rounding_floor"][dtype] = [
            error_stats.rounding_floor(r[0], DTYPES[dtype], p.bounds) for r, p in zip(refs, problems)
        ]
        for impl in self.impls:
            entry = dict(impl=impl.name, dtype=dtype, output_rms=[], state=[])
            section["entries"].append(entry)
            for label, p, (ref_o, ref_s) in zip(section["labels"], problems, refs):
                self.step(f"{impl.name}, {dtype}, {axis}={label}")
                try:
                    out = impl.run(p)
                except Exception as exc:  # noqa: BLE001
                    entry["error"] = _failure(exc)
                    break
                errors = tol.measure(out.o, out.final_state, ref_o, ref_s, p)
                entry["output_rms"].append(_finite_or_none(errors.output_rms))
                entry["state"].append(_finite_or_none(errors.state))
