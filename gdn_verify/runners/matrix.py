"""The release matrix: one ``check`` per release of a library, each in a child process of its own.

``run_matrix("fla-chunk", ["0.5.2", "0.6.0"], ["--dtype", "float32"])`` unpacks each release
(``releases.site``), runs ``python -m gdn_verify check --impl fla-chunk --json TMP ...`` in a child
with that release first on its path (``releases.child_env``), and reads the child's JSON (schema
``kind: check``) into a :class:`Row`: per property its status, the worst error over its bound and a
failure's kind and cause. Two releases of one library cannot share a process, hence the children.

A release that cannot be had is a row with status ``unavailable``, a child that exits 2 (the
adapter cannot take the release, a bad argument) a row ``misuse`` with the child's one line, and
a Ctrl-C stops the running child, keeps its partial JSON as a row ``interrupted`` and is raised
again. Nothing here prints: ``on_start(version)`` and ``on_release(row)`` report progress.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gdn_verify.core.implementation import ConfigurationError
from gdn_verify.core.property import Measurement
from gdn_verify.implementations import interpreter
from gdn_verify.runners import releases
from gdn_verify.runners.check import NOT_PASSED

# The library a built-in implementation name belongs to, by its prefix.
LIBRARIES = {"fla-": "fla", "vllm-": "vllm"}
# A release's overall status: every property passed (or was unsupported); some property did not;
# the child exited 2 (misuse); the release could not be had; the child died without a verdict;
# Ctrl-C (or SIGTERM) while it ran.
ROW_STATUSES = ("passed", "failed", "misuse", "unavailable", "error", "interrupted")
# check's flags a matrix passes on to every child, by argparse destination.
CHECK_FLAGS = (
    "dtype",
    "properties",
    "seed",
    "max_examples",
    "max_tokens",
    "dims",
    "timeout",
    "cases",
    "compile_budget",
    "plans",
)
# The child is this, then --impl IMPL --json PATH and the check arguments (tests replace it).
CHILD = (sys.executable, "-m", "gdn_verify", "check")
# check's header line, "gdn-verify check: impl=NAME (DESCRIPTION), arrays=...": the description
# names the release when the adapter is version-aware (check's JSON does not carry it).
HEADER = re.compile(r"^gdn-verify check: impl=\S+ \((.*)\), arrays=", re.MULTILINE)
INTERRUPTED = "stopped by Ctrl-C or SIGTERM"
# A stopped child gets GRACE_SECONDS to end on the Ctrl-C it shares with us (a terminal signals the
# whole process group), then SIGTERM, then STOP_SECONDS to save its partial JSON before it is killed.
GRACE_SECONDS = 2.0
STOP_SECONDS = 30.0


def library_of(impl: str) -> str:
    """The library whose releases ``impl`` runs (``fla-chunk``: ``fla``); ConfigurationError otherwise."""
    for prefix, library in LIBRARIES.items():
        if impl.startswith(prefix):
            return library
    raise ConfigurationError(
        "impl",
        f"{impl!r}: a release matrix runs an implementation of a released library: "
        + ", ".join(f"{p}* ({lib})" for p, lib in LIBRARIES.items()),
    )


def check_argv(values: Mapping[str, Any]) -> list[str]:
    """The check flags among ``values`` (argparse destinations, None: not given) as a child's arguments."""
    argv = []
    for name in CHECK_FLAGS:
        value = values.get(name)
        if value is not None:
            argv += ["--" + name.replace("_", "-"), str(value)]
    return argv


@dataclass(frozen=True)
class Cell:
    """One property of one release: its status (passed, failed, unsupported, timeout, error, misuse),
    the worst error over its bound (the failure's for one that did not pass; None when nothing was
    measured) and a numeric failure's kind and likely cause (empty otherwise)."""

    status: str
    ratio: float | None = None
    kind: str = ""
    cause: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dict(status=self.status, ratio=self.ratio, kind=self.kind, cause=self.cause)


