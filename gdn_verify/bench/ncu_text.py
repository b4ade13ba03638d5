"""Nsight Compute's text report (``ncu`` without ``--csv``) as data: one record per profiled launch,
with the launch attributed to the range the profiled program announced before it (pure: no GPU).

``ncu`` prints ``==PROF== Profiling "NAME"`` as it profiles each launch, interleaved with the
program's own output, and every launch's sections at the end, in the same order. A program that
prints a marker line (``range: LABEL``, as ``scripts/profile_peers_ncu.py`` does, or ``launch:
LABEL``) before its profiled calls thereby names the launches that follow it. :func:`parse`
returns the launches, :func:`summary` the figures a kernel comparison needs (time, DRAM bytes,
throughputs, occupancy, registers, shared memory) per launch and per range.
"""

from __future__ import annotations

import re
from typing import Any

_MARKER = re.compile(r"^(?:range|launch): (?P<label>.+?)\s*$")
_PROFILING = re.compile(r'^==PROF== Profiling "(?P<name>[^"]+)"')
_LAUNCH = re.compile(
    r"^  (?P<kernel>\S.*?) \((?P<grid>\d+, \d+, \d+)\)x\((?P<block>\d+, \d+, \d+)\), Context \d+, Stream \d+"
)
_SECTION = re.compile(r"^    Section: (?P<name>.+?)\s*$")
_ROW = re.compile(r"^    (?P<name>\S.*?)\s{2,}(?:(?P<unit>\S+)\s+)?(?P<value>\S+(?: data)?)\s*$")
_SCALE = {
    "byte": 1,
    "Kbyte": 1e3,
    "Mbyte": 1e6,
    "Gbyte": 1e9,
    "Tbyte": 1e12,
    "ns": 1e-3,
    "us": 1.0,
    "ms": 1e3,
    "s": 1e6,
}


def _number(text: str) -> float | str | None:
    if text == "no data":
        return None
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return text


def parse(text: str, marker_after: bool = False) -> list[dict[str, Any]]:
    """Every launch of an ``ncu`` text log, in order: ``range`` (the marker label before its
    ``==PROF== Profiling`` line, None without one; with ``marker_after``, the first marker after
    it, for a program that announces each launch once it ran, as ``scripts/profile_decode_ncu.py``
    does), ``kernel`` (the full name), ``grid`` and
    ``block`` (3-tuples) and ``sections`` ({section: {metric: (unit, value)}}; a value is a float
    where it reads as a number, None for "no data", else the text)."""
    ranges: list[str | None] = []
    label = None
    launches: list[dict[str, Any]] = []
    section: dict[str, tuple[str, Any]] | None = None
    for line in text.splitlines():
        if m := _MARKER.match(line):
            if not marker_after:
                label = m["label"]
            elif ranges and ranges[-1] is None:
                ranges[-1] = m["label"]
        elif _PROFILING.match(line):
            ranges.append(label)
        elif m := _LAUNCH.match(line):
            grid = tuple(int(x) for x in m["grid"].split(", "))
            block = tuple(int(x) for x in m["block"].split(", "))
            index = len(launches)
            launches.append(
                dict(
                    range=ranges[index] if index < len(ranges) else None,
                    kernel=m["kernel"],
                    grid=grid,
                    block=block,
                    sections={},
                )
            )
            section = None
        elif launches and (m := _SECTION.match(line)):
            section = launches[-1]["sections"].setdefault(m["name"], {})
        elif section is not None and line.startswith("    ") and not line.lstrip().startswith(("-", "Metric Name")):
            if m := _ROW.match(line):
                section[m["name"]] = (m["unit"] or "", _number(m["value"]))
        elif not line.startswith("    "):
            section = None
    return launches


def _metric(launch: dict, name: str, sections: tuple[str, ...] = ()) -> tuple[str, Any]:
    for title, metrics in launch["sections"].items():
        if (not sections or title in sections) and name in metrics:
            return metrics[name]
    return "", None


def _scaled(launch: dict, name: str, to: float) -> float | None:
    unit, value = _metric(launch, name)
    if not isinstance(value, float):
        return None
    return value * _SCALE.get(unit.split("/")[0], 1.0) / to  # "Kbyte/block" scales as Kbyte


def short_name(kernel: str) -> str:
    """``void ns::name<...>(args)`` as ``name``: the kernel's identifier without namespace,
    template arguments or parameters."""
    head = kernel.removeprefix("void ").split("(")[0]
    depth, out = 0, []
    for ch in head:  # drop template arguments, nested or not
        depth += ch == "<"
        if depth == 0:
            out.append(ch)
        depth -= ch == ">"
    return "".join(out).split("::")[-1].strip()


