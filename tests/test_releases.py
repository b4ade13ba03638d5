"""Release sites: a wheel folder's release unpacked once per version, vLLM's ops folder found in either layout."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gdn_verify.runners import releases


def _wheel(folder: Path, dist: str, version: str, files: dict[str, str]) -> Path:
    """A minimal valid wheel of ``dist`` holding ``files`` (path -> text)."""
    name = dist.replace("-", "_")
    info = f"{name}-{version}.dist-info"
    meta = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    every = {**files, **meta}
    record = "".join(f"{p},,\n" for p in every) + f"{info}/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, text in {**every, f"{info}/RECORD": record}.items():
            z.writestr(p, text)
    return path


def test_distribution_names_follow_the_fla_core_split():
    assert releases.distributions("fla", "0.1") == ("flash-linear-attention",)
    assert releases.distributions("fla", "0.3.1") == ("flash-linear-attention",)
    assert releases.distributions("fla", "0.3.2")[0] == "fla-core"
    assert releases.distributions("fla", "0.6.0")[0] == "fla-core"
    with pytest.raises(ValueError, match="library"):
        releases.distributions("flashinfer", "0.7")


def test_fla_site_installs_once_and_comes_first_on_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv(releases.ENV, str(tmp_path / "cache"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "fla-core", "9.9.1", {"fla/__init__.py": "__version__ = '9.9.1'\n"})
    site = releases.site("fla", "9.9.1", wheels)
    assert (site.path / "fla" / "__init__.py").is_file()
    stamp = (site.path / ".complete").stat().st_mtime_ns
    assert releases.site("fla", "9.9.1", wheels).path == site.path
    assert (site.path / ".complete").stat().st_mtime_ns == stamp  # not unpacked again
    env = releases.child_env(site, {"PYTHONPATH": "/elsewhere"})
    code = "import fla, gdn_verify; print(fla.__version__, gdn_verify.__file__)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    version, where = out.split()
    assert version == "9.9.1"
    assert Path(where).resolve().is_relative_to(releases.PROJECT_ROOT)
    assert env["PYTHONPATH"].split(":")[-1] == "/elsewhere"


@pytest.mark.parametrize("ops_dir", releases.VLLM_OPS_DIRS)
def test_vllm_site_is_the_ops_folder_of_either_layout(tmp_path, monkeypatch, ops_dir):
    monkeypatch.setenv(releases.ENV, str(tmp_path / "cache"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "vllm", "0.0.1", {f"{ops_dir}/ops/fused_recurrent.py": "# kernel\n", "vllm/other.py": "x = 1\n"})
    site = releases.site("vllm", "0.0.1", wheels)
    ops = Path(site.env["GDN_VERIFY_VLLM_OPS"])
    assert (ops / "ops" / "fused_recurrent.py").is_file()
    assert not (site.path / "vllm" / "other.py").exists()  # only the ops folder is kept
    assert releases.child_env(site)["GDN_VERIFY_VLLM_OPS"] == str(ops)


def test_a_vllm_wheel_without_gdn_ops_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(releases.ENV, str(tmp_path / "cache"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "vllm", "0.0.2", {"vllm/other.py": "x = 1\n"})
    with pytest.raises(releases.ReleaseError, match="no GDN ops folder"):
        releases.site("vllm", "0.0.2", wheels)
