"""``scripts/gpu-machine/pack_carried.sh`` and what it puts in a bundle, on the CPU and without
network: the install script of ``.whl/fqla/`` (``scripts/gpu-machine/carried/fqla_install.sh``)
installs a tiny bundle laid out as the real one and refuses, leaving nothing behind, one whose
archive or unpacked files do not match their sha256; the two FlashInfer parts that the script's own
``fi_parts`` makes of a tiny site install beside another package, and part 2 refuses without part 1,
with part 1 of another site, with a damaged archive or with foreign files in the site's folders,
changing nothing; ``scripts/gpu-machine/carried/requires.py`` refuses a wheel set that misses a
requirement, carries a wheel nothing needs or one the GPU image has, follows extras, and reports
(not fails) a requirement it is told may miss; vLLM's files are refused where they differ from the
wheel's RECORD; every pin names a wheel of its version. MAX's three parts, as the script's
``max_parts`` cuts a tiny site, go through ``scripts/gpu-machine/gpu_max.sh stage`` (one call per
part) and ``install``, which refuses a missing or damaged part and unpacked files that differ from
site.sha256; ``verify`` checks the parts."""

from __future__ import annotations

import base64
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
SCRIPTS = ROOT / "scripts" / "gpu-machine"
PACK = SCRIPTS / "pack_carried.sh"
INSTALL = SCRIPTS / "carried" / "fqla_install.sh"
FI_INSTALL = SCRIPTS / "carried" / "flashinfer_install.sh"
REQUIRES = SCRIPTS / "carried" / "requires.py"
GPU_MAX = SCRIPTS / "gpu_max.sh"

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
    sha256 of each site file (of ``manifest``'s, where given) in site.sha256, SHA256SUMS, install.sh
    and site_check.py."""
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
    shutil.copy(SCRIPTS / "carried" / "site_check.py", dest / "site_check.py")
    names = ["fqla-site.tar.xz", "site.sha256", "install.sh", "site_check.py"]
    (dest / "SHA256SUMS").write_text("".join(f"{_sha((dest / n).read_bytes())}  {n}\n" for n in names))
    return dest


def _install(bundle: Path, site: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "SITE": str(site), "PYTHON": sys.executable}
    return subprocess.run(["bash", str(bundle / "install.sh")], env=env, capture_output=True, text=True, timeout=120)


def test_scripts_parse():
    for script in (PACK, INSTALL, FI_INSTALL, GPU_MAX):
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


# FlashInfer's two parts ---------------------------------------------------------------------------
def _gnu_tar() -> bool:
    tar = shutil.which("tar")
    return tar is not None and "GNU tar" in subprocess.run([tar, "--version"], capture_output=True, text=True).stdout


needs_xz = pytest.mark.skipif(
    shutil.which("xz") is None or not _gnu_tar(), reason="fi_parts compresses with xz and GNU tar"
)

FI_FILES = {
    "cutlass/_mlir_libs/_ir.so": bytes(range(256)) * 64,  # part 1: alone in .whl/gpu1
    "cutlass/lib/runtime.so": b"\x7fELF runtime" * 50,  # part 2, compressed alone
    "cutlass/__init__.py": b"",
    "tvm_ffi/__init__.py": b"__version__ = '0.1.15.post2'\n",
    "bin/tvm-ffi-config": b"#!/usr/bin/python3\n",
    "cutlass_packages.pth": b"import cutlass\n",
}
FI_LONE = "FI_LONE1=_ir.so.xz=cutlass/_mlir_libs/_ir.so FI_LONE2=runtime.so.xz=cutlass/lib/runtime.so"


def _pack(snippet: str) -> subprocess.CompletedProcess:
    """``snippet`` run with pack_carried.sh's functions (sourced: the subcommands do not run)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": "/nonexistent"}
    return subprocess.run(
        ["bash", "-c", f'source "{PACK}"\n{snippet}'], env=env, capture_output=True, text=True, timeout=120
    )


def _fi_parts(tmp_path: Path, files: dict[str, bytes] = FI_FILES) -> tuple[Path, Path]:
    """.whl/gpu1 and .whl/gpu2 as pack_carried.sh makes them, of a tiny site."""
    site, gpu1, gpu2 = tmp_path / "packed-site", tmp_path / "gpu1", tmp_path / "gpu2"
    for name, data in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(data)
    (site / "bin/tvm-ffi-config").chmod(0o755)
    gpu1.mkdir()
    gpu2.mkdir()
    result = _pack(f'{FI_LONE}; fi_parts "{site}" "{gpu1}" "{gpu2}"')
    assert result.returncode == 0, result.stderr
    return gpu1, gpu2


def _fi_install(script: Path, site: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "SITE": str(site), "PYTHON": sys.executable}
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)


