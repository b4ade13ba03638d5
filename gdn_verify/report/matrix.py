"""A release matrix's two outputs: its console table (:func:`table_lines`) and its JSON document
(:func:`document`, schema ``gdn_verify/schema/matrix.schema.json``).

The table has a row per release and a column per property; a cell is ``pass``, ``FAIL`` with the
worst error over its bound (``FAIL 41x``; ``FAIL (raised)`` where none was measured), ``unsup``,
``timeout``, ``error``, ``misuse`` or ``-`` (not run), and the last column the release's status,
with its reason when it did not run to a verdict. Below it, what each release was (the
implementation's description) and each failure's kind and likely cause.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gdn_verify import api
from gdn_verify.core import environment
from gdn_verify.implementations import interpreter
from gdn_verify.runners import releases
from gdn_verify.runners.matrix import Cell, MatrixResult

MATRIX_SCHEMA_PATH = Path(api.SCHEMA_PATH).with_name("matrix.schema.json")
CELLS = {"passed": "pass", "failed": "FAIL", "unsupported": "unsup"}  # others by their status's name
STATUS_WORDS = {"passed": "passed", "failed": "FAILED"}  # the last column; others with their reason


def times(ratio: float | None) -> str:
    """``41x``, ``1.2e+03x``, ``inf``: an error over its bound."""
    if ratio is None:
        return "?"
    return "inf" if ratio == float("inf") else f"{ratio:.3g}x"


def cell_text(cell: Cell | None) -> str:
    if cell is None:
        return "-"
    text = CELLS.get(cell.status, cell.status)
    if cell.status != "failed":
        return text
    # a failure with no error measured (a launch error, a broken output contract): no ratio to give
    return f"{text} {times(cell.ratio)}" if cell.ratio is not None else f"{text} (raised)"


def _description(text: str | None) -> str:
    """The description without the interpreter's limits (the header names the interpreter once)."""
    return (text or "?").replace(f" [{interpreter.LIMITS}]", "")


def table_lines(result: MatrixResult) -> list[str]:
    """The matrix as lines of text (no colour, no trailing spaces)."""
    columns = result.columns()
    header = ["release", *columns, "status"]
    body = []
    for row in result.rows:
        status = STATUS_WORDS.get(row.status) or f"{row.status}: {row.reason}"
        if row.status in STATUS_WORDS and row.reason:
            status += f" ({row.reason})"
        body.append([row.version, *(cell_text(row.properties.get(name)) for name in columns), status])
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header) - 1)]
    where = "Triton interpreter on the CPU" if result.interpreter else "GPU"
    lines = [f"release matrix: {result.impl} ({result.library}), {where}; check {' '.join(result.check_args)}"]
    for line in [header, *body]:
        lines.append("  ".join([*(text.ljust(w) for text, w in zip(line, widths)), line[-1]]).rstrip())
    if any(c.status == "failed" for row in result.rows for c in row.properties.values()):
        lines.append("FAIL Nx: the worst error was N times its bound")
    if any(c.status == "failed" and c.ratio is None for row in result.rows for c in row.properties.values()):
        lines.append("FAIL (raised): no error was measured: the kernel raised or broke the output contract")
    for row in result.rows:
        if row.description is not None:
            lines.append(f"{row.version}: {_description(row.description)}")
        for name, cell in row.properties.items():
            if cell.kind or cell.cause:
                lines.append(f"{row.version} {name}: {', '.join(x for x in (cell.kind, cell.cause) if x)}")
    return lines


def document(result: MatrixResult, status: str, command: Sequence[str] | None = None) -> dict[str, Any]:
    """The matrix as its JSON document (``kind: matrix``); ``status``: running, complete,
    interrupted or misuse; ``command``: the command line, recorded."""
    if status not in api.RUN_STATUSES:
        raise ValueError(f"status {status!r}: expected one of {api.RUN_STATUSES}")
    env = environment.describe("numpy")  # this process's; the children's GPU is theirs
    library_dists = {d for v in result.versions for d in releases.distributions(result.library, v)}
    env["packages"] = {k: v for k, v in env["packages"].items() if k not in library_dists}  # each row has its own
    env["device"] = next((r.device for r in result.rows if r.device), None)
    env["interpreter"] = result.interpreter
    return dict(
        schema_version=api.SCHEMA_VERSION,
        kind="matrix",
        status=status,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command=None if command is None else " ".join(command),
        environment=env,
        impl=result.impl,
        library=result.library,
        versions=result.versions,
        check_args=result.check_args,
        columns=result.columns(),
        rows=[row.as_dict() for row in result.rows],
    )
