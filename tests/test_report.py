"""``report``: precision metrics against hand-computed cases, the report on CPU at small size, and
its HTML rendered by a real headless Chromium."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import shutil
import subprocess
import sys
from html import unescape
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import cli
from gdn_verify import report
from gdn_verify.core import error_stats, tolerance
from gdn_verify.implementations import ConfigurationError, numpy_impl, resolve
from gdn_verify.report import render

ROOT = Path(__file__).resolve().parent.parent
BF16 = ml_dtypes.bfloat16
FIGURE_NAMES = ("error_vs_length.png", "distributions.png", "error_map.png", "gate_beta.png")
BUG = "tests.test_report:boundary_bug"


def boundary_bug(q, k, v, g, beta, cu_seqlens=None, **kw):
    """NumPy's chunked form with the output of every chunk's first token (each 64 from a sequence
    start) 5 % too large: the kind of bug the error map must show as stripes."""
    o, state = numpy_impl.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu_seqlens, **kw)
    B, T, HV, V = o.shape
    if cu_seqlens is None:
        position = np.tile(np.arange(T), B)
    else:
        cu = np.asarray(cu_seqlens)
        position = np.arange(B * T) - np.repeat(cu[:-1], np.diff(cu))
    flat = o.reshape(B * T, HV, V).astype(np.float32)
    flat[position % 64 == 0] *= 1.05
    return flat.reshape(o.shape).astype(o.dtype), state


# Rounding, ULPs and the rounding floor ---------------------------------------------------------
def bits(x) -> list[int]:
    return np.asarray(x).view(np.uint16).tolist()


def test_round_exact_bfloat16_rounds_once_to_nearest_even():
    one = 0x3F80  # bfloat16 1.0; the next value up is 1 + 2^-7 (0x3F81)
    x = np.array([1 + 2**-8 + 2**-30, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8 + 2**-30), 1 + 2**-9])
    assert bits(error_stats.round_exact(x, BF16)) == [one + 1, one, one + 2, 0x8000 | (one + 1), one]
    tiny = 2.0**-133  # the smallest bfloat16 subnormal
    assert error_stats.round_exact(np.array([1.5 * tiny, 2.5 * tiny, 0.4 * tiny]), BF16).astype(float).tolist() == [
        2 * tiny,
        2 * tiny,
        0.0,
    ]
    assert np.isposinf(error_stats.round_exact(np.array([3.4e38]), BF16).astype(float)).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_round_exact_matches_numpy_where_numpy_rounds_correctly(dtype):
    rng = np.random.default_rng(5)
    x = rng.standard_normal(20000) * np.exp(rng.uniform(-40, 40, 20000))
    with np.errstate(over="ignore"):
        assert np.array_equal(error_stats.round_exact(x, dtype), x.astype(dtype))


def test_ulp_distance_counts_representable_values():
    f32 = np.float32
    up2 = np.nextafter(np.nextafter(f32(1), f32(2)), f32(2))
    tiny = np.array([np.finfo(f32).smallest_subnormal], f32)
    assert error_stats.ulp_distance(np.array([up2, f32(1), f32(-0.0)]), np.array([1.0, 1.0, 0.0])).tolist() == [2, 0, 0]
    assert error_stats.ulp_distance(tiny, -tiny.astype(np.float64)).tolist() == [2]  # -tiny, 0, tiny
    assert error_stats.ulp_distance(np.array([2.0], np.float16), np.array([1.0])).tolist() == [1024]  # 2^10 in [1, 2)
    # bfloat16: 1.0 is one ULP from 1 + 2^-8 + 2^-30, whose correct rounding is 1 + 2^-7.
    got = error_stats.ulp_distance(np.array([1.0, 1.0078125], BF16), np.array([1 + 2**-8 + 2**-30] * 2))
    assert got.tolist() == [1, 0]
    assert np.isnan(error_stats.ulp_distance(np.array([np.nan], f32), np.array([1.0]))).all()


@pytest.mark.parametrize(
    "dtype, value, expected",
    [
        (BF16, 1 + 2**-10, 2**-10 / (1 + 2**-10)),  # rounds to 1
        (np.float32, 1 + 2**-30, 2**-30 / (1 + 2**-30)),  # rounds to 1
        (np.float16, 1 + 2**-12, 2**-12 / (1 + 2**-12)),
        (np.float64, 1 + 2**-30, 0.0),
    ],
)
def test_rounding_floor_hand_cases(dtype, value, expected):
    ref = np.full((1, 6, 2, 3), value)
    assert error_stats.rounding_floor(ref, dtype, np.array([0, 6])) == pytest.approx(expected, rel=1e-12)


def test_rounding_floor_of_random_outputs_is_a_fraction_of_the_unit_roundoff():
    ref = np.random.default_rng(1).standard_normal((1, 200, 4, 16))
    for dtype, u in ((np.float32, 2.0**-24), (BF16, 2.0**-8)):
        floor = error_stats.rounding_floor(ref, dtype, np.array([0, 200]))
        assert u / 8 < floor < u  # between the mean and the worst case of one rounding


def test_ulp_histogram_bins_are_closed_and_cover_everything():
    h = error_stats.ulp_histogram(np.array([0, 0, 1, 3, 4, 5, 2**20, 2**20 + 1, np.nan]))
    counts = dict(zip(h["labels"], h["counts"]))
    assert (counts["0"], counts["1"], counts["2"], counts["3-4"], counts["5-8"]) == (2, 1, 0, 2, 1)
    assert (counts[f"{2**19 + 1}-{2**20}"], counts[f">{2**20}"]) == (1, 1)
    assert sum(h["counts"]) == 8 and h["nan"] == 1 and h["correctly_rounded"] == pytest.approx(2 / 8)


def test_growth_exponent_and_token_errors():
    T = np.array([64, 128, 256, 512])
    assert error_stats.growth_exponent(T, 3e-7 * T**0.5) == pytest.approx(0.5)
    assert error_stats.growth_exponent(T, [0.0, None, 1.0, 0.0]) is None
    ref = np.random.default_rng(2).standard_normal((1, 10, 3, 4))
    o = ref.copy()
    o[0, 7, 2] *= 1.1
    errors = tolerance.token_errors(o, ref, np.array([0, 5, 10]))
    assert errors.shape == (10, 3)
    assert np.unravel_index(np.argmax(errors), errors.shape) == (7, 2)
    assert np.count_nonzero(errors) == 1


# The report on CPU -----------------------------------------------------------------------------
class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "cpu"
    argv = [
        "--impl",
        "numpy",
        "--impl",
        "numpy-recurrent",
        "--impl",
        BUG,
        "--impl",
        "cupy-chunk",
        "--dtype",
        "float32",
        "--dtype",
        "bfloat16",
        "--quick",
        "--max-tokens",
        "256",
        "--seed",
        "3",
        "--properties",
        "matches_reference,determinism,varlen_equals_separate",
        "--max-examples",
        "5",
        "--out",
        str(out),
    ]
    # stderr a terminal: the progress line is drawn there only (off a terminal it is not written at all).
    stdout, stderr = io.StringIO(), Terminal()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = cli.main(["report", *argv])
    doc = json.loads((out / "results.json").read_text())
    # boundary_bug fails matches_reference: a report with a failed property exits 1, like check.
    assert status == 1
    return out, doc, stdout.getvalue() + stderr.getvalue()


def walk_numbers(x, path="$"):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from walk_numbers(v, f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from walk_numbers(v, f"{path}[{i}]")
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield path, x


def test_report_writes_every_file_with_valid_pngs(made):
    out, _, _ = made
    for name in ("index.html", "report.md", "results.json", "error_map.npz") + FIGURE_NAMES:
        assert (out / name).is_file(), name
    from PIL import Image

    for name in FIGURE_NAMES:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        with Image.open(out / name) as image:
            image.verify()
        with Image.open(out / name) as image:
            assert image.width > 400 and image.height > 300
            assert len(np.unique(np.asarray(image.convert("L")))) > 20  # drawn, not blank


def test_results_json_sections_and_finite_numbers(made):
    out, _, _ = made
    doc = json.loads((out / "results.json").read_text())
    for section in (
        "environment",
        "config",
        "summary",
        "error_vs_length",
        "rounding_floor",
        "distributions",
        "error_map",
        "gate_sweep",
        "beta_sweep",
        "properties",
    ):
        assert section in doc, section
    numbers = list(walk_numbers(doc))
    assert len(numbers) > 500
    assert all(math.isfinite(v) for _, v in numbers)
    env = doc["environment"]
    assert env["seed"] == 3 and "numpy" in env["packages"] and env["command"].startswith("gdn-verify report")
    names = [i["name"] for i in doc["config"]["implementations"]]
    assert names[:3] == ["numpy", "numpy-recurrent", BUG]
    try:
        resolve("cupy-chunk")
    except ConfigurationError:
        assert [s["impl"] for s in doc["config"]["skipped"]] == ["cupy-chunk"]
        assert "unavailable" in doc["config"]["skipped"][0]["reason"]
    # Every implementation x dtype measured at every length, without a null.
    assert {(e["impl"], e["dtype"]) for e in doc["error_vs_length"]} >= {
        (n, d) for n in names[:3] for d in ("float32", "bfloat16")
    }
    for e in doc["error_vs_length"]:
        assert e["lengths"] == [64, 128, 256] and None not in e["output_rms"] and e["exponent"] is not None


def test_no_output_beats_the_rounding_floor(made):
    _, doc, _ = made
    for e in doc["error_vs_length"]:
        floor = doc["rounding_floor"][e["dtype"]]["output_rms"]
        assert all(err >= f for err, f in zip(e["output_rms"], floor)), e
        if e["impl"].startswith("numpy"):
            assert max(e["output_rms"]) < (1e-5 if e["dtype"] == "float32" else 2e-2)
    for section in ("gate_sweep", "beta_sweep"):
        for e in doc[section]["entries"]:
            assert len(e["output_rms"]) == len(doc[section]["labels"])
            floors = doc[section]["rounding_floor"][e["dtype"]]
            assert all(err >= f for err, f in zip(e["output_rms"], floors))


def test_ulp_statistics_leave_out_near_zero_outputs_and_say_so():
    # A correct float32 output with a harmless absolute error of 1e-12 where the exact value is
    # 1e-20: billions of ULPs, which used to show as "max ULP 1.6e+09" for a correct kernel.
    ref = np.array([1.0, -0.5, 2.0, 1e-20, 0.25])
    o = ref.astype(np.float32)
    o[3] = np.float32(1e-12)
    assert error_stats.ulp_histogram(error_stats.ulp_distance(o, ref))["max"] > 1e8
    stats = error_stats.ulp_statistics(o, ref)
    assert stats["max"] == 0 and stats["below_floor"] == 1 and stats["total"] == 4
    assert stats["magnitude_floor"] == pytest.approx(1e-3 * np.sqrt(np.mean(ref**2)))
    from gdn_verify.report import render

    assert "|exact| >=" in render.summary_rows(dict(summary=[]))[0][8]


def test_histograms_account_for_every_element(made):
    _, doc, _ = made
    for d in doc["distributions"]:
        elements = 256 * 8 * 32
        u = d["ulp"]  # ULPs counted where |exact| is above the magnitude floor, the rest counted apart
        assert u["total"] + u["below_floor"] == elements and sum(u["counts"]) + u["nan"] == u["total"]
        rel = d["relative_error"]
        assert sum(rel["counts"]) + rel["exact"] + rel["undefined"] + rel["nonfinite"] == elements
        if d["impl"] == "numpy" and d["dtype"] == "bfloat16":
            assert d["ulp"]["median"] <= 1  # float32 arithmetic, one rounding to bfloat16


def test_error_map_shows_the_boundary_bug_as_stripes(made):
    _, doc, _ = made
    entries = {(e["impl"], e["dtype"]): e for e in doc["error_map"]["entries"]}
    for dtype in ("float32", "bfloat16"):
        bug = entries[(BUG, dtype)]
        assert bug["worst"]["position"] % 64 == 0
        profile = bug["by_position_in_chunk"]
        assert profile[0] > 5 * max(profile[1:])
        fine = entries[("numpy", dtype)]
        assert fine["worst"]["error"] < bug["worst"]["error"] / 3


def capture_figure(monkeypatch):
    from gdn_verify.report import figures

    drawn = []
    monkeypatch.setattr(figures, "_save", lambda fig, path: drawn.append(fig) or path)
    return figures, drawn


def test_plots_mark_nan_and_inf_points_instead_of_dropping_them(monkeypatch, tmp_path):
    figures, drawn = capture_figure(monkeypatch)
    results = dict(
        rounding_floor={"float32": dict(lengths=[64, 128, 256], output_rms=[1e-8, 1e-8, 1e-8])},
        error_vs_length=[
            dict(impl="broken", dtype="float32", lengths=[64, 128, 256], output_rms=[1e-7, None, 0.0], exponent=None)
        ],
    )
    figures.error_vs_length(results, ["broken"], tmp_path / "x.png")
    ax = drawn[0].axes[0]
    marks = {line.get_label(): line for line in ax.get_lines()}
    assert list(marks[figures.NONFINITE_LABEL].get_xdata()) == [128]
    assert list(marks[figures.ZERO_LABEL].get_xdata()) == [256]
    assert figures.NONFINITE_LABEL in [t.get_text() for t in ax.get_legend().get_texts()]


def test_error_maps_share_one_colour_scale_and_show_nan_apart_from_zero(monkeypatch, tmp_path):
    figures, drawn = capture_figure(monkeypatch)
    good = np.full((100, 2), 1e-7)
    good[10, 0] = 0.0
    bad = np.full((100, 2), 0.9)
    bad[20, 1] = np.nan
    section = dict(lengths=[50, 50], chunk=64, entries=[])
    maps = {}
    for name, errors in (("good", good), ("bad", bad)):
        w = dict(error=0.9, token=0, head=0, sequence=0, position=0)
        section["entries"].append(dict(impl=name, dtype="float32", worst=w))
        maps[(name, "float32")] = errors
    figures.error_map(dict(error_map=section), maps, tmp_path / "m.png")
    images = [ax.images[0] for ax in drawn[0].axes if ax.images]
    assert len(images) == 2
    assert {(im.norm.vmin, im.norm.vmax) for im in images} == {(images[0].norm.vmin, 0.9)}
    assert images[0].norm.vmin <= 1e-7  # the correct map sits low on the same scale
    cmap = images[0].get_cmap()
    assert cmap.get_bad().tolist() != cmap.get_under().tolist()  # NaN is not drawn like 0
    assert "1 non-finite" in drawn[0].axes[1].get_title(loc="left")


def test_property_table_has_failures_with_replay_commands(made):
    out, doc, _ = made
    by = {(p["impl"], p["dtype"]): {r["name"]: r for r in p["results"]} for p in doc["properties"]}
    for dtype in ("float32", "bfloat16"):
        assert all(r["status"] == "passed" for r in by[("numpy", dtype)].values())
    failed = by[(BUG, "float32")]["matches_reference"]
    assert failed["status"] == "failed"
    replay = failed["failure"]["replay"]
    assert replay.startswith("gdn-verify replay /") and replay.endswith(f"--impl {BUG}")
    case = Path(failed["failure"]["case"])
    assert case.is_file() and case.parent == out / "cases"
    rerun = subprocess.run(
        [sys.executable, "cli.py", *replay.split()[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert rerun.returncode == 1 and "failed" in rerun.stdout
    md = (out / "report.md").read_text()
    page = (out / "index.html").read_text()
    for heading in ("## 1.", "## 2.", "## 3.", "## 4.", "## 5.", "## 6."):
        assert heading in md
    assert replay in md and replay.replace("'", "&#x27;") in page
    assert "skipped: `cupy-chunk`" in md or "cupy-chunk" in [i["name"] for i in doc["config"]["implementations"]]


def markdown_tables(md: str) -> list[list[list[str]]]:
    """Every table in ``md`` as rows of cells, split at the pipes that are not escaped."""
    tables, rows = [], []
    for line in [*md.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
        elif rows:
            tables.append(rows)
            rows = []
    return tables


def test_every_markdown_table_has_as_many_cells_in_each_row_as_in_its_header(made):
    """GitHub drops a table whose separator has fewer cells than its header: the ULP column's
    "|exact|" once made 13 header cells over 11."""
    out, doc, _ = made
    tables = markdown_tables((out / "report.md").read_text())
    assert len(tables) == 2 + len(doc["properties"])  # summary, one per (implementation, dtype), environment
    for head, separator, *rows in tables:
        assert set(separator) == {"---"} and len(separator) == len(head), head
        assert all(len(row) == len(head) for row in rows), head
    assert any("\\|exact\\|" in cell for cell in tables[0][0])


def test_no_legend_covers_a_plot(made, monkeypatch, tmp_path):
    """Every legend lies outside every axes: none hides a bar or a line (the ULP histogram's did)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.legend import Legend
    from matplotlib.transforms import Bbox

    _, doc, _ = made
    figures, drawn = capture_figure(monkeypatch)
    names = [i["name"] for i in doc["config"]["implementations"]]
    for draw in (figures.error_vs_length, figures.distributions, figures.gate_beta):
        draw(doc, names, tmp_path / "x.png")
    for fig in drawn:
        FigureCanvasAgg(fig).draw()
        renderer = fig.canvas.get_renderer()
        legends = fig.findobj(Legend)
        assert legends
        for legend in legends:
            box = legend.get_window_extent(renderer)
            for ax in fig.axes:
                frame = ax.get_window_extent(renderer)
                assert not box.overlaps(frame), ax.get_title()
                # A bar's drawn part: on a log axis it reaches down to -inf, clipped at the frame.
                bars = [Bbox.intersection(p.get_window_extent(renderer), frame) for p in ax.patches]
                assert not any(bar is not None and box.overlaps(bar) for bar in bars), ax.get_title()


def test_progress_and_summary_are_printed(made):
    """On a terminal: the progress line, then the summary."""
    out, _, printed = made
    percents = [int(p) for p in re.findall(r"\[\s*(\d+)%\]", printed)]
    assert percents and percents == sorted(percents) and percents[-1] == 100
    assert re.search(r"numpy +float32 +error \d(\.\d+)?e-0\d at T=256", printed)
    assert f"report written to {out / 'index.html'}" in printed


def test_a_failing_report_says_so_first(made):
    """The page opens with the verdict: which properties did not pass, each a link to its minimal
    example in section 5 (before, a failing run read "6 / 8 / 1" in the summary until section 5)."""
    out, doc, _ = made
    expected = [
        f"{row['impl']} / {row['dtype']}: {r['name']} ({r['status']})"
        for row in doc["properties"]
        for r in row["results"]
        if r["status"] not in ("passed", "unsupported")
    ]
    assert expected, "the report has no failure: the test proves nothing"
    page = (out / "index.html").read_text()
    first = page[page.index("<body") :].splitlines()[1]
    n = len(expected)
    assert first.startswith('<div class="verdict failed"')
    assert f"FAILED: {n} propert{'y' if n == 1 else 'ies'} did not pass" in first
    links = re.findall(r'<a href="#([\w-]+)">([^<]*)</a>', first)
    assert [unescape(label) for _, label in links] == expected
    examples = page.index("Minimal failing examples")
    for anchor, _ in links:  # each link lands on its minimal example, below section 5's tables
        assert page.count(f'id="{anchor}"') == 1 and page.index(f'<li id="{anchor}">') > examples
    md = (out / "report.md").read_text().splitlines()  # report.md opens alike, under its title
    assert md[2] == f"**FAILED: {n} propert{'y' if n == 1 else 'ies'} did not pass**:"
    assert md[4 : 4 + n] == [f"- [{unescape(label)}](#{anchor})" for anchor, label in links]


def test_a_passing_report_says_so_in_one_line(made):
    out, doc, _ = made
    passing = dict(doc, properties=[row for row in doc["properties"] if row["impl"] == "numpy"])
    page = render.html(passing, [])
    first = page[page.index("<body") :].splitlines()[1]
    passed = sum(r["status"] == "passed" for row in passing["properties"] for r in row["results"])
    assert passed and first.startswith('<p class="verdict passed"')
    assert f"Passed: every property held ({passed} passed" in first
    assert "FAILED" not in page


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(dtypes=["int8"]), "dtypes"),
        (dict(impls=["nonsense"]), "impl"),
        (dict(max_tokens=4), "max_tokens"),
        (dict(properties=["bogus"]), "properties"),
        (dict(max_examples=0), "max_examples"),
    ],
)
def test_misuse_is_a_configuration_error(kw, field):
    with pytest.raises(ConfigurationError) as info:
        report.options(**kw)
    assert info.value.field == field


