"""The settings of a check run as one object, :class:`CheckOptions`, validated in one place.

``gdn_verify.check`` takes them as keywords; the command line (``check``'s flags), the pytest
plugin (``--gdn-*``) and the report build a :class:`CheckOptions` and pass it on as
``check(impl, **options.keywords(), progress=...)``. A setting added later is a field here and a
keyword of ``check``; ``tests/test_options.py`` fails until the command line and the plugin
have its flag too (or list it as an exception, with the reason).

The ``valid_*`` functions are the checks themselves, also used where ``fuzz`` and ``selftest``
take the same arguments; each raises :class:`ConfigurationError` naming the argument.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from gdn_verify.core import arrays
from gdn_verify.core.implementation import ConfigurationError
from gdn_verify.core.problem import DTYPES
from gdn_verify.implementations import CONVENTIONS
from gdn_verify.runners.check import CASES_DIR
from gdn_verify.runners.compile import PLANS_DIR
from gdn_verify.runners.fuzz import parse_budget
from gdn_verify.runners.guard import DEFAULT_TIMEOUT
from gdn_verify.runners.scale import ScaleLimits

MIN_TOKENS = 64  # error_growth needs a few chunks of 64 tokens
# Flags named otherwise than their field (--cases, --gdn-cases: cases_dir); every other is --FIELD.
FLAG_NAMES = {"cases_dir": "cases", "plans_dir": "plans"}


@dataclasses.dataclass(frozen=True)
class CheckOptions:
    """Everything ``gdn_verify.check`` takes but the implementation and the callbacks (its keywords,
    same names and defaults). Bad values raise :class:`ConfigurationError` naming the field when
    the object is made; ``properties`` and ``dims`` are kept as tuples (``dims`` sorted, without
    repeats) and a ``timeout`` of 0 as None (no limit)."""

    array: str | None = None
    dtype: str | None = None
    properties: Sequence[str] | None = None
    seed: int | None = None
    max_examples: int | None = None
    dims: Sequence[int] | None = None
    max_tokens: int | None = None
    database: str | Path | None = None
    cases_dir: str | Path = CASES_DIR
    plans_dir: str | Path | None = PLANS_DIR
    convention: str = "native"
    timeout: float | None = DEFAULT_TIMEOUT
    compile_budget: str | float | None = None
    scale: bool = False
    scale_limits: ScaleLimits | None = None
    grad: bool = False

    def __post_init__(self) -> None:
        if self.array is not None:
            valid_choice("array", self.array, arrays.ARRAY_KINDS)
        valid_choice("convention", self.convention, CONVENTIONS)
        if self.dtype is not None:
            valid_choice("dtype", self.dtype, DTYPES)
        valid_max_tokens(self.max_tokens)
        valid_max_examples(self.max_examples)
        valid_compile_budget(self.compile_budget)
        # Frozen: normalised through object.__setattr__, so that equal settings compare equal and
        # the object holds no list of the caller's.
        if self.properties is not None:
            object.__setattr__(self, "properties", tuple(self.properties))
        object.__setattr__(self, "dims", valid_dims(self.dims))
        object.__setattr__(self, "timeout", valid_timeout(self.timeout))

    def keywords(self) -> dict[str, Any]:
        """The settings as ``gdn_verify.check``'s keyword arguments."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def replace(self, **changes: Any) -> CheckOptions:
        """A copy with ``changes``, validated like a new one."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_flags(cls, values: Mapping[str, Any], prefix: str = "") -> CheckOptions:
        """The options a command line gave: ``values`` by flag destination (``prefix`` + ``max_examples``,
        ``cases``, ...; see :func:`flag_name`), None or absent where unset (the field's default
        applies), comma-separated ``properties`` and ``dims`` split; other entries are ignored."""
        given: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            value = values.get(prefix + flag_name(field.name))
            if field.name == "properties" and isinstance(value, str):
                value = comma_list(value)
            elif field.name == "dims" and isinstance(value, str):
                value = comma_dims(value)
            if value is not None:
                given[field.name] = value
        return cls(**given)


def flag_name(field: str) -> str:
    """The flag of a :class:`CheckOptions` field, as a destination: ``max_examples``, ``cases``
    (``--max-examples``, ``--gdn-cases``)."""
    return FLAG_NAMES.get(field, field)


def comma_list(text: str | None) -> list[str] | None:
    """``"a, b"`` as ``["a", "b"]`` (a flag's comma-separated list)."""
    return None if text is None else [part.strip() for part in text.split(",") if part.strip()]


def comma_dims(text: str | None) -> tuple[int, ...] | None:
    """``"64,128"`` as ``(64, 128)``."""
    if text is None:
        return None
    try:
        return tuple(int(part) for part in comma_list(text) or [])
    except ValueError:
        raise ConfigurationError("dims", f"{text!r}: expected comma-separated head sizes such as 64,128") from None


def valid_choice(field: str, value: str, choices: Collection[str]) -> str:
    if value not in choices:
        raise ConfigurationError(field, f"{value!r}: choose from {', '.join(choices)}")
    return value


def valid_max_examples(n: int | None) -> int | None:
    if n is not None and n < 1:
        raise ConfigurationError("max_examples", f"{n}: must be at least 1")
    return n


def valid_max_tokens(max_tokens: int | None) -> int | None:
    """``max_tokens`` (None or 0: the default of the implementation's array kind)."""
    if max_tokens and max_tokens < MIN_TOKENS:
        raise ConfigurationError("max_tokens", f"{max_tokens}: must be at least {MIN_TOKENS}")
    return max_tokens


def valid_dims(dims: Sequence[int] | None) -> tuple[int, ...] | None:
    """The head sizes, sorted, without repeats."""
    if dims is None:
        return None
    try:
        head_dims = tuple(sorted({int(d) for d in dims}))
    except (TypeError, ValueError):
        raise ConfigurationError("dims", f"{dims!r}: expected head sizes such as (64, 128)") from None
    if not head_dims or min(head_dims) < 1:
        raise ConfigurationError("dims", f"{dims!r}: expected positive head sizes such as (64, 128)")
    return head_dims


def valid_timeout(seconds: float | None) -> float | None:
    """Seconds a kernel call may take, or None (given as None or 0) for no limit."""
    if seconds is None or seconds == 0:
        return None
    if not seconds > 0 or math.isinf(seconds):
        raise ConfigurationError("timeout", f"{seconds}: must be a positive number of seconds (0: no limit)")
    return float(seconds)


def valid_compile_budget(value: str | float | None) -> float | None:
    """Seconds of ``"90s"``, ``"3m"`` or a number (None: none given)."""
    if value is None:
        return None
    try:
        return parse_budget(value)
    except ConfigurationError as exc:
        raise ConfigurationError("compile_budget", exc.message) from None
