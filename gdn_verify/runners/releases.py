"""Released versions of the libraries we adapt, each in a folder of its own, run in child processes.

A release of FLA (``fla-core``, or ``flash-linear-attention`` before 0.3.2) is its wheel installed
with ``pip install --no-deps --target`` into ``<cache>/fla-<version>``; a release of vLLM is the
GDN ops folder of its wheel (``vllm/model_executor/layers/fla`` in older wheels,
``vllm/third_party/flash_linear_attention`` in later ones) extracted into ``<cache>/vllm-<version>``,
pointed at by ``GDN_VERIFY_VLLM_OPS`` (the 440 MB wheel itself is not kept). Two releases of one
library cannot share a process, so each runs in a child with :func:`child_env`.

The cache is ``$GDN_VERIFY_RELEASES``, else ``~/.cache/gdn-verify/releases``. Wheels come from
``wheels`` (a folder) when it holds them, else from the package index through
``pip download --no-deps``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ENV = "GDN_VERIFY_RELEASES"
LIBRARIES = ("fla", "vllm")
# vLLM's GDN ops folder inside its wheel, newest layout first (the adapters' PACKAGE_DIRS).
VLLM_OPS_DIRS = ("vllm/third_party/flash_linear_attention", "vllm/model_executor/layers/fla")
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class ReleaseError(RuntimeError):
    """A release could not be fetched or unpacked (one line saying which and why)."""


@dataclass(frozen=True)
class Site:
    """One release, ready to run: ``path`` goes first on ``PYTHONPATH``, ``env`` into the child's environment."""

    library: str
    version: str
    path: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.library} {self.version}"


def cache_root() -> Path:
    return Path(os.environ.get(ENV) or Path.home() / ".cache" / "gdn-verify" / "releases")


def distributions(library: str, version: str) -> tuple[str, ...]:
    """The distribution names that may hold ``library`` at ``version``, in the order tried."""
    if library == "fla":
        # the kernels moved to fla-core at 0.3.2; flash-linear-attention before that
        old = tuple(int(p) for p in version.split(".")[:3] if p.isdigit()) < (0, 3, 2)
        return ("flash-linear-attention",) if old else ("fla-core", "flash-linear-attention")
    if library == "vllm":
        return ("vllm",)
    raise ValueError(f"library: {library!r}: choose from {', '.join(LIBRARIES)}")


def _wheel_name(dist: str) -> str:
    return dist.replace("-", "_")


def wheel(library: str, version: str, wheels: Path | None = None, into: Path | None = None) -> Path:
    """The wheel of ``library`` ``version``: from ``wheels`` when there, else downloaded into ``into``."""
    names = distributions(library, version)
    if wheels is not None:
        for dist in names:
            found = sorted(Path(wheels).glob(f"{_wheel_name(dist)}-{version}-*.whl"))
            if found:
                return found[0]
    into = into or Path(tempfile.mkdtemp(prefix="gdn-verify-wheel-"))
    errors = []
    for dist in names:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        done = subprocess.run([*cmd, "-d", str(into), f"{dist}=={version}"], capture_output=True, text=True)
        found = sorted(into.glob(f"{_wheel_name(dist)}-{version}-*.whl"))
        if done.returncode == 0 and found:
            return found[0]
        errors.append(f"{dist}=={version}: {(done.stderr.strip().splitlines() or ['no wheel'])[-1]}")
    raise ReleaseError(f"{library} {version}: no wheel ({'; '.join(errors)})")


def _unpack_vllm_ops(whl: Path, target: Path) -> Path:
    """Extract the GDN ops folder of a vLLM wheel under ``target``; returns the folder holding ``ops/``."""
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        for ops_dir in VLLM_OPS_DIRS:
            members = [n for n in names if n.startswith(ops_dir + "/") and not n.endswith("/")]
            if any(n == f"{ops_dir}/ops/fused_recurrent.py" for n in members):
                z.extractall(target, members)
                return target / ops_dir
    raise ReleaseError(f"{whl.name}: no GDN ops folder among {', '.join(VLLM_OPS_DIRS)}")


def site(library: str, version: str, wheels: Path | None = None) -> Site:
    """``library`` at ``version`` unpacked in the cache (once); :class:`ReleaseError` when it cannot be had."""
    folder = cache_root() / f"{library}-{version}"
    done = folder / ".complete"
    if not done.is_file():
        if folder.exists():
            shutil.rmtree(folder)  # an unpacking that did not finish
        folder.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="gdn-verify-wheel-", dir=folder.parent) as tmp:
            whl = wheel(library, version, wheels, Path(tmp))
            if library == "vllm":
                ops = _unpack_vllm_ops(whl, folder)
                (folder / ".ops").write_text(str(ops.relative_to(folder)))
            else:
                cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target"]
                out = subprocess.run([*cmd, str(folder), str(whl)], capture_output=True, text=True)
                if out.returncode != 0:
                    raise ReleaseError(f"{library} {version}: pip install failed: {out.stderr.strip()[-300:]}")
        done.write_text(version)
    env = {}
    if library == "vllm":
        env["GDN_VERIFY_VLLM_OPS"] = str(folder / (folder / ".ops").read_text())
    return Site(library, version, folder, env)


def child_env(release: Site, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process that runs ``release``: its folder first on ``PYTHONPATH``.

    The project's own root follows it, so the child imports this checkout's ``gdn_verify``.
    """
    env = dict(os.environ if base is None else base)
    path = [str(release.path), str(PROJECT_ROOT)] if release.library != "vllm" else [str(PROJECT_ROOT)]
    rest = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join([*path, *([rest] if rest else [])])
    env.update(release.env)
    return env