@dataclass
class Row:
    """One release's verdict: ``status`` (:data:`ROW_STATUSES`), ``reason`` (one line, for a status
    other than passed or failed), the implementation's description and the library version the
    child reported (its distribution's metadata; None for vLLM's ops folder), the GPU it ran on
    (None on the CPU), the child's exit code
    and one :class:`Cell` per property, in the order the child ran them."""

    version: str
    status: str
    reason: str = ""
    description: str | None = None
    loaded: str | None = None
    device: str | None = None
    exit_code: int | None = None
    seconds: float = 0.0
    properties: dict[str, Cell] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def as_dict(self) -> dict[str, Any]:
        return dict(
            version=self.version,
            status=self.status,
            reason=self.reason,
            description=self.description,
            loaded=self.loaded,
            device=self.device,
            exit_code=self.exit_code,
            seconds=round(self.seconds, 1),
            properties={name: cell.as_dict() for name, cell in self.properties.items()},
        )


@dataclass
class MatrixResult:
    """The rows of a matrix, one per release in the order given (fewer when interrupted)."""

    impl: str
    library: str
    versions: list[str]
    check_args: list[str]
    interpreter: bool
    rows: list[Row] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Every release ran and passed."""
        return len(self.rows) == len(self.versions) and all(r.passed for r in self.rows)

    @property
    def misuse(self) -> Row | None:
        """The first row when every release was misuse: then it is the arguments, not the releases."""
        if self.rows and all(r.status == "misuse" for r in self.rows):
            return self.rows[0]
        return None

    def columns(self) -> list[str]:
        """The properties of every row, in the order first run."""
        names: dict[str, None] = {}
        for row in self.rows:
            names.update(dict.fromkeys(row.properties))
        return list(names)


def _number(x: Any) -> float | None:
    """A JSON number, or the strings "inf", "-inf", "nan" that stand for one; None otherwise."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    if x in ("inf", "-inf", "nan"):
        return float(x)
    return None


def cell(result: Mapping[str, Any]) -> Cell:
    """A :class:`Cell` from a ``property_result`` of check's JSON."""
    worst = result.get("worst") or {}
    error, bound = _number(worst.get("error")), _number(worst.get("bound"))
    ratio = None if error is None or bound is None or math.isnan(error) else Measurement.ratio_of(error, bound)
    failure = result.get("failure") or {}
    return Cell(str(result["status"]), ratio, failure.get("kind") or "", failure.get("cause") or "")


def loaded_version(library: str, document: Mapping[str, Any], version: str) -> str | None:
    """The version of ``library`` the child's environment records (its distributions' metadata)."""
    packages = (document.get("environment") or {}).get("packages") or {}
    if library != "fla":  # vLLM's ops folder is no distribution of its own
        return None
    found = [packages[d] for d in releases.distributions(library, version) if d in packages]
    return found[0] if found else None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def row_of(
    version: str, library: str, code: int | None, document: Mapping[str, Any] | None, stdout: str, stderr: str
) -> Row:
    """A release's :class:`Row` from its child's exit code (None: stopped), JSON (None: none written) and output."""
    header = HEADER.search(stdout)
    description = (document or {}).get("description") or (header.group(1) if header else None)
    row = Row(version, "error", description=description, exit_code=code)
    if document is not None:
        row.properties = {str(r["name"]): cell(r) for r in document.get("results") or []}
        row.loaded = loaded_version(library, document, version)
        row.device = (document.get("environment") or {}).get("device")
    if code is None:
        row.status, row.reason = "interrupted", INTERRUPTED
    elif code == 2:
        row.status, row.reason = "misuse", _last_line(stderr) or "the child exited 2 (misuse)"
    elif document is None or code not in (0, 1) or document.get("status") in ("running", "interrupted"):
        why = _last_line(stderr) or "no output"
        state = "no JSON" if document is None else f"JSON status {document.get('status')}"
        row.reason = f"the child exited {code} ({state}): {why}"
    elif row.loaded is not None and row.loaded != version:
        row.reason = f"the child loaded {library} {row.loaded}, not {version}: the release's folder is not first"
    else:
        failed = any(c.status in NOT_PASSED for c in row.properties.values())
        row.status = "failed" if failed or code == 1 else "passed"
        if document.get("not_run"):
            row.reason = f"not run: {', '.join(document['not_run'])} (the GPU context was lost)"
    return row


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def _stop(child: subprocess.Popen) -> None:
    """Stop the child as check stops on Ctrl-C or SIGTERM (saving its partial JSON), else kill it."""
    try:
        for wait, then in ((GRACE_SECONDS, child.terminate), (STOP_SECONDS, child.kill)):
            try:
                child.wait(wait)
                return
            except subprocess.TimeoutExpired:
                then()
        child.wait()
    except KeyboardInterrupt:  # a second Ctrl-C: no more waiting
        child.kill()
        child.wait()
        raise


