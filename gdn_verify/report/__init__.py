"""Reports: run the experiments and the property suite for several implementations and write a
self-contained report directory (index.html, report.md, results.json, PNG figures).

``request`` (:func:`options` validates a request into :class:`Options`), ``build``
(:func:`make_report` runs it and writes the directory), ``measurements`` (the experiments: error
vs length, distributions, error map, gate and beta sweeps; error statistics come from
``gdn_verify.core.error_stats``), ``figures`` and ``render`` (PNG, Markdown, HTML),
``environment`` (versions and device).

Sizes: on a machine with a usable CUDA GPU (and without ``--quick``) H=4, HV=8, K=V=128 and
T up to 16384, with the float64 GPU recurrence (``cupy-oracle``) as the oracle; otherwise
K=V=32 and T up to 1024 with the NumPy oracle. Implementations that cannot run here are
listed as skipped with the reason; the report is made for the rest.
"""

from gdn_verify.report.build import make_report, run_properties, summarize
from gdn_verify.report.request import (
    CPU_DEFAULTS,
    DEFAULT_DTYPES,
    DEFAULT_OUT,
    GPU_DEFAULTS,
    Options,
    gpu_usable,
    options,
    resolve_all,
)

__all__ = [
    "CPU_DEFAULTS",
    "DEFAULT_DTYPES",
    "DEFAULT_OUT",
    "GPU_DEFAULTS",
    "Options",
    "gpu_usable",
    "make_report",
    "options",
    "resolve_all",
    "run_properties",
    "summarize",
]