def test_only_unavailable_implementations_is_a_configuration_error():
    try:
        resolve("cupy-recurrent")
    except ConfigurationError:
        with pytest.raises(ConfigurationError, match="no implementation can run here"):
            report.options(["cupy-recurrent"])
    else:
        pytest.skip("cupy-recurrent is available here")


def test_cli_report_without_gpu_exits_0_and_names_what_it_skipped(tmp_path):
    if report.gpu_usable():
        pytest.skip("a GPU is usable here: nothing is skipped by default")
    done = subprocess.run(
        [
            sys.executable,
            "cli.py",
            "report",
            "--quick",
            "--max-tokens",
            "64",
            "--properties",
            "determinism",
            "--max-examples",
            "2",
            "--dtype",
            "float32",
            "--out",
            str(tmp_path / "r"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    for name in report.GPU_DEFAULTS:
        assert f"skipped: {name}:" in done.stdout
    # Off a terminal no progress line, not even at each tenth of the work: the log holds the results.
    assert not re.search(r"\[\s*\d+%\]", done.stdout + done.stderr), done.stdout + done.stderr
    assert (tmp_path / "r" / "index.html").is_file()


# The page in a real browser --------------------------------------------------------------------
def chromium_dom(page: Path, tmp_path: Path) -> str:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not on PATH (Debian: apt-get install -y chromium)")
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=10000",
        "--dump-dom",
    ]
    done = subprocess.run([browser, *flags, page.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def body_counts(dom: str) -> tuple[int, int]:
    body = re.search(r"<body[^>]*>", dom).group(0)
    loaded = re.search(r'data-figures-loaded="(\d+)"', body).group(1)
    expected = re.search(r'data-figures-expected="(\d+)"', body).group(1)
    return int(loaded), int(expected)


def test_every_figure_renders_in_headless_chromium(made, tmp_path):
    out, _, _ = made
    assert body_counts(chromium_dom(out / "index.html", tmp_path)) == (len(FIGURE_NAMES), len(FIGURE_NAMES))
    # The counter counts decoded images only: with one figure missing the page says so.
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    (broken / "gate_beta.png").unlink()
    assert body_counts(chromium_dom(broken / "index.html", tmp_path)) == (len(FIGURE_NAMES) - 1, len(FIGURE_NAMES))


COMMITTED_GPU_REPORT = Path(__file__).resolve().parents[1] / "reports" / "2026-11-22-precision-report"


def test_committed_gpu_report_renders_every_figure(tmp_path):
    """The report in the repository (measured on an H100) opens with all its figures."""
    page = COMMITTED_GPU_REPORT / "index.html"
    assert page.is_file(), "the committed GPU report is missing"
    assert body_counts(chromium_dom(page, tmp_path)) == (len(FIGURE_NAMES), len(FIGURE_NAMES))
    results = json.loads((COMMITTED_GPU_REPORT / "results.json").read_text())
    assert {row["impl"] for row in results["summary"]} == {"cupy-chunk", "cupy-recurrent", "fla-chunk", "fla-recurrent"}
