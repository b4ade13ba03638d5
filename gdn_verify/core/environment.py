"""What a result was computed with: Python and package versions and, for GPU arrays, the device.

Cheap by design (it goes into every JSON result): versions come from the installed
distributions' metadata, and the device name only from a GPU library the run already imported.
The report's fuller record (git commit, nvidia-smi, CPU) is ``gdn_verify.report.environment``.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from pathlib import Path
from typing import Any

PACKAGES = (
    "gdn-verify",
    "numpy",
    "scipy",
    "ml_dtypes",
    "matplotlib",
    "hypothesis",
    "cupy-cuda13x",
    "cupy-cuda12x",
    "cupy",
    "torch",
    "triton",
    "fla-core",
    "flash-linear-attention",
    "flashinfer-python",
)


def package_versions() -> dict[str, str]:
    """Installed versions of the packages a verdict depends on (missing ones left out)."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def process_seconds() -> float | None:
    """Seconds since this process started (Python's own start and every import included), from
    ``/proc``; None where there is none. A check records it when it begins, so that its JSON
    accounts for the wall clock a user sees, not only the check's own."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def device_name(array: str) -> str | None:
    """The GPU's name when the arrays live on one (``torch``/``cupy``) and its library is loaded."""
    if array == "numpy":
        return None
    try:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return str(torch.cuda.get_device_name(0))
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
            return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 - no usable device is an answer, not an error
        return None
    return None


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def describe(array: str = "numpy") -> dict[str, Any]:
    """``{"python", "platform", "packages": {name: version}, "device", "triton_interpret"}`` (device None
    on CPU; ``triton_interpret`` true when Triton kernels ran under its CPU interpreter, ``TRITON_INTERPRET=1``).
    """
    return dict(
        python=platform.python_version(),
        platform=platform.platform(),
        packages=package_versions(),
        device=device_name(array),
        triton_interpret=triton_interpret(),
    )


def triton_interpret() -> bool:
    """Whether Triton's own switch for its CPU interpreter is on (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def triton_version() -> str:
    """The version of the Triton this process imports (``triton.__version__``; Triton must be installed)."""
    import triton

    return str(triton.__version__)
