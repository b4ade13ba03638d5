#!/usr/bin/env python3
"""gdn-verify command line: check, selftest, replay, fuzz, report, bench, matrix.

A thin layer over ``gdn_verify.api``: it parses flags, shows progress and results, and maps
library errors (which name the argument) to flags. A command's flags become one object in
``gdn_verify.options`` (``CheckCommand``, ``FuzzCommand``, ``SelftestCommand``), every flag
checked and the implementation loaded there, once; then the API runs it to the end
(``api.check_resolved``, ...), reporting through callbacks. A subcommand is a parser function
(``add_NAME``, listed in ``SUBCOMMANDS``) and a ``cmd_NAME`` function.

Exit status: 0 every property holds, 1 a property is violated (failed, timeout, error), 2 misuse
(a one-line message), 130 interrupted (Ctrl-C), 143 terminated (SIGTERM: ``timeout``, a
cancelled CI job, a batch scheduler).
``--json PATH`` is checked for writability before the run, rewritten after each property and
written on Ctrl-C or SIGTERM (status ``interrupted``).
"""

from __future__ import annotations

import os
import sys

# One OpenBLAS thread, set before NumPy (and SciPy) load it, since OpenBLAS reads this only when it
# starts. The float64 oracle's matrix products are many and small (chunks of 64, heads of 128): a
# BLAS thread pool hands each one off and spins waiting, which buys nothing at these sizes and takes
# the CPU from everything else. Measured on a 2-core machine (a default ``check --seed 1``, same
# results bitwise): 35 s -> 34 s when idle, but CPU time 35 s -> 27 s, and 41 s -> 33 s beside one
# busy process, 91 s -> 71 s beside two (a previous session, with several runs at once: 88 s -> 34 s).
# Spawned children (oracle pool, compile workers, matrix and scale children) inherit it: they
# already run one per core. A value the user set wins. Not OMP_NUM_THREADS or MKL_NUM_THREADS:
# those size PyTorch's own CPU pool, i.e. the kernel under test. Only the command line sets it: the
# library, imported by someone else's program or by pytest, leaves the process's environment alone.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

INTERRUPTED = "gdn-verify: interrupted"  # the line a Ctrl-C ends with, wherever it lands (exit 130)

# NumPy, SciPy and Hypothesis load here, a second or more before main() runs: a Ctrl-C meanwhile
# ends the program with the same one line as anywhere else, not a traceback through importlib.
try:
    import argparse
    import json
    import random
    import signal
    import textwrap
    from collections.abc import Sequence
    from pathlib import Path

    import gdn_verify
    from gdn_verify import api, console, implementations
    from gdn_verify.core.backends import BACKENDS
    from gdn_verify.core.implementation import ConfigurationError
    from gdn_verify.core.problem import DTYPES
    from gdn_verify.options import (
        SCALE_PREFIX,
        CheckCommand,
        CheckOptions,
        FuzzCommand,
        ResolvedFuzz,
        SelftestCommand,
        comma_dims,
        comma_list,
        declared_head_dims,
        flag_name,
        writable,
    )
    from gdn_verify.properties import NAMES
    from gdn_verify.runners import sanitize
    from gdn_verify.runners.check import PropertyResult
    from gdn_verify.runners.guard import DEFAULT_TIMEOUT, FIRST_CALL_FACTOR, abandoned_calls
except KeyboardInterrupt:
    sys.stderr.write(INTERRUPTED + "\n")
    raise SystemExit(130) from None

ARRAYS = ("numpy", "torch", "cupy")
# Library argument names that are not spelled --name on the command line.
FLAGS = {"case": "CASE", "dtypes": "--dtype", "device": "bench"}


def flag(field: str) -> str:
    return FLAGS.get(field, "--" + flag_name(field).replace("_", "-"))


