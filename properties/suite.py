"""The whole property suite: :func:`catalogue` builds every property for one configuration, by name;
:data:`NAMES` are the forward properties' names."""

from __future__ import annotations

from gdn_verify.core.oracle import Oracle, numpy_oracle
from gdn_verify.core.property import Property
from gdn_verify.properties.native import native_properties
from gdn_verify.properties.pools import pool_properties
from gdn_verify.properties.process import process_properties
from gdn_verify.properties.speculative import spec_properties
from gdn_verify.properties.strategies import Limits


def catalogue(limits: Limits, large: Limits | None = None, oracle: Oracle = numpy_oracle) -> dict[str, Property]:
    """Every property, by name, drawing within ``limits`` (see ``native_properties`` for ``large``)."""
    properties = native_properties(limits, large, oracle) + spec_properties(limits) + pool_properties(limits)
    properties += process_properties(limits)
    return {p.name: p for p in properties}


NAMES: tuple[str, ...] = tuple(catalogue(Limits(dtype="float32")))
