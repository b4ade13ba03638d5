"""FLA's conventions table and probes (``gdn_verify.implementations.fla_releases``), on the CPU.

The table covers every published release with GDN and nothing else; the installed release is
read from its metadata and its ops are imported without the layers where its ``fla/__init__.py``
would import transformers; the probes tell the conventions apart on stand-in kernels (the float64
oracle behind each convention) and, under Triton's interpreter, agree with the table's row on the
real kernels of the oldest, a middle and the newest release (each in a child process).
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gdn_verify.core import reference
from gdn_verify.core.implementation import ConfigurationError
from gdn_verify.implementations import fla_releases as R

ROOT = Path(__file__).resolve().parents[1]
# Every release of flash-linear-attention / fla-core on PyPI (2026-12-04): all have GDN.
PUBLISHED = "0.1 0.1.1 0.1.2 0.2.0 0.2.1 0.2.2 0.3.0 0.3.1 0.3.2 0.4.0 0.4.1 0.4.2 0.5.0 0.5.1 0.5.2 0.6.0".split()


def test_every_published_release_has_exactly_one_row():
    for version in PUBLISHED:
        rows = [r for r in R.TABLE if R.parse(r.first) <= R.parse(version) <= R.parse(r.last)]
        assert len(rows) == 1, (version, rows)
        assert R.row(version) is rows[0]
    assert R.row("0.1.0") is R.row("0.1")


def test_the_row_is_looked_up_in_the_table_as_it_is_at_the_call(monkeypatch):
    """A row patched into TABLE (the corrupted-row tests) is the one the adapters use."""
    changed = replace(R.row("0.6.0"), stages=False)
    monkeypatch.setattr(R, "TABLE", (changed,))
    assert R.row("0.6.0") is changed and R.row("0.1") is None


@pytest.mark.parametrize("version", ["0.7.0", "0.0.9", "0.6.1.dev0", "0.6.0rc1", "main"])
def test_a_release_no_row_covers_has_none(version):
    assert R.row(version) is None


def test_the_rows_say_where_the_conventions_changed():
    old, new = R.row("0.1"), R.row("0.6.0")
    assert old.ops_only and old.dist == "flash-linear-attention" and old.chunk.head_first
    assert (old.chunk.gva, old.chunk.float32, old.chunk.layout) == (False, False, None)
    assert not new.ops_only and new.dist == "fla-core" and not new.chunk.head_first
    assert (new.chunk.gva, new.chunk.float32, new.chunk.layout) == (True, True, "state_v_first")
    assert R.row("0.4.2").chunk.layout == "transpose_state_layout" and not R.row("0.4.2").chunk.gva
    assert R.row("0.3.0").recurrent.gva and not R.row("0.2.2").recurrent.gva


def _child(code: str, path: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def _fake_site(tmp_path: Path, dist: str, version: str, declared: str, init_raises: bool) -> Path:
    """A site with an ``fla`` package (its ``__init__`` raising ImportError when asked) and metadata."""
    fla = tmp_path / "fla"
    (fla / "ops" / "gated_delta_rule").mkdir(parents=True)
    (fla / "modules").mkdir()
    first = "raise ImportError('no transformers')\n" if init_raises else ""
    (fla / "__init__.py").write_text(f"{first}__version__ = '{declared}'\n")
    (fla / "ops" / "__init__.py").write_text("raise ImportError('every op imported')\n")
    (fla / "modules" / "__init__.py").write_text("raise ImportError('fla.modules imported')\n")
    body = (
        "def chunk_gated_delta_rule(**kw): return 'chunk'\ndef fused_recurrent_gated_delta_rule(**kw): return 'rec'\n"
    )
    (fla / "ops" / "gated_delta_rule" / "__init__.py").write_text(body)
    info = tmp_path / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    return tmp_path


LOAD = """
import json
from gdn_verify.implementations import fla_releases as R
dist, version, folder = R.installed()
row = R.row(version)
fns = R.load(folder, {ops_only})
print(json.dumps([dist, version, folder.name, fns["chunk"](), fns["recurrent"]()]))
"""


def test_an_old_release_is_read_from_its_metadata_and_loaded_without_its_layers(tmp_path):
    site = _fake_site(tmp_path, "flash-linear-attention", "0.1", "0.1", init_raises=True)
    out = json.loads(_child(LOAD.format(ops_only="row.ops_only"), site))
    assert out == ["flash-linear-attention", "0.1", "fla", "chunk", "rec"]


def test_a_release_without_a_row_falls_back_to_the_bare_packages(tmp_path):
    site = _fake_site(tmp_path, "fla-core", "0.7.0", "0.7.0", init_raises=True)
    assert json.loads(_child(LOAD.format(ops_only="None"), site)) == ["fla-core", "0.7.0", "fla", "chunk", "rec"]


def test_the_source_wins_over_stale_metadata(tmp_path):
    site = _fake_site(tmp_path, "fla-core", "0.6.0", "0.7.0.dev0", init_raises=False)
    assert json.loads(_child(LOAD.format(ops_only="None"), site))[:2] == ["fla", "0.7.0.dev0"]


# ---- probes on stand-in kernels: the float64 oracle behind a given convention -------------------
torch = pytest.importorskip("torch", reason="the probes call torch functions (pip install torch)")


def stand_in(v_first_default=False, layout="state_v_first", honours_layout=True, linear=False, gva=True):
    """A kernel in FLA's keyword convention computing the oracle, with the convention asked for."""

    def kernel(q, k, v, g, beta, initial_state=None, output_final_state=False, **kw):
        if not gva and v.shape[2] != q.shape[2]:
            v = v[:, :, : q.shape[2]].repeat_interleave(v.shape[2] // q.shape[2], dim=2).flip(2)  # wrong heads
        n = [x.double().numpy() for x in (q, k, v, g, beta)]
        if linear:  # handed the log of a decay, a kernel taking the decay itself computes NaN
            if (n[3] <= 0).any():
                nan = torch.full(v.shape, float("nan"))
                return nan, torch.full(initial_state.shape, float("nan"))
            n[3] = np.log(n[3])
        v_first = kw.get(layout, False) if honours_layout else False
        v_first = v_first != v_first_default
        s = initial_state.double().numpy()
        o, final = reference.recurrent_gated_delta_rule(
            *n, initial_state=s.swapaxes(-1, -2) if v_first else s, output_final_state=True
        )
        final = final.swapaxes(-1, -2) if v_first else final
        return torch.from_numpy(o).to(q.dtype), torch.from_numpy(np.ascontiguousarray(final)).float()

    params = ["q", "k", "v", "g", "beta", "initial_state", "output_final_state"] + ([layout] if layout else [])
    P = inspect.Parameter
    kernel.__signature__ = inspect.Signature([P(p, P.POSITIONAL_OR_KEYWORD) for p in params])  # type: ignore[attr-defined]
    return kernel


def test_the_probe_reads_a_faithful_kernel_as_it_is():
    assert R.probe_entry(stand_in(), "cpu") == R.EntryPoint(False, "state_v_first", True, True)
    assert R.probe_entry(stand_in(layout="transpose_state_layout"), "cpu").layout == "transpose_state_layout"
    assert R.probe_entry(stand_in(layout=None), "cpu").layout is None


def test_the_probe_reports_no_gva_when_more_value_heads_run_wrong():
    notes: list[str] = []
    assert not R.probe_entry(stand_in(gva=False), "cpu", notes).gva
    assert "HV = 2 H runs but matches no GVA reading" in notes[0]


@pytest.mark.parametrize(
    "kernel, why",
    [
        (stand_in(honours_layout=False), "state_v_first=True still reads the state k-first"),
        (stand_in(v_first_default=True, layout=None), "the default state layout is v-first"),
        (stand_in(linear=True), "the gate is linear"),
    ],
)
def test_what_the_probe_cannot_settle_is_one_line_naming_the_release(kernel, why):
    with pytest.raises(ConfigurationError) as err:
        R.probe({"chunk": kernel, "recurrent": stand_in()}, "fla-core", "0.7.0", "cpu")
    message = str(err.value)
    assert "\n" not in message and "FLA 0.7.0 (fla-core)" in message and "chunk_gated_delta_rule" in message
    assert why in message


# ---- the table against probes of the real kernels (interpreter, one child per release) ----------
PROBE = """
import json, warnings
warnings.filterwarnings("ignore")
from gdn_verify.implementations import fla_releases as R, interpreter
interpreter.install()
dist, version, folder = R.installed()
row = R.row(version)
fns = R.load(folder, row.ops_only)
print("RESULT " + json.dumps({
    "version": version,
    "probed": {form: R.probed_fields(R.probe_entry(fn, "cpu")) for form, fn in fns.items()},
    "row": {form: R.probed_fields(row.entry(form)) for form in fns},
}))
"""


@pytest.mark.interpreter
@pytest.mark.parametrize("version", ["0.1", "0.4.2", "0.6.0"])
def test_the_row_of_a_release_is_what_probing_its_kernels_finds(version):
    pytest.importorskip("triton", reason="the real kernels run under Triton's interpreter (pip install triton)")
    pytest.importorskip("einops", reason="FLA's kernels import einops (pip install einops)")
    from tests.test_interpreter_fla import release_site

    releases, site = release_site(version)
    env = {**releases.child_env(site), "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (done.stdout + done.stderr)[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["version"] == version
    assert result["probed"] == result["row"]


def test_a_row_corrupted_in_a_probed_field_disagrees_with_its_probe():
    """The comparison above is field by field: flipping any probed field of a row changes it."""
    row = R.row("0.6.0").chunk
    for field, value in R.probed_fields(row).items():
        flipped = (not value) if isinstance(value, bool) else (None if value else "state_v_first")
        assert R.probed_fields(replace(row, **{field: flipped})) != R.probed_fields(row), field