class CtrlC:
    """Ctrl-C (or SIGTERM), remembered until a progress callback acts on it.

    Python raises KeyboardInterrupt wherever the main thread happens to be. Inside a garbage
    collector callback (Hypothesis registers one) it is printed as "Exception ignored" and lost:
    CI saw a check run to completion after its Ctrl-C. The handler remembers it, and every progress
    callback and the end of each run raise it again; the "Exception ignored" traceback is not shown.
    SIGTERM takes the same path, so that ``timeout`` or a cancelled job still leaves the partial
    results saved as ``interrupted``, and exits 143 rather than 130.
    """

    seen = False
    signum = signal.SIGINT

    @classmethod
    def install(cls) -> None:
        cls.seen, cls.signum = False, signal.SIGINT
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # an ignored or handled SIGTERM stays so
            signal.signal(signal.SIGTERM, cls._handler)
        # Only where Python's own handler is in place: a SIGINT the parent ignores stays ignored.
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, cls._handler)
            show = sys.unraisablehook

            def hook(unraisable) -> None:
                if not (cls.seen and isinstance(unraisable.exc_value, KeyboardInterrupt)):
                    show(unraisable)

            sys.unraisablehook = hook

    @classmethod
    def _handler(cls, signum: int, frame: object) -> None:
        cls.seen, cls.signum = True, signal.Signals(signum)
        raise KeyboardInterrupt

    @classmethod
    def check(cls) -> None:
        """Raise the KeyboardInterrupt of a Ctrl-C that something swallowed."""
        if cls.seen:
            raise KeyboardInterrupt


def misuse_exit(r: PropertyResult) -> int:
    """The kernel could not take the arguments: one line, exit 2."""
    message = r.failure.message if r.failure is not None else r.note
    print(f"error: --impl: {message}", file=sys.stderr)
    return 2


def cmd_sanitized(args: argparse.Namespace) -> int:
    """``check --sanitize``: the same check in a child under memcheck; its first error fails the run."""
    sanitize.memcheck_tool()
    argv = [a for a in args.argv if a != "--sanitize"]
    print("gdn-verify check under compute-sanitizer memcheck (kernels run 10-100x slower)", flush=True)
    done = sanitize.run_sanitized(argv)
    lines = done.output.splitlines()
    keep = [line for line in lines if not line.startswith(sanitize.PREFIX) or "ERROR SUMMARY" in line]
    print("\n".join(keep))
    if not done.clean:
        print(f"FAILED memcheck: {done.first_error or 'compute-sanitizer reported an error'}")
        return 1
    return done.returncode


def head_sizes_note(asked: Sequence[int] | None, drawn: Sequence[int], declarer: str | None) -> str:
    """The header's words on head sizes: those the properties draw (``ResolvedCheck.limits``), where
    ``--dims`` asked for some or the implementation ``declarer`` declares its own."""
    if declarer is not None:
        return f", head sizes {','.join(map(str, drawn))} only (the sizes {declarer} declares)"
    return "" if asked is None else f", head sizes {','.join(map(str, drawn))} only"


