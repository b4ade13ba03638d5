"""``scripts/pack_carried.sh`` and what it puts in a bundle, on the CPU and without network: the
install script of ``.whl/fqla/`` (``scripts/carried/fqla_install.sh``) installs a tiny bundle laid
out as the real one and refuses, leaving nothing behind, one whose archive or unpacked files do not
match their sha256; ``scripts/carried/requires.py`` refuses a wheel set that misses a requirement,
carries a wheel nothing needs or one the GPU image has; every pin names a wheel of its version."""

from __future__ import annotations

import hashlib
import io
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
INSTALL = SCRIPTS / "carried" / "fqla_install.sh"
REQUIRES = SCRIPTS / "carried" / "requires.py"

pytestmark = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("sha256sum") is None, reason="needs bash and sha256sum"
)

SITE_FILES = {
    "flash_qla/__init__.py": b"__version__ = '0.1.3'\n",
    "tilelang/lib/libtilelang.so": bytes(range(256)) * 64,
    "tvm_ffi/__init__.py": b"__version__ = '0.1.12'\n",
    "bin/z3": b"\x7fELF stand-in\n",
}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _bundle(dest: Path, files: dict[str, bytes], manifest: dict[str, bytes] | None = None) -> Path:
    """A bundle laid out as pack_carried.sh lays out .whl/fqla/: the site as fqla-site.tar.xz, the
    sha256 of each site file (of ``manifest``'s, where given) in site.sha256, SHA256SUMS, install.sh."""
    dest.mkdir(parents=True)
    with tarfile.open(dest / "fqla-site.tar.xz", "w:xz") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo("./" + name)
            info.size = len(data)
            info.mode = 0o755 if name.startswith("bin/") else 0o644
            tar.addfile(info, io.BytesIO(data))
    (dest / "site.sha256").write_text(
        "".join(f"{_sha(data)}  {name}\n" for name, data in sorted((manifest or files).items()))
    )
    shutil.copy(INSTALL, dest / "install.sh")
    names = ["fqla-site.tar.xz", "site.sha256", "install.sh"]
    (dest / "SHA256SUMS").write_text("".join(f"{_sha((dest / n).read_bytes())}  {n}\n" for n in names))
    return dest


def _install(bundle: Path, site: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "SITE": str(site), "PYTHON": sys.executable}
    return subprocess.run(["bash", str(bundle / "install.sh")], env=env, capture_output=True, text=True, timeout=120)


def test_scripts_parse():
    for script in (SCRIPTS / "pack_carried.sh", INSTALL):
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


def test_install_unpacks_checks_and_marks(tmp_path):
    bundle = _bundle(tmp_path / "fqla", SITE_FILES)
    site = tmp_path / "fqsite"
    result = _install(bundle, site)
    assert result.returncode == 0, result.stderr
    assert "4 files unpacked" in result.stdout
    assert (site / ".fqla-site-complete").is_file()
    for name, data in SITE_FILES.items():
        assert (site / name).read_bytes() == data
    assert (site / "bin/z3").stat().st_mode & 0o100  # modes kept
    again = _install(bundle, site)  # a complete site is left as it is
    assert again.returncode == 0 and "complete already" in again.stdout


def _refused(result: subprocess.CompletedProcess, site: Path, words: str) -> None:
    assert result.returncode == 3, result.stdout + result.stderr
    assert words in result.stderr
    assert not (site / ".fqla-site-complete").exists()
    assert not list(site.parent.glob(".fqsite-unpack.*"))  # the scratch folder is gone


def test_install_refuses_an_archive_whose_sha256_differs(tmp_path):
    bundle = _bundle(tmp_path / "fqla", SITE_FILES)
    archive = bundle / "fqla-site.tar.xz"
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF  # damaged on the way: SHA256SUMS no longer matches
    archive.write_bytes(bytes(data))
    site = tmp_path / "fqsite"
    _refused(_install(bundle, site), site, "does not match $BUNDLE/SHA256SUMS".replace("$BUNDLE", str(bundle)))
    assert not site.exists()


