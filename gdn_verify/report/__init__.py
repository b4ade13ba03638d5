"""``python cli.py report``: run the experiments and the property suite for several implementations
and write a self-contained report directory (index.html, report.md, results.json, PNG figures).

Sizes: on a machine with a usable CUDA GPU (and without ``--quick``) H=4, HV=8, K=V=128 and
T up to 16384, with the float64 GPU recurrence (``cupy-oracle``) as the oracle; otherwise
K=V=32 and T up to 1024 with the NumPy oracle. Implementations that cannot run here are
listed as skipped with the reason; the report is made for the rest.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from gdn_verify.core import arrays

from gdn_verify.report import environment

from gdn_verify.report import measurements as experiments

from gdn_verify import implementations
from gdn_verify.implementations import ConfigurationError, Implementation
from gdn_verify.core.problem import DTYPES

GPU_DEFAULTS = ("cupy-chunk", "cupy-recurrent", "fla-chunk", "fla-recurrent")
CPU_DEFAULTS = ("numpy", "numpy-recurrent")
DEFAULT_DTYPES = ("float32", "bfloat16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``report`` subcommand's options (cheap to import: no matplotlib here)."""
    parser.add_argument("--impl", action="append",
                        help="implementation to include; repeat to compare several (default: the CuPy and FLA "
                             f"kernels on a GPU, else {', '.join(CPU_DEFAULTS)})")
    parser.add_argument("--array", choices=arrays.ARRAY_KINDS, help="array type a MODULE:FUNCTION takes")
    parser.add_argument("--dtype", action="append", help=f"input dtype; repeat for several "
                                                         f"(default: {' and '.join(DEFAULT_DTYPES)})")
    parser.add_argument("--out", help="report directory (default: reports/report-<UTC date and time>)")
    parser.add_argument("--max-tokens", type=int, help="longest T of the length sweep (default 16384 on a GPU, "
                                                       "1024 on CPU or with --quick)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the inputs and of the property suite (default 0)")
    parser.add_argument("--quick", action="store_true", help="small sizes and 10 examples per property, even on a GPU")
    parser.add_argument("--max-examples", type=int, help="examples per property (default 20, 10 with --quick)")
    parser.add_argument("--properties", help="comma-separated subset of the properties to run (default: all)")
    parser.add_argument("--dims", help="head sizes K, V the property suite draws, e.g. 128 (default: every size; "
                                       "the figures use K = V = 128, or 32 on CPU)")


class ProgressBar:
    """A one-line progress bar on stderr; on a non-terminal, one line per 10 % of the work."""

    def __init__(self, total: int, stream=None, width: int = 28):
        self.total, self.done, self.width = max(total, 1), 0, width
        self.stream = stream if stream is not None else sys.stderr
        self.live = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.last_draw, self.last_decile = 0.0, -1

    def step(self, label: str) -> None:
        """One unit of work is starting: ``label`` says which."""
        self.done = min(self.done + 1, self.total)
        self._draw(label, force=True)

    def note(self, label: str) -> None:
        """Progress inside the current unit (throttled)."""
        self._draw(label, force=False)

    def _draw(self, label: str, force: bool) -> None:
        fraction = self.done / self.total
        if self.live:
            now = time.monotonic()
            if not force and now - self.last_draw < 0.1:
                return
            self.last_draw = now
            filled = int(self.width * fraction)
            line = f"\r[{'#' * filled}{'.' * (self.width - filled)}] {fraction:4.0%} {label[:60]:<60}"
            self.stream.write(line)
            self.stream.flush()
        elif int(fraction * 10) > self.last_decile:
            self.last_decile = int(fraction * 10)
            self.stream.write(f"  [{fraction:4.0%}] {label}\n")
            self.stream.flush()

    def close(self) -> None:
        if self.live:
            self.stream.write("\r" + " " * (self.width + 70) + "\r")
            self.stream.flush()


def gpu_usable() -> bool:
    """A CUDA GPU is visible to CuPy or to torch."""
    for kind in ("cupy", "torch"):
        try:
            arrays.check_kind(kind)
        except arrays.ArrayKindUnavailable:
            continue
        if kind == "cupy":
            return True
        import torch

        return bool(torch.cuda.is_available())
    return False


def resolve_all(names: list[str] | None, array: str | None) -> tuple[list[Implementation], list[dict]]:
    """``(implementations, skipped)``; a name nobody knows is misuse, one that cannot run here is skipped."""
    defaulted = not names
    names = list(dict.fromkeys(names or GPU_DEFAULTS))
    impls, skipped = [], []
    for name in names:
        if name not in implementations.names() and ":" not in name:
            raise ConfigurationError(f"--impl {name!r}: unknown; choose from {', '.join(implementations.names())} "
                                     "or MODULE:FUNCTION")
        try:
            impls.append(implementations.resolve(name, array if ":" in name else None))
        except ConfigurationError as exc:
            skipped.append(dict(impl=name, reason=str(exc)))
    if defaulted and not impls:
        impls = [implementations.resolve(name) for name in CPU_DEFAULTS]
    if not impls:
        raise ConfigurationError("report: no implementation can run here (" +
                                 "; ".join(f"{s['impl']}: {s['reason']}" for s in skipped) + ")")
    return impls, skipped


