"""The backward form that gradient checks call: an implementation's own, or autograd's of a torch forward."""

from __future__ import annotations

import dataclasses

from gdn_verify.core.implementation import BACKWARD_FORM, SPEC_FORM, ConfigurationError, Implementation


def backward_only(impl: Implementation) -> bool:
    """Whether ``impl`` has a backward form and no forward one (a ``convention="backward"`` plug-in)."""
    return BACKWARD_FORM in impl.forms and not impl.native_forms and SPEC_FORM not in impl.forms


def with_backward(impl: Implementation) -> Implementation:
    """``impl`` with the backward form that gradient properties call.

    Its own when it has one; for a torch implementation with a native form (FLA's
    ``chunk_gated_delta_rule``, a ``MODULE:FUNCTION`` with ``array="torch"``) the backward of its
    default form through autograd (``autograd.autograd_backward``); anything else raises
    :class:`ConfigurationError` naming ``grad``.
    """
    if BACKWARD_FORM in impl.forms:
        return impl
    if impl.array == "torch" and impl.native_forms:
        try:
            from gdn_verify.implementations.autograd import autograd_backward
        except ImportError as exc:
            raise ConfigurationError("grad", f"{impl.name}: no autograd backward here: {exc}") from None
        backward = autograd_backward(impl.forms[impl.default_form])
        return dataclasses.replace(impl, forms={**impl.forms, BACKWARD_FORM: backward})
    raise ConfigurationError(
        "grad",
        f"{impl.name} has no backward form; pass --convention backward (convention='backward') with a functional "
        "backward fn(q, k, v, g, beta, ..., *, do, dht=None) -> (dq, dk, dv, dg, dbeta, dh0), or a torch function "
        "(--array torch), whose backward autograd gives",
    )
