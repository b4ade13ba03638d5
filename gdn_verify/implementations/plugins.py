"""Plug-ins: a user's callable, or ``MODULE:FUNCTION`` / ``FILE.py:FUNCTION``, as an implementation.

A plug-in's function is its native form, with ``convention="spec"`` its speculative-decoding
form, with ``convention="backward"`` its functional backward (``BACKWARD_KEYWORDS``), or with
``convention="max"`` a callable in MAX's ``gated_delta`` convention.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Callable
from pathlib import Path

from gdn_verify.core import arrays, max_convention
from gdn_verify.core.implementation import BACKWARD_FORM, SPEC_FORM, ConfigurationError, Implementation
from gdn_verify.implementations import interpreter

CONVENTIONS = ("native", "spec", "backward", "max")
# Forms a plug-in's callable becomes, by convention (native: the default native form; max: Modular
# MAX's gated_delta convention, run as the native form through ``max_convention.native_form``).
_CONVENTION_FORMS = {"native": "default", "spec": SPEC_FORM, "backward": BACKWARD_FORM, "max": "default"}


def _import_file(path: Path) -> types.ModuleType:
    """The Python file ``path`` imported as a module (its folder first on ``sys.path``, for its own imports)."""
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = f"gdn_verify_plugin_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"not a Python module: {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_plugin(spec_text: str, array: str = "numpy", convention: str = "native") -> Implementation:
    """``MODULE:FUNCTION`` importable from ``PYTHONPATH`` or the current directory, or ``FILE.py:FUNCTION``."""
    module_name, _, function_name = spec_text.partition(":")
    if not module_name or not function_name:
        raise ConfigurationError("impl", f"{spec_text!r}: expected MODULE:FUNCTION")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    as_file = module_name.endswith(".py") or "/" in module_name
    try:
        if as_file and not Path(module_name).is_file():
            raise ImportError("no such file (give FILE.py:FUNCTION, or MODULE:FUNCTION with MODULE importable)")
        module = _import_file(Path(module_name)) if as_file else importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's configuration
        raise ConfigurationError("impl", f"{spec_text!r}: cannot import module {module_name!r}: {exc}") from None
    fn = getattr(module, function_name, None)
    if fn is None or not callable(fn):
        raise ConfigurationError("impl", f"{spec_text!r}: module {module_name!r} has no function {function_name!r}")
    return from_callable(fn, array, convention, name=spec_text)


def from_callable(
    fn: Callable, array: str = "numpy", convention: str = "native", name: str | None = None
) -> Implementation:
    """A user's callable as an implementation: its only form, native, spec with ``convention="spec"``,
    the functional backward with ``convention="backward"``, or with ``convention="max"`` a callable
    in MAX's convention (``gdn_verify.core.max_convention``) run as the native form.

    A chunked plug-in may expose its stages for ``replay --diagnose`` as ``fn.stages`` (a
    ``gdn_verify.runners.diagnose.StagedImplementation``), and the calls beside a shape class's
    own that compile kernels of their own as ``fn.warm_variants``
    (``Implementation.extra["warm_variants"]``, ``runners.compile.warm_calls``).
    """
    if convention not in CONVENTIONS:
        raise ConfigurationError("convention", f"{convention!r}: choose from {', '.join(CONVENTIONS)}")
    if array not in arrays.ARRAY_KINDS:
        raise ConfigurationError("array", f"{array!r}: choose from {', '.join(arrays.ARRAY_KINDS)}")
    name = name or f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"
    stages = getattr(fn, "stages", None)
    rules = getattr(fn, "spec_rules", None)  # a spec plug-in's SpecRules (padding, null slot, pool layout)
    warm = getattr(fn, "warm_variants", None)  # calls that compile apart, warmed with each class
    form = _CONVENTION_FORMS[convention]
    if convention == "max":
        fn = max_convention.native_form(fn, array)
    impl = Implementation(
        name,
        {form: fn},
        array=array,
        description=f"plug-in {name}",
        default_dtype="float32" if array == "numpy" else "bfloat16",
        extra={k: x for k, x in (("stages", stages), ("spec_rules", rules), ("warm_variants", warm)) if x is not None},
    )
    return interpreter.adapt(impl)
