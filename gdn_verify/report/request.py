"""A report request: which implementations, dtypes, sizes and checks, validated before anything runs.

:func:`options` turns the command line's (or a caller's) arguments into :class:`Options`,
raising :class:`ConfigurationError` naming the argument; implementations that cannot run here
are kept as skipped, with the reason.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from gdn_verify import implementations
from gdn_verify.core import arrays
from gdn_verify.core.problem import DTYPES
from gdn_verify.implementations import ConfigurationError, Implementation
from gdn_verify.options import CheckOptions
from gdn_verify.report import measurements

GPU_DEFAULTS = ("cupy-chunk", "cupy-recurrent", "fla-chunk", "fla-recurrent")
CPU_DEFAULTS = ("numpy", "numpy-recurrent")
DEFAULT_DTYPES = ("float32", "bfloat16")
DEFAULT_OUT = Path(".gdn_verify") / "reports"  # --out's default folder, relative to where the command runs


def gpu_usable() -> bool:
    """A CUDA GPU is visible to CuPy or to torch."""
    for kind in ("cupy", "torch"):
        try:
            arrays.check_kind(kind)
        except arrays.ArrayKindUnavailable:
            continue
        if kind == "cupy":
            return True
        import torch

        return bool(torch.cuda.is_available())
    return False


def resolve_all(names: list[str] | None, array: str | None) -> tuple[list[Implementation], list[dict]]:
    """``(implementations, skipped)``; a name nobody knows is misuse, one that cannot run here is skipped."""
    defaulted = not names
    names = list(dict.fromkeys(names or GPU_DEFAULTS))
    impls, skipped = [], []
    for name in names:
        if name not in implementations.names() and ":" not in name:
            raise ConfigurationError(
                "impl", f"{name!r}: unknown; choose from {', '.join(implementations.names())} or MODULE:FUNCTION"
            )
        try:
            impls.append(implementations.resolve(name, array if ":" in name else None))
        except ConfigurationError as exc:
            skipped.append(dict(impl=name, reason=str(exc)))
    if defaulted and not impls:
        impls = [implementations.resolve(name) for name in CPU_DEFAULTS]
    if not impls:
        raise ConfigurationError(
            "impl", "no implementation can run here (" + "; ".join(f"{s['impl']}: {s['reason']}" for s in skipped) + ")"
        )
    return impls, skipped


@dataclasses.dataclass
class Options:
    """A validated request. ``checks``: the property suite's settings (``properties`` None: every
    property that applies; each row adds its dtype); its seed is the measurements' seed too."""

    impls: list[Implementation]
    skipped: list[dict]
    dtypes: list[str]
    sizes: measurements.Sizes
    out: Path
    checks: CheckOptions


def options(
    impls: list[str] | None = None,
    *,
    array: str | None = None,
    dtypes: list[str] | None = None,
    out: str | Path | None = None,
    max_tokens: int | None = None,
    seed: int = 0,
    quick: bool = False,
    max_examples: int | None = None,
    properties: list[str] | None = None,
    dims: tuple[int, ...] | None = None,
) -> Options:
    """Validate a report request; raises :class:`ConfigurationError` naming the argument."""
    from gdn_verify.properties import NAMES

    dtypes = list(dict.fromkeys(dtypes or DEFAULT_DTYPES))
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise ConfigurationError("dtypes", f"{bad[0]!r}: choose from {', '.join(DTYPES)}")
    if max_tokens is not None and not 16 <= max_tokens <= 1 << 20:
        raise ConfigurationError("max_tokens", f"{max_tokens}: must be between 16 and 1048576")
    unknown = [n for n in properties or () if n not in NAMES]  # the report runs the forward properties
    if unknown or properties == []:
        raise ConfigurationError(
            "properties", f"unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(NAMES)}"
        )
    # By default under .gdn_verify/ (git-ignored, beside the cases and plans): reports/ is tracked,
    # and every run left an untracked folder there.
    out = Path(out) if out else DEFAULT_OUT / time.strftime("report-%Y%m%d-%H%M%S", time.gmtime())
    if out.exists() and not out.is_dir():
        raise ConfigurationError("out", f"{out}: exists and is not a directory")
    checks = CheckOptions(
        properties=properties or None,
        seed=seed,
        max_examples=(10 if quick else 20) if max_examples is None else max_examples,
        dims=dims,
        cases_dir=out / "cases",
    )
    resolved, skipped = resolve_all(impls, array)
    sizes = measurements.FULL if not quick and gpu_usable() else measurements.SMALL
    if max_tokens is not None:
        sizes = dataclasses.replace(sizes, max_tokens=max_tokens)
    return Options(resolved, skipped, dtypes, sizes, out, checks)
