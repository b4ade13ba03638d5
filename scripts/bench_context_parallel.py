"""Context parallelism of our chunked prefill against its segment count J: one sequence of T tokens
(bfloat16, K = V = 128) per head layout (H, HV), timed with ``context_parallel`` off, forced to
J = 2, 4, 8, 16, 32 segments, and auto (``None``, the cost model of ``cupy_kernels/chunk_plan.py``,
section "context parallelism"), whose choice is read from ``chunk.last_kernels``.

Why: the auto choice is a cost model whose overheads (a fixed one and one per segment) are fitted
to these timings; this bench is what to run again after a change to the context-parallel passes,
the scan or the model's constants, to see where splitting pays and whether the auto choice finds it.

Each time is the median of 9 CUDA-event timings of one call, after 2 warm-up calls
(``gdn_verify.bench.prefill._time_ms``); a J the launcher refuses (``ValueError``) is left out of
its row. Writes ``OUT_DIR/context_parallel.json`` after every row (device, date, torch and CuPy
versions, settings, ``rows``: ``H``, ``HV``, ``T``, the time in ms under the key ``str(J)``,
``"False"`` for off and ``"None"`` for auto, and ``auto_label``) and ``OUT_DIR/context_parallel.md``
(per layout and T: ms per J, the best, auto's choice and its time over the plain call's). One line
of progress per row on stderr; exit 2 with one line where no CUDA device is usable. Usage (GPU)::

    PYTHONPATH=. python3 scripts/bench_context_parallel.py OUT_DIR [--layouts 2/8,8/16] [--tokens 8192,65536]

Results: ``reports/2026-11-27-context-parallel/``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LAYOUTS = ((2, 8), (8, 16), (16, 32))
TOKENS = (8192, 16384, 32768, 65536, 131072)
MODES: tuple[bool | int | None, ...] = (False, 2, 4, 8, 16, 32, None)
K = V = 128
WARMUP, REPS = 2, 12  # REPS split over prefill.ROUNDS interleaved rounds


def parse_layouts(text: str) -> tuple[tuple[int, int], ...]:
    """``"2/8,8/16"`` as ``((2, 8), (8, 16))``; ``ValueError`` on anything else."""
    pairs = []
    for item in text.split(","):
        h, hv = item.split("/")
        pairs.append((int(h), int(hv)))
    if any(h < 1 or hv < 1 for h, hv in pairs):
        raise ValueError(f"head counts must be positive: {text!r}")
    return tuple(pairs)


def parse_tokens(text: str) -> tuple[int, ...]:
    """``"8192,65536"`` as ``(8192, 65536)``; ``ValueError`` on anything else."""
    tokens = tuple(int(t) for t in text.split(","))
    if any(t < 1 for t in tokens):
        raise ValueError(f"token counts must be positive: {text!r}")
    return tokens


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The command line; ``layouts`` and ``tokens`` come back as tuples (the defaults if not given)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="bench_context_parallel.py")
    parser.add_argument("out", help="folder for context_parallel.json and context_parallel.md")
    parser.add_argument("--layouts", help="H/HV pairs, e.g. 2/8,8/16 (default: 2/8, 8/16, 16/32)")
    parser.add_argument("--tokens", help="sequence lengths, e.g. 8192,65536 (default: 8192 to 131072)")
    args = parser.parse_args(list(argv))
    try:
        args.layouts = parse_layouts(args.layouts) if args.layouts else LAYOUTS
        args.tokens = parse_tokens(args.tokens) if args.tokens else TOKENS
    except ValueError:
        parser.error("--layouts takes H/HV pairs (2/8,8/16), --tokens positive integers (8192,65536)")
    return args


def segments_of(label: str | None) -> int | None:
    """The segment count J in a ``chunk.last_kernels`` label (1 without "context-parallel x J"; None
    without a label)."""
    if not label:
        return None
    found = re.search(r"context-parallel x (\d+)", label)
    return int(found.group(1)) if found else 1


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def format_row(row: dict[str, Any]) -> str:
    """One Markdown table row of :func:`render`."""
    times = {mode: row.get(str(mode)) for mode in MODES[:-1]}
    measured = {mode: t for mode, t in times.items() if t is not None}
    best = min(measured, key=lambda mode: measured[mode]) if measured else None
    plain, auto = row.get("False"), row.get("None")
    J = segments_of(row.get("auto_label"))
    cells = [f"{row['H']}/{row['HV']}", str(row["T"]), *(_ms(t) for t in times.values())]
    cells += ["-" if best is None else ("off" if best is False else str(best))]
    cells += [_ms(auto), "-" if J is None else ("off" if J == 1 else str(J))]
    cells += ["-" if auto is None or not plain else f"{auto / plain:.2f}"]
    return "| " + " | ".join(cells) + " |"


def render(doc: dict[str, Any]) -> str:
    """The Markdown of a bench document (:func:`main`'s JSON): its header and one row per measurement."""
    versions = ", ".join(f"{name} {version}" for name, version in doc.get("versions", {}).items())
    lines = [
        "# Context parallelism: time against the segment count J",
        "",
        f"{doc.get('device', 'device not recorded')}; {doc.get('date', 'date not recorded')}; {versions}.",
        f"bfloat16, K = V = {K}, one sequence of T tokens; ms per call, the median over interleaved rounds "
        f"in alternating order of each mode's CUDA-event timings ({REPS} in all, {WARMUP} warm-up calls "
        "before the first round, one before each later one). off: `context_parallel=False`; J: forced J segments; "
        "auto: `context_parallel=None`, its J from `chunk.last_kernels`; auto / off: its time over the "
        "plain call's.",
        "",
        "| H/HV | T | off | J=2 | J=4 | J=8 | J=16 | J=32 | best | auto | auto's J | auto / off |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- | ---: |",
    ]
    lines += [format_row(row) for row in doc.get("rows", [])]
    return "\n".join(lines) + "\n"


def device_problem() -> str | None:
    """Why this machine cannot run the bench (no torch CUDA device, no usable CuPy device), or None."""
    from gdn_verify.core import arrays

    try:
        arrays.check_kind("torch")
        arrays.check_kind("cupy")
    except arrays.ArrayKindUnavailable as exc:
        return str(exc)
    import torch

    return None if torch.cuda.is_available() else "torch sees no CUDA device"


def inputs(torch: Any, H: int, HV: int, T: int) -> dict[str, Any]:
    """The call's tensors: bfloat16 q, unit-norm k and v; gates -0.1 U(0, 1) and beta U(0, 1) in
    float32; a zero float32 initial state."""
    d: dict[str, Any] = dict(device="cuda")
    k = torch.nn.functional.normalize(torch.randn(1, T, H, K, **d), dim=-1)
    return dict(
        q=torch.randn(1, T, H, K, **d).bfloat16(),
        k=k.bfloat16(),
        v=torch.randn(1, T, HV, V, **d).bfloat16(),
        g=-torch.rand(1, T, HV, **d) * 0.1,
        beta=torch.rand(1, T, HV, **d),
        initial_state=torch.zeros(1, HV, K, V, **d),
    )


def measure_row(torch: Any, chunk: Any, H: int, HV: int, T: int) -> dict[str, Any]:
    """One row: the median ms of each mode in :data:`MODES` (key ``str(mode)``) and the auto call's
    label. The modes are timed in interleaved rounds of alternating order (``prefill.interleave``):
    timed one after another, the first mode of a row ran on a GPU still clocking up from the row's
    set-up, which put ``off`` 45 % above the identical auto call on 2026-11-28."""
    from gdn_verify.bench import prefill

    x = inputs(torch, H, HV, T)
    row: dict[str, Any] = dict(H=H, HV=HV, T=T)
    calls = {}
    for mode in MODES:

        def call(mode: bool | int | None = mode) -> Any:
            return chunk.chunk_gated_delta_rule(**x, output_final_state=True, context_parallel=mode)

        try:
            call()
        except ValueError:  # a J the launcher refuses for this shape
            continue
        if mode is None:
            row["auto_label"] = chunk.last_kernels
        calls[str(mode)] = call
    torch.cuda.synchronize()
    for name, cell in prefill.interleave_calls(calls, torch.cuda.synchronize, WARMUP, REPS).items():
        row[name] = round(cell["ms"], 4)
    return row


def progress(row: dict[str, Any]) -> str:
    """The stderr line of a finished row."""
    names = {False: "off", None: "auto"}
    parts = [f"{names.get(mode, f'J={mode}')} {_ms(row.get(str(mode)))}" for mode in MODES]
    J = segments_of(row.get("auto_label"))
    return f"{row['H']}/{row['HV']} T={row['T']}: " + ", ".join(parts) + f" ms (auto J={J})"


def write(doc: dict[str, Any], out: Path) -> None:
    """``context_parallel.json`` and ``context_parallel.md`` in ``out``."""
    (out / "context_parallel.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "context_parallel.md").write_text(render(doc))


def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    problem = device_problem()
    if problem:
        print(f"bench_context_parallel: needs a CUDA device with torch and CuPy: {problem}", file=sys.stderr)
        return 2
    import cupy
    import torch

    from cupy_kernels import chunk

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = dict(
        device=torch.cuda.get_device_name(),
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        versions={"torch": torch.__version__, "cupy": cupy.__version__},
        settings=dict(dtype="bfloat16", K=K, V=V, warmup=WARMUP, reps=REPS, modes=[str(m) for m in MODES]),
        rows=[],
    )
    for H, HV in args.layouts:
        for T in args.tokens:
            row = measure_row(torch, chunk, H, HV, T)
            torch.cuda.empty_cache()  # the row's inputs are gone: the next, larger ones get the room
            doc["rows"].append(row)
            write(doc, out)
            print(progress(row), file=sys.stderr, flush=True)
    doc["finished"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    write(doc, out)
    print(render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