def _tree(top: Path) -> dict[str, bytes]:
    return {str(p.relative_to(top)): p.read_bytes() for p in sorted(top.rglob("*")) if p.is_file()}


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@needs_xz
def test_flashinfer_parts_install_beside_another_package(tmp_path):
    gpu1, gpu2 = _fi_parts(tmp_path)
    assert sorted(p.name for p in gpu1.iterdir()) == [
        "SHA256SUMS",
        "_ir.so.xz",
        "install1.sh",
        "site.sha256",
        "site_check.py",
    ]
    assert sorted(p.name for p in gpu2.iterdir()) == [
        "SHA256SUMS",
        "install.sh",
        "runtime.so.xz",
        "site-rest.tar.xz",
        "site.sha256",
        "site_check.py",
    ]
    site = tmp_path / "site"
    (site / "fla").mkdir(parents=True)  # scripts/gpu-machine/common.sh installs FLA into the same folder
    (site / "fla" / "__init__.py").write_text("# FLA\n")
    one = _fi_install(gpu1 / "install1.sh", site)
    assert one.returncode == 0, one.stderr
    assert (site / ".gdnv-site-part1").is_file() and not (site / ".gdnv-site-complete").exists()
    two = _fi_install(gpu2 / "install.sh", site)
    assert two.returncode == 0, two.stderr
    assert (site / ".gdnv-site-complete").is_file()
    installed = _tree(site)
    assert installed.pop("fla/__init__.py") == b"# FLA\n"
    assert {k: v for k, v in installed.items() if not k.startswith(".gdnv")} == FI_FILES
    assert (site / "bin/tvm-ffi-config").stat().st_mode & 0o100  # modes kept by the tar
    assert not list(tmp_path.glob(".gdnv-site-unpack.*"))
    again = _fi_install(gpu2 / "install.sh", site)
    assert again.returncode == 0 and "complete already" in again.stdout
    # verify's check of a bundle: as packed, then with an installer that is not the template's
    render = f'$(fi_render 2 "{gpu2}/site.sha256")'
    check = f'{FI_LONE}; verify_site "{gpu2}" scripts/gpu-machine/carried/flashinfer_install.sh install.sh {render}'
    assert _pack(check).returncode == 0
    with open(gpu2 / "install.sh", "a") as f:
        f.write("# edited by hand\n")
    assert "differs from what" in _pack(check).stdout


def _fi_refused(result: subprocess.CompletedProcess, words: str) -> None:
    assert result.returncode == 3, result.stdout + result.stderr
    assert words in result.stderr


@needs_xz
def test_flashinfer_part2_refuses_without_part1_of_the_same_site(tmp_path):
    gpu1, gpu2 = _fi_parts(tmp_path)
    site = tmp_path / "site"
    _fi_refused(_fi_install(gpu2 / "install.sh", site), "part 1 is not in")
    assert not site.exists()
    assert _fi_install(gpu1 / "install1.sh", site).returncode == 0
    before = _tree(site)
    (site / ".gdnv-site-part1").write_text("0" * 64 + "\n")  # part 1 of another pack
    _fi_refused(_fi_install(gpu2 / "install.sh", site), "of another pack")
    (site / ".gdnv-site-part1").write_text(before[".gdnv-site-part1"].decode())
    assert _tree(site) == before and not (site / ".gdnv-site-complete").exists()


@needs_xz
def test_flashinfer_parts_refuse_damage_and_foreign_files(tmp_path):
    gpu1, gpu2 = _fi_parts(tmp_path)
    site = tmp_path / "site"
    _flip(gpu1 / "_ir.so.xz")
    _fi_refused(_fi_install(gpu1 / "install1.sh", site), "does not match")
    assert not site.exists()
    gpu1, gpu2 = _fi_parts(tmp_path / "again")
    assert _fi_install(gpu1 / "install1.sh", site).returncode == 0
    before = _tree(site)
    rest = gpu2 / "site-rest.tar.xz"
    intact = rest.read_bytes()
    _flip(rest)
    _fi_refused(_fi_install(gpu2 / "install.sh", site), "does not match")
    rest.write_bytes(intact)
    (site / "tvm_ffi").mkdir()
    (site / "tvm_ffi" / "stray.py").write_text("# another tvm_ffi's\n")
    _fi_refused(_fi_install(gpu2 / "install.sh", site), "not in site.sha256 (another install?): tvm_ffi/stray.py")
    shutil.rmtree(site / "tvm_ffi")
    (site / "cutlass/_mlir_libs/_ir.so").write_bytes(b"another build")
    _fi_refused(_fi_install(gpu2 / "install.sh", site), "with another sha256: cutlass/_mlir_libs/_ir.so")
    (site / "cutlass/_mlir_libs/_ir.so").write_bytes(FI_FILES["cutlass/_mlir_libs/_ir.so"])
    assert _tree(site) == before and not (site / ".gdnv-site-complete").exists()
    assert not list(tmp_path.glob(".gdnv-site-unpack.*"))
    assert _fi_install(gpu2 / "install.sh", site).returncode == 0


