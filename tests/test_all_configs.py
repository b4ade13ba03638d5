"""``check --all-configs``: the properties under every config of each autotuned Triton kernel.

The autotuner machinery (discovery, pinning, the config text, the agreement across configs) is
tested in this process on Triton's own ``Autotuner`` around a plain Python kernel. The checks run
in a child process with ``TRITON_INTERPRET=1`` (Triton decides at decoration whether a kernel is
interpreted) on ``tests/triton_gdn.py``, whose planted bugs live in one config only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gdn_verify import api
from gdn_verify.core.implementation import ConfigurationError
from gdn_verify.core.shapes import ShapeClass
from gdn_verify.options import CheckOptions
from gdn_verify.runners import configs

torch = pytest.importorskip("torch", reason="the all-configs tests need torch (pip install -e '.[test]')")
triton = pytest.importorskip("triton", reason="the all-configs tests need Triton (pip install -e '.[test]')")

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "tests/triton_gdn.py"
REDUCED = ["--array", "torch", "--dtype", "float32", "--dims", "16", "--max-examples", "3", "--max-tokens", "64"]
BAD = "_recurrent_kernel[BV=32, num_warps=1, num_stages=3]"  # FLOOR_GRID's config: no program launched for V=16
WARPS = "_recurrent_kernel[BV=16, num_warps=2, num_stages=3]"  # WARPS_HOOK's config


def _check(tmp_path: Path, fn: str, *flags: str) -> tuple[int, dict, str]:
    out = tmp_path / f"{fn}.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "gdn_verify", "check", "--impl", f"{KERNEL}:{fn}", *REDUCED, *flags]
    argv += ["--seed", "1", "--json", str(out), "--cases", str(tmp_path), "--plans", str(tmp_path)]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    doc = json.loads(out.read_text()) if out.exists() else {}
    return done.returncode, doc, done.stdout + done.stderr


def _verdicts(doc: dict) -> dict[tuple[str, str], str]:
    """(property, kernel[config]) -> status, for every row of an all-configs document."""
    return {
        (row["name"], f"{row['config']['kernel']}[{row['config']['config']}]"): row["status"] for row in doc["results"]
    }


@pytest.mark.interpreter
def test_a_config_only_bug_passes_the_default_check_and_fails_under_its_config(tmp_path):
    code, doc, text = _check(tmp_path, "floor_grid", "--properties", "matches_reference")
    assert code == 0, text  # the default config (the first, BV=16) is right
    assert "all_configs" not in doc and all("config" not in row for row in doc["results"])

    code, doc, text = _check(tmp_path, "floor_grid", "--all-configs", "--properties", "matches_reference")
    assert code == 1, text
    assert "configs differ only in tiling" in text  # the header says what the interpreter can tell apart
    assert "1 autotuned kernel, 3 (kernel, config) pairs x 1 properties = 3 property runs" in text
    verdicts = _verdicts(doc)
    failed = {where for (prop, where), status in verdicts.items() if status == "failed"}
    assert failed == {BAD}, text
    assert verdicts[("matches_reference", "_recurrent_kernel[BV=16, num_warps=1, num_stages=3]")] == "passed"
    assert f"FAILED matches_reference {BAD}" in text  # the failure names the kernel and the config
    assert doc["all_configs"]["pairs"] == 3 and doc["all_configs"]["interpreter"] is True


@pytest.mark.interpreter
def test_a_correct_kernel_passes_under_every_config(tmp_path):
    code, doc, text = _check(tmp_path, "recurrent", "--all-configs", "--properties", "matches_reference,determinism")
    assert code == 0, text
    verdicts = _verdicts(doc)
    assert len(verdicts) == 3 * 2 + 1, text  # 3 configs x 2 properties, and the agreement across configs
    assert set(verdicts.values()) == {"passed"}, text
    (agreement,) = [row for row in doc["results"] if row["name"] == configs.AGREEMENT]
    assert agreement["note"].startswith("3 of 3 configs bitwise identical to the first"), agreement
    _validate(doc)


def _validate(doc: dict) -> None:
    """``doc`` validates against the published schema (rows with ``config``, ``all_configs``)."""
    pytest.importorskip("jsonschema")
    from tests.test_schema import validate

    validate(doc)


@pytest.mark.interpreter
def test_configs_differing_only_in_num_warps_must_agree_bitwise_under_the_interpreter(tmp_path):
    code, doc, text = _check(tmp_path, "warps_hook", "--all-configs", "--properties", "determinism")
    assert code == 1, text
    verdicts = _verdicts(doc)
    assert verdicts[(configs.AGREEMENT, "_recurrent_kernel[all 3 configs]")] == "failed", text
    assert verdicts[("determinism", WARPS)] == "passed"  # each config alone repeats itself bitwise
    (agreement,) = [row for row in doc["results"] if row["name"] == configs.AGREEMENT]
    assert (
        f"{WARPS} differs from _recurrent_kernel[BV=16, num_warps=1, num_stages=3]" in agreement["failure"]["message"]
    )
    _validate(doc)  # a failed agreement (no saved case) is a valid row too


@pytest.mark.interpreter
def test_the_pytest_plugin_runs_each_property_under_every_config(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--gdn-impl", "triton_gdn:floor_grid"]
    argv += ["--gdn-array", "torch", "--gdn-dtype", "float32", "--gdn-dims", "16", "--gdn-max-examples", "3"]
    argv += ["--gdn-properties", "matches_reference", "--gdn-seed", "1", "--gdn-all-configs"]
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    text = done.stdout + done.stderr
    assert done.returncode == 1, text
    assert "every autotuner config" in text  # the header
    assert f"FAILED matches_reference {BAD}" in text and "1 failed" in text, text


def test_the_cli_refuses_all_configs_for_an_implementation_without_triton_in_one_line():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "gdn_verify", "check", "--impl", "numpy", "--all-configs"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: --all-configs: pins Triton autotuner configs; numpy takes numpy arrays (no Triton kernels)"
    ]


# In this process: Triton's Autotuner around a plain Python "kernel" ---------------------------
class _Kernel:
    """Stands in for a ``JITFunction``: ``run`` records the config kwargs it was launched with."""

    def __init__(self) -> None:
        def scaled_kernel(x, BV, **kw):  # the function Autotuner.base_fn finds, for the name
            return None

        self.fn = scaled_kernel
        self.launches: list[dict] = []

    def run(self, *args, **kwargs):
        self.launches.append(kwargs)


def _autotuner(configs_list, kernel):
    from triton.runtime.autotuner import Autotuner

    return Autotuner(kernel, ["x"], configs_list, key=[], reset_to_zero=None, restore_value=None)


def test_config_text_names_the_kwargs_then_the_launch_options():
    assert configs.config_text(triton.Config({"BV": 32}, num_warps=4, num_stages=2)) == (
        "BV=32, num_warps=4, num_stages=2"
    )
    assert configs.config_text(triton.Config({}, num_warps=8, num_stages=1, num_ctas=2, maxnreg=128)) == (
        "num_warps=8, num_stages=1, num_ctas=2, maxnreg=128"
    )
    assert configs.label("k", triton.Config({"BK": 64})) == "k[BK=64, num_warps=4, num_stages=3]"


def test_recording_finds_each_autotuner_once_through_heuristics_and_restores_run():
    from triton.runtime.autotuner import Autotuner, Heuristics

    kernel = _Kernel()
    tuner = _autotuner([triton.Config({"BV": 16}), triton.Config({"BV": 32})], kernel)
    tuner.cache[()] = tuner.configs[1]  # the choice a timing made earlier (no driver here)
    outer = Heuristics(tuner, ["x"], {"EXTRA": lambda args: 1})  # FLA's @heuristics over @autotune
    original = Autotuner.run
    with configs.recording() as seen:
        outer.run(1, grid=(1,), warmup=False)
        outer.run(2, grid=(1,), warmup=False)
    assert Autotuner.run is original
    assert seen == [tuner]
    assert configs._kernel_name(tuner) == "scaled_kernel"


def test_pinning_runs_exactly_the_config_given_and_restores_the_list():
    kernel = _Kernel()
    listed = [triton.Config({"BV": 16}, num_warps=1), triton.Config({"BV": 32}, num_warps=2)]
    tuner = _autotuner(listed, kernel)
    tuner.cache[()] = listed[0]
    tuned = configs.Tuned("scaled_kernel", tuner, tuple(listed))
    with configs.pinned(tuned, listed[1]):
        tuner.run(1, grid=(1,), warmup=False)
    assert kernel.launches[-1]["BV"] == 32 and kernel.launches[-1]["num_warps"] == 2
    assert tuner.configs == listed
    tuner.run(1, grid=(1,), warmup=False)  # afterwards: its own (cached) choice again
    assert kernel.launches[-1]["BV"] == 16


def test_a_config_the_autotuner_would_drop_on_this_gpu_is_unsupported_not_failed():
    from triton.runtime.errors import OutOfResources

    class TooBig(_Kernel):
        def run(self, *args, **kwargs):
            if kwargs["BV"] == 128:
                raise OutOfResources(300000, 232448, "shared memory")
            super().run(*args, **kwargs)

    kernel = TooBig()
    listed = [triton.Config({"BV": 16}), triton.Config({"BV": 128})]
    tuner = _autotuner(listed, kernel)
    tuned = configs.Tuned("scaled_kernel", tuner, tuple(listed))
    with configs.pinned(tuned, listed[1]), pytest.raises(NotImplementedError, match=r"BV=128.*cannot launch here"):
        tuner.run(1, grid=(1,), warmup=False)
    with configs.pinned(tuned, listed[0]):
        tuner.run(1, grid=(1,), warmup=False)
    assert kernel.launches[-1]["BV"] == 16
    assert "run" not in vars(tuner)  # the class's own run again


def _outputs(x: float) -> dict[str, np.ndarray]:
    return {"chunk.o": np.full((2, 3), x, np.float32)}


def test_agreement_is_bitwise_within_same_kwargs_under_the_interpreter_and_information_on_a_gpu():
    listed = (
        triton.Config({"BV": 16}, num_warps=1),
        triton.Config({"BV": 16}, num_warps=2),
        triton.Config({"BV": 32}, num_warps=1),
    )
    tuned = configs.Tuned("k", None, listed)
    problem = ShapeClass(1, 1, 16, 16, "float32").example()
    # BV=32 differs (another tiling: allowed); the num_warps twin is identical
    ok = configs.agreement(tuned, [_outputs(1.0), _outputs(1.0), _outputs(1.5)], True, problem)
    assert ok.status == "passed" and ok.note.startswith("2 of 3 configs bitwise identical"), ok.note
    # the num_warps twin differs: a failure under the interpreter, information on a GPU
    twin = [_outputs(1.0), _outputs(1.0 + 2**-20), _outputs(1.0)]
    bad = configs.agreement(tuned, twin, True, problem)
    assert bad.status == "failed" and "k[BV=16, num_warps=2, num_stages=3] differs from" in bad.failure.message
    gpu = configs.agreement(tuned, twin, False, problem)
    assert gpu.status == "passed" and "not promised on a GPU" in gpu.note
    raised = configs.agreement(tuned, [_outputs(1.0), "RuntimeError: boom", _outputs(1.0)], True, problem)
    assert (
        raised.status == "passed" and "k[BV=16, num_warps=2, num_stages=3] raised (RuntimeError: boom)" in raised.note
    )


def _plain_torch(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **kw):
    """A torch function with no Triton kernel at all (zeros of the right shapes)."""
    B, T, H, K = q.shape
    N, HV, V = B, v.shape[2], v.shape[3]
    return torch.zeros_like(v), (torch.zeros(N, HV, K, V) if output_final_state else None)


def test_all_configs_is_refused_where_it_cannot_apply():
    with pytest.raises(ConfigurationError, match="launches no autotuned Triton kernel") as exc:
        CheckOptions(all_configs=True, array="torch", dims=[16]).resolve(_plain_torch)
    assert exc.value.field == "all_configs"
    with pytest.raises(ConfigurationError, match="not with the scale tier") as exc:
        CheckOptions(all_configs=True, scale=True).resolve("numpy")
    assert exc.value.field == "all_configs"


def test_the_default_check_discovers_nothing_and_labels_nothing(monkeypatch):
    def no_discovery(*args, **kwargs):
        raise AssertionError("the default check must not look for autotuners")

    monkeypatch.setattr(configs, "discover", no_discovery)
    result = api.check("numpy", properties=["determinism"], max_examples=2, seed=1, plans_dir=None, dims=[4])
    assert result.passed and result.configs is None
    doc = result.as_dict()
    assert "all_configs" not in doc and [row["name"] for row in doc["results"]] == ["determinism"]
    assert "config" not in doc["results"][0]


def test_config_kernels_sweeps_only_the_kernels_named(monkeypatch):
    """``config_kernels``: the plan keeps the kernels named (launch order), lists the others as not
    swept; a name no kernel has is one ConfigurationError listing those launched."""

    def tuned(name: str, widths: tuple[int, ...]) -> configs.Tuned:
        return configs.Tuned(name, None, tuple(triton.Config({"BV": w}, num_warps=4) for w in widths))

    launched = [tuned("fwd_kernel", (16, 32)), tuned("bwd_kernel", (16, 32, 64))]
    monkeypatch.setattr(configs, "discover", lambda *args, **kw: launched)
    options = dict(all_configs=True, array="torch", dims=[16], properties=["matches_reference"])
    plan = CheckOptions(**options, config_kernels=["bwd_kernel"]).resolve(_plain_torch).configs
    assert plan is not None and [t.kernel for t in plan.kernels] == ["bwd_kernel"] and plan.pairs == 3
    assert plan.describe().startswith("1 autotuned kernel, 3 (kernel, config) pairs x 1 properties = 3 property runs")
    assert "not swept, under their autotuner's choice: fwd_kernel" in plan.describe()
    assert plan.as_dict()["not_swept"] == ["fwd_kernel"]
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "gdn_verify" / "schema" / "result.schema.json").read_text())
    jsonschema.validate(plan.as_dict(), schema["properties"]["all_configs"])
    every = CheckOptions(**options).resolve(_plain_torch).configs
    assert every is not None and every.pairs == 5 and "not_swept" not in every.as_dict()
    with pytest.raises(ConfigurationError, match="no autotuned kernel bwd was launched; these were: fwd_kernel, bwd"):
        CheckOptions(**options, config_kernels=["bwd"]).resolve(_plain_torch)
    with pytest.raises(ConfigurationError, match="give all_configs too") as exc:
        CheckOptions(config_kernels=["bwd_kernel"])
    assert exc.value.field == "config_kernels"


def test_the_cli_takes_config_kernels_as_a_comma_list():
    from gdn_verify.options import CheckOptions as Options

    given = Options.from_flags({"all_configs": True, "config_kernels": "a_kernel,b_kernel"})
    assert given.config_kernels == ("a_kernel", "b_kernel")
    assert Options(all_configs=True, config_kernels="a_kernel,b_kernel").config_kernels == ("a_kernel", "b_kernel")
    done = subprocess.run(
        [sys.executable, "-m", "gdn_verify", "check", "--impl", "numpy", "--config-kernels", "x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
    assert "--config-kernels" in done.stderr and "give all_configs too" in done.stderr
