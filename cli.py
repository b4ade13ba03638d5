#!/usr/bin/env python3
"""gdn-verify command line: check, selftest, replay, bench, report, fuzz.

Exit status: 0 all properties hold, 1 a property is violated, 2 misuse (a one-line message).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from gdn_verify import implementations
from gdn_verify.check import CheckOptions, PropertyResult, parse_head_dims, replay, run_check
from gdn_verify.implementations import ConfigurationError
from gdn_verify.problem import DTYPES
from properties.checks import PROPERTIES


class Progress:
    """One status line per property; live example counts on a terminal."""

    def __init__(self, stream=sys.stderr):
        self.stream = stream
        self.live = stream.isatty()
        self.last = 0.0

    def update(self, name: str, examples: int, worst) -> None:
        now = time.monotonic()
        if self.live and now - self.last > 0.1:
            worst_text = f" worst {worst.error:.2e}" if worst is not None else ""
            self.stream.write(f"\r  {name:<24} {examples:4d} examples{worst_text}   ")
            self.stream.flush()
            self.last = now

    def start(self, name: str, examples: int) -> None:
        if not self.live:
            self.stream.write(f"  running {name} (up to {examples} examples)...\n")
            self.stream.flush()

    def clear(self) -> None:
        if self.live:
            self.stream.write("\r" + " " * 78 + "\r")
            self.stream.flush()


def format_result(r: PropertyResult) -> str:
    worst = ""
    if r.worst is not None and r.status != "unsupported":
        if r.worst.bound:
            worst = f"worst {r.worst.error:.2e} (bound {r.worst.bound:.2e}, {r.worst.detail.split(';')[0]})"
        elif r.status == "failed":
            worst = f"max difference {r.worst.error:.2e} (exact contract)"
        else:
            worst = f"exact ({r.worst.detail})"
    note = f"  [{r.note}]" if r.note else ""
    return f"  {r.name:<24} {r.status:<11} {r.examples:4d} examples  {worst}  {r.seconds:.1f}s{note}"


def format_failure(r: PropertyResult, impl_name: str, extra: str) -> str:
    f = r.failure
    lines = [f"FAILED {r.name}: {f.message}", f"  minimal example: {f.problem.describe()}"]
    if f.params:
        lines.append(f"  parameters: {f.params}")
    if f.case_path is not None:
        lines.append(f"  replay: python cli.py replay {f.case_path} --impl {impl_name}{extra}")
    return "\n".join(lines)


def parse_properties(text: str | None) -> list[str]:
    if not text:
        return list(PROPERTIES)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PROPERTIES]
    if unknown:
        raise ConfigurationError(f"--properties: unknown {', '.join(unknown)}; choose from {', '.join(PROPERTIES)}")
    return names


def resolve_impl(args) -> implementations.Implementation:
    name = args.impl
    if name is None:
        name, why = implementations.default_name()
        print(f"no --impl given: {why}", file=sys.stderr)
    return implementations.resolve(name, getattr(args, "array", None))


def cmd_check(args) -> int:
    if args.convention == "spec":
        from gdn_verify.spec_runner import check_spec

        if args.impl is None:
            raise ConfigurationError("--convention spec needs --impl (spec-numpy or MODULE:FUNCTION)")
        return check_spec(args.impl, args.array, args.dtype, args.max_examples, args.seed, args.database)
    impl = resolve_impl(args)
    dtype = args.dtype or impl.default_dtype
    if dtype not in DTYPES:
        raise ConfigurationError(f"--dtype {dtype!r}: choose from {', '.join(DTYPES)}")
    if args.max_examples is not None and args.max_examples < 1:
        raise ConfigurationError("--max-examples must be at least 1")
    if args.max_tokens is not None and args.max_tokens < 64:
        raise ConfigurationError("--max-tokens must be at least 64")
    props = parse_properties(args.properties)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    options = CheckOptions(dtype=dtype, max_examples=args.max_examples, seed=seed, database=args.database,
                           max_tokens=args.max_tokens or (2048 if impl.array == "numpy" else 65536),
                           head_dims=parse_head_dims(args.dims))
    dims = "" if options.head_dims is None else f", head sizes {','.join(map(str, options.head_dims))} only"
    print(f"gdn-verify check: impl={impl.name} ({impl.description}), arrays={impl.array}, dtype={dtype}, "
          f"seed={seed}, {len(props)} properties{dims}")
    progress = Progress()
    extra = f" --array {impl.array}" if ":" in impl.name and impl.array != "numpy" else ""

    def on_result(r: PropertyResult) -> None:
        progress.clear()
        print(format_result(r), flush=True)
        if r.status == "failed":  # at once, so that a run cut short still shows its minimal example
            print(format_failure(r, impl.name, extra), flush=True)

    def on_progress(name, examples, worst):
        progress.update(name, examples, worst)

    results = []
    for name in props:
        progress.start(name, args.max_examples or PROPERTIES[name].max_examples)
        results += run_check(impl, [name], options, on_progress, on_result)
    failed = [r for r in results if r.status == "failed"]
    counts = {s: sum(r.status == s for r in results) for s in ("passed", "failed", "unsupported")}
    print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['unsupported']} unsupported")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(dict(impl=impl.name, dtype=dtype, seed=seed,
                                                   results=[r.as_dict() for r in results]), indent=2))
    return 1 if failed else 0


def margin(m) -> str:
    """A planted bug's margin: error / bound, and error / uniform bound where they differ."""
    if m is None:
        return "margin n/a (non-numeric failure)"
    text = f"margin {m.ratio:.3g}x"
    if m.uniform is not None and m.uniform_ratio != m.ratio:
        text += f", {m.uniform_ratio:.3g}x the uniform bound"
    return text