# MAX's three parts and scripts/gpu-machine/gpu_max.sh ----------------------------------------------
MAX_FILES = {
    "max/__init__.py": b"",
    "max-26.7.0.dist-info/METADATA": b"Name: max\nVersion: 26.7.0\n",
    "modular/lib/libmax.so": bytes(range(256)) * 300,
    "modular/bin/mojo": b"\x7fELF mojo stand-in\n",
}
MAX_PIN = 'MAX_PINS=("max 26.7.0 max-26.7.0-py3-none-any.whl ' + "0" * 64 + '")'


def _max_parts(tmp_path: Path, files: dict[str, bytes] = MAX_FILES) -> Path:
    """The checkout's .whl/ with max1, max2 and max3 as pack_carried.sh cuts them, of a tiny site."""
    site, whl = tmp_path / "packed-site", tmp_path / "whl"
    for name, data in files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(data)
    (site / "modular/bin/mojo").chmod(0o755)
    for d in ("max1", "max2", "max3"):
        (whl / d).mkdir(parents=True)
    result = _pack(f'max_parts "{site}" "{whl}/max1" "{whl}/max2" "{whl}/max3"')
    assert result.returncode == 0, result.stderr
    return whl


def _gpu_max(tree: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """``bash scripts/gpu-machine/gpu_max.sh ARGS`` from the checkout ``tree``, the parts and the site
    under tmp_path."""
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",  # install runs python3
        "MAX_PARTS": str(tmp_path / "maxparts"),
        "MAX_SITE": str(tmp_path / "maxsite"),
    }
    return subprocess.run(["bash", str(GPU_MAX), *args], cwd=tree, env=env, capture_output=True, text=True, timeout=120)


def _stage(whl: Path, tmp_path: Path, last: str = "stage") -> subprocess.CompletedProcess:
    """The three device calls: each carries one part (a call removes what it does not carry)."""
    for i, d in enumerate(("max1", "max2", "max3")):
        tree = tmp_path / "checkout"
        shutil.rmtree(tree, ignore_errors=True)
        (tree / ".whl").mkdir(parents=True)
        shutil.copytree(whl / d, tree / ".whl" / d)
        result = _gpu_max(tree, tmp_path, *(["stage"] if i < 2 else last.split()))
    return result


def _max_refused(result: subprocess.CompletedProcess, tmp_path: Path, words: str) -> None:
    assert result.returncode == 3, result.stdout + result.stderr
    assert words in result.stdout + result.stderr
    assert not (tmp_path / "maxsite").exists()
    assert not list(tmp_path.glob(".maxsite-unpack.*"))  # the scratch folder is gone
    assert not (tmp_path / "maxparts" / "max-site.tar.xz").exists()  # so is the joined archive


@needs_xz
def test_max_parts_stage_and_install(tmp_path):
    whl = _max_parts(tmp_path)
    assert sorted(p.name for p in (whl / "max3").iterdir()) == ["SHA256SUMS", "max-site.tar.xz.part2", "site.sha256"]
    sizes = [(whl / f"max{i + 1}" / f"max-site.tar.xz.part{i}").stat().st_size for i in range(3)]
    assert max(sizes) - min(sizes) <= 2  # cut in equal parts
    names = [line.split("  ", 1)[1] for line in (whl / "max3" / "SHA256SUMS").read_text().splitlines()]
    assert names == ["max-site.tar.xz", *(f"max-site.tar.xz.part{i}" for i in range(3)), "site.sha256"]
    result = _stage(whl, tmp_path, "stage install")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 files unpacked, each sha256 as in site.sha256" in result.stdout
    site = tmp_path / "maxsite"
    assert (site / ".max-site-complete").is_file()
    assert {k: v for k, v in _tree(site).items() if k != ".max-site-complete"} == MAX_FILES
    assert (site / "modular/bin/mojo").stat().st_mode & 0o100  # modes kept
    assert not (tmp_path / "maxparts" / "max-site.tar.xz").exists()
    again = _gpu_max(tmp_path / "checkout", tmp_path, "install")
    assert again.returncode == 0 and "site already complete" in again.stdout
    # verify's check of the parts: as cut, then with a part damaged and a pin that the site does not hold
    check = f'WHL="{whl}"; {MAX_PIN}; echo readme > "{whl}/max3/README.txt"; verify_max'
    result = _pack(check)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "max3: " in result.stdout and "as " in result.stdout
    assert "the pins install" in _pack(check.replace("26.7.0", "26.8.0")).stdout
    _flip(whl / "max2" / "max-site.tar.xz.part1")
    result = _pack(check)
    assert result.returncode == 1 and "parts joined are not" in result.stdout


