#!/usr/bin/env python3
"""gdn-verify command line: check, selftest, replay, fuzz, report, bench.

A thin layer over ``gdn_verify.api``: it parses flags, shows progress and results, and maps
library errors (which name the argument) to flags. Exit status: 0 every property holds, 1 a
property is violated, 2 misuse (a one-line message), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from gdn_verify import api, console, implementations
from gdn_verify.core.implementation import ConfigurationError
from gdn_verify.core.problem import DTYPES
from gdn_verify.properties import NAMES
from gdn_verify.runners.check import PropertyResult

ARRAYS = ("numpy", "torch", "cupy")
# Library argument names that are not spelled --name on the command line.
FLAGS = {"case": "CASE", "dtypes": "--dtype", "device": "bench"}


def flag(field: str) -> str:
    return FLAGS.get(field, "--" + field.replace("_", "-"))


def split_list(text: str | None) -> list[str] | None:
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]


def head_dims(text: str | None) -> tuple[int, ...] | None:
    """``--dims 64,128`` as ``(64, 128)``."""
    if text is None:
        return None
    try:
        return tuple(int(part) for part in split_list(text) or [])
    except ValueError:
        raise ConfigurationError("dims", f"{text!r}: expected comma-separated head sizes such as 64,128") from None


def impl_name(args: argparse.Namespace) -> str:
    if args.impl is not None:
        return args.impl
    name, why = implementations.default_name()
    print(f"no --impl given: {why}", file=sys.stderr)
    return name


def cmd_check(args: argparse.Namespace) -> int:
    display = console.ProgressDisplay()
    impl = api.implementation(impl_name(args), args.array, args.convention)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    dims = head_dims(args.dims)
    print(
        f"gdn-verify check: impl={impl.name} ({impl.description}), arrays={impl.array}, "
        f"dtype={args.dtype or impl.default_dtype}, seed={seed}"
        + ("" if dims is None else f", head sizes {','.join(map(str, dims))} only"),
        flush=True,
    )

    def progress(name: str, examples: int, worst) -> None:
        worst_text = f" worst {worst.error:.2e}" if worst is not None else ""
        display.update(f"  {name:<24} {examples:4d} examples{worst_text}")

    def on_result(r: PropertyResult) -> None:
        display.print(console.format_result(r))
        if r.status == "failed":  # at once, so that a run cut short still shows its minimal example
            replay = console.replay_command(r.failure.case_path, impl, args.convention) if r.failure.case_path else None
            display.print(console.format_failure(r, replay))

    result = api.check(
        impl,
        dtype=args.dtype,
        properties=split_list(args.properties),
        seed=seed,
        max_examples=args.max_examples,
        dims=dims,
        max_tokens=args.max_tokens,
        database=args.database,
        convention=args.convention,
        progress=progress,
        on_result=on_result,
        **({"cases_dir": args.cases} if args.cases else {}),
        **_compile_options(args, display),
    )
    counts = result.counts()
    print(
        f"{counts['passed']} passed, {counts['failed']} failed, {counts['unsupported']} unsupported "
        f"(impl={impl.name}, dtype={result.dtype}, seed={result.seed})"
    )
    _print_compile(result.shapes, result.seconds)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result.as_dict(), indent=2))
    return 0 if result.passed else 1


def _compile_options(args: argparse.Namespace, display: console.ProgressDisplay) -> dict:
    """``compile_budget`` and the ``compiling N shape classes`` progress line (issue 14)."""
    return dict(compile_budget=args.compile_budget, on_compile=console.compile_progress(display))


def _print_compile(plan, seconds: float) -> None:
    if plan is not None and plan.expensive:
        took = f"compile {console.duration(plan.compile_seconds)} of {console.duration(seconds)}"
        print(f"shapes: {plan.describe()}; {took}")


def cmd_selftest(args: argparse.Namespace) -> int:
    def on_bug(row) -> None:
        if row.caught_by is not None:
            margin = console.margin(row.caught_by.failure.measurement)
            print(
                f"  caught  {row.bug:<30} by {row.caught_by.name} ({row.seconds:.1f}s, {margin}): "
                f"{row.caught_by.failure.message[:80]}",
                flush=True,
            )
        else:
            print(f"  MISSED  {row.bug:<30} ({row.description}) ({row.seconds:.1f}s)", flush=True)

    print(f"gdn-verify selftest: planted bugs, dtype={args.dtype}, seed={args.seed}")
    rows = api.selftest(dtype=args.dtype, seed=args.seed, max_examples=args.max_examples, on_bug=on_bug)
    caught = sum(row.caught_by is not None for row in rows)
    print(f"{caught} of {len(rows)} planted bugs caught")
    return 0 if caught == len(rows) else 1


def cmd_replay(args: argparse.Namespace) -> int:
    r = api.replay(args.case, args.impl, array=args.array, property=args.property)
    print(f"replay {args.case} ({r.property}) with {r.impl.name}: {r.status}{': ' + r.message if r.message else ''}")
    if r.measurement is not None and r.measurement.bound:
        print(f"  error {r.measurement.error:.3g}, bound {r.measurement.bound:.3g} ({r.measurement.detail})")
    if args.diagnose:
        from gdn_verify.runners.diagnose import replay_diagnosis

        print(replay_diagnosis(args.case, r.impl))
    return 1 if r.status == "failed" else 0


def cmd_fuzz(args: argparse.Namespace) -> int:
    display = console.ProgressDisplay()
    impl = api.implementation(impl_name(args), args.array, args.convention)

    def on_result(r: PropertyResult) -> None:
        if r.status == "failed":
            replay = console.replay_command(r.failure.case_path, impl, args.convention) if r.failure.case_path else None
            display.print(console.format_failure(r, replay))
        else:
            display.print(f"  {r.name}: unsupported ({r.note})")

    workers = args.workers if args.workers == "auto" else int(args.workers)
    print(
        f"gdn-verify fuzz: impl={impl.name}, budget {args.budget}, database {args.database}"
        + (f", {workers} workers" if workers != 1 else "")
    )
    if args.seed is not None:
        print(f"fuzz: --seed {args.seed} makes the run reproducible but Hypothesis then ignores the example database")
    report = api.fuzz(
        impl,
        args.budget,
        dtype=args.dtype,
        properties=split_list(args.properties),
        seed=args.seed,
        dims=head_dims(args.dims),
        max_tokens=args.max_tokens,
        database=args.database,
        convention=args.convention,
        progress=lambda rep, name: display.update(rep.status_line(name)),
        on_result=on_result,
        **({"cases_dir": args.cases} if args.cases else {}),
        **_compile_options(args, display),
        workers=workers,
    )
    display.clear()
    w = report.worst
    print(
        f"fuzz done: {report.cases} cases in {report.rounds} rounds, {report.elapsed:.0f}s; worst "
        f"{'-' if w is None else f'{w[1].ratio:.3g} of bound ({w[0]})'}; {len(report.failures)} failures"
        + (f"; compile {console.duration(report.compile_seconds)} of {console.duration(report.seconds)}")
        + (f"; {report.workers} workers" if report.workers > 1 else "")
    )
    for error in report.worker_errors:
        print(f"  {error}", file=sys.stderr)
    _write_fuzz_records(args, report, impl)
    return 1 if report.failures or report.worker_errors else 0


def _write_fuzz_records(args: argparse.Namespace, report, impl) -> None:
    """``--json`` (the merged report) and ``--campaigns`` (one row appended to campaigns.json)."""
    from gdn_verify.runners import campaigns, workers

    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(dict(impl=impl.name, **report.as_dict()), indent=2))
    if args.campaigns:
        gpus = min(report.workers, len(workers.visible_gpus()) or 1) if impl.array != "numpy" else 1
        dtype = args.dtype or impl.default_dtype
        row = campaigns.campaign_row(report, impl.name, dtype, campaigns.device_name(impl.array, gpus))
        campaigns.append_campaign(args.campaigns, row)
        print(f"campaign recorded in {args.campaigns}: {json.dumps(row)}")


def cmd_report(args: argparse.Namespace) -> int:
    from gdn_verify import report

    options = report.options(
        args.impl,
        array=args.array,
        dtypes=args.dtype,
        out=args.out,
        max_tokens=args.max_tokens,
        seed=args.seed,
        quick=args.quick,
        max_examples=args.max_examples,
        properties=split_list(args.properties),
        dims=head_dims(args.dims),
    )
    s = options.sizes
    print(
        f"gdn-verify report: {', '.join(i.name for i in options.impls)}; dtypes {', '.join(options.dtypes)}; "
        f"{s.name} sizes (H={s.H} HV={s.HV} K={s.K} V={s.V}, T up to {s.max_tokens}); seed {options.seed}; "
        f"{options.max_examples} examples per property"
    )
    for skip in options.skipped:
        print(f"skipped: {skip['impl']}: {skip['reason']}")
    display = console.ProgressDisplay()
    deciles = [-1]

    def progress(fraction: float, label: str) -> None:  # every tenth of the work is shown, off a terminal too
        decile = int(fraction * 10)
        display.update(f"[{fraction:4.0%}] {label}", force=decile > deciles[0])
        deciles[0] = max(deciles[0], decile)

    doc = report.make_report(options, ["gdn-verify", *args.argv], progress=progress)
    display.clear()
    for row in doc["summary"]:
        p = row.get("properties", {})
        checked = (
            f"properties {p.get('passed', 0)} passed / {p.get('failed', 0)} failed / "
            f"{p.get('unsupported', 0)} unsupported"
        )
        if row.get("error") or row.get("output_rms") is None:
            print(f"  {row['impl']:<18} {row['dtype']:<9} {row.get('error') or 'non-finite output'}; {checked}")
            continue
        times, exponent = row.get("times_floor"), row.get("exponent")
        print(
            f"  {row['impl']:<18} {row['dtype']:<9} error {console.number(row['output_rms'])} at T={row['tokens']}"
            f" ({console.number(times)}x the rounding floor), growth exponent {console.number(exponent)}; {checked}"
        )
    print(f"report written to {options.out / 'index.html'} ({doc['seconds']:.0f}s)")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from gdn_verify.bench import run_bench

    text = run_bench(args.what)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


def _impl_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--impl", help=f"{', '.join(implementations.names())}, planted:BUG, or MODULE:FUNCTION")
    p.add_argument("--array", choices=ARRAYS, help="array type a MODULE:FUNCTION takes")
    p.add_argument(
        "--convention",
        choices=("native", "spec"),
        default="native",
        help="calling convention of a MODULE:FUNCTION: native (FLA) or spec (vLLM speculative decoding)",
    )


def _suite_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", help="input dtype: " + ", ".join(DTYPES))
    p.add_argument("--properties", help="comma-separated subset of: " + ", ".join(NAMES))
    p.add_argument("--seed", type=int, help="Hypothesis seed (default: random, printed)")
    p.add_argument(
        "--dims",
        help="draw head sizes K and V only from these, e.g. 64,128 (for kernels compiled per "
        "size; default: every size, awkward ones included)",
    )
    p.add_argument("--cases", help="directory for minimal failing cases (default .gdn_verify/cases)")


def _compile_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--compile-budget",
        help="time for compiling shape classes up front when a new class is expensive (JIT kernels such as "
        "FLA's): 90s, 5m (default 5m); the pool of classes drawn from adapts to it",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gdn-verify", description="Verify Gated DeltaNet (GDN) implementations.")
    sub = parser.add_subparsers(dest="command", required=True)

    check = sub.add_parser("check", help="run the property suite against an implementation")
    _impl_options(check)
    _suite_options(check)
    check.add_argument("--max-examples", type=int, help="examples per property (default: each property's own)")
    check.add_argument(
        "--max-tokens", type=int, help="longest T for error_growth (default 65536 for GPU arrays, 2048 for NumPy)"
    )
    check.add_argument("--database", help="directory for Hypothesis's example database (default: none)")
    check.add_argument("--json", help="write the results as JSON to this path")
    _compile_option(check)
    check.set_defaults(func=cmd_check)

    selftest = sub.add_parser("selftest", help="check the planted-bug implementations; all must be caught")
    selftest.add_argument("--dtype", default="float32", choices=tuple(DTYPES))
    selftest.add_argument("--max-examples", type=int)
    selftest.add_argument("--seed", type=int)
    selftest.set_defaults(func=cmd_selftest)

    rp = sub.add_parser("replay", help="rerun a saved failing case")
    rp.add_argument("case")
    rp.add_argument("--impl", help="implementation (default: the one recorded in the case)")
    rp.add_argument("--array", choices=ARRAYS, help="array type a MODULE:FUNCTION takes (default: as recorded)")
    rp.add_argument("--property", help="property to rerun (default: the one saved in the case)")
    rp.add_argument(
        "--diagnose",
        action="store_true",
        help="also name the first token, chunk, head and sequence where the error crosses the tolerance",
    )
    rp.set_defaults(func=cmd_replay)

    fz = sub.add_parser("fuzz", help="long Hypothesis campaign with a persistent example database")
    _impl_options(fz)
    _suite_options(fz)
    fz.add_argument("--budget", default="30m", help="time to spend: 90s, 30m, 1h (default 30m)")
    fz.add_argument("--database", default=".gdn_verify/hypothesis", help="example database directory")
    fz.add_argument("--max-tokens", type=int, default=2048, help="longest T for error_growth (default 2048)")
    _compile_option(fz)
    fz.add_argument(
        "--workers",
        default="1",
        help="worker processes over disjoint shards of the properties: one per GPU (round robin over the visible "
        "ones) or per CPU core for NumPy implementations; 'auto' = as many as GPUs (or cores); default 1",
    )
    fz.add_argument("--json", help="write the merged campaign report as JSON to this path")
    fz.add_argument("--campaigns", help="append this campaign's row (impl, dtype, cases, ...) to this JSON list")
    fz.set_defaults(func=cmd_fuzz)

    rep = sub.add_parser("report", help="error and precision report: index.html, report.md, results.json, figures")
    rep.add_argument(
        "--impl",
        action="append",
        help="implementation to include; repeat to compare several "
        "(default: the CuPy and FLA kernels on a GPU, else NumPy)",
    )
    rep.add_argument("--array", choices=ARRAYS, help="array type a MODULE:FUNCTION takes")
    rep.add_argument("--dtype", action="append", help="input dtype; repeat for several (default: float32 and bfloat16)")
    rep.add_argument("--out", help="report directory (default: reports/report-<UTC date and time>)")
    rep.add_argument(
        "--max-tokens",
        type=int,
        help="longest T of the length sweep (default 16384 on a GPU, 1024 on CPU or with --quick)",
    )
    rep.add_argument("--seed", type=int, default=0, help="seed of the inputs and of the property suite (default 0)")
    rep.add_argument("--quick", action="store_true", help="small sizes and 10 examples per property, even on a GPU")
    rep.add_argument("--max-examples", type=int, help="examples per property (default 20, 10 with --quick)")
    rep.add_argument("--properties", help="comma-separated subset of the properties to run (default: all)")
    rep.add_argument(
        "--dims",
        help="head sizes K, V the property suite draws, e.g. 128 (default: every size; "
        "the figures use K = V = 128, or 32 on CPU)",
    )
    rep.set_defaults(func=cmd_report)

    bench = sub.add_parser("bench", help="GPU benchmarks: decode and prefill, side by side with FLA and a copy")
    bench.add_argument("--what", choices=("decode", "prefill", "all"), default="all")
    bench.add_argument("--out", help="write the Markdown table to this file")
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        return args.func(args)
    except ConfigurationError as exc:
        print(f"error: {flag(exc.field)}: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