def cmd_check(args: argparse.Namespace) -> int:
    # Every flag checked and the implementation loaded, in one place: misuse is one line, before the header.
    command = CheckCommand.from_flags(vars(args))
    if command.default_impl is not None:
        print(f"no --impl given: {command.default_impl}", file=sys.stderr)
    if command.sanitize:
        return cmd_sanitized(args)
    run, options, out = command.check, command.check.options, command.json
    impl = run.impl
    display = console.ProgressDisplay()
    if options.database and options.seed is not None:
        print(
            f"check: --database {options.database} takes precedence: Hypothesis ignores --seed {options.seed} "
            "when it replays an example database",
            file=sys.stderr,
        )
    print(
        f"gdn-verify check: impl={impl.name} ({impl.description}), arrays={impl.array}, "
        f"dtype={run.dtype}, seed={run.seed}"
        + head_sizes_note(options.dims, run.limits.head_dims, impl.name if declared_head_dims(impl) else None)
        + (", gradients (the backward)" if run.grad else ""),
        flush=True,
    )
    if run.configs is not None:
        _print_configs_plan(run.configs)
    partial = api.CheckResult.started(run)

    def save(status: str) -> None:
        if out is not None:
            api.write_json(out, partial.as_dict(status, ["gdn-verify", *args.argv]))

    def progress(name: str, examples: int, worst) -> None:
        CtrlC.check()
        worst_text = f" worst {worst.error:.2e}" if worst is not None else ""
        display.update(f"  {name:<24} {examples:4d} examples{worst_text}")

    def on_result(r: PropertyResult) -> None:
        CtrlC.check()
        partial.results.append(r)
        save("running")  # as results arrive: a run cut short keeps what it found
        if r.status == "misuse":
            return  # one line on stderr at the end, not a property verdict
        display.print(console.format_result(r))
        if r.failure is not None:  # at once, so that a run cut short still shows its minimal example
            case = r.failure.case_path
            replay = console.replay_command(case, impl, options.convention) if case else None
            display.print(console.format_failure(r, replay))

    save("running")
    try:
        result = api.check_resolved(
            run, progress=progress, on_result=on_result, on_compile=console.compile_progress(display)
        )
        CtrlC.check()
    except KeyboardInterrupt:
        display.clear()
        save("interrupted")
        if out is not None:
            print(f"partial results ({len(partial.results)} properties) written to {out}", file=sys.stderr)
        raise
    partial = result  # the final document is the result's own: it also carries the compile plan and time
    save("misuse" if result.misuse is not None else "stopped" if result.not_run else "complete")
    if result.misuse is not None:
        return misuse_exit(result.misuse)
    if result.not_run:
        lost = result.results[-1].name
        print(
            f"not run: {', '.join(result.not_run)} (the GPU context was lost in {lost}); run them in a fresh "
            f"process: gdn-verify check --impl {impl.name} --properties {','.join(result.not_run)}",
            file=sys.stderr,
        )
    if result.configs is not None:
        print(console.format_configs_summary(result.results))
    print(
        f"{console.format_counts(result.counts())} (impl={impl.name}, dtype={result.dtype}, seed={result.seed}); "
        + console.format_backends(result.backends(), result.backend)
    )
    _print_compile(result.shapes, result.seconds)
    print(console.format_time_split(result.time_split(), result.seconds, result.startup_seconds))
    return 0 if result.passed else 1


def _print_configs_plan(plan) -> None:
    """--all-configs: the cost (kernels, configs, properties) and each kernel's configs, before the run."""
    print(f"all configs: {plan.describe()}", flush=True)
    for tuned in plan.kernels:
        print(f"  {tuned.kernel}: {len(tuned.configs)} configs", flush=True)


def _print_compile(plan, seconds: float) -> None:
    if plan is not None and plan.expensive:
        took = f"compile {console.duration(plan.compile_seconds)} of {console.duration(seconds)}"
        print(f"shapes: {plan.describe()}; {took}")