@needs_xz
def test_max_install_refuses_a_missing_or_damaged_part(tmp_path):
    whl = _max_parts(tmp_path)
    parts = tmp_path / "maxparts"
    assert _stage(whl, tmp_path).returncode == 0
    (parts / "max-site.tar.xz.part1").unlink()  # call 2 went to another machine
    _max_refused(_gpu_max(tmp_path / "checkout", tmp_path, "install"), tmp_path, "part 1 missing: stage all three")
    assert _stage(whl, tmp_path).returncode == 0
    _flip(parts / "max-site.tar.xz.part2")
    _max_refused(_gpu_max(tmp_path / "checkout", tmp_path, "install"), tmp_path, "a part is damaged")
    other = _max_parts(tmp_path / "other", {**MAX_FILES, "max/__init__.py": b"# another pack\n"})
    assert _stage(whl, tmp_path).returncode == 0
    shutil.copy(other / "max1" / "max-site.tar.xz.part0", parts)  # part 1 of another pack
    _max_refused(_gpu_max(tmp_path / "checkout", tmp_path, "install"), tmp_path, "a part is damaged")
    assert _stage(whl, tmp_path).returncode == 0
    (parts / "site.sha256").unlink()  # a pack without the manifest
    _max_refused(_gpu_max(tmp_path / "checkout", tmp_path, "install"), tmp_path, "site.sha256 missing")


@needs_xz
def test_max_install_refuses_files_that_differ_from_site_sha256(tmp_path):
    whl = _max_parts(tmp_path)
    manifest = whl / "max3" / "site.sha256"
    sums = whl / "max3" / "SHA256SUMS"
    intact = manifest.read_text()
    for changed, words in (
        (intact.replace(_sha(MAX_FILES["modular/lib/libmax.so"]), "0" * 64), "sha256 differs: modular/lib/libmax.so"),
        (intact + f"{_sha(b'')}  max/extra.py\n", "missing max/extra.py"),
        (
            "".join(line + "\n" for line in intact.splitlines() if "modular/bin/mojo" not in line),
            "not in site.sha256: modular/bin/mojo",
        ),
    ):
        manifest.write_text(changed)  # SHA256SUMS agrees: the archive and the manifest of two packs
        lines = [line for line in sums.read_text().splitlines() if not line.endswith("  site.sha256")]
        sums.write_text("\n".join([*lines, f"{_sha(changed.encode())}  site.sha256"]) + "\n")
        shutil.rmtree(tmp_path / "maxparts", ignore_errors=True)
        _max_refused(_stage(whl, tmp_path, "stage install"), tmp_path, words)


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


def test_requires_follows_extras_and_reports_what_may_miss(tmp_path):
    app = _wheel(tmp_path, "app", "1.0", ["lib>=1", "lib[fast]>=1; extra == 'gpu'", "absent", "win; os_name == 'nt'"])
    lib = _wheel(tmp_path, "lib", "1.0", ["lib-base==1.0", "lib-fast==1.0; extra == 'fast'"])
    base = _wheel(tmp_path, "lib-base", "1.0", [])
    fast = _wheel(tmp_path, "lib-fast", "1.0", [])
    wheels = [app, lib, base, fast]
    result = _requires(tmp_path, ["app"], wheels)  # without the extra, nothing asks for lib-fast
    assert result.returncode == 1
    assert "lib-fast 1.0: carried, but no root needs it" in result.stderr
    assert "requires absent: neither carried nor in the GPU image" in result.stderr
    result = _requires(tmp_path, ["app[gpu]", "--missing-ok", "absent"], wheels)
    assert result.returncode == 0, result.stderr
    assert 'lib-fast 1.0: required by lib[fast] (lib-fast==1.0; extra == "fast")' in result.stdout
    assert "absent (MISSING: neither carried nor in the GPU image, --missing-ok)" in result.stdout
    assert "note: app 1.0 requires absent" in result.stderr
    result = _requires(tmp_path, ["app[gpu]", "--missing-ok", "absent", "stale"], wheels)
    assert result.returncode == 1 and "--missing-ok stale: no requirement misses it" in result.stderr


