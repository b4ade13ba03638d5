"""Running real Triton GDN kernels on a CPU under Triton's interpreter (``TRITON_INTERPRET=1``).

Triton's interpreter executes a ``@triton.jit`` kernel in NumPy, one program at a time, on CPU
torch tensors. FLA's and vLLM's GDN kernels need four workarounds to run there, all in this
module and applied by :func:`install` (idempotent, before the kernels run):

1. **Autotuning without a driver.** The autotuner times every config through the active GPU
   driver, and there is none (``0 active drivers``). Here it takes a config without timing:
   :func:`chosen_config` (the first of the pruned list unless :data:`CONFIG` pins one), and
   never touches the on-disk autotuning cache (whose key asks the driver for its target).
   ``check --all-configs`` (``gdn_verify.runners.configs.pinned``) replaces an autotuner's list by
   one config, which ``Autotuner.run`` launches without pruning or timing: these patches are
   not reached then, and :data:`CONFIG` does not apply to the kernel pinned.
2. **Loop variables as int32 tensors.** Compiled Triton makes a ``range``/``tl.range`` loop
   variable an int32 tensor; the interpreter leaves it a Python int, and FLA's kernels call
   ``i_t.to(tl.int64)`` on it. The kernel's AST is rewritten so that such loops yield int32
   scalars (``tl.static_range`` loops keep Python ints, as compiled Triton does).
3. **Builtins bound as module globals.** A module that binds ``exp = tl.exp`` (vLLM's
   ``op.py``) holds the compiled-mode builtin, which the interpreter does not swap; it is
   swapped here for the interpreter's while the kernel runs.
4. **bfloat16.** The interpreter holds bfloat16 as uint16 and runs ``tl.dot`` and arithmetic on
   the raw bits (silent garbage), and rounds float32 -> bfloat16 by truncation. There is no
   faithful fix: :func:`widen_bfloat16` hands a kernel float32 copies of its bfloat16 tensors
   and rounds its floating outputs back to bfloat16 (to nearest), and the check says so.

Beside them, old releases ask torch's CUDA (or CPU) device API on the host, which a torch without
CUDA refuses: ``torch.cpu.device``, ``torch.cuda.device`` and ``torch.cuda.get_device_capability``
get answers that select nothing (the capability :data:`CAPABILITY`, an H100's).

What the interpreter cannot show (:data:`LIMITS`, in the check's header and ``docs/jit-kernels.md``):
launch limits and grid sizes, races and memory ordering between programs (they run one after
another), the GPU's rounding (TF32 products, fused multiply-adds, fast ``exp``), and bfloat16
arithmetic. Written against Triton 3.7 (:data:`TESTED`); another version is refused with one line.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gdn_verify.core import environment
from gdn_verify.core.implementation import BACKWARD_FORM, GRADIENTS, ConfigurationError, Implementation

ENV = "TRITON_INTERPRET"  # Triton's own switch (read by gdn_verify.core.environment.triton_interpret)
TESTED = ("3.7",)  # Triton minor versions whose interpreter internals these workarounds match
LIMITS = (
    "Triton interpreter on the CPU: programs run one after another in NumPy, so launch limits, races and "
    "the GPU's rounding (TF32, fused multiply-adds, fast exp) are not exercised; autotuned kernels run one "
    "config each (check --all-configs: each in turn); bfloat16 inputs are widened to float32"
)
BF16_LABEL = (
    "bfloat16 inputs widened to float32 for the interpreter (its bfloat16 arithmetic is wrong); "
    "outputs rounded back to bfloat16"
)

# The autotuner config each autotuned kernel runs under the interpreter: None, the first of its
# pruned list; an int, that index (taken modulo the list's length).
CONFIG: int | None = None
_installed = False


def requested() -> bool:
    """Whether Triton's own switch for its interpreter is on (``TRITON_INTERPRET=1``)."""
    return environment.triton_interpret()


def chosen_config(configs: list[Any]) -> Any:
    """The config an autotuned kernel runs under the interpreter (see :data:`CONFIG`)."""
    return configs[(CONFIG or 0) % len(configs)]