def summary(launches: list[dict[str, Any]]) -> dict[str, Any]:
    """Per launch the comparison's figures: ``range``, ``kernel`` (short name), ``grid``,
    ``block``, ``duration_us``, ``dram_read_mb``, ``dram_write_mb`` (the ``--metrics`` counters,
    where collected), ``dram_pct``, ``memory_pct``, ``compute_pct``, ``achieved_occupancy_pct``,
    ``theoretical_occupancy_pct``, ``registers``, ``dynamic_smem_kb``, ``issued_per_scheduler``,
    ``no_eligible_pct`` (cycles a scheduler had no warp to issue), ``l1tex_pct`` (the L1 / shared
    memory pipe's throughput); and per range (in order of first
    appearance) ``launches``, ``duration_us`` and the DRAM bytes summed."""
    rows = []
    for launch in launches:
        rows.append(
            dict(
                range=launch["range"],
                kernel=short_name(launch["kernel"]),
                grid=launch["grid"],
                block=launch["block"],
                duration_us=_scaled(launch, "gpu__time_duration.sum", 1.0) or _scaled(launch, "Duration", 1.0),
                dram_read_mb=_scaled(launch, "dram__bytes_read.sum", 1e6),
                dram_write_mb=_scaled(launch, "dram__bytes_write.sum", 1e6),
                dram_pct=_metric(launch, "DRAM Throughput")[1],
                memory_pct=_metric(launch, "Memory Throughput", ("GPU Speed Of Light Throughput",))[1],
                compute_pct=_metric(launch, "Compute (SM) Throughput")[1],
                achieved_occupancy_pct=_metric(launch, "Achieved Occupancy")[1],
                theoretical_occupancy_pct=_metric(launch, "Theoretical Occupancy")[1],
                registers=_metric(launch, "Registers Per Thread")[1],
                dynamic_smem_kb=_scaled(launch, "Dynamic Shared Memory Per Block", 1e3),
                issued_per_scheduler=_metric(launch, "Issued Warp Per Scheduler")[1],
                no_eligible_pct=_metric(launch, "No Eligible")[1],
                l1tex_pct=_metric(launch, "L1/TEX Cache Throughput")[1],
            )
        )
    ranges: dict[str | None, dict[str, Any]] = {}
    for row in rows:
        r = ranges.setdefault(row["range"], dict(range=row["range"], launches=0, duration_us=0.0))
        r["launches"] += 1
        r["duration_us"] += row["duration_us"] or 0.0
        for key in ("dram_read_mb", "dram_write_mb"):
            if row[key] is not None:
                r[key] = r.get(key, 0.0) + row[key]
    return dict(launches=rows, ranges=list(ranges.values()))


def _cell(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec) if isinstance(x, float) else str(x)


def markdown(report: dict[str, Any]) -> str:
    """The launches of :func:`summary` as one Markdown table, then the per-range totals."""
    lines = [
        "| range | kernel | grid | block | us | DRAM read MB | DRAM write MB | DRAM % | L1/TEX % | SM % "
        "| occupancy % (theoretical) | registers | dyn. smem KB | issued / scheduler | no eligible % |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in report["launches"]:
        lines.append(
            f"| {r['range'] or '-'} | `{r['kernel']}` | {r['grid']} | {r['block']} | "
            f"{_cell(r['duration_us'], '.1f')} | "
            f"{_cell(r['dram_read_mb'], '.1f')} | {_cell(r['dram_write_mb'], '.1f')} | {_cell(r['dram_pct'], '.1f')} | "
            f"{_cell(r['l1tex_pct'], '.1f')} | {_cell(r['compute_pct'], '.1f')} | "
            f"{_cell(r['achieved_occupancy_pct'], '.1f')} ({_cell(r['theoretical_occupancy_pct'], '.1f')}) | "
            f"{_cell(r['registers'], '.0f')} | {_cell(r['dynamic_smem_kb'], '.1f')} | "
            f"{_cell(r['issued_per_scheduler'], '.2f')} | {_cell(r['no_eligible_pct'], '.1f')} |"
        )
    lines += ["", "| range | launches | us | DRAM read MB | DRAM write MB |", "| --- | ---: | ---: | ---: | ---: |"]
    for r in report["ranges"]:
        lines.append(
            f"| {r['range'] or '-'} | {r['launches']} | {r['duration_us']:.1f} | "
            f"{_cell(r.get('dram_read_mb'), '.1f')} | {_cell(r.get('dram_write_mb'), '.1f')} |"
        )
    return "\n".join(lines) + "\n"
