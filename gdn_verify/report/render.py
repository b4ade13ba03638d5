"""report.md and index.html from a report's results document (see ``gdn_verify.report``).

index.html needs no server: inline CSS, figures as PNG files beside it, and a short script
that sets ``data-figures-loaded`` on <body> to the number of figures the browser decoded
(``data-figures-expected`` holds how many there are), which the browser test reads.
"""

from __future__ import annotations

import json
from html import escape

from gdn_verify.core.error_stats import ULP_MAGNITUDE_FLOOR
from gdn_verify.report.figures import FIGURES, percent
from gdn_verify.runners.check import NOT_PASSED

SECTIONS = (
    (
        "error_vs_length.png",
        "1. Error against sequence length",
        "Relative RMS output error (worst value head) of one sequence against its length, log-log; the legend gives "
        "the fitted growth exponent (about 0.5 is rounding adding up like a random walk; near 1 or more is coherent "
        "error that dominates at long context). Grey lines: the error of the exact output rounded once to the dtype, "
        "below which no implementation returning that dtype can go.",
    ),
    (
        "distributions.png",
        "2. Distribution of the error",
        "Per-element relative error and distance in ULPs (of the output dtype) from the exact output correctly "
        "rounded, over the output elements at the longest length. 0 ULP means the correctly rounded value. ULPs "
        f"are counted only where |exact| >= {ULP_MAGNITUDE_FLOOR:g} x its RMS (the tolerance model's magnitude "
        "floor): nearer zero a ULP is so small that a harmless absolute error counts millions of them; the "
        "legend says how many elements that leaves out.",
    ),
    (
        "error_map.png",
        "3. Where the error is",
        "Per-token relative error over (token, value head) of a varlen pack with a random initial state per "
        "sequence. Marks above and below each map: blue, sequence boundaries; grey, chunk boundaries. A boundary "
        "bug shows as a vertical stripe in line with the marks. Value heads differ in decay (head 0 remembers "
        "longest). All maps share one colour scale, so a broken kernel's map looks unlike a correct one's; "
        "black is an error of exactly 0, green a NaN or Inf output.",
    ),
    (
        "gate_beta.png",
        "4. Error against gate strength and beta",
        "Relative RMS output error with the same log decay g on every token (no decay to saturated, and -1e4 "
        "spikes) and with the same beta on every token; grey: rounding floors.",
    ),
)


def _fmt(x, spec: str = ".2e") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return format(x, spec)
    return str(x)


def _pct(x) -> str:
    return "n/a" if x is None else percent(x)


def summary_rows(doc: dict) -> tuple[list[str], list[list[str]]]:
    head = [
        "implementation",
        "dtype",
        "T",
        "output error",
        "x rounding floor",
        "growth exp.",
        "state error",
        "correctly rounded",
        f"median / p99 / max ULP (where |exact| >= {ULP_MAGNITUDE_FLOOR:g} RMS)",
        "worst token error",
        "properties (pass/fail/unsup.)",
    ]
    rows = []
    for r in doc["summary"]:
        if r.get("error") and "output_rms" not in r:
            rows.append([r["impl"], r["dtype"], "", r["error"]] + [""] * (len(head) - 4))
            continue
        p = r.get("properties", {})
        rows.append(
            [
                r["impl"],
                r["dtype"],
                _fmt(r.get("tokens")),
                _fmt(r.get("output_rms")),
                _fmt(r.get("times_floor"), ".3g"),
                _fmt(r.get("exponent"), ".3g"),
                _fmt(r.get("state")),
                _pct(r.get("correctly_rounded")),
                " / ".join(_fmt(r.get(k), ".3g") for k in ("median_ulp", "p99_ulp", "max_ulp")),
                _fmt(r.get("worst_token_error")),
                f"{p.get('passed', 0)} / {p.get('failed', 0)} / {p.get('unsupported', 0)}"
                + (f" (+{p['error']} errored)" if p.get("error") else ""),
            ]
        )
    return head, rows