def cmd_selftest(args) -> int:
    from gdn_verify import planted

    seed = args.seed if args.seed is not None else random.randrange(2**31)
    print(f"gdn-verify selftest: {len(planted.BUGS)} planted bugs, dtype={args.dtype}, seed={seed}")
    caught = 0
    for bug, (description, _) in planted.BUGS.items():
        impl = planted.implementation(bug)
        options = CheckOptions(dtype=args.dtype, max_examples=args.max_examples, seed=seed)
        start = time.perf_counter()
        by = None
        for name in PROPERTIES:
            (result,) = run_check(impl, [name], options)
            if result.status == "failed":
                by = result
                break
        took = time.perf_counter() - start
        if by is not None:
            caught += 1
            print(f"  caught  {bug:<32} by {by.name} ({took:.1f}s, {margin(by.failure.measurement)}): "
                  f"{by.failure.message[:90]}", flush=True)
        else:
            print(f"  MISSED  {bug:<32} ({description}) ({took:.1f}s)", flush=True)
    print(f"{caught} of {len(planted.BUGS)} planted bugs caught")
    return 0 if caught == len(planted.BUGS) else 1


def cmd_replay(args) -> int:
    if args.convention == "spec":
        from gdn_verify.spec_runner import replay_spec

        if args.impl is None:
            raise ConfigurationError("--convention spec needs --impl")
        return replay_spec(args.case, args.impl, args.array)
    impl = resolve_impl(args)
    if not Path(args.case).is_file():
        raise ConfigurationError(f"replay: no case file {args.case!r}")
    try:
        status, m = replay(args.case, impl, args.property)
    except (ValueError, KeyError, OSError) as exc:
        raise ConfigurationError(f"replay: cannot read case {args.case}: {exc}") from None
    print(f"replay {args.case} with {impl.name}: {status}")
    if m is not None and m.bound:
        print(f"  error {m.error:.3e}, bound {m.bound:.3e} ({m.detail})")
    if args.diagnose:
        from gdn_verify.diagnose import replay_diagnosis

        print(replay_diagnosis(args.case, impl))
    return 1 if status.startswith("failed") else 0


def cmd_bench(args) -> int:
    try:
        from gdn_verify import bench
    except ImportError as exc:
        raise ConfigurationError(f"bench: unavailable ({exc})") from None
    return bench.main(args)


def cmd_fuzz(args) -> int:
    from gdn_verify import fuzz

    if args.impl is None:
        raise ConfigurationError("fuzz needs --impl")
    return fuzz.main(args.impl, args.budget, dtype=args.dtype, database=args.database, cases=args.cases,
                     properties=args.properties, max_tokens=args.max_tokens, seed=args.seed, array=args.array,
                     head_dims=parse_head_dims(args.dims))


