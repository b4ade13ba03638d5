"""gdn-verify: numerics and verification toolkit for Gated DeltaNet (GDN) kernels.

Public API (see the README for a runnable example)::

    from gdn_verify import check
    result = check("my_module:my_gdn", array="torch", dtype="bfloat16")
    result.passed            # False when any property failed
    result.assert_passed()   # AssertionError carrying each minimal example and its replay command

``check``, ``replay``, ``fuzz`` and ``selftest`` live in ``gdn_verify.api``; ``CheckOptions``
(``gdn_verify.options``) holds ``check``'s settings as one object. The package's layers,
each importing only downward: ``core`` (problem, oracle, tolerance, verdict), ``properties``
(Hypothesis strategies and properties), ``implementations`` (built-ins, plug-ins, adapters to
FLA, FlashInfer and our CuPy kernels), ``runners`` (check, fuzz, selftest, diagnose), ``report``
and ``bench``; on top, ``api`` and ``options``, ``console`` (the terminal display), the pytest plugin and the
command line (``gdn-verify``, ``python -m gdn_verify``, ``cli.py``).
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING, Any

try:
    __version__ = metadata.version("gdn-verify")
except metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

if TYPE_CHECKING:
    from gdn_verify.api import CheckResult, ReplayResult, check, fuzz, replay, selftest
    from gdn_verify.core.implementation import ConfigurationError, Implementation
    from gdn_verify.core.problem import Problem
    from gdn_verify.options import CheckOptions

__all__ = [
    "__version__",
    "CheckOptions",
    "CheckResult",
    "ConfigurationError",
    "Implementation",
    "Problem",
    "ReplayResult",
    "check",
    "fuzz",
    "replay",
    "selftest",
]

_WHERE = {
    "CheckResult": "gdn_verify.api",
    "ReplayResult": "gdn_verify.api",
    "check": "gdn_verify.api",
    "fuzz": "gdn_verify.api",
    "replay": "gdn_verify.api",
    "selftest": "gdn_verify.api",
    "CheckOptions": "gdn_verify.options",
    "ConfigurationError": "gdn_verify.core.implementation",
    "Implementation": "gdn_verify.core.implementation",
    "Problem": "gdn_verify.core.problem",
}


def __getattr__(name: str) -> Any:
    # Lazy, so that importing one layer (gdn_verify.core...) does not load the whole library.
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'gdn_verify' has no attribute {name!r}")
