"""Machine-readable campaign records: one ``campaigns.json`` row per fuzz campaign.

A row is ``{"impl", "dtype", "cases", "failures", "minutes", "device", "date"}``;
:func:`append_campaign` adds it to a JSON list under a file lock, so campaigns run side by side
(two on one GPU, or several jobs on a shared disk) can write the same file.
"""

from __future__ import annotations

import datetime
import fcntl
import json
from pathlib import Path
from typing import Any

from gdn_verify.core.environment import cpu_name
from gdn_verify.runners.fuzz import FuzzReport


def gpu_name(array: str) -> str | None:
    """The name of the GPU an implementation taking ``array`` arrays runs on (None: no GPU in use)."""
    try:
        if array == "torch":
            import torch

            return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        if array == "cupy":
            import cupy

            name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
            return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 - no usable GPU is an answer, not an error
        return None
    return None


def device_name(array: str, gpus: int = 1) -> str:
    """``"NVIDIA H100 80GB HBM3"`` (``"2x ..."`` for several GPUs) when a GPU is in use, else the CPU's name."""
    gpu = gpu_name(array)
    if gpu is None:
        return cpu_name()
    return gpu if gpus <= 1 else f"{gpus}x {gpu}"


def campaign_row(report: FuzzReport, impl: str, dtype: str, device: str, date: str | None = None) -> dict[str, Any]:
    """The ``campaigns.json`` row of one campaign (minutes include up-front compilation)."""
    return dict(
        impl=impl,
        dtype=dtype,
        cases=report.cases,
        failures=len(report.failures),
        minutes=round(report.seconds / 60, 2),
        device=device,
        date=date or datetime.datetime.now(datetime.timezone.utc).date().isoformat(),
    )


def append_campaign(path: str | Path, row: dict[str, Any]) -> list[dict[str, Any]]:
    """Append ``row`` to the JSON list at ``path`` (created with its folder if missing); returns the list."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # read-modify-write by one writer at a time
        f.seek(0)
        text = f.read().strip()
        rows = json.loads(text) if text else []
        if not isinstance(rows, list):
            raise ValueError(f"{path}: expected a JSON list of campaign rows")
        rows.append(row)
        f.seek(0)
        f.truncate()
        f.write(json.dumps(rows, indent=1) + "\n")
    return rows