def run_release(
    impl: str, library: str, version: str, check_args: Sequence[str], wheels: Path | None, workdir: Path
) -> Row:
    """Check ``impl`` at release ``version`` in a child process; its :class:`Row`.

    On Ctrl-C (KeyboardInterrupt) while the child runs, the child is stopped and the row is
    ``interrupted``, with the properties the child had finished; :func:`run_matrix` raises it again.
    """
    start = time.monotonic()
    try:
        site = releases.site(library, version, wheels)
    except releases.ReleaseError as exc:
        return Row(version, "unavailable", reason=str(exc), seconds=time.monotonic() - start)
    folder = Path(tempfile.mkdtemp(prefix=f"{library}-{version}-", dir=workdir))
    out, stdout, stderr = folder / "check.json", folder / "stdout", folder / "stderr"
    command = [*CHILD, "--impl", impl, "--json", str(out), *check_args]
    with stdout.open("w") as o, stderr.open("w") as e:
        child = subprocess.Popen(command, env=releases.child_env(site), stdout=o, stderr=e, stdin=subprocess.DEVNULL)
        code: int | None
        try:
            code = child.wait()
        except KeyboardInterrupt:
            _stop(child)
            code = None
    row = row_of(version, library, code, _read_json(out), stdout.read_text(), stderr.read_text())
    row.seconds = time.monotonic() - start
    return row


def prepare(
    impl: str, versions: Sequence[str], check_args: Sequence[str] = (), wheels: str | Path | None = None
) -> MatrixResult:
    """A matrix with no rows yet, its arguments checked (ConfigurationError naming the argument)."""
    library = library_of(impl)
    versions = [str(v).strip() for v in versions if str(v).strip()]
    if not versions:
        raise ConfigurationError("versions", "no release given: e.g. 0.5.2,0.6.0")
    if len(set(versions)) != len(versions):
        raise ConfigurationError("versions", f"{','.join(versions)}: a release is named twice")
    if wheels is not None and not Path(wheels).is_dir():
        raise ConfigurationError("wheels", f"{wheels}: no such folder")
    return MatrixResult(impl, library, versions, list(check_args), interpreter.requested())


def run_matrix(
    impl: str,
    versions: Sequence[str],
    check_args: Sequence[str] = (),
    wheels: str | Path | None = None,
    on_start: Callable[[str], None] | None = None,
    on_release: Callable[[Row], None] | None = None,
) -> MatrixResult:
    """Check ``impl`` at each of ``versions`` (one child process each); the rows in that order.

    ``check_args``: check's own flags, passed to every child (:func:`check_argv`); ``wheels``: a
    folder of wheels tried before the package index. ``on_start(version)`` is called before a
    release is fetched and run, ``on_release(row)`` after. A Ctrl-C stops the child and is raised
    again once ``on_release`` has had the interrupted row.
    """
    result = prepare(impl, versions, check_args, wheels)
    folder = None if wheels is None else Path(wheels)
    with tempfile.TemporaryDirectory(prefix="gdn-verify-matrix-") as tmp:
        for version in result.versions:
            if on_start is not None:
                on_start(version)
            try:
                row = run_release(impl, result.library, version, result.check_args, folder, Path(tmp))
            except KeyboardInterrupt:  # while the release was fetched or unpacked
                row = Row(version, "interrupted", reason=INTERRUPTED)
            result.rows.append(row)
            if on_release is not None:
                on_release(row)
            if row.status == "interrupted":
                raise KeyboardInterrupt
    return result