def cmd_selftest(args: argparse.Namespace) -> int:
    command = SelftestCommand.from_flags(vars(args))  # every flag checked: misuse is one line, before the header
    run, options, out = command.selftest, command.selftest.options, command.json
    rows: list = []

    def save(status: str) -> None:
        if out is not None:
            doc = api.selftest_document(
                rows,
                options.dtype,
                seed=run.seed,
                timeout=options.timeout,
                status=status,
                command=["gdn-verify", *args.argv],
                grad=options.grad,
            )
            api.write_json(out, doc)

    def on_bug(row) -> None:
        CtrlC.check()
        rows.append(row)
        save("running")
        if row.not_applicable:
            print(f"  n/a     {row.bug:<30} (no bug on {options.dtype} inputs: {row.not_applicable})", flush=True)
        elif row.caught_by is not None:
            failure = row.caught_by.failure
            margin = console.margin(failure.measurement)
            cause = f"cause {row.cause_verdict}" + (f" ({failure.cause_model})" if failure.cause_model else "")
            print(
                f"  caught  {row.bug:<30} by {row.caught_by.name} ({row.seconds:.1f}s, {margin}; {cause}): "
                f"{textwrap.shorten(failure.message, 80, placeholder=' ...')}",
                flush=True,
            )
        else:
            print(f"  MISSED  {row.bug:<30} ({row.description}) ({row.seconds:.1f}s)", flush=True)

    what = "planted gradient bugs (the backward)" if options.grad else "planted bugs"
    print(f"gdn-verify selftest: {what}, dtype={options.dtype}, seed={run.seed}")  # printed: a run can be repeated
    save("running")
    try:
        api.selftest_resolved(run, on_bug=on_bug)
        CtrlC.check()
    except KeyboardInterrupt:
        save("interrupted")
        raise
    save("complete")
    caught = sum(row.caught_by is not None for row in rows)
    applicable = [row for row in rows if not row.not_applicable]
    verdicts = [row.cause_verdict for row in applicable]
    skipped = len(rows) - len(applicable)
    print(
        f"{caught} of {len(applicable)} planted bugs caught"
        + (f" ({skipped} not applicable on {options.dtype} inputs)" if skipped else "")
        + f"; named causes: {verdicts.count('right')} right, {verdicts.count('wrong')} wrong, "
        f"{verdicts.count('none')} none"
    )
    return 0 if caught == len(applicable) else 1


def cmd_replay(args: argparse.Namespace) -> int:
    r = api.replay(args.case, args.impl, array=args.array, property=args.property, convention=args.convention)
    print(f"replay {args.case} ({r.property}) with {r.impl.name}: {r.status}{': ' + r.message if r.message else ''}")
    if r.measurement is not None and r.measurement.bound:
        print(f"  error {r.measurement.error:.3g}, bound {r.measurement.bound:.3g} ({r.measurement.detail})")
    if r.kind:
        print(f"  kind: {r.kind}" + ("" if r.cause else " (no known mistake reproduces it)"))
    if r.cause:
        print(f"  likely cause: {r.cause}")
    if args.diagnose and r.form == "backward":
        print("  --diagnose locates forward errors; not available for a gradient property (yet)")
    elif args.diagnose:
        from gdn_verify.runners.diagnose import replay_diagnosis

        print(replay_diagnosis(args.case, r.impl))
    return 1 if r.status == "failed" else 0


def cmd_fuzz(args: argparse.Namespace) -> int:
    # Every flag checked and the implementation loaded, in one place: misuse is one line, before the header.
    command = FuzzCommand.from_flags(vars(args))
    if command.default_impl is not None:
        print(f"no --impl given: {command.default_impl}", file=sys.stderr)
    run, options, out = command.fuzz, command.fuzz.options, command.json
    impl = run.impl
    display = console.ProgressDisplay()
    state: dict = {"report": None}

    def save(status: str) -> None:
        if out is not None and state["report"] is not None:
            doc = api.fuzz_document(
                state["report"],
                impl,
                run.dtype,
                seed=options.seed,
                timeout=options.timeout,
                convention=options.convention,
                status=status,
                command=["gdn-verify", *args.argv],
            )
            api.write_json(out, doc)

    def on_round(report) -> None:
        state["report"] = report
        save("running")

    def on_result(r: PropertyResult) -> None:
        if r.status == "misuse":
            return
        if r.failure is not None:
            case = r.failure.case_path
            replay = console.replay_command(case, impl, options.convention) if case else None
            display.print(console.format_failure(r, replay))
        else:
            display.print(f"  {r.name}: unsupported ({r.note})")

    print(
        f"gdn-verify fuzz: impl={impl.name}, budget {options.budget}, database {options.database}"
        + (f", {run.workers} workers" if run.workers != 1 else "")
    )
    if options.seed is not None:
        seed = options.seed
        print(f"fuzz: --seed {seed} makes the run reproducible but Hypothesis then ignores the example database")
    state["report"] = api.fuzz_runner.FuzzReport(budget=run.seconds)
    save("running")

    def progress(rep, name: str) -> None:
        CtrlC.check()
        state["report"] = rep
        display.update(rep.status_line(name))

    try:
        report = api.fuzz_resolved(
            run,
            progress=progress,
            on_result=on_result,
            on_round=on_round,
            on_compile=console.compile_progress(display),
        )
        CtrlC.check()
    except KeyboardInterrupt:
        display.clear()
        save("interrupted")
        raise
    state["report"] = report
    display.clear()
    misuse = next((r for r in report.properties.values() if r.status == "misuse"), None)
    save("misuse" if misuse is not None else "complete")
    if misuse is not None:
        return misuse_exit(misuse)
    warned = [r for r in report.properties.values() if r.warnings]
    top = max(warned, key=lambda r: r.warnings, default=None)
    print(
        f"fuzz done: {report.cases} cases in {report.rounds} rounds, {report.elapsed:.0f}s; worst "
        f"{report.describe_worst()}; {len(report.failures)} failures"
        + (f"; compile {console.duration(report.compile_seconds)} of {console.duration(report.seconds)}")
        + (f"; {report.workers} workers" if report.workers > 1 else "")
    )
    if top is not None:  # one line, however many warnings the kernel raised
        total = sum(r.warnings for r in warned)
        print(f"warnings: {total} in all; most in {top.name}: {top.warning}")
    for error in report.worker_errors:
        print(f"  {error}", file=sys.stderr)
    if command.campaigns is not None:
        _record_campaign(command.campaigns, report, run)
    return 1 if report.failures or report.worker_errors else 0