def property_rows(row: dict) -> tuple[list[str], list[list[str]]]:
    head = ["property", "status", "examples", "worst error", "bound", "detail", "backend", "note"]
    rows = []
    for r in row["results"]:
        worst = r.get("worst") or {}
        rows.append(
            [
                r["name"],
                r["status"],
                str(r.get("examples", 0)),
                _fmt(worst.get("error")),
                _fmt(worst.get("bound")),
                worst.get("detail", ""),
                backend_cell(r.get("backend")),
                r.get("note", ""),
            ]
        )
    return head, rows


def backend_cell(tally: dict | None) -> str:
    """A property's ``backend`` (``$defs/backend_tally``) in a cell: "triton: 12", "flash_qla: 40, triton: 2"."""
    calls = (tally or {}).get("calls", {})
    return ", ".join(f"{name}: {n}" for name, n in calls.items())


def failures(doc: dict) -> list[dict]:
    """Every property that did not pass (failed, timed out, raised, misused: the ones that make
    ``report`` exit 1) with its implementation, dtype, minimal example and replay command;
    ``anchor`` is the id of its entry in the page."""
    out = []
    for row in doc["properties"]:
        for r in row["results"]:
            if r["status"] in NOT_PASSED:
                f = r.get("failure") or {}
                out.append(
                    dict(
                        impl=row["impl"],
                        dtype=row["dtype"],
                        name=r["name"],
                        status=r["status"],
                        message=f.get("message", r.get("note", "")),
                        cause=f.get("cause") or "",
                        problem=f.get("problem"),
                        params=f.get("params"),
                        replay=f.get("replay"),
                        anchor=f"failure-{len(out) + 1}",
                    )
                )
    return out


def verdict(doc: dict) -> str:
    """The report's verdict, its first line: ``FAILED: 2 properties did not pass`` (then each is
    listed, :func:`failure_label`), or ``Passed: every property held (...)``."""
    fails = failures(doc)
    if fails:
        return f"FAILED: {len(fails)} propert{'y' if len(fails) == 1 else 'ies'} did not pass"
    statuses = [r["status"] for row in doc["properties"] for r in row["results"]]
    pairs = len(doc["properties"])
    unsupported = statuses.count("unsupported")
    return (
        f"Passed: every property held ({statuses.count('passed')} passed"
        + (f", {unsupported} unsupported" if unsupported else "")
        + f"; {pairs} implementation and dtype pair{'' if pairs == 1 else 's'})"
    )


def failure_label(f: dict) -> str:
    """``numpy / float32: matches_reference (failed)``: one entry of :func:`failures` named."""
    return f"{f['impl']} / {f['dtype']}: {f['name']} ({f['status']})"


def environment_rows(doc: dict) -> list[tuple[str, str]]:
    env, cfg = doc["environment"], doc["config"]
    s = cfg["sizes"]
    rows = [
        ("date (UTC)", env["date"]),
        ("command", env["command"]),
        ("seed", str(env["seed"])),
        (
            "sizes",
            f"{s['name']}: H={s['H']} HV={s['HV']} K={s['K']} V={s['V']}, T up to {s['max_tokens']}, "
            f"varlen pack {s['pack_lengths']}, sweeps T={s['sweep_tokens']}",
        ),
        ("oracle", cfg["oracle"]),
        ("examples per property", str(cfg["max_examples"])),
        ("git commit", env.get("git_commit") or "unknown"),
        ("python", env["python"]),
        ("platform", env["platform"]),
        ("CPU", env["cpu"]),
    ]
    gpu = env.get("gpu", {})
    for g in gpu.get("nvidia_smi", []):
        rows.append(("GPU (nvidia-smi)", f"{g.get('name')}, driver {g.get('driver')}, {g.get('memory')}"))
    if "cupy" in gpu:
        rows.append(("GPU (CuPy)", ", ".join(f"{k} {v}" for k, v in gpu["cupy"].items())))
    if "torch" in gpu:
        rows.append(("GPU (torch)", ", ".join(f"{k} {v}" for k, v in gpu["torch"].items())))
    if not gpu:
        rows.append(("GPU", "none found (no nvidia-smi, CuPy or torch)"))
    rows += [(name, version) for name, version in env["packages"].items()]
    return rows


