"""The report's PNG figures (matplotlib, Agg canvas; no pyplot state), drawn from the results dict
of ``gdn_verify.report.measurements`` and its per-token error maps.

Colour names the implementation, line style and marker the dtype, so a figure reads the same
way in every report. Errors of exactly 0 or not finite cannot sit on a log axis: they leave a
gap in the line and are marked at the bottom edge (0, a triangle) or the top edge (NaN or Inf,
a red cross) of the axes, so a broken kernel's missing points are not silently dropped
(results.json keeps them, as 0 or null).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

COLORS = tuple(matplotlib.colormaps["tab10"].colors)
DTYPE_STYLE = {"float32": ("-", "o"), "bfloat16": ("--", "s"), "float16": (":", "^"), "float64": ("-.", "D")}
DPI = 110


def _style(dtype: str) -> tuple[str, str]:
    return DTYPE_STYLE.get(dtype, ("-", "x"))


def _positive(values) -> np.ndarray:
    """Float array with None, 0, NaN and inf replaced by NaN (a gap on a log axis)."""
    x = np.array([np.nan if v is None else v for v in values], np.float64)
    return np.where(np.isfinite(x) & (x > 0), x, np.nan)


NONFINITE_LABEL = "NaN/Inf (top edge)"
ZERO_LABEL = "exactly 0 (bottom edge)"


def mark_gaps(ax, x, values, color) -> tuple[int, int]:
    """Mark the points of ``values`` a log axis cannot show: NaN, Inf or None (JSON's NaN) at the top
    edge, exactly 0 at the bottom edge, at their ``x``. Returns ``(non-finite, zero)`` counts."""
    v = np.array([np.nan if value is None else value for value in values], np.float64)
    x = np.asarray(x, np.float64)[: v.size]
    edge = ax.get_xaxis_transform()  # x in data, y in axes coordinates
    bad, zero = ~np.isfinite(v), v == 0
    if bad.any():
        ax.plot(
            x[bad],
            np.full(bad.sum(), 0.97),
            ls="none",
            marker="X",
            ms=10,
            mfc=color,
            mec="red",
            mew=1.5,
            transform=edge,
            clip_on=False,
            label=NONFINITE_LABEL,
        )
    if zero.any():
        ax.plot(
            x[zero],
            np.full(zero.sum(), 0.03),
            ls="none",
            marker="v",
            ms=8,
            mfc=color,
            mec="black",
            transform=edge,
            clip_on=False,
            label=ZERO_LABEL,
        )
    return int(bad.sum()), int(zero.sum())


def _dedupe_legend(ax, **kw) -> None:
    """One legend entry per label (the gap markers repeat per line)."""
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), **kw)


def _legend_below(panel, ax) -> None:
    """``ax``'s legend under it, outside the axes (constrained layout makes the room)."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        panel.legend(handles, labels, fontsize=8, loc="outside lower center")


def percent(x: float) -> str:
    """``x`` as a percentage that never shows 100.0% or 0.0% unless it is exactly that."""
    for digits in (1, 2, 3, 4):
        text = f"{x:.{digits}%}"
        if (text not in (f"{100:.{digits}f}%", f"{0:.{digits}f}%")) or x in (0.0, 1.0):
            return text
    return f"{x:.4%}"


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=DPI)
    return path


def _color_of(impls: list[str]):
    return {name: COLORS[i % len(COLORS)] for i, name in enumerate(impls)}