def test_install_refuses_unpacked_files_that_differ_from_the_manifest(tmp_path):
    site = tmp_path / "fqsite"
    changed = {**SITE_FILES, "tilelang/lib/libtilelang.so": b"another build"}
    _refused(_install(_bundle(tmp_path / "a", changed, SITE_FILES), site), site, "sha256 differs")
    extra = {**SITE_FILES, "stray.py": b""}
    _refused(_install(_bundle(tmp_path / "b", extra, SITE_FILES), site), site, "not in site.sha256")
    fewer = {k: v for k, v in SITE_FILES.items() if k != "bin/z3"}
    _refused(_install(_bundle(tmp_path / "c", fewer, SITE_FILES), site), site, "missing bin/z3")
    assert not site.exists()


def test_install_never_overwrites_an_incomplete_site(tmp_path):
    bundle = _bundle(tmp_path / "fqla", SITE_FILES)
    site = tmp_path / "fqsite"
    site.mkdir()
    (site / "tvm_ffi").mkdir()
    (site / "tvm_ffi" / "__init__.py").write_text("# FlashInfer's\n")
    _refused(_install(bundle, site), site, "exists without")
    assert (site / "tvm_ffi" / "__init__.py").read_text() == "# FlashInfer's\n"


def _wheel(path: Path, name: str, version: str, requires: list[str]) -> str:
    with zipfile.ZipFile(path / f"{name.replace('-', '_')}-{version}-py3-none-any.whl", "w") as z:
        meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
        z.writestr(
            f"{name.replace('-', '_')}-{version}.dist-info/METADATA",
            "\n".join(meta + [f"Requires-Dist: {r}" for r in requires]) + "\n",
        )
    return str(path / f"{name.replace('-', '_')}-{version}-py3-none-any.whl")


def _requires(tmp_path, roots, wheels):
    image = tmp_path / "image.txt"
    image.write_text("# the image\ntorch 2.11.0+cu130\nnumpy\n")
    cmd = [sys.executable, str(REQUIRES), "--image", str(image), "--roots", *roots, "--", *wheels]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_requires_accepts_exactly_what_the_roots_need(tmp_path):
    lib = _wheel(
        tmp_path,
        "lib",
        "1.0",
        ["dep<2", "torch>=2.8", "numpy", "win-only; platform_system == 'Windows'", "x; extra == 'vis'"],
    )
    dep = _wheel(tmp_path, "dep", "1.5", [])
    result = _requires(tmp_path, ["lib"], [lib, dep])
    assert result.returncode == 0, result.stderr
    assert "dep 1.5: required by lib (dep<2)" in result.stdout
    assert "torch>=2.8 (GPU image 2.11.0+cu130)" in result.stdout


def test_requires_refuses_missing_needless_and_image_wheels(tmp_path):
    lib = _wheel(tmp_path, "lib", "1.0", ["dep<2", "torch>=3"])
    result = _requires(tmp_path, ["lib"], [lib])
    assert result.returncode == 1
    assert "requires dep<2: neither carried nor in the GPU image" in result.stderr
    assert "requires torch>=3, but GPU image has 2.11.0+cu130" in result.stderr
    stray = _wheel(tmp_path, "stray", "0.1", [])
    numpy = _wheel(tmp_path, "numpy", "2.5.2", [])
    dep = _wheel(tmp_path, "dep", "2.0", [])
    result = _requires(tmp_path, ["lib"], [lib, dep, stray, numpy])
    assert "requires dep<2, but carried has 2.0" in result.stderr
    assert "stray 0.1: carried, but no root needs it" in result.stderr
    assert "numpy 2.5.2: in the GPU image already" in result.stderr


def test_every_pin_names_a_wheel_of_its_version():
    text = (SCRIPTS / "pack_carried.sh").read_text()
    pins = re.findall(r'^  "([a-z0-9-]+) (\S+) (\S+\.whl) (\S+)"$', text, re.M)
    names = {name for name, *_ in pins}
    assert {"fla-core", "flash-linear-attention", "flash-qla", "tilelang", "apache-tvm-ffi"} <= names
    for name, version, wheel, sha in pins:
        assert re.fullmatch(r"[0-9a-f]{64}", sha), name
        dist, wheel_version = wheel.split("-")[:2]
        assert re.sub(r"[-_.]+", "-", dist).lower() == name and wheel_version == version, wheel