def _record_campaign(path: Path, report, run: ResolvedFuzz) -> None:
    """``--campaigns``: one row appended to campaigns.json."""
    from gdn_verify.runners import campaigns, workers

    impl = run.impl
    gpus = min(report.workers, len(workers.visible_gpus()) or 1) if impl.array != "numpy" else 1
    row = campaigns.campaign_row(report, impl.name, run.dtype, campaigns.device_name(impl.array, gpus))
    campaigns.append_campaign(path, row)
    print(f"campaign recorded in {path}: {json.dumps(row)}")


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
        properties=comma_list(args.properties),
        dims=comma_dims(args.dims),
    )
    writable(options.out, "out", directory=True)  # before hours of measurements, not after
    s = options.sizes
    print(
        f"gdn-verify report: {', '.join(i.name for i in options.impls)}; dtypes {', '.join(options.dtypes)}; "
        f"{s.name} sizes (H={s.H} HV={s.HV} K={s.K} V={s.V}, T up to {s.max_tokens}); seed {options.checks.seed}; "
        f"{options.checks.max_examples} examples per property"
    )
    for skip in options.skipped:
        print(f"skipped: {skip['impl']}: {skip['reason']}")
    display = console.ProgressDisplay()
    deciles = [-1]

    def progress(fraction: float, label: str) -> None:  # every tenth of the work is drawn at once (a terminal only)
        CtrlC.check()
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
    # Issue 13: a report with a failed property is a failed run (exit 1), like check.
    failed = [r for row in doc["properties"] for r in row["results"] if r["status"] not in ("passed", "unsupported")]
    if failed:
        print(f"{len(failed)} propert{'y' if len(failed) == 1 else 'ies'} failed (see the report's property tables)")
    return 1 if failed else 0


def cmd_bench(args: argparse.Namespace) -> int:
    from gdn_verify.bench import run_bench

    out = writable(args.out, "out") if args.out else None  # before the measurements, not after
    json_path = writable(args.json, "json") if args.json else None
    text, document = run_bench(args.what)
    print(text)
    if out:
        out.write_text(text + "\n")
    if json_path:
        api.write_json(json_path, document)
    return 0