def error_vs_length(results: dict, impls: list[str], path: Path) -> Path:
    """Log-log relative RMS output error against T, fitted exponent in the legend, rounding floors dashed."""
    color = _color_of(impls)
    fig = Figure(figsize=(10.5, 5.2), layout="constrained")
    ax = fig.add_subplot()
    for dtype, floor in results["rounding_floor"].items():
        ls, _ = _style(dtype)
        ax.plot(
            floor["lengths"],
            _positive(floor["output_rms"]),
            color="0.55",
            ls=ls,
            lw=2.5,
            alpha=0.6,
            label=f"{dtype} rounding floor",
        )
    for e in results["error_vs_length"]:
        if not e["lengths"]:
            continue
        ls, marker = _style(e["dtype"])
        exponent = "n/a" if e.get("exponent") is None else f"{e['exponent']:.3g}"
        ax.plot(
            e["lengths"],
            _positive(e["output_rms"]),
            color=color[e["impl"]],
            ls=ls,
            marker=marker,
            label=f"{e['impl']} / {e['dtype']}: T^{exponent}",
        )
        mark_gaps(ax, e["lengths"], e["output_rms"], color[e["impl"]])
    ax.set_xscale("log", base=2)
    lengths = (
        results["rounding_floor"][next(iter(results["rounding_floor"]))]["lengths"] if results["rounding_floor"] else []
    )
    ax.set_xticks(lengths, [str(T) for T in lengths])
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_xlabel("sequence length T (tokens)")
    ax.set_ylabel("relative RMS output error (worst head)")
    ax.set_title("Error against sequence length (fitted growth exponent in the legend)")
    ax.grid(True, which="both", alpha=0.3)
    # Beside the axes: with four or more implementations a legend inside hides the short-T points.
    _dedupe_legend(ax, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return _save(fig, path)


def distributions(results: dict, impls: list[str], path: Path) -> Path:
    """Per dtype: histogram of per-element relative error (top) and of ULP distance (bottom)."""
    color = _color_of(impls)
    dtypes = list(dict.fromkeys(d["dtype"] for d in results["distributions"])) or ["(none)"]
    legends = 0.3 + 0.35 * max(len(impls), 1)  # inches for the two legends' lines, one per implementation
    fig = Figure(figsize=(6.5 * len(dtypes), 7.5 + legends), layout="constrained")
    # One subfigure per panel, so that each panel's legend sits below it ("outside lower center"),
    # never over the bars and lines: a legend inside covered the tallest bars, those at 0 and 1 ULP.
    panels = fig.subfigures(2, len(dtypes), squeeze=False)
    for col, dtype in enumerate(dtypes):
        entries = [d for d in results["distributions"] if d["dtype"] == dtype]
        top, bottom = panels[0, col].add_subplot(), panels[1, col].add_subplot()
        for d in entries:
            rel = d["relative_error"]
            fraction = np.array(rel["counts"], float) / max(rel["total"], 1)
            exact = percent(rel["exact"] / max(rel["total"], 1))
            top.stairs(
                fraction,
                rel["log10_edges"],
                color=color[d["impl"]],
                lw=1.8,
                label=f"{d['impl']} (median {rel['median']:.3g}, exact {exact})"
                if rel["median"] is not None
                else d["impl"],
            )
        top.set_yscale("log")
        top.set_xlabel("log10 per-element relative error |o - ref| / |ref|")
        top.set_ylabel("fraction of elements")
        top.set_title(f"{dtype}: per-element relative error")
        top.grid(True, alpha=0.3)
        _legend_below(panels[0, col], top)
        width = 0.8 / max(len(entries), 1)
        for i, d in enumerate(entries):
            u = d["ulp"]
            x = np.arange(len(u["labels"])) + (i - (len(entries) - 1) / 2) * width
            fraction = np.array(u["counts"], float) / max(u["total"], 1)
            share = u["correctly_rounded"]
            rounded = "" if share is None else f" ({percent(share)} correctly rounded)"
            if u.get("below_floor"):
                rounded += f"; {u['below_floor']} near-zero elements not counted"
            bottom.bar(
                x,
                np.where(fraction > 0, fraction, np.nan),
                width=width,
                color=color[d["impl"]],
                label=f"{d['impl']}{rounded}",
            )
        if entries:
            labels = entries[0]["ulp"]["labels"]
            bottom.set_xticks(np.arange(len(labels)), labels, rotation=60, fontsize=7)
        bottom.set_yscale("log")
        out_dtype = entries[0]["output_dtype"] if entries else dtype
        floor = entries[0]["ulp"].get("floor_relative_to_rms") if entries else None
        where = "" if floor is None else f"\n(elements with |exact| >= {floor:g} x RMS only)"
        bottom.set_xlabel(f"ULPs of {out_dtype} from the correctly rounded exact output{where}")
        bottom.set_ylabel("fraction of elements")
        bottom.set_title(f"{dtype}: ULP distance")
        bottom.grid(True, axis="y", alpha=0.3)
        _legend_below(panels[1, col], bottom)
    return _save(fig, path)


def shared_scale(maps: list[np.ndarray]) -> tuple[float, float]:
    """Colour limits shared by every map: the largest error of any down to the lowest 1st percentile
    (at most 10^10 below), so that errors near 1 and near 1e-7 look different."""
    values = [m[np.isfinite(m) & (m > 0)] for m in maps]
    values = [v for v in values if v.size]
    if not values:
        return 1e-8, 1.0
    top = max(float(v.max()) for v in values)
    low = min(float(np.percentile(v, 1)) for v in values)
    return max(min(low, top / 10), top * 1e-10), top


def error_map(results: dict, maps: dict, path: Path) -> Path:
    """Heat map of per-token relative error over (token, value head) for the varlen pack.

    Boundaries are drawn in margins above and below the map (blue, long: sequence starts;
    grey, short: every ``chunk`` tokens from a sequence start) rather than across it, so that
    a stripe of bad tokens right at a boundary is not hidden under the line that marks it.
    All panels share one log colour scale (a broken kernel's map must not look like a correct
    one's); exact zeros are black (under the scale), NaN or Inf outputs green.
    """
    section = results["error_map"]
    entries = [e for e in section["entries"] if (e["impl"], e["dtype"]) in maps]
    bounds = np.concatenate([[0], np.cumsum(section["lengths"])])
    chunk_lines = [
        s + j for s, e in zip(bounds[:-1], bounds[1:]) for j in range(section["chunk"], e - s, section["chunk"])
    ]
    cmap = matplotlib.colormaps["magma"].with_extremes(bad="lime", under="black")
    fig = Figure(figsize=(13, 0.6 + 2.1 * max(len(entries), 1)), layout="constrained")
    if not entries:
        fig.text(0.5, 0.5, "no implementation produced an error map", ha="center")
        return _save(fig, path)
    axes = fig.subplots(len(entries), 1, squeeze=False)[:, 0]
    scale = shared_scale([maps[(e["impl"], e["dtype"])] for e in entries])
    for ax, e in zip(axes, entries):
        errors = maps[(e["impl"], e["dtype"])]
        heads = errors.shape[1]
        finite = np.isfinite(errors)
        # Zeros sit under the scale (black); NaN and Inf are "bad" (green), never confused with 0.
        shown = np.where(finite, np.where(errors > 0, errors, scale[0] / 10), np.nan)
        image = ax.imshow(
            shown.T,
            aspect="auto",
            interpolation="nearest",
            cmap=cmap,
            norm=LogNorm(*scale),
            extent=(0, errors.shape[0], heads - 0.5, -0.5),
        )
        margin, top, bottom = 0.14 * heads, -0.5, heads - 0.5  # y grows downwards: head 0 on top
        ax.vlines(bounds[1:-1], top - margin, top, color="tab:blue", lw=1.4)
        ax.vlines(bounds[1:-1], bottom, bottom + margin, color="tab:blue", lw=1.4)
        ax.vlines(chunk_lines, top - margin / 2, top, color="0.45", lw=0.9)  # half as long: chunks
        ax.vlines(chunk_lines, bottom, bottom + margin / 2, color="0.45", lw=0.9)
        ax.set_ylim(heads - 0.5 + margin, -0.5 - margin)
        ax.set_xlim(0, errors.shape[0])
        w = e["worst"]
        nonfinite = int((~finite).sum())
        flagged = f"; {nonfinite} non-finite (token, head) errors in green" if nonfinite else ""
        ax.set_title(
            f"{e['impl']} / {e['dtype']}: worst {w['error']:.2g} at token {w['token']} "
            f"(sequence {w['sequence']}, position {w['position']}), head {w['head']}" + flagged
            if w["error"] is not None
            else f"{e['impl']} / {e['dtype']}: non-finite output at token {w['token']}, head {w['head']}" + flagged,
            fontsize=9,
            loc="left",
        )
        ax.set_ylabel("value head")
        ax.set_yticks(range(heads))
        ax.tick_params(axis="y", labelsize=7)
    fig.colorbar(image, ax=list(axes), pad=0.01, fraction=0.03, label="rel. error (one scale for every map)")
    axes[-1].set_xlabel(
        f"token (flat index in the varlen pack of lengths {section['lengths']}); marks above and "
        f"below: blue = sequence boundary, grey = every {section['chunk']} tokens of a sequence"
    )
    return _save(fig, path)


def gate_beta(results: dict, impls: list[str], path: Path) -> Path:
    """Relative RMS output error against constant gate g (left) and constant beta (right)."""
    color = _color_of(impls)
    fig = Figure(figsize=(15, 5), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, key in zip(axes, ("gate_sweep", "beta_sweep")):
        section = results[key]
        x = np.arange(len(section["labels"])) if key == "gate_sweep" else np.array(section["values"], float)
        for dtype, floor in section["rounding_floor"].items():
            ax.plot(
                x,
                _positive(floor),
                color="0.55",
                ls=_style(dtype)[0],
                lw=2.5,
                alpha=0.6,
                label=f"{dtype} rounding floor",
            )
        for e in section["entries"]:
            ls, marker = _style(e["dtype"])
            y = _positive(e["output_rms"])
            ax.plot(x[: len(y)], y, color=color[e["impl"]], ls=ls, marker=marker, label=f"{e['impl']} / {e['dtype']}")
            mark_gaps(ax, x, e["output_rms"], color[e["impl"]])
        if key == "gate_sweep":
            ax.set_xticks(x, section["labels"], rotation=30, fontsize=8)
            ax.set_xlabel("log decay g on every token (last: mild decay with -1e4 spikes on 1/16 of the tokens)")
            ax.set_title(f"Error against gate strength (T={section['tokens']}, random initial state)")
        else:
            ax.set_xlabel("beta on every token")
            ax.set_title(f"Error against beta (T={section['tokens']}, per-head decays, random initial state)")
        ax.set_yscale("log")
        ax.set_ylabel("relative RMS output error (worst head)")
        ax.grid(True, which="both", alpha=0.3)
    # One legend for both panels, outside them, so that no curve hides behind it.
    handles = {}
    for ax in axes:
        handles.update(zip(*ax.get_legend_handles_labels()[::-1]))
    fig.legend(list(handles.values()), list(handles.keys()), fontsize=8, loc="outside right upper")
    return _save(fig, path)


FIGURES = {
    "error_vs_length.png": "Error against sequence length",
    "distributions.png": "Distribution of relative error and ULP distance",
    "error_map.png": "Where the error is: per-token error over the varlen pack",
    "gate_beta.png": "Error against gate strength and beta",
}


def draw_all(results: dict, maps: dict, impls: list[str], out: Path) -> list[Path]:
    """Write the four figures into ``out``; returns their paths in ``FIGURES`` order."""
    return [
        error_vs_length(results, impls, out / "error_vs_length.png"),
        distributions(results, impls, out / "distributions.png"),
        error_map(results, maps, out / "error_map.png"),
        gate_beta(results, impls, out / "gate_beta.png"),
    ]