# Markdown --------------------------------------------------------------------------------------
def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    # Header cells are escaped too: the ULP column's "|exact|" made 13 header cells over 11.
    lines = ["| " + " | ".join(_md_cell(c) for c in head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(doc: dict, figures: list[str]) -> str:
    """The whole report as Markdown, figures linked beside it."""
    cfg = doc["config"]
    parts = [
        f"# GDN precision report: {', '.join(i['name'] for i in cfg['implementations'])}",
        "",
    ]
    fails = failures(doc)
    parts += [f"**{verdict(doc)}**" + (":" if fails else ""), ""]
    if fails:
        parts += [f"- [{failure_label(f)}](#{f['anchor']})" for f in fails] + [""]
    parts += [
        f"{doc['environment']['date']}; dtypes {', '.join(cfg['dtypes'])}; seed {cfg['seed']}; "
        f"oracle: {cfg['oracle']}.",
        "",
    ]
    if cfg["skipped"]:
        parts += ["**Skipped** (cannot run here):", ""]
        parts += [f"- skipped: `{s['impl']}`: {s['reason']}" for s in cfg["skipped"]] + [""]
    parts += ["## Summary", "", _md_table(*summary_rows(doc)), ""]
    for name, title, caption in SECTIONS:
        if name in figures:
            parts += [f"## {title}", "", caption, "", f"![{FIGURES[name]}]({name})", ""]
    parts += ["## 5. Properties", ""]
    for row in doc["properties"]:
        parts += [f"### {row['impl']} / {row['dtype']}", "", _md_table(*property_rows(row)), ""]
    parts += ["### Minimal failing examples", ""]
    if not fails:
        parts += ["None: every property held on every example.", ""]
    for f in fails:
        first, *details = str(f["message"]).splitlines() or [""]
        parts += [f'- <a id="{f["anchor"]}"></a>**{failure_label(f)}**: {first}']
        parts += [f"  - {line.strip()}" for line in details if line.strip()]
        if f["cause"]:
            parts += [f"  - likely cause: {f['cause']}"]
        if f["problem"]:
            parts += [f"  - minimal example: {f['problem']}"]
        if f["params"]:
            parts += [f"  - parameters: `{json.dumps(f['params'])}`"]
        if f["replay"]:
            parts += [f"  - replay: `{f['replay']}`"]
    parts += [
        "",
        "## 6. Environment",
        "",
        _md_table(["", ""], [list(r) for r in environment_rows(doc)]),
        "",
        "Data: `results.json` (everything above), `error_map.npz` (the per-token error maps).",
        "",
    ]
    return "\n".join(parts)


# HTML ------------------------------------------------------------------------------------------
CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1400px; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
td.passed { background: #e3f5e1; } td.unsupported { background: #eee; }
td.failed, td.error, td.timeout, td.misuse { background: #fbe0e0; }
img { max-width: 100%; border: 1px solid #ddd; }
code { background: #f4f4f4; padding: 1px 4px; }
.skipped { background: #fff6d8; border: 1px solid #e8d48a; padding: 0.5em 1em; }
.verdict { padding: 0.5em 1em; border: 1px solid; }
.verdict.failed { background: #fbe0e0; border-color: #d08080; font-size: 1.1em; }
.verdict.passed { background: #e3f5e1; border-color: #9c9; }
.caption { max-width: 75em; }
"""

SCRIPT = """
function countFigures() {
  var n = 0;
  for (var img of document.querySelectorAll("img.figure")) { if (img.complete && img.naturalWidth > 0) n++; }
  document.body.setAttribute("data-figures-loaded", String(n));
}
window.addEventListener("load", countFigures);
"""


def _e(x) -> str:
    return escape(str(x))


def _html_table(head: list[str], rows: list[list[str]], status_col: int | None = None) -> str:
    out = ["<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    for row in rows:
        cells = []
        for i, c in enumerate(row):
            cls = f' class="{_e(c)}"' if i == status_col else ""
            cells.append(f"<td{cls}>{_e(c)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(out + ["</table>"])


def html(doc: dict, figures: list[str]) -> str:
    """The whole report as one HTML page; figures load from the PNG files beside it."""
    cfg = doc["config"]
    title = f"GDN precision report: {', '.join(i['name'] for i in cfg['implementations'])}"
    fails = failures(doc)
    if fails:  # the first thing on the page: a failing run must not read as "6 / 8 / 1" until section 5
        links = "".join(f'<li><a href="#{f["anchor"]}">{_e(failure_label(f))}</a></li>' for f in fails)
        banner = f'<div class="verdict failed" id="verdict"><b>{_e(verdict(doc))}</b>:<ul>{links}</ul></div>'
    else:
        banner = f'<p class="verdict passed" id="verdict">{_e(verdict(doc))}</p>'
    body = [
        banner,
        f"<h1>{_e(title)}</h1>",
        f"<p>{_e(doc['environment']['date'])}; dtypes {_e(', '.join(cfg['dtypes']))}; seed {_e(cfg['seed'])}; "
        f'oracle: {_e(cfg["oracle"])}. Data: <a href="results.json">results.json</a>, '
        f'<a href="report.md">report.md</a>.</p>',
    ]
    if cfg["skipped"]:
        body.append(
            '<div class="skipped"><b>Skipped</b> (cannot run here):<ul>'
            + "".join(f"<li>skipped: <code>{_e(s['impl'])}</code>: {_e(s['reason'])}</li>" for s in cfg["skipped"])
            + "</ul></div>"
        )
    body += ["<h2>Summary</h2>", _html_table(*summary_rows(doc))]
    for name, section_title, caption in SECTIONS:
        if name in figures:
            body += [
                f"<h2>{_e(section_title)}</h2>",
                f'<p class="caption">{_e(caption)}</p>',
                f'<img class="figure" src="{_e(name)}" alt="{_e(FIGURES[name])}">',
            ]
    body.append("<h2>5. Properties</h2>")
    for row in doc["properties"]:
        body += [f"<h3>{_e(row['impl'])} / {_e(row['dtype'])}</h3>", _html_table(*property_rows(row), status_col=1)]
    body.append("<h3>Minimal failing examples</h3>")
    if not fails:
        body.append("<p>None: every property held on every example.</p>")
    else:
        items = []
        for f in fails:
            first, *details = str(f["message"]).splitlines() or [""]
            item = f'<li id="{f["anchor"]}"><b>{_e(failure_label(f))}</b>: {_e(first)}<ul>'
            item += "".join(f"<li>{_e(line.strip())}</li>" for line in details if line.strip())
            if f["cause"]:
                item += f"<li>likely cause: {_e(f['cause'])}</li>"
            if f["problem"]:
                item += f"<li>minimal example: {_e(f['problem'])}</li>"
            if f["params"]:
                item += f"<li>parameters: <code>{_e(json.dumps(f['params']))}</code></li>"
            if f["replay"]:
                item += f"<li>replay: <code>{_e(f['replay'])}</code></li>"
            items.append(item + "</ul></li>")
        body.append("<ul>" + "".join(items) + "</ul>")
    body += ["<h2>6. Environment</h2>", _html_table(["", ""], [list(r) for r in environment_rows(doc)])]
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{CSS}</style><script>{SCRIPT}</script></head>\n"
        f'<body data-figures-expected="{len(figures)}" data-figures-loaded="0">\n'
        + "\n".join(body)
        + "\n</body></html>\n"
    )