def cmd_matrix(args: argparse.Namespace) -> int:
    """``matrix``: check one implementation at several releases of its library, a child process each."""
    from gdn_verify.report import matrix as matrix_report
    from gdn_verify.runners import matrix

    out = writable(args.json, "json") if args.json else None
    # misuse (a bad --dtype, --dims, ...) is one line before any release runs
    options = CheckOptions.from_flags(vars(args))
    # scale_<case> names are the child's to check (the cases depend on its device's limits)
    unknown = [n for n in options.properties or () if n not in NAMES and not n.startswith(SCALE_PREFIX)]
    if unknown:
        raise ConfigurationError("properties", f"{', '.join(unknown)}: choose from {', '.join(NAMES)}")
    seed = options.seed if options.seed is not None else random.randrange(2**31)  # one seed: the same examples
    values = {**vars(args), "seed": seed, "timeout": options.timeout or 0}
    partial = matrix.prepare(args.impl, comma_list(args.versions) or [], matrix.check_argv(values), args.wheels)
    display = console.ProgressDisplay()

    def save(status: str) -> None:
        if out is not None:
            api.write_json(out, matrix_report.document(partial, status, ["gdn-verify", *args.argv]))

    def on_start(version: str) -> None:
        CtrlC.check()
        if display.live:
            display.update(f"  {args.impl} {version}: fetching and checking", force=True)

    def on_release(row) -> None:
        partial.rows.append(row)
        save("running")
        if display.live:  # a terminal: one line per release as it ends; a log gets the table
            display.print(
                f"  {args.impl} {row.version}: {row.status} {row.reason}".rstrip() + f" ({row.seconds:.0f} s)"
            )
        CtrlC.check()

    save("running")
    try:
        result = matrix.run_matrix(
            args.impl,
            partial.versions,
            partial.check_args,
            args.wheels,
            on_start=on_start,
            on_release=on_release,
            keep=out,
        )
        CtrlC.check()
    except KeyboardInterrupt:
        display.clear()
        save("interrupted")
        print("\n".join(matrix_report.table_lines(partial)))
        if out is not None:
            print(f"partial matrix ({len(partial.rows)} releases) written to {out}", file=sys.stderr)
        raise
    display.clear()
    misuse = result.misuse
    save("misuse" if misuse is not None else "complete")
    if misuse is not None:
        print(f"error: every release: {misuse.reason}", file=sys.stderr)
        return 2
    print("\n".join(matrix_report.table_lines(result)))
    return 0 if result.passed else 1


def _impl_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--impl", help=f"{', '.join(implementations.names())}, planted:BUG, planted-grad:BUG, or MODULE:FUNCTION"
    )
    p.add_argument("--array", choices=ARRAYS, help="array type a MODULE:FUNCTION takes")
    p.add_argument(
        "--convention",
        choices=implementations.CONVENTIONS,
        default="native",
        help="calling convention of a MODULE:FUNCTION: native (FLA), spec (vLLM speculative decoding) or "
        "backward (a functional backward fn(q, k, v, g, beta, scale=None, initial_state=None, "
        "use_qk_l2norm_in_kernel=False, cu_seqlens=None, *, do, dht=None) -> (dq, dk, dv, dg, dbeta, dh0); "
        "check then verifies the gradients, as with --grad) or max (a callable in Modular MAX's gated_delta "
        "convention, gdn_verify/core/max_convention.py)",
    )


def _suite_options(p: argparse.ArgumentParser, grad: bool = False) -> None:
    p.add_argument("--dtype", help="input dtype: " + ", ".join(DTYPES))
    gradients = api.grad_names() if grad else ()
    p.add_argument(
        "--properties",
        help="comma-separated subset of: "
        + ", ".join(NAMES)
        + (f"; with --grad, of: {', '.join(gradients)}" if gradients else ""),
    )
    p.add_argument("--seed", type=int, help="Hypothesis seed (default: random, printed)")
    p.add_argument(
        "--dims",
        help="draw head sizes K and V only from these, e.g. 64,128 (for kernels compiled per "
        "size; default: every size, awkward ones included)",
    )
    p.add_argument("--cases", help="directory for minimal failing cases (default .gdn_verify/cases)")
    _run_options(p)


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds a kernel call may take before it is reported as a timeout (default {DEFAULT_TIMEOUT:g}; "
        f"the first call of a new shape gets {FIRST_CALL_FACTOR:g}x that for compilation; 0: no limit)",
    )
    p.add_argument("--json", help="write the results as JSON to this path (rewritten as results arrive)")


