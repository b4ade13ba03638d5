"""Hypothesis strategies and the GDN properties, configured by their arguments.

``strategies`` (small composable strategies that take a :class:`Limits`), ``native`` (the 15
properties of FLA's convention), ``speculative`` (the 6 of the speculative-decoding form) and ``pools``
(4 on guarded memory and multi-step decode), ``process`` (2 on what one call leaves behind
for the next: 27 in all), ``gradients`` (the gradient properties)
and ``suite`` (:func:`catalogue` builds every forward property for one configuration; the
runners receive the result as objects). This package imports ``gdn_verify.core`` and nothing
else of the library.
"""

from gdn_verify.core.property import Property
from gdn_verify.properties.strategies import LARGE_CPU, LARGE_GPU, Limits
from gdn_verify.properties.suite import NAMES, catalogue

__all__ = ["LARGE_CPU", "LARGE_GPU", "NAMES", "Limits", "Property", "catalogue"]