def cmd_report(args) -> int:
    from gdn_verify import report

    return report.main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cli.py", description="Verify Gated DeltaNet (GDN) implementations.")
    sub = parser.add_subparsers(dest="command", required=True)

    check = sub.add_parser("check", help="run the property suite against an implementation")
    check.add_argument("--impl", help=f"{', '.join(implementations.names())}, or MODULE:FUNCTION")
    check.add_argument("--array", choices=("numpy", "torch", "cupy"), help="array type a MODULE:FUNCTION takes")
    check.add_argument("--dtype", help="input dtype: float64, float32, float16, bfloat16")
    check.add_argument("--properties", help="comma-separated subset of: " + ", ".join(PROPERTIES))
    check.add_argument("--max-examples", type=int, help="examples per property (default: each property's own)")
    check.add_argument("--max-tokens", type=int,
                       help="longest T for error_growth (default 65536 for GPU arrays, 2048 for NumPy)")
    check.add_argument("--seed", type=int, help="Hypothesis seed (default: random, printed)")
    check.add_argument("--database", help="directory for Hypothesis's example database (default: none)")
    check.add_argument("--json", help="write the results as JSON to this path")
    check.add_argument("--dims", help=DIMS_HELP)
    check.add_argument("--convention", choices=("native", "spec"), default="native",
                       help="calling convention of --impl: native (FLA) or spec (vLLM speculative decoding)")
    check.set_defaults(func=cmd_check)

    selftest = sub.add_parser("selftest", help="check the planted-bug implementations; all must be caught")
    selftest.add_argument("--dtype", default="float32", choices=tuple(DTYPES))
    selftest.add_argument("--max-examples", type=int)
    selftest.add_argument("--seed", type=int)
    selftest.set_defaults(func=cmd_selftest)

    rp = sub.add_parser("replay", help="rerun a saved failing case")
    rp.add_argument("case")
    rp.add_argument("--impl")
    rp.add_argument("--array", choices=("numpy", "torch", "cupy"))
    rp.add_argument("--property", help="property to rerun (default: the one saved in the case)")
    rp.add_argument("--diagnose", action="store_true",
                    help="also name the first token, chunk, head and sequence where the error crosses the tolerance")
    rp.add_argument("--convention", choices=("native", "spec"), default="native", help="convention of --impl")
    rp.set_defaults(func=cmd_replay)

    bench = sub.add_parser("bench", help="GPU benchmarks: decode and prefill, side by side with FLA and a copy")
    bench.add_argument("--what", choices=("decode", "prefill", "all"), default="all")
    bench.add_argument("--out", help="write the Markdown table to this file")
    bench.set_defaults(func=cmd_bench)

    fz = sub.add_parser("fuzz", help="long Hypothesis campaign with a persistent example database")
    fz.add_argument("--impl", help=f"{', '.join(implementations.names())}, or MODULE:FUNCTION")
    fz.add_argument("--array", choices=("numpy", "torch", "cupy"), help="array type a MODULE:FUNCTION takes")
    fz.add_argument("--budget", default="30m", help="time to spend: 90s, 30m, 1h (default 30m)")
    fz.add_argument("--dtype", help="input dtype: float64, float32, float16, bfloat16")
    fz.add_argument("--database", help="example database directory (default .gdn_verify/hypothesis)")
    fz.add_argument("--cases", help="directory for failing cases (default .gdn_verify/cases)")
    fz.add_argument("--properties", help="comma-separated subset of: " + ", ".join(PROPERTIES))
    fz.add_argument("--max-tokens", type=int, default=2048, help="longest T for error_growth (default 2048)")
    fz.add_argument("--seed", type=int, help="reproducible run (Hypothesis then ignores the database)")
    fz.add_argument("--dims", help=DIMS_HELP)
    fz.set_defaults(func=cmd_fuzz)

    from gdn_verify.report import add_arguments as add_report_arguments

    rep = sub.add_parser("report", help="error and precision report: index.html, report.md, results.json, figures")
    add_report_arguments(rep)
    rep.set_defaults(func=cmd_report)
    return parser


DIMS_HELP = ("draw head sizes K and V only from these, e.g. 64,128 (for kernels compiled per size; "
             "default: every size, awkward ones included)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
