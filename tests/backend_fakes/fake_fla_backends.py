"""A dispatch registry with the shape of FLA >= 0.6's ``fla.backends``, as the backend recorder
sees it: ``BaseBackend`` objects with a ``backend_type``, ``verify(function_name, *args, **kw) ->
(accepted, reason)`` and ``get_implementation(function_name)``; :func:`dispatch` tries each
backend in turn and falls back to the decorated (default) function.

The test installs this module as ``sys.modules["fla.backends"]``. Its one backend, ``flash_qla``,
takes only head size K = 32 and computes with the NumPy reference (so a property passes on it);
the default function is the NumPy reference too: only the record tells the two apart.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from gdn_verify.implementations.numpy_impl import recurrent_gated_delta_rule

ACCEPTED_K = 32


class BaseBackend:
    backend_type = "base"

    def verify(self, function_name: str, *args: Any, **kw: Any) -> tuple[bool, str | None]:
        return True, None

    def get_implementation(self, function_name: str) -> Callable[..., Any] | None:
        return getattr(self, function_name, None)


class FakeQlaBackend(BaseBackend):
    backend_type = "flash_qla"

    def verify(self, function_name: str, *args: Any, **kw: Any) -> tuple[bool, str | None]:
        K = kw["q"].shape[-1]
        return (True, None) if K == ACCEPTED_K else (False, f"head size K={K}, needs {ACCEPTED_K}")

    def gated_delta_rule(self, **kw: Any) -> Any:
        return recurrent_gated_delta_rule(**kw)


REGISTERED: list[BaseBackend] = [FakeQlaBackend()]


def dispatch(default: Callable[..., Any]) -> Callable[..., Any]:
    """``default`` behind the registry: the first backend that accepts the call runs it."""

    @functools.wraps(default)
    def call(**kw: Any) -> Any:
        for backend in REGISTERED:
            accepted, _ = backend.verify(default.__name__, **kw)
            implementation = backend.get_implementation(default.__name__) if accepted else None
            if implementation is not None:
                return implementation(**kw)
        return default(**kw)

    return call


@dispatch
def gated_delta_rule(**kw: Any) -> Any:
    return recurrent_gated_delta_rule(**kw)