def _compile_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--compile-budget",
        help="time for compiling shape classes up front when a new class is expensive (JIT kernels such as "
        "FLA's): 90s, 5m (default 3m); the pool of classes drawn from adapts to it. Given, it re-plans the pool "
        "and replaces the stored plan; without it, a run reuses the pool stored for the same implementation, "
        "version, device, dtype, head sizes and gradient mode",
    )
    p.add_argument("--plans", help="directory of stored shape-class pools (default .gdn_verify/plans)")


def add_check(sub: argparse._SubParsersAction) -> None:
    check = sub.add_parser("check", help="run the property suite against an implementation")
    _impl_options(check)
    _suite_options(check, grad=True)
    check.add_argument("--max-examples", type=int, help="examples per property (default: each property's own)")
    check.add_argument(
        "--max-tokens", type=int, help="longest T for error_growth (default 65536 for GPU arrays, 2048 for NumPy)"
    )
    check.add_argument("--database", help="directory for Hypothesis's example database (default: none)")
    check.add_argument(
        "--scale",
        action="store_true",
        help="then the scale tier: problems past the launch-grid and 2^31-element limits, each in a child "
        "process (GPU only; name scale_<case> in --properties to run some alone)",
    )
    check.add_argument(
        "--sanitize",
        action="store_true",
        help="run the check in a child under compute-sanitizer memcheck; its first error is a failure (slow: "
        "keep --max-examples small)",
    )
    check.add_argument(
        "--grad",
        action="store_true",
        help="verify the backward instead of the forward: the gradient properties (dq, dk, dv, dg, dbeta, dh0 "
        "against the float64 adjoint, ...) on the implementation's functional backward (--convention backward) "
        "or, for a torch function (--array torch, fla-chunk), its autograd backward; not with --scale",
    )
    check.add_argument(
        "--all-configs",
        action="store_true",
        help="for each autotuned Triton kernel the implementation launches, run the properties (default: "
        "matches_reference, varlen_equals_separate, determinism; or --properties) under every config of its "
        "autotuner, one at a time; a failure names the kernel and the config. Costs configs x properties; "
        "not with --scale",
    )
    check.add_argument(
        "--config-kernels",
        metavar="NAMES",
        help="with --all-configs: sweep only these autotuned kernels (comma-separated, as the plan lists them); "
        "the others keep their autotuner's choice",
    )
    _compile_option(check)
    check.add_argument(
        "--backend",
        metavar="NAME",
        help="every kernel call must run on this backend, else its property fails (a fallback); "
        f"one of {', '.join(BACKENDS)} (default: any, recorded)",
    )
    check.set_defaults(func=cmd_check)


def add_selftest(sub: argparse._SubParsersAction) -> None:
    selftest = sub.add_parser("selftest", help="check the planted-bug implementations; all must be caught")
    selftest.add_argument("--dtype", default="float32", choices=tuple(DTYPES))
    selftest.add_argument("--max-examples", type=int)
    selftest.add_argument("--seed", type=int, help="Hypothesis seed (default: random, printed)")
    selftest.add_argument(
        "--grad",
        action="store_true",
        help="the planted gradient bugs (planted-grad:BUG) against the gradient properties",
    )
    _run_options(selftest)
    selftest.set_defaults(func=cmd_selftest)


def add_replay(sub: argparse._SubParsersAction) -> None:
    rp = sub.add_parser("replay", help="rerun a saved failing case")
    rp.add_argument("case")
    rp.add_argument("--impl", help="implementation (default: the one recorded in the case)")
    rp.add_argument("--array", choices=ARRAYS, help="array type a MODULE:FUNCTION takes (default: as recorded)")
    rp.add_argument("--property", help="property to rerun (default: the one saved in the case)")
    rp.add_argument(
        "--convention",
        choices=implementations.CONVENTIONS,
        help="calling convention of a MODULE:FUNCTION (default: the property's; for a gradient property backward, "
        "or native, through autograd, for --array torch)",
    )
    rp.add_argument(
        "--diagnose",
        action="store_true",
        help="also name the first token, chunk, head and sequence where the error crosses the tolerance",
    )
    rp.set_defaults(func=cmd_replay)