def _vllm_wheel(path: Path, files: dict[str, bytes], record: dict[str, bytes]) -> Path:
    """A wheel holding ``files`` under vLLM's FLA folder, its RECORD taken from ``record``."""
    wheel = path / "vllm-0.0-py3-none-any.whl"
    src = "vllm/third_party/flash_linear_attention/ops"
    with zipfile.ZipFile(wheel, "w") as z:
        rows = []
        for name, data in files.items():
            z.writestr(f"{src}/{name}.py", data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(record[name]).digest()).rstrip(b"=").decode()
            rows.append(f"{src}/{name}.py,sha256={digest},{len(record[name])}")
        z.writestr("vllm-0.0.dist-info/RECORD", "\n".join(rows + ["vllm-0.0.dist-info/RECORD,,"]) + "\n")
    return wheel


def test_vllm_files_are_checked_against_the_wheels_record(tmp_path):
    files = {"chunk": b"# chunk\n", "utils": b"# utils\n"}
    only = "VLLM_FILES=(chunk utils)"
    good = _vllm_wheel(tmp_path, files, files)
    result = _pack(f'{only}; vllm_extract "{good}" "{tmp_path / "ok"}"')
    assert result.returncode == 0, result.stderr
    manifest = (tmp_path / "ok" / "MANIFEST.txt").read_text().splitlines()
    assert manifest[0].startswith("# Extracted from vllm-0.33.0-") and len(manifest) == 4
    assert manifest[2] == f"{_sha(files['chunk'])}  ops/chunk.py"
    (tmp_path / "bad").mkdir()
    bad = _vllm_wheel(tmp_path / "bad", {**files, "utils": b"# patched\n"}, files)
    result = _pack(f'{only}; vllm_extract "{bad}" "{tmp_path / "out"}"')
    assert result.returncode == 1
    assert "ops/utils.py: sha256 differs from RECORD" in result.stderr and "chunk.py" not in result.stderr


def test_every_pin_names_a_wheel_of_its_version():
    text = (SCRIPTS / "pack_carried.sh").read_text()
    pins = re.findall(r'^  "([a-z0-9-]+) (\S+) (\S+\.whl) (\S+)"$', text, re.M)
    names = {name for name, *_ in pins}
    assert {"fla-core", "flash-linear-attention", "flash-qla", "tilelang", "apache-tvm-ffi"} <= names
    assert {"flashinfer-python", "nvidia-cutlass-dsl-libs-cu13", "vllm"} <= names
    assert {"max", "max-core", "max-mojo-libs", "max-shmem-libs", "mojo-compiler", "msgspec", "taskgroup"} <= names
    for name, version, wheel, sha in pins:
        assert re.fullmatch(r"[0-9a-f]{64}", sha), name
        dist, wheel_version = wheel.split("-")[:2]
        assert re.sub(r"[-_.]+", "-", dist).lower() == name and wheel_version == version, wheel


@needs_xz
def test_max_stage_unpacks_the_precompiled_graphs_carried_with_part_3(tmp_path):
    whl = _max_parts(tmp_path)
    graphs = tmp_path / "made" / "mefs"
    graphs.mkdir(parents=True)
    (graphs / "gdn_verify_max_recurrence-0123456789ab.mef").write_bytes(b"MEF stand-in")
    (graphs / "manifest.json").write_text('{"graphs": []}')
    (whl / "maxmefs").mkdir()
    subprocess.run(["tar", "-C", str(graphs.parent), "-cJf", str(whl / "maxmefs" / "mefs.tar.xz"), "mefs"], check=True)
    tree = tmp_path / "checkout"
    (tree / ".whl").mkdir(parents=True)
    for d in ("max3", "maxmefs"):  # the third call carries both
        shutil.copytree(whl / d, tree / ".whl" / d)
    result = _gpu_max(tree, tmp_path, "stage")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "precompiled graphs: 1 in" in result.stdout
    staged = tmp_path / "maxparts" / "mefs" / "gdn_verify_max_recurrence-0123456789ab.mef"
    assert staged.read_bytes() == b"MEF stand-in"
