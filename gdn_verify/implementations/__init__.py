"""Implementations that a check can verify: built-in ones by name, plug-ins as ``MODULE:FUNCTION``.

``registry`` (the built-in names, planted bugs, ``resolve``, ``names``, ``choose_oracle``),
``plugins`` (a user's callable or ``MODULE:FUNCTION`` as an implementation, by convention) and
``backward`` (``with_backward``: the backward form that gradient checks call). The built-ins:
``numpy_impl``, ``numpy_grad``, ``precision`` (the precision-contract models), ``planted``,
``planted_grad`` and ``planted_memory`` (planted bugs), ``speculative``, ``max_numpy``, ``autograd``;
the adapters, imported on demand: ``cupy``, ``fla``, ``flashqla``, ``flashinfer``, ``vllm``,
``max_kernels``.
"""

from gdn_verify.core.implementation import ConfigurationError, ContractError, Implementation, Result
from gdn_verify.implementations.backward import backward_only, with_backward
from gdn_verify.implementations.plugins import CONVENTIONS, from_callable, load_plugin
from gdn_verify.implementations.registry import (
    BUILTIN,
    LAZY,
    PLANTED,
    choose_oracle,
    default_name,
    is_plugin,
    names,
    planted_prefix,
    resolve,
)

__all__ = [
    "BUILTIN",
    "CONVENTIONS",
    "LAZY",
    "PLANTED",
    "ConfigurationError",
    "ContractError",
    "Implementation",
    "Result",
    "backward_only",
    "choose_oracle",
    "default_name",
    "from_callable",
    "is_plugin",
    "load_plugin",
    "names",
    "planted_prefix",
    "resolve",
    "with_backward",
]