def _int32_loop(values: Iterable[int]) -> Iterator[Any]:
    """The values of a ``range`` as int32 scalar tensors, like compiled Triton's loop variable."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    for i in values:
        yield tl.tensor(TensorHandle(np.array([i], dtype=np.int32), tl.int32), tl.int32)


_LOOP = "_gdn_verify_int32_loop"  # the name the rewritten kernels call _int32_loop by


class _LoopRewriter(ast.NodeTransformer):
    """``for i in range(...)`` / ``tl.range(...)`` -> ``for i in _gdn_verify_int32_loop(range(...))``."""

    def __init__(self, base: ast.NodeTransformer):
        self.base = base

    def visit(self, node: ast.AST) -> ast.AST:
        node = self.base.visit(node)  # Triton's own rewrite (assignments through to_tensor)
        for loop in [n for n in ast.walk(node) if isinstance(n, ast.For)]:
            it = loop.iter
            name = ""
            if isinstance(it, ast.Call):
                name = it.func.attr if isinstance(it.func, ast.Attribute) else getattr(it.func, "id", "")
            if name == "range":  # builtin range and tl.range; not static_range
                loop.iter = ast.Call(func=ast.Name(id=_LOOP, ctx=ast.Load()), args=[it], keywords=[])
        return node


def install() -> None:
    """Apply the workarounds to the imported Triton (once); ConfigurationError if it cannot."""
    global _installed
    if _installed:
        return
    try:
        import triton.language as tl
        import triton.runtime.autotuner as autotuner
        import triton.runtime.interpreter as interp
    except ImportError as exc:
        raise ConfigurationError("impl", f"{ENV}=1 needs Triton (pip install triton): {exc}") from None
    version = environment.triton_version()
    if not version.startswith(TESTED) or not all(
        hasattr(x, a)
        for x, a in (
            (interp, "FunctionRewriter"),
            (interp, "_patch_lang"),
            (autotuner.Autotuner, "_bench"),
            (autotuner.Autotuner, "check_disk_cache"),
        )
    ):
        raise ConfigurationError(
            "impl",
            f"{ENV}=1: the interpreter workarounds are written for Triton {', '.join(TESTED)}, "
            f"not {version} (pip install 'triton==3.7.1')",
        )

    # 1. autotuning without a driver: no timing, no disk cache (its key needs the driver's target)
    def bench(self, *args, config, **meta):
        return [0.0, 0.0, 0.0] if config is chosen_config(list(self._gdn_verify_pruned)) else [1.0, 1.0, 1.0]

    prune = autotuner.Autotuner.prune_configs

    def prune_configs(self, kwargs):
        self._gdn_verify_pruned = prune(self, kwargs)
        return self._gdn_verify_pruned

    def check_disk_cache(self, tuning_key, configs, bench_fn):
        bench_fn()
        return False

    autotuner.Autotuner._bench = bench
    autotuner.Autotuner.prune_configs = prune_configs
    autotuner.Autotuner.check_disk_cache = check_disk_cache

    # 2. int32 loop variables
    interp.FunctionRewriter.ast_transformer = _LoopRewriter(interp.FunctionRewriter.ast_transformer)
    setattr(interp, _LOOP, _int32_loop)  # the interpreter copies its module globals into the kernel's

    # 3. builtins bound as module globals: swapped with tl's patched ones for the kernel's run
    originals = {id(getattr(tl, n)): n for n in dir(tl) if tl.core.is_builtin(getattr(tl, n))}
    patch_lang = interp._patch_lang

    def patched_lang(fn):
        scope = patch_lang(fn)
        g = fn.__globals__
        for name, value in list(g.items()):
            tl_name = originals.get(id(value))
            if tl_name is not None and not isinstance(value, type):
                scope._changes.append((_GlobalsView(g), name, value))
                g[name] = getattr(tl, tl_name)
        return scope

    interp._patch_lang = patched_lang

    # FLA 0.5's device context calls torch.cpu.device(index) on a CPU tensor; this torch has none
    import torch

    if not hasattr(torch.cpu, "device"):
        torch.cpu.device = _NoDevice
    # With no CUDA device, what old releases ask of torch.cuda on the host gets an answer:
    # FLA 0.1-0.1.1 pick block sizes by get_device_capability() (CAPABILITY: what an H100 runs),
    # vLLM <= 0.19's input_guard enters torch.cuda.device(None) for a CPU tensor (nothing to select)
    if not torch.cuda.is_available():
        torch.cuda.get_device_capability = _capability
        torch.cuda.device = _NoDevice
    _installed = True


# The GPU generation host code is told it runs on when torch has no CUDA (an H100's).
CAPABILITY = (9, 0)


def _capability(device: Any = None) -> tuple[int, int]:
    """``torch.cuda.get_device_capability`` under the interpreter without CUDA: :data:`CAPABILITY`."""
    return CAPABILITY


class _NoDevice:
    """``torch.cpu.device(index)``: a context that selects nothing (there is one CPU device)."""

    def __init__(self, index: Any = None):
        pass

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class _GlobalsView:
    """A module's globals as an object, so that the interpreter's patch scope restores them."""

    def __init__(self, namespace: dict[str, Any]):
        object.__setattr__(self, "_ns", namespace)

    def __setattr__(self, name: str, value: Any) -> None:
        self._ns[name] = value

    def __delattr__(self, name: str) -> None:
        del self._ns[name]


def widen_bfloat16(fn: Callable[..., Any], rounded: int = 1) -> Callable[..., Any]:
    """``fn`` with its bfloat16 torch tensors handed over as float32 copies (workaround 4).

    When the call's ``q`` (the first positional argument or the keyword) was bfloat16, the first
    ``rounded`` outputs (``o``; the gradients before ``dh0`` for a backward) come back rounded to
    bfloat16 (to nearest), the rest (the float32 final state, ``dh0``) as they are: the outputs'
    dtype follows the inputs', never an optional argument's (a bfloat16 ``initial_state`` beside
    float32 inputs leaves ``o`` float32). A widened argument the kernel wrote into (an ``output=``
    buffer) is copied back into the caller's tensor.
    """

    @functools.wraps(fn)  # keeps the signature: the harness reads which keywords fn takes
    def call(*args: Any, **kwargs: Any) -> Any:
        import torch

        widened: list[tuple[Any, Any]] = []

        def widen(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16:
                widened.append((x, x.float()))
                return widened[-1][1]
            return x

        q = kwargs.get("q", args[0] if args else None)
        out = fn(*[widen(a) for a in args], **{k: widen(v) for k, v in kwargs.items()})
        for original, wide in widened:
            original.copy_(wide)
        if not (isinstance(q, torch.Tensor) and q.dtype == torch.bfloat16):
            return out

        def narrow(x: Any) -> Any:
            return x.to(torch.bfloat16) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

        if isinstance(out, tuple):
            return tuple(narrow(x) if i < rounded else x for i, x in enumerate(out))
        return narrow(out)

    return call


def adapt(impl: Implementation) -> Implementation:
    """``impl`` as it runs under the interpreter: workarounds installed, bfloat16 widened, labelled.

    A no-op unless :func:`requested`, and for implementations that take NumPy or CuPy arrays.
    """
    if not requested() or impl.array != "torch":
        return impl
    install()
    rounded = {BACKWARD_FORM: len(GRADIENTS) - 1}
    impl.forms = {name: widen_bfloat16(fn, rounded.get(name, 1)) for name, fn in impl.forms.items()}
    impl.description = f"{impl.description} [{LIMITS}]"
    impl.extra["interpreter"] = dict(limits=LIMITS, bfloat16=BF16_LABEL, triton=environment.triton_version())
    # nothing compiles under the interpreter: no shape classes to compile up front
    # (gdn_verify.core.shapes), which took 4 of every 6 minutes of a check there
    impl.extra["compile_classes"] = False
    return impl
