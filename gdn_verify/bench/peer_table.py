"""The peer bench's JSON document and its Markdown tables (pure: no GPU, no torch).

A document: ``{"kind": KIND, "version": 1, "runs": [meta, ...], "rows": [row, ...]}``. A run is one
invocation of the bench (:func:`gdn_verify.bench.peers.bench`'s ``meta``: device, date, versions,
the peers it loaded and why others did not, the copy bandwidth, the settings); a row is one shape
(:func:`gdn_verify.bench.peers.bench`'s rows), its ``cells`` one per peer, each naming its ``run``.
Ratios to ours are taken within one run (both in the same rounds), so a peer benched in another
invocation (FlashQLA, whose site cannot share a process with FlashInfer's) carries its own run's
ours time beside it (``ours_ms``). :func:`merge` joins documents by row key; :func:`write` writes
the JSON (atomically: a run cut short leaves the last complete file) and the Markdown.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

KIND = "gdn-verify prefill peers"
JSON_NAME = "prefill_peers.json"
MD_NAME = "prefill_peers.md"
# Table order of the peers (gdn_verify.bench.peers.PEERS plus the optional one); others after, by name.
ORDER = ("ours", "ours-cp-off", "fla", "flashinfer", "flashinfer-cp", "flashinfer-cp-on", "flashqla", "vllm")
# Issue 29's goal for our prefill (bfloat16 inputs): at most the fastest peer's time, at no more extra
# memory, with the output and final state at most these relative RMS errors against the float64 oracle.
GOAL_RATIO = 1.0
GOAL_O_REL_RMS = 2e-3
GOAL_STATE_REL_RMS = 1e-4
OURS = ("ours", "ours-cp-off")  # our own variants: never "the fastest peer"


def new_document() -> dict:
    return {"kind": KIND, "version": 1, "runs": [], "rows": []}


def add_run(doc: dict, meta: dict) -> int:
    """Append a run's ``meta``; returns its index (what its rows and cells name as ``run``)."""
    doc["runs"].append(meta)
    return len(doc["runs"]) - 1


def _order(row: dict) -> tuple:
    return (row.get("plan_index", 10**9), row["key"])


def put_row(doc: dict, row: dict) -> None:
    """Add ``row`` to ``doc``, replacing a row of the same key; rows stay in plan order."""
    doc["rows"] = sorted([r for r in doc["rows"] if r["key"] != row["key"]] + [row], key=_order)


def _failed(cell: dict) -> bool:
    return "error" in cell


def gates(run: dict) -> str:
    """A run's gate regime (``prefill.GATES``); runs from before the setting existed used "fast"."""
    return run.get("settings", {}).get("gates", "fast")


def merge(base: dict, other: dict) -> dict:
    """``base`` with ``other``'s runs appended and its rows joined in by key: a peer's cell from
    ``other`` is added where ``base``'s row has none, or has only an error; a row only ``other`` has
    is added whole. Run indices of ``other`` are shifted past ``base``'s. Neither input changes."""
    for doc in (base, other):
        if doc.get("kind") != KIND:
            raise ValueError(f"not a peer-bench document (kind {doc.get('kind')!r})")
    devices = {r.get("device") for r in base["runs"] + other["runs"]}
    if len(devices) > 1:
        raise ValueError(f"runs on different devices cannot share a table: {sorted(map(str, devices))}")
    regimes = {gates(r) for r in base["runs"] + other["runs"]}
    if len(regimes) > 1:
        raise ValueError(f"runs on different gate regimes cannot share a table: {sorted(regimes)}")
    out = copy.deepcopy(base)
    shift = len(out["runs"])
    out["runs"] += copy.deepcopy(other["runs"])
    rows = {r["key"]: r for r in out["rows"]}
    for row in copy.deepcopy(other["rows"]):
        row["run"] += shift
        for cell in row["cells"].values():
            cell["run"] += shift
        mine = rows.get(row["key"])
        if mine is None:
            put_row(out, row)
            continue
        for name, cell in row["cells"].items():
            if name not in mine["cells"] or (_failed(mine["cells"][name]) and not _failed(cell)):
                mine["cells"][name] = cell
    return out


def load(path: str | Path) -> dict:
    doc = json.loads(Path(path).read_text())
    if doc.get("kind") != KIND:
        raise ValueError(f"{path}: not a peer-bench document (kind {doc.get('kind')!r})")
    return doc


