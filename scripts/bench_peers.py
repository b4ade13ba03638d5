"""Prefill beside every peer that loads (``gdn_verify.bench.peers``): ours with context parallelism
auto and off, FLA, FlashInfer (``use_cp`` off and auto), FlashQLA, vLLM's FLA copy, on the five
rows of ``cli.py bench --what prefill``, Qwen3.5's tensor-parallel head layouts and a 262144-token
sequence, with the physical floor of each row, extra memory and accuracy against the float64 oracle.

Writes ``OUT_DIR/prefill_peers.json`` after every row (a run cut short keeps its finished rows)
and ``OUT_DIR/prefill_peers.md`` (device, date, versions, the summary and detail tables, the peers
that did not load and why). Usage::

    python3 scripts/bench_peers.py OUT_DIR [--peers ours,fla,...] [--rows REGEX,...] [--resume]
    python3 scripts/bench_peers.py OUT_DIR --merge-only --merge OTHER/prefill_peers.json ...   # CPU
    python3 scripts/bench_peers.py OUT_DIR --list                                               # CPU

``--rows`` picks rows by their key ``"H/HV SxL"`` (``"^2/8 "``, ``"1x65536$"``). ``--resume``
keeps the rows already in ``OUT_DIR/prefill_peers.json`` and runs the others (a new run in the
same file). FlashQLA's site (``/tmp/fqsite``) cannot share a process with FlashInfer's
(``/tmp/site``: two tvm-ffi versions), so it runs in an invocation of its own, with ``ours`` for
its ratios, and ``--merge`` joins that file's rows into this one by key (a cell this file has
wins, unless it is an error). Exit status: 0, 3 when the run stopped early (a CUDA context lost),
130 when interrupted (Ctrl-C, SIGTERM from ``timeout``). Commands for the GPU machine:
``scripts/gpu-machine/README.md``.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gdn_verify.bench import peer_table, peers  # noqa: E402 - after the path above


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="bench_peers.py")
    parser.add_argument("out", help="folder for prefill_peers.json and prefill_peers.md")
    parser.add_argument("--peers", help=f"comma-separated, default {','.join(peers.PEERS)}")
    parser.add_argument("--rows", help="comma-separated regular expressions on the row key 'H/HV SxL'")
    parser.add_argument("--merge", nargs="+", default=[], metavar="FILE", help="peer-bench JSON files to join in")
    parser.add_argument("--merge-only", action="store_true", help="run nothing: join --merge into OUT's file")
    parser.add_argument("--resume", action="store_true", help="keep OUT's finished rows and run the others")
    parser.add_argument("--list", action="store_true", help="print the row plan and the peers, run nothing")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=peers.prefill.REPS)
    parser.add_argument("--rounds", type=int, default=peers.prefill.ROUNDS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--gates", choices=peers.prefill.GATES, default="fast", help="the gate regime of the inputs (prefill.GATES)"
    )
    parser.add_argument("--no-inference-mode", action="store_true", help="call the kernels outside inference mode")
    return parser.parse_args(argv)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str]) -> int:
    args = parse(argv)
    out = Path(args.out)
    plan = peers.select_rows(peers.rows(), args.rows.split(",") if args.rows else None)
    names = peers.peer_names(args.peers)
    if args.list:
        for row in plan:
            heads, note = peers.oracle_heads(row)
            print(f"{row.key:18s} {row.tokens:7d} tokens, oracle heads {heads}" + (f" ({note})" if note else ""))
        print("peers:", ", ".join(names), f"(optional: {', '.join(peers.OPTIONAL_PEERS)})")
        return 0
    existing = out / peer_table.JSON_NAME
    keep = (args.resume or args.merge_only) and existing.is_file()
    doc = peer_table.load(existing) if keep else peer_table.new_document()
    status = 0
    if not args.merge_only:
        skip = frozenset(r["key"] for r in doc["rows"]) if args.resume else frozenset()

        def on_start(meta: dict) -> int:
            devices = {run.get("device") for run in doc["runs"]} - {meta["device"]}
            if devices:
                raise SystemExit(f"{existing} holds runs on {sorted(devices)}, this is {meta['device']}")
            meta["command"] = ["scripts/bench_peers.py", *argv]
            run = peer_table.add_run(doc, meta)
            peer_table.write(doc, out)
            return run

        def on_row(row: dict) -> None:
            peer_table.put_row(doc, row)
            peer_table.write(doc, out)

        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            meta = peers.bench(
                plan,
                names,
                on_start=on_start,
                on_row=on_row,
                skip=skip,
                warmup=args.warmup,
                reps=args.reps,
                rounds=args.rounds,
                seed=args.seed,
                inference_mode=not args.no_inference_mode,
                gates=args.gates,
            )
            status = 3 if meta.get("stopped") else 0
        except KeyboardInterrupt as exc:
            if doc["runs"]:
                doc["runs"][-1]["stopped"] = f"interrupted ({exc or 'Ctrl-C'}); the row in progress is lost"
            print(f"interrupted: {exc or 'Ctrl-C'}", file=sys.stderr)
            status = 130
        finally:
            signal.signal(signal.SIGTERM, previous)
    for path in args.merge:
        doc = peer_table.merge(doc, peer_table.load(path))
    json_path, md_path = peer_table.write(doc, out)
    print(f"{json_path}: {len(doc['rows'])} rows, {len(doc['runs'])} runs; {md_path}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