def _properties(text: str | None) -> list[str]:
    from gdn_verify.properties.native import PROPERTIES

    if not text:
        return list(PROPERTIES)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROPERTIES]
    if unknown or not names:
        raise ConfigurationError(f"--properties: unknown {', '.join(unknown) or '(empty)'}; "
                                 f"choose from {', '.join(PROPERTIES)}")
    return names


@dataclasses.dataclass
class Options:
    impls: list[Implementation]
    skipped: list[dict]
    dtypes: list[str]
    sizes: experiments.Sizes
    seed: int
    out: Path
    max_examples: int
    properties: list[str]
    head_dims: tuple[int, ...] | None = None


def parse_options(args: argparse.Namespace) -> Options:
    """Validate the command line; raises :class:`ConfigurationError` on misuse."""
    dtypes = list(dict.fromkeys(args.dtype or DEFAULT_DTYPES))
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise ConfigurationError(f"--dtype {bad[0]!r}: choose from {', '.join(DTYPES)}")
    if args.max_tokens is not None and not 16 <= args.max_tokens <= 1 << 20:
        raise ConfigurationError("--max-tokens must be between 16 and 1048576")
    if args.max_examples is not None and args.max_examples < 1:
        raise ConfigurationError("--max-examples must be at least 1")
    properties = _properties(args.properties)
    impls, skipped = resolve_all(args.impl, args.array)
    sizes = experiments.FULL if not args.quick and gpu_usable() else experiments.SMALL
    if args.max_tokens is not None:
        sizes = dataclasses.replace(sizes, max_tokens=args.max_tokens)
    out = Path(args.out) if args.out else Path("reports") / time.strftime("report-%Y%m%d-%H%M%S", time.gmtime())
    if out.exists() and not out.is_dir():
        raise ConfigurationError(f"--out {out}: exists and is not a directory")
    max_examples = args.max_examples or (10 if args.quick else 20)
    from gdn_verify.runners.check import parse_head_dims

    head_dims = parse_head_dims(getattr(args, "dims", None))
    return Options(impls, skipped, dtypes, sizes, args.seed, out, max_examples, properties, head_dims)


def replay_command(case: str, impl: Implementation) -> str:
    extra = f" --array {impl.array}" if ":" in impl.name and impl.array != "numpy" else ""
    return f"python cli.py replay {shlex.quote(case)} --impl {shlex.quote(impl.name)}{extra}"


def run_properties(options: Options, bar: ProgressBar) -> list[dict]:
    """The property suite per (implementation, dtype), as ``check --json`` rows plus replay commands."""
    from gdn_verify.runners.check import CheckOptions, run_check

    rows = []
    for impl in options.impls:
        for dtype in options.dtypes:
            row = dict(impl=impl.name, dtype=dtype, results=[])
            rows.append(row)
            check = CheckOptions(dtype=dtype, max_examples=options.max_examples, seed=options.seed,
                                 cases_dir=options.out / "cases", max_tokens=min(options.sizes.max_tokens, 2048),
                                 head_dims=options.head_dims)
            label = f"check {impl.name}, {dtype}"
            for name in options.properties:
                bar.step(f"{label}: {name}")
                try:
                    (result,) = run_check(impl, [name], check,
                                          progress=lambda p, n, w, label=label: bar.note(f"{label}: {p} ({n})"))
                except Exception as exc:  # noqa: BLE001 - the suite itself broke on this implementation
                    row["results"].append(dict(name=name, status="error", examples=0, unsupported=0, note=(
                        f"the property runner raised {type(exc).__name__}: {exc}")))
                    continue
                d = result.as_dict()
                if d.get("failure") and d["failure"].get("case"):
                    d["failure"]["replay"] = replay_command(d["failure"]["case"], impl)
                row["results"].append(d)
    return rows