def write(doc: dict, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``OUT/prefill_peers.json`` and ``OUT/prefill_peers.md`` (each through a temporary file
    and a rename, so an interrupted write leaves the previous complete file)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = (out / JSON_NAME, out / MD_NAME)
    for path, text in zip(paths, (json.dumps(doc, indent=1) + "\n", render(doc))):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return paths


def peer_order(names: Iterable[str]) -> list[str]:
    names = set(names)
    return [n for n in ORDER if n in names] + sorted(names - set(ORDER))


def _num(x: float | None, fmt: str, suffix: str = "") -> str:
    return "n/a" if x is None else format(x, fmt) + suffix


def _mib(x: int | None) -> str:
    return "n/a" if x is None else f"{x / 2**20:.0f} MiB"


def _cell(name: str, cell: dict | None) -> str:
    """A summary cell: ``ms (x ours)``, ours' ms alone, or what went wrong."""
    if cell is None:
        return "-"
    if _failed(cell):
        return f"error ({cell.get('stage', '?')})"
    ratio = cell.get("ratio")
    if name == "ours" or ratio is None:
        return _num(cell.get("ms"), ".3f")
    return f"{cell['ms']:.3f} ({ratio:.2f}x)"


def format_row(row: dict, names: Sequence[str]) -> str:
    """One progress line: the row, its floor, and each peer's time (x ours) or error."""
    fl = row["floor"].get("datasheet")
    head = f"{row['key']}"
    if fl:
        head += f" (floor {fl['floor_ms']:.3f} ms, {fl['bound']}-bound)"
    parts = []
    for name in names:
        cell = row["cells"].get(name)
        if cell is None:
            continue
        if _failed(cell):
            parts.append(f"{name} {cell['stage']}: {cell['error']}")
        else:
            parts.append(f"{name} {_cell(name, cell)}")
    return head + ": " + " | ".join(parts) + f" [{row.get('wall_s', '?')} s]"


def _accurate(cell: dict) -> bool:
    o, state = cell.get("o_rel_rms"), cell.get("state_rel_rms")
    return o is not None and state is not None and o <= GOAL_O_REL_RMS and state <= GOAL_STATE_REL_RMS


def goal_rows(doc: dict) -> list[dict]:
    """Per row, ours (the default call) against the fastest peer that ran: ``key``, ``ours_ms``,
    ``fastest`` (its name, None where no peer ran), ``fastest_ms``, ``ours_over_fastest`` (from the
    peer's in-run ratio: ours' time over the peer's, above 1: ours slower), ``memory_ratio`` (ours'
    extra memory over the peer's), ``accurate`` (ours within the goal's errors), the fastest peer's
    errors and whether they are within the goal (``fastest_accurate``), and ``met``."""
    out = []
    for r in doc["rows"]:
        ours = r["cells"].get("ours")
        if ours is None or _failed(ours):
            continue
        peers = [(n, c) for n, c in r["cells"].items() if n not in OURS and not _failed(c) and c.get("ratio")]
        name, best = min(peers, key=lambda p: p[1]["ratio"], default=(None, None))
        o, state = ours.get("o_rel_rms"), ours.get("state_rel_rms")
        accurate = _accurate(ours)
        ratio = None if best is None else 1.0 / best["ratio"]
        mem = None
        if best is not None and ours.get("peak_bytes") is not None and best.get("peak_bytes"):
            mem = ours["peak_bytes"] / best["peak_bytes"]
        met = accurate and (best is None or (ratio <= GOAL_RATIO and mem is not None and mem <= 1.0))
        out.append(
            dict(key=r["key"], layout=r["layout"], sequences=r["sequences"], length=r["length"],
                 ours_ms=ours.get("ms"), fastest=name, fastest_ms=best and best.get("ms"),
                 ours_over_fastest=ratio, memory_ratio=mem, o_rel_rms=o, state_rel_rms=state,
                 accurate=accurate, fastest_o_rel_rms=best and best.get("o_rel_rms"),
                 fastest_state_rel_rms=best and best.get("state_rel_rms"),
                 fastest_accurate=best is not None and _accurate(best), met=met)
        )  # fmt: skip
    return out


def _goal_table(doc: dict) -> list[str]:
    rows = goal_rows(doc)
    met = sum(g["met"] for g in rows)
    fast_ok = sum(g["fastest_accurate"] for g in rows)
    lines = [
        f"Ours (the default call) against the fastest other peer on each row: the goal is at most "
        f"{GOAL_RATIO:.1f}x its time, at no more extra memory, with the output within {GOAL_O_REL_RMS:.0e} "
        f"and the final state within {GOAL_STATE_REL_RMS:.0e} relative RMS of the float64 oracle. "
        f"Met on {met} of {len(rows)} rows; the fastest peer itself is within those errors on {fast_ok}. "
        "`ours / fastest` is the inverse of the peer's in-run ratio.",
        "",
        "| layout | sequences x length | ours ms | fastest peer | its ms | ours / fastest | extra memory ours / its "
        "| ours o / state rel RMS | its o / state rel RMS | goal |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for g in rows:
        short = []
        if g["ours_over_fastest"] is not None and g["ours_over_fastest"] > GOAL_RATIO:
            short.append(f"time {g['ours_over_fastest']:.2f}x")
        if g["memory_ratio"] is not None and g["memory_ratio"] > 1.0:
            short.append(f"memory {g['memory_ratio']:.2f}x")
        if not g["accurate"]:
            short.append("accuracy")
        lines.append(
            f"| {g['layout']} | {g['sequences']} x {g['length']} | {_num(g['ours_ms'], '.3f')} | "
            f"{g['fastest'] or '-'} | {_num(g['fastest_ms'], '.3f')} | {_num(g['ours_over_fastest'], '.2f', 'x')} | "
            f"{_num(g['memory_ratio'], '.2f', 'x')} | "
            f"{_num(g['o_rel_rms'], '.2e')} / {_num(g['state_rel_rms'], '.2e')} | "
            f"{_num(g['fastest_o_rel_rms'], '.2e')} / {_num(g['fastest_state_rel_rms'], '.2e')} | "
            f"{'met' if g['met'] else 'short: ' + ', '.join(short)} |"
        )
    return lines


def _runs_table(doc: dict) -> list[str]:
    lines = [
        "| run | date | started (UTC) | device | torch | triton | CuPy | CUDA | copy GB/s | peers run "
        "| peers not loaded |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, run in enumerate(doc["runs"]):
        v = run.get("versions", {})
        cupy = next((v[k] for k in ("cupy-cuda13x", "cupy-cuda12x", "cupy") if k in v), "n/a")
        lines.append(
            f"| {i} | {run.get('date', '?')} | {run.get('started', '?')} | {run.get('device', '?')} | "
            f"{v.get('torch', 'n/a')} | {v.get('triton', 'n/a')} | {cupy} | {v.get('cuda_runtime', 'n/a')} | "
            f"{_num(run.get('copy', {}).get('gbps'), '.0f')} | {', '.join(peer_order(run.get('peers', {})))} | "
            f"{', '.join(peer_order(run.get('not_loaded', {}))) or '-'} |"
        )
    return lines


def render(doc: dict) -> str:
    """The Markdown page: header (device, dates, versions, settings, floor), the summary table (ms,
    x ours), the detail table (per row and peer), the peers that did not load, the errors."""
    runs, rows = doc["runs"], doc["rows"]
    names = peer_order({n for r in rows for n in r["cells"]} | {n for run in runs for n in run.get("peers", {})})
    lines = ["# Prefill: our chunked kernel beside every peer that loads", ""]
    if not runs:
        return "\n".join(lines + ["(no run yet)", ""])
    s = runs[0].get("settings", {})
    peak = runs[0].get("peak")
    lines += [
        f"Device **{runs[0].get('device')}**; {s.get('dtype')} q, k, v and beta, float32 g ({gates(runs[0])} gates: "
        f"`gdn_verify/bench/prefill.py`, GATES), K = V = {s.get('K')}, "
        f"final state written, `cu_seqlens` on {s.get('cu_seqlens')}; "
        f"{'under' if s.get('inference_mode') else 'outside'} `torch.inference_mode()`. Time: CUDA-event medians "
        f"over {s.get('rounds')} interleaved rounds of {max(1, (s.get('reps') or 0) // max(1, s.get('rounds') or 1))} "
        f"calls per peer ({s.get('warmup')} warm-up calls before the first); `x ours` = the median of the per-round "
        "ratios peer / ours within the peer's own run (above 1: slower than ours). Floor = max(FLOP / peak, "
        "bytes / bandwidth) (`gdn_verify/bench/floor.py`): datasheet "
        + (
            f"{peak['name']} {peak['flops'] / 1e12:.1f} TFLOP/s bf16 dense, {peak['bandwidth'] / 1e12:.2f} TB/s"
            if peak
            else "peaks unknown for this device"
        )
        + "; `x floor` is time / datasheet floor, `x copy floor` time / floor at the run's measured copy "
        "bandwidth. Extra memory: peak device bytes beyond the inputs. Accuracy: relative RMS against the float64 "
        "oracle on the row's sampled value heads.",
        "",
        "## Runs",
        "",
        *_runs_table(doc),
        "",
        "Peer versions and calling conventions:",
        "",
    ]
    for i, run in enumerate(runs):
        for name in peer_order(run.get("peers", {})):
            p = run["peers"][name]
            hints = f"; hints {', '.join(p['hints'])}" if p.get("hints") else ""
            lines.append(f"- run {i}, `{name}`: {p['version']}; {p['convention']}{hints}")
        if run.get("stopped"):
            lines.append(f"- run {i} stopped early: {run['stopped']}")
    lines += ["", "## Summary (ms; x ours)", ""]
    head = "| layout | sequences x length | tokens | GFLOP | HBM GB | floor ms | bound | copy floor ms | "
    lines.append(head + " | ".join(names) + " |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | " + " | ".join("---" for _ in names) + " |")
    for r in rows:
        fl, cp = r["floor"].get("datasheet"), r["floor"].get("copy")
        shape = (
            f"| {r['layout']} | {r['sequences']} x {r['length']} | {r['tokens']} | {r['floor']['flop'] / 1e9:.1f} | "
            f"{r['floor']['bytes'] / 1e9:.3f} | {_num(fl and fl['floor_ms'], '.3f')} | "
            f"{fl['bound'] if fl else 'n/a'} | {_num(cp and cp['floor_ms'], '.3f')} | "
        )
        lines.append(shape + " | ".join(_cell(n, r["cells"].get(n)) for n in names) + " |")
    lines += ["", "## Against the goal", "", *_goal_table(doc)]
    lines += [
        "",
        "## Detail",
        "",
        "| layout | sequences x length | peer | run | ms | x ours (rounds) | ours ms in its run | x floor "
        "| x copy floor | extra memory | o rel RMS | state rel RMS | kernel |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    errors = []
    for r in rows:
        for name in names:
            c = r["cells"].get(name)
            if c is None:
                continue
            shape = f"| {r['layout']} | {r['sequences']} x {r['length']} | {name} | {c.get('run', '?')} |"
            if _failed(c):
                lines.append(f"{shape} error ({c.get('stage')}) | | | | | | | | |")
                errors.append(f"- {r['key']}, `{name}` ({c.get('stage')}): {c['error']}")
                continue
            spread = c.get("ratio_spread")
            ratio = _num(c.get("ratio"), ".2f") + (f" ({spread[0]:.2f}-{spread[1]:.2f})" if spread else "")
            lines.append(
                f"{shape} {_num(c.get('ms'), '.3f')} | {ratio} | {_num(c.get('ours_ms'), '.3f')} | "
                f"{_num(c.get('floor_ratio'), '.1f', 'x')} | {_num(c.get('floor_copy_ratio'), '.1f', 'x')} | "
                f"{_mib(c.get('peak_bytes'))} | {_num(c.get('o_rel_rms'), '.2e')} | "
                f"{_num(c.get('state_rel_rms'), '.2e')} | {c.get('kernels') or ''} |"
            )
            for stage in ("memory", "accuracy"):
                if c.get(f"{stage}_error"):
                    errors.append(f"- {r['key']}, `{name}` ({stage}; its time stands): {c[f'{stage}_error']}")
            for w in c.get("warnings", []):
                errors.append(f"- {r['key']}, `{name}` warned: {w}")
    notes = [f"- {r['key']}: {r['oracle_note']}" for r in rows if r.get("oracle_note")]
    if notes:
        lines += ["", "Accuracy sampling:", "", *notes]
    lines += ["", "## Peers that did not load", ""]
    loaded = {n for run in runs for n in run.get("peers", {})}
    missing = [
        f"- `{name}` (run {i}): {reason}"
        for i, run in enumerate(runs)
        for name, reason in run.get("not_loaded", {}).items()
        if name not in loaded
    ]
    lines += missing or ["(none)"]
    lines += ["", "## Errors and warnings", "", *(errors or ["(none)"]), ""]
    return "\n".join(lines)
