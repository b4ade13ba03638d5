"""Hypothesis strategies and the GDN properties, configured by their arguments.

``strategies`` (small composable strategies that take a :class:`Limits`), ``native`` (the 14
properties of FLA's convention), ``spec`` (the 5 of the speculative-decoding form) and ``pools``
(3 on guarded memory and multi-step decode: 22 in all). :func:`catalogue` builds every property
for one configuration; the runners receive the result as objects. This package imports
``gdn_verify.core`` and nothing else of the library.
"""

from __future__ import annotations

from gdn_verify.core.oracle import Oracle, numpy_oracle
from gdn_verify.core.verdict import Property
from gdn_verify.properties.native import native_properties
from gdn_verify.properties.pools import pool_properties
from gdn_verify.properties.spec import spec_properties
from gdn_verify.properties.strategies import LARGE_CPU, LARGE_GPU, Limits


def catalogue(limits: Limits, large: Limits | None = None, oracle: Oracle = numpy_oracle) -> dict[str, Property]:
    """Every property, by name, drawing within ``limits`` (see ``native_properties`` for ``large``)."""
    properties = native_properties(limits, large, oracle) + spec_properties(limits) + pool_properties(limits)
    return {p.name: p for p in properties}


NAMES: tuple[str, ...] = tuple(catalogue(Limits(dtype="float32")))

__all__ = ["LARGE_CPU", "LARGE_GPU", "NAMES", "Limits", "Property", "catalogue"]