def summarize(results: dict, properties: list[dict]) -> list[dict]:
    """One row per (implementation, dtype): the numbers a kernel author compares first."""
    rows = []
    for e in results["error_vs_length"]:
        impl, dtype = e["impl"], e["dtype"]
        row = dict(impl=impl, dtype=dtype, error=e.get("error"))
        if e["lengths"]:
            floor = results["rounding_floor"][dtype]
            row.update(tokens=e["lengths"][-1], output_rms=e["output_rms"][-1], state=e["state"][-1],
                       floor=floor["output_rms"][len(e["lengths"]) - 1], exponent=e.get("exponent"))
            if row["output_rms"] is not None and row["floor"]:
                row["times_floor"] = row["output_rms"] / row["floor"]
        for d in results["distributions"]:
            if (d["impl"], d["dtype"]) == (impl, dtype):
                row.update(correctly_rounded=d["ulp"]["correctly_rounded"], median_ulp=d["ulp"]["median"],
                           p99_ulp=d["ulp"]["p99"], max_ulp=d["ulp"]["max"])
        for m in results["error_map"]["entries"]:
            if (m["impl"], m["dtype"]) == (impl, dtype) and "worst" in m:
                row["worst_token_error"] = m["worst"]["error"]
        for p in properties:
            if (p["impl"], p["dtype"]) == (impl, dtype):
                row["properties"] = {s: sum(r["status"] == s for r in p["results"])
                                     for s in ("passed", "failed", "unsupported", "error")}
        rows.append(row)
    return rows


def _json_ready(x: Any) -> Any:
    """NaN and inf become null (JSON has neither); NumPy scalars become Python numbers."""
    if isinstance(x, dict):
        return {str(k): _json_ready(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_ready(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, Path):
        return str(x)
    return x


def make_report(options: Options, argv: list[str] | None = None, stream=None) -> dict:
    """Run everything and write the report directory; returns the results document."""
    from gdn_verify.report import figures
    from gdn_verify.report import render

    stream = stream if stream is not None else sys.stderr
    oracle_name, oracle = experiments.choose_oracle()
    names = [impl.name for impl in options.impls]
    runner = experiments.Runner(options.impls, options.dtypes, options.sizes, options.seed, oracle)
    bar = ProgressBar(runner.steps() + len(names) * len(options.dtypes) * len(options.properties), stream)
    runner.step = bar.step
    started = time.perf_counter()
    results, maps = runner.run()
    properties = run_properties(options, bar)
    bar.close()
    s = options.sizes
    doc = dict(
        environment=environment.capture(options.seed, argv),
        config=dict(implementations=[dict(name=i.name, description=i.description, array=i.array)
                                     for i in options.impls],
                    skipped=options.skipped, dtypes=options.dtypes, sizes=dataclasses.asdict(s), oracle=oracle_name,
                    seed=options.seed, max_examples=options.max_examples, properties=options.properties,
                    chunk=experiments.CHUNK, decay_rates=experiments.decay_rates(s.HV).tolist()),
        summary=summarize(results, properties),
        **results,
        properties=properties,
    )
    doc["seconds"] = round(time.perf_counter() - started, 1)
    doc = _json_ready(doc)
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    paths = figures.draw_all(doc, maps, names, out)
    keys = sorted(maps)
    np.savez_compressed(out / "error_map.npz", names=np.array([f"{i} {d}" for i, d in keys]),
                        **{f"errors_{n}": maps[k] for n, k in enumerate(keys)})
    (out / "results.json").write_text(json.dumps(doc, indent=1, allow_nan=False))
    (out / "report.md").write_text(render.markdown(doc, [p.name for p in paths]))
    (out / "index.html").write_text(render.html(doc, [p.name for p in paths]))
    return doc


def main(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    """Entry point of ``cli.py report``: 0 once the report is written (findings are in the report)."""
    options = parse_options(args)
    s = options.sizes
    print(f"gdn-verify report: {', '.join(i.name for i in options.impls)}; dtypes {', '.join(options.dtypes)}; "
          f"{s.name} sizes (H={s.H} HV={s.HV} K={s.K} V={s.V}, T up to {s.max_tokens}); seed {options.seed}; "
          f"{options.max_examples} examples per property")
    for skip in options.skipped:
        print(f"skipped: {skip['impl']}: {skip['reason']}")
    doc = make_report(options, argv)
    for row in doc["summary"]:
        p = row.get("properties", {})
        checked = (f"properties {p.get('passed', 0)} passed / {p.get('failed', 0)} failed / "
                   f"{p.get('unsupported', 0)} unsupported")
        if row.get("error") or row.get("output_rms") is None:
            print(f"  {row['impl']:<18} {row['dtype']:<9} {row.get('error') or 'non-finite output'}; {checked}")
            continue
        times = row.get("times_floor")
        exponent = row.get("exponent")
        print(f"  {row['impl']:<18} {row['dtype']:<9} error {row['output_rms']:.2e} at T={row['tokens']} "
              f"({'n/a' if times is None else f'{times:.1f}'}x the rounding floor), growth exponent "
              f"{'n/a' if exponent is None else f'{exponent:.2f}'}; {checked}")
    print(f"report written to {options.out / 'index.html'} ({doc['seconds']:.0f}s)")
    return 0