def add_fuzz(sub: argparse._SubParsersAction) -> None:
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
    fz.add_argument("--campaigns", help="append this campaign's row (impl, dtype, cases, ...) to this JSON list")
    fz.set_defaults(func=cmd_fuzz)


def add_report(sub: argparse._SubParsersAction) -> None:
    rep = sub.add_parser("report", help="error and precision report: index.html, report.md, results.json, figures")
    rep.add_argument(
        "--impl",
        action="append",
        help="implementation to include; repeat to compare several "
        "(default: the CuPy and FLA kernels on a GPU, else NumPy)",
    )
    rep.add_argument("--array", choices=ARRAYS, help="array type a MODULE:FUNCTION takes")
    rep.add_argument("--dtype", action="append", help="input dtype; repeat for several (default: float32 and bfloat16)")
    rep.add_argument(
        "--out",
        help="report directory (default: .gdn_verify/reports/report-<UTC date and time>, which git ignores "
        "like the rest of .gdn_verify/)",
    )
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


def add_bench(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="GPU benchmarks: decode and prefill, side by side with FLA and a copy")
    bench.add_argument("--what", choices=("decode", "prefill", "all"), default="all")
    bench.add_argument("--out", help="write the Markdown tables to this file")
    bench.add_argument("--json", help="write the rows as JSON: lists under decode, prefill, prefill_accuracy")
    bench.set_defaults(func=cmd_bench)


def add_matrix(sub: argparse._SubParsersAction) -> None:
    mx = sub.add_parser(
        "matrix", help="check one implementation at several releases of its library: release x property"
    )
    mx.add_argument("--impl", required=True, help="fla-chunk, fla-recurrent, vllm-chunk, ... (an FLA or vLLM adapter)")
    mx.add_argument("--versions", required=True, help="comma-separated releases, e.g. 0.5.2,0.6.0")
    mx.add_argument("--wheels", help="folder of wheels tried before the package index (pip download)")
    _suite_options(mx)
    mx.add_argument("--max-examples", type=int, help="examples per property (default: each property's own)")
    mx.add_argument("--max-tokens", type=int, help="longest T for error_growth (default as check's)")
    mx.add_argument("--scale", action="store_true", help="each release's check runs the scale tier too (GPU only)")
    _compile_option(mx)
    mx.set_defaults(func=cmd_matrix)


# A subcommand is a parser function here and its cmd_* function above (set as its func).
SUBCOMMANDS = (add_check, add_selftest, add_replay, add_fuzz, add_report, add_bench, add_matrix)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gdn-verify", description="Verify Gated DeltaNet (GDN) implementations.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {gdn_verify.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; a Ctrl-C anywhere in it, start-up included, is one line and exit 130, a
    SIGTERM after start-up exit 143 (the commands themselves save their partial results first)."""
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        args = build_parser().parse_args(argv)
        args.argv = argv
        return args.func(args)
    except ConfigurationError as exc:
        print(f"error: {flag(exc.field)}: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        terminated = CtrlC.seen and CtrlC.signum == signal.SIGTERM
        print(INTERRUPTED + (" (SIGTERM)" if terminated else ""), file=sys.stderr)
        return 143 if terminated else 130


def run(argv: list[str] | None = None) -> int:
    """:func:`main`, then exit; at once when a timed-out kernel call still runs in an abandoned
    thread (waiting for it, or for a stuck device at interpreter shutdown, could take forever)."""
    CtrlC.install()  # the process's own entry point: in-process callers of main() keep their handler
    code = main(argv)
    if abandoned_calls():
        print(
            f"note: {abandoned_calls()} timed-out kernel call(s) still running; exiting without waiting for them",
            file=sys.stderr,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(run())
