"""The machine and software a report was made on, so that it can be reproduced.

Nothing here fails: a library or tool that is missing is recorded as missing. GPU libraries
are imported only when installed.
"""

from __future__ import annotations

import datetime
import importlib.util
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from gdn_verify.core.environment import cpu_name, package_versions

ROOT = Path(__file__).resolve().parents[2]  # the repository, for git


def _run(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=ROOT)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def gpu_info() -> dict:
    """GPU name, driver and CUDA versions from nvidia-smi, CuPy and torch, whichever are present."""
    info: dict = {}
    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    if smi:
        info["nvidia_smi"] = [
            dict(zip(("name", "driver", "memory"), (p.strip() for p in line.split(",")))) for line in smi.splitlines()
        ]
    if importlib.util.find_spec("cupy") is not None:
        try:
            import cupy

            runtime = cupy.cuda.runtime
            props = runtime.getDeviceProperties(0)
            name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
            info["cupy"] = dict(
                device=name,
                compute_capability=f"{props['major']}.{props['minor']}",
                cuda_runtime=runtime.runtimeGetVersion(),
                cuda_driver=runtime.driverGetVersion(),
            )
        except Exception as exc:  # noqa: BLE001 - no usable device is an answer, not an error
            info["cupy"] = dict(unavailable=f"{type(exc).__name__}: {exc}")
    if importlib.util.find_spec("torch") is not None:
        try:
            import torch

            info["torch"] = dict(cuda=torch.version.cuda, available=torch.cuda.is_available())
            if torch.cuda.is_available():
                info["torch"]["device"] = torch.cuda.get_device_name(0)
        except Exception as exc:  # noqa: BLE001
            info["torch"] = dict(unavailable=f"{type(exc).__name__}: {exc}")
    return info


def capture(seed: int, argv: list[str] | None = None) -> dict:
    """Date (UTC), command line, seed, host, Python, packages, git commit and GPU details."""
    argv = list(sys.argv if argv is None else argv)
    commit = _run(["git", "rev-parse", "HEAD"])
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"])
    return dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command="python " + shlex.join(argv) if argv and argv[0].endswith(".py") else shlex.join(argv),
        seed=seed,
        python=platform.python_version(),
        platform=platform.platform(),
        cpu=cpu_name(),
        git_commit=None if commit is None else commit + (" (with uncommitted changes)" if dirty else ""),
        packages=package_versions(),
        gpu=gpu_info(),
    )
