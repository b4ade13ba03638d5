"""The release matrix: a row per release, each checked in a child process with that release first on its path.

Fake FLA releases are wheels built here whose ``fla.ops.gated_delta_rule`` is a plain torch token
loop (one release right, one ignoring the gate), checked through the real ``fla-recurrent`` adapter
and ``check`` under ``TRITON_INTERPRET=1``; the outcomes that need no real check (a child's misuse,
crash or Ctrl-C) use a tiny stand-in child. The real releases run in a slow test.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import pytest

import cli
from gdn_verify.report import matrix as matrix_report
from gdn_verify.runners import matrix, releases
from gdn_verify.runners.matrix import Cell, MatrixResult, Row
from tests.test_releases import _wheel

# A release's GDN kernels in plain torch: the float32 token loop of the native convention.
# GATED is False in the broken release: it ignores the gate (no decay).
FAKE_KERNELS = """
import torch

GATED = {gated}


def fused_recurrent_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None):
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q, k = (x.repeat_interleave(HV // H, dim=2) for x in (q, k))  # value head h reads q/k head h // (HV // H)
    scale = K ** -0.5 if scale is None else scale
    bounds = [0, T] if cu_seqlens is None else cu_seqlens.tolist()
    spans = [(b, 0, T) for b in range(B)] if cu_seqlens is None else [
        (0, s, e) for s, e in zip(bounds[:-1], bounds[1:])]
    o = torch.zeros(B, T, HV, V)
    finals = []
    for n, (b, start, end) in enumerate(spans):
        S = torch.zeros(HV, K, V) if initial_state is None else initial_state[n].float().clone()
        for t in range(start, end):
            if GATED:
                S = S * torch.exp(g[b, t])[:, None, None]
            u = beta[b, t, :, None] * (v[b, t] - torch.einsum("hk,hkv->hv", k[b, t], S))
            S = S + k[b, t, :, :, None] * u[:, None, :]
            o[b, t] = scale * torch.einsum("hk,hkv->hv", q[b, t], S)
        finals.append(S)
    return o.to(v.dtype), torch.stack(finals) if output_final_state else None


chunk_gated_delta_rule = fused_recurrent_gated_delta_rule
"""


def _release(wheels: Path, version: str, gated: bool) -> None:
    kernels = FAKE_KERNELS.format(gated=gated)
    _wheel(
        wheels,
        "fla-core",
        version,
        {"fla/__init__.py": "", "fla/ops/__init__.py": "", "fla/ops/gated_delta_rule/__init__.py": kernels},
    )


def _schema_validate(doc: dict) -> dict:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(matrix_report.MATRIX_SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(doc)
    return doc


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """Release sites in a fresh cache; the children's cases and plans under tmp_path."""
    monkeypatch.setenv(releases.ENV, str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_library_is_named_by_the_implementation():
    assert matrix.library_of("fla-chunk") == "fla"
    assert matrix.library_of("vllm-recurrent") == "vllm"
    with pytest.raises(ValueError, match="impl.*'cupy-chunk'"):
        matrix.library_of("cupy-chunk")


def test_check_flags_pass_through_and_unset_ones_do_not():
    values = {"dtype": "float32", "properties": "a,b", "max_examples": 5, "dims": None, "impl": "x", "seed": 7}
    assert matrix.check_argv({**values, "scale": True})[-1] == "--scale"  # a switch, given
    assert "--scale" not in matrix.check_argv({**values, "scale": False})
    assert matrix.check_argv(values) == [
        "--dtype",
        "float32",
        "--properties",
        "a,b",
        "--seed",
        "7",
        "--max-examples",
        "5",
    ]


def test_the_table_shows_each_cell_and_the_release_status():
    rows = [
        Row("0.5.2", "passed", description="FLA 0.5.2 recurrent", properties={"a": Cell("passed", 0.1)}),
        Row(
            "0.6.0",
            "failed",
            properties={"a": Cell("failed", 41.23, "logic error", "gate ignored"), "b": Cell("unsupported")},
        ),
        Row("0.1", "unavailable", reason="fla 0.1: no wheel"),
        Row("0.4.0", "misuse", reason="error: --impl: FLA 0.4 has no l2norm option"),
    ]
    result = MatrixResult(
        "fla-recurrent", "fla", ["0.5.2", "0.6.0", "0.1", "0.4.0"], ["--dtype", "float32"], True, rows
    )
    lines = matrix_report.table_lines(result)
    header = lines[1].split()
    assert header == ["release", "a", "b", "status"]
    cells = {line.split()[0]: line for line in lines[2:6]}
    assert cells["0.5.2"].split() == ["0.5.2", "pass", "-", "passed"]
    assert cells["0.6.0"].split() == ["0.6.0", "FAIL", "41.2x", "unsup", "FAILED"]
    assert cells["0.1"].split()[:3] == ["0.1", "-", "-"] and cells["0.1"].endswith("unavailable: fla 0.1: no wheel")
    assert cells["0.4.0"].endswith("misuse: error: --impl: FLA 0.4 has no l2norm option")
    assert "0.6.0 a: logic error, gate ignored" in lines
    assert "FAIL Nx: the worst error was N times its bound" in lines  # the legend, as a cell failed
    assert not any(line.startswith("FAIL (raised)") for line in lines)  # every failure here has its ratio
    raised = [Row("0.5.2", "failed", properties={"scale_decode_batch": Cell("failed")})]  # a launch error, say
    raised_lines = matrix_report.table_lines(MatrixResult("fla-chunk", "fla", ["0.5.2"], [], False, raised))
    assert raised_lines[2].split() == ["0.5.2", "FAIL", "(raised)", "FAILED"]
    assert "FAIL (raised): no error was measured: the kernel raised or broke the output contract" in raised_lines
    assert not any(
        "FAIL" in line
        for line in matrix_report.table_lines(MatrixResult("fla-chunk", "fla", ["0.5.2"], [], True, rows[:1]))
    )
    assert "0.5.2: FLA 0.5.2 recurrent" in lines
    assert all(line == line.rstrip() for line in lines)
    for status in ("running", "complete", "interrupted"):
        doc = _schema_validate(json.loads(json.dumps(matrix_report.document(result, status, ["gdn-verify"]))))
        assert doc["rows"][1]["properties"]["a"] == dict(
            status="failed", ratio=41.23, kind="logic error", cause="gate ignored"
        )


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--impl", "numpy", "--versions", "1"], "--impl"),
        (["--impl", "fla-chunk", "--versions", " , "], "--versions"),
        (["--impl", "fla-chunk", "--versions", "1,1"], "--versions"),
        (["--impl", "fla-chunk", "--versions", "1", "--wheels", "/no/such/folder"], "--wheels"),
        (["--impl", "fla-chunk", "--versions", "1", "--properties", "no_such_property"], "--properties"),
        (["--impl", "fla-chunk", "--versions", "1", "--dtype", "float8"], "--dtype"),
        (["--impl", "fla-chunk", "--versions", "1", "--max-tokens", "3"], "--max-tokens"),
    ],
)
def test_misuse_is_one_line_before_any_release_runs(argv, flag, cache, capsys, monkeypatch):
    monkeypatch.setattr(releases, "site", lambda *a, **k: pytest.fail("a release was fetched"))
    assert cli.main(["matrix", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {flag}:"), err


# A stand-in for `python -m gdn_verify check`: it does what the release's fla/__init__.py says
# (BEHAVIOUR), so that outcomes a real check cannot be made to produce on demand are tested.
STAND_IN = """
import json, signal, sys, time
import fla

argv = sys.argv[1:]
out = argv[argv.index("--json") + 1]


def write(status, results):
    doc = dict(status=status, environment=dict(packages={"fla-core": fla.VERSION}, device=None), results=results)
    with open(out, "w") as f:
        json.dump(doc, f)


done = [dict(name="determinism", status="passed", worst=dict(error=0.0, bound=1e-6))]
if fla.BEHAVIOUR == "misuse":
    print("error: --impl: FLA " + fla.VERSION + " cannot take use_qk_l2norm_in_kernel", file=sys.stderr)
    sys.exit(2)
if fla.BEHAVIOUR == "crash":
    write("running", done)
    print("Fatal Python error: Segmentation fault", file=sys.stderr)
    sys.exit(139)
if fla.BEHAVIOUR == "hang":
    def stop(signum, frame):
        write("interrupted", done)
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    write("running", done)
    open(out + ".ready", "w").close()
    time.sleep(60)
print("gdn-verify check: impl=fla-recurrent (stand-in " + fla.VERSION + ", a kernel), arrays=torch, dtype=float32")
write("complete", done)
"""


@pytest.fixture
def stand_in(cache, monkeypatch):
    """A wheel folder of stand-in releases (version -> BEHAVIOUR) and the stand-in child."""
    script = cache / "stand_in.py"
    script.write_text(STAND_IN)
    monkeypatch.setattr(matrix, "CHILD", (sys.executable, str(script)))
    wheels = cache / "wheels"
    wheels.mkdir()

    def make(**behaviours: str) -> Path:
        for version, behaviour in behaviours.items():
            version = version.removeprefix("v").replace("_", ".")
            text = f"VERSION = {version!r}\nBEHAVIOUR = {behaviour!r}\n"
            _wheel(wheels, "fla-core", version, {"fla/__init__.py": text})
        return wheels

    return make


def test_a_child_that_cannot_take_the_release_is_a_row_not_a_crash(stand_in, capsys):
    wheels = stand_in(v1_0_1="misuse", v1_0_2="pass", v1_0_3="crash")
    (wheels / "fla_core-1.0.4-py3-none-any.whl").write_text("not a zip")
    out = Path("m.json")
    argv = ["matrix", "--impl", "fla-recurrent", "--versions", "1.0.1,1.0.2,1.0.3,1.0.4", "--wheels", str(wheels)]
    assert cli.main([*argv, "--json", str(out), "--seed", "3"]) == 1
    doc = _schema_validate(json.loads(out.read_text()))
    rows = {r["version"]: r for r in doc["rows"]}
    assert [r["version"] for r in doc["rows"]] == ["1.0.1", "1.0.2", "1.0.3", "1.0.4"]
    assert rows["1.0.1"]["status"] == "misuse" and rows["1.0.1"]["exit_code"] == 2
    assert rows["1.0.1"]["reason"] == "error: --impl: FLA 1.0.1 cannot take use_qk_l2norm_in_kernel"
    assert rows["1.0.2"]["status"] == "passed" and rows["1.0.2"]["loaded"] == "1.0.2"
    assert rows["1.0.2"]["description"] == "stand-in 1.0.2, a kernel"
    assert rows["1.0.2"]["properties"]["determinism"]["status"] == "passed"
    assert rows["1.0.3"]["status"] == "error" and "exited 139" in rows["1.0.3"]["reason"]
    assert rows["1.0.3"]["reason"].endswith("Segmentation fault")
    assert rows["1.0.4"]["status"] == "unavailable" and "pip install failed" in rows["1.0.4"]["reason"]
    assert doc["status"] == "complete" and "--seed 3" in " ".join(doc["check_args"])
    table = capsys.readouterr().out
    assert "misuse: error: --impl: FLA 1.0.1" in table and "unavailable: fla 1.0.4" in table
    # Beside the matrix, each child's own check document and console (what a bug report quotes).
    assert json.loads(Path("m-1.0.2.json").read_text())["status"] == "complete"
    assert "cannot take use_qk_l2norm_in_kernel" in Path("m-1.0.1.txt").read_text()
    assert not Path("m-1.0.4.txt").exists()  # never ran: nothing to keep


def test_every_release_misused_is_the_arguments_exit_2(stand_in, capsys):
    wheels = stand_in(v2_0_1="misuse", v2_0_2="misuse")
    assert cli.main(["matrix", "--impl", "fla-chunk", "--versions", "2.0.1,2.0.2", "--wheels", str(wheels)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: every release: error: --impl: FLA 2.0.1 cannot take use_qk_l2norm_in_kernel"]


def test_all_passing_releases_exit_0_and_a_wrong_release_on_the_path_is_an_error(stand_in, monkeypatch):
    wheels = stand_in(v3_0_1="pass", v3_0_2="pass")
    assert cli.main(["matrix", "--impl", "fla-chunk", "--versions", "3.0.1,3.0.2", "--wheels", str(wheels)]) == 0
    # A child that imports another release than its own (the site not first on its path) is caught.
    other = releases.site("fla", "3.0.1", wheels)
    monkeypatch.setattr(releases, "site", lambda library, version, wheels=None: other)
    result = matrix.run_matrix("fla-chunk", ["3.0.2"], wheels=wheels)
    assert result.rows[0].status == "error" and "loaded fla 3.0.1, not 3.0.2" in result.rows[0].reason


def test_ctrl_c_stops_the_child_and_keeps_the_rows_done(stand_in, monkeypatch, capsys):
    wheels = stand_in(v4_0_1="pass", v4_0_2="hang", v4_0_3="pass")
    monkeypatch.setattr(matrix, "GRACE_SECONDS", 0.2)
    out = Path("m.json").resolve()
    children = []
    main = threading.main_thread().ident
    real_popen = matrix.subprocess.Popen

    def popen(*args, **kwargs):
        child = real_popen(*args, **kwargs)
        if "--json" not in args[0]:
            return child  # pip, unpacking a release
        children.append(child)
        ready = Path(args[0][args[0].index("--json") + 1] + ".ready")

        def interrupt_when_ready() -> None:
            for _ in range(600):
                if ready.exists():  # a Ctrl-C to the waiting main thread, as a terminal sends it
                    signal.pthread_kill(main, signal.SIGINT)
                    return
                threading.Event().wait(0.05)

        if "4.0.2" in str(kwargs["env"]["PYTHONPATH"].split(os.pathsep)[0]):
            threading.Thread(target=interrupt_when_ready, daemon=True).start()
        return child

    monkeypatch.setattr(matrix.subprocess, "Popen", popen)
    argv = ["matrix", "--impl", "fla-chunk", "--versions", "4.0.1,4.0.2,4.0.3", "--wheels", str(wheels)]
    assert cli.main([*argv, "--json", str(out)]) == 130
    assert len(children) == 2 and all(c.poll() == 143 for c in children[1:])  # stopped, its JSON saved
    doc = _schema_validate(json.loads(out.read_text()))
    assert doc["status"] == "interrupted"
    assert [(r["version"], r["status"]) for r in doc["rows"]] == [("4.0.1", "passed"), ("4.0.2", "interrupted")]
    assert doc["rows"][1]["properties"]["determinism"]["status"] == "passed"  # what the child had done
    captured = capsys.readouterr()
    assert "gdn-verify: interrupted" in captured.err and "4.0.2" in captured.out


@pytest.mark.interpreter
def test_a_release_that_ignores_the_gate_fails_where_the_right_one_passes(cache, monkeypatch, capsys):
    """Real children, the real fla-recurrent adapter and check, on two fake releases in plain torch."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the adapter's way onto the CPU (no Triton kernel here)
    wheels = cache / "wheels"
    wheels.mkdir()
    # Versions a row of the table covers (0.4.0-0.4.1: no layout keyword, GVA in the recurrent
    # kernel), so the adapter takes that row's conventions: an unknown version would be probed
    # first, and no convention explains a kernel that ignores the gate (exit 2 before any verdict).
    _release(wheels, "0.4.0", gated=True)
    _release(wheels, "0.4.1", gated=False)
    out = cache / "matrix.json"
    argv = ["matrix", "--impl", "fla-recurrent", "--versions", "0.4.0,0.4.1", "--wheels", str(wheels), "--seed", "1"]
    checks = ["--dtype", "float32", "--properties", "matches_reference", "--max-examples", "3", "--dims", "32"]
    checks += ["--max-tokens", "64", "--compile-budget", "1s", "--timeout", "0"]  # a small pool of shape classes
    assert cli.main([*argv, *checks, "--json", str(out)]) == 1
    doc = _schema_validate(json.loads(out.read_text()))
    right, broken = doc["rows"]
    assert doc["environment"]["interpreter"] is True and doc["columns"] == ["matches_reference"]
    assert (right["status"], right["loaded"], right["exit_code"]) == ("passed", "0.4.0", 0)
    assert (broken["status"], broken["loaded"], broken["exit_code"]) == ("failed", "0.4.1", 1)
    assert right["properties"]["matches_reference"]["ratio"] <= 1
    assert broken["properties"]["matches_reference"]["ratio"] > 1
    assert "fused_recurrent_gated_delta_rule" in right["description"]
    table = capsys.readouterr().out.splitlines()
    assert table[1].split() == ["release", "matches_reference", "status"]
    assert table[2].split() == ["0.4.0", "pass", "passed"]
    assert table[3].split()[:2] == ["0.4.1", "FAIL"] and table[3].split()[-1] == "FAILED"
    # The failure's kind and cause: the planted gate_ignored mistake reproduces it.
    assert any(line.startswith("0.4.1 matches_reference: logic error, the gate ignored") for line in table)


@pytest.mark.slow
def test_real_fla_releases_under_the_interpreter(cache, monkeypatch, capsys):
    """FLA 0.5.2 and 0.6.0's fused recurrent kernels, run by Triton's interpreter, both pass."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    wheels = Path(os.environ.get("GDN_VERIFY_WHEELS", "no-wheels-folder"))  # else the package index
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = cache / "matrix.json"
    argv = ["matrix", "--impl", "fla-recurrent", "--versions", "0.5.2,0.6.0", "--dtype", "float32"]
    argv += ["--properties", "matches_reference", "--max-examples", "5", "--dims", "32", "--max-tokens", "64"]
    argv += ["--seed", "1", "--timeout", "0", "--json", str(out)]  # no call limit: the interpreter is slow
    argv += ["--wheels", str(wheels)] if wheels.is_dir() else []
    assert cli.main(argv) == 0, capsys.readouterr().out
    doc = _schema_validate(json.loads(out.read_text()))
    assert [(r["version"], r["status"], r["loaded"]) for r in doc["rows"]] == [
        ("0.5.2", "passed", "0.5.2"),
        ("0.6.0", "passed", "0.6.0"),
    ]
    assert all(0 <= r["properties"]["matches_reference"]["ratio"] <= 1 for r in doc["rows"])
