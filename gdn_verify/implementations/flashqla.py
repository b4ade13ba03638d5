"""Adapter to FlashQLA (``flash-qla`` on PyPI): fused TileLang GDN prefill and backward, Hopper.

FlashQLA takes FLA's convention (``q, k [B, T, H, K]``, log-space ``g``, ``cu_seqlens``), so the
adapter translates nothing: ``fla.wrap`` passes every tensor by keyword and ``cu_seqlens`` as
a LongTensor. FlashQLA supports bfloat16 and float16 inputs only (it asserts so), and FLA 0.6
dispatches its own ``chunk_gated_delta_rule`` to it when it can be imported (head sizes 128,
16-bit inputs, Hopper; ``FLA_FLASH_QLA=0`` turns that off). Training stacks call it through
autograd: ``check --grad --impl flash-qla`` verifies that backward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gdn_verify.core import arrays
from gdn_verify.core.implementation import Implementation
from gdn_verify.core.problem import Problem
from gdn_verify.core.shapes import COMPILED_SCALES, ShapeClass, variants
from gdn_verify.implementations.fla import cuda_library, jit_compiled, wrap


def training_contract(fn: Callable) -> Callable:
    """``fn`` under FlashQLA 0.1.3's contract, as read from its source and seen on an H100
    (2026-11-26):

    - a call with an empty sequence is reported unsupported: FlashQLA raises ``ValueError: invalid
      sequence lengths: [0, 1]`` for any zero length (its context-parallel planner), an explicit
      refusal;
    - ``g`` is passed in float32, as models compute it: FlashQLA keeps the chunk-local cumsum of
      ``g`` in ``g``'s dtype and its backward asserts ``dg should be fp32``. The values are those of
      the drawn 16-bit ``g``, so the oracle's inputs do not change.
    """

    def call(q, k, v, g, *args, cu_seqlens=None, **kw):
        lengths = [q.shape[1]] if cu_seqlens is None else (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        if min(lengths, default=0) == 0:
            raise NotImplementedError("FlashQLA refuses a call with an empty sequence")
        return fn(q, k, v, g.float(), *args, cu_seqlens=cu_seqlens, **kw)

    return call


# A single batched sequence this long takes FlashQLA's intra-card context-parallel path in a
# training step on an H100 (16 chunks of 64; the calibrated sm90 model chooses it from 9-10 chunks
# for HV <= 16 with 132 SMs): the length ``grad_error_growth``'s prefixes of 1024 and 2048 reach.
CP_TOKENS = 1024


def first_row(problem: Problem) -> Problem:
    """Batch row 0 of a batched ``problem`` as a batched call with ``B == 1``."""
    return problem.replace(
        **{name: getattr(problem, name)[:1] for name in ("q", "k", "v", "g", "beta")},
        initial_state=None if problem.initial_state is None else problem.initial_state[:1],
    )


def warm_variants(example: Problem, backward: bool) -> list[tuple[Problem, bool]]:
    """The calls beside ``(example, True)`` that compile TileLang kernels of their own in FlashQLA
    0.1.3 (``Implementation.extra["warm_variants"]``, ``runners.compile.warm_calls``): every scale
    the strategies draw (None and ``shapes.COMPILED_SCALES``: the adapter declares
    ``compile_scales``, so ``api.plan_limits`` narrows the scales drawn) crossed with, through the backward
    form, ``dht`` given and not; through a forward form, the example's ``shapes.variants`` (state
    ``[V, K]``, no final state); each on the example, for a batched class also on its first row
    alone (``B == 1``), and through the backward form on one batched sequence of ``CP_TOKENS``.

    FlashQLA's kernels are ``@tilelang.jit`` functions: every Python argument is a compile-time
    one (token counts and batch are ``T.dynamic``), so a new value compiles a new kernel. Those a
    gdn-verify example varies within one :class:`ShapeClass` (Hopper path; paths under
    ``flash_qla/ops/gated_delta_rule/chunk/``):

    - ``scale`` (``None`` becomes ``K ** -0.5`` in ``__init__.py:441-442``): a jit argument of the
      forward ``hopper/fused_fwd.py:27`` (passed at ``:744``), the backward ``hopper/fused_bwd.py:24``
      (``:1186``) and the context-parallel backward ``hopper/cp_bwd.py:22`` (``:675``). 2 values.
    - ``use_dht = dht is not None``, ``hopper/fused_bwd.py:33`` (``:1164``), and ``hopper/cp_bwd.py:31``
      (``:644``); with it ``store_final_state``, ``hopper/fused_fwd.py:39`` (``:755``): autograd's
      forward stores the final state exactly when ``dht`` is given (``with_dht`` of
      ``gradients.cotangent_params``). 2 values.
    - the layout: ``is_varlen`` and ``seqlen_dtype`` of every kernel (``fused_fwd.py:673-683``,
      ``fused_bwd.py:1153-1162``, ``prepare_h.py:594-605``, ``kkt_solve.py:295-302``,
      ``ops/utils/cumsum.py:149-156``). A batched call with ``B == 1`` is not the batched variant:
      ``__init__.py:49-52`` gives it a synthesized int32 ``cu_seqlens`` (``cp/context.py:400``), so
      it runs the varlen kernels with int32 offsets, neither the ``B > 1`` ones (``is_varlen``
      False) nor those of a varlen class (the adapter's int64 ``cu_seqlens``). 3 layouts, 2 per class.
    - the context-parallel path, ``is_cp`` of ``fused_fwd.py:43`` (``:689-691``) and
      ``prepare_h.py:34`` (``:606-612``), and the kernels of ``hopper/cp_fwd.py`` and ``cp_bwd.py``:
      chosen when ``B == 1`` (``__init__.py:49``) and ``cp/context.py:362-364``'s calibrated model
      (``cp/autocp/decision.py``, sm90 coefficients) says it pays, which needs a sequence of at least
      ``MIN_LCP = 4`` chunks (``autocp/utils.py:40``, ``decision.py:43``): on an H100 (132 SMs), for
      HV <= 16, from 9-10 chunks in a training step (``is_train``, ``__init__.py:444``), from about
      116 chunks without gradients. ``grad_error_growth``'s B = 1 prefixes of 1024 and 2048 tokens
      take it; nothing else of ``check --grad`` (``MAX_LEN`` 96) does.
    - ``state_v_first`` (``fused_fwd.py:44``, ``fused_bwd.py:34``, ``prepare_h.py:35``): drawn by the
      forward properties only (``backward_kwargs`` drops it): ``shapes.variants``.
    - ``block_DV`` of the forward (``fused_fwd.py:45``, ``:730-736``): 128, 64 or 32 as the
      sequences (or context-parallel pieces) times HV reach ``0.7 * SMs`` (92 on an H100) or half
      of it: at most 6 x 4 = 24 in a ``--dims 128`` pool (HV <= 4), always 32. Not warmed.
    - constant here: ``g_dtype`` float32 (``training_contract``) in the forward, and so in the
      backward (the chunk-local cumsum keeps ``g``'s dtype, ``ops/utils/cumsum.py:166``); ``b_dtype``,
      ``qkva_dtype``, ``h_dtype`` and ``o_dtype`` the input dtype; ``h0``/``ht``/``dht`` float32;
      ``use_initial_state`` and ``Hg``/``H`` are the class's. l2norm is torch code, no jit argument.

    Warm calls per class: backward 2 scales x 2 x 3 shapes = 12 for a batched class, 2 x 2 = 4 for
    a varlen one; forward 2 x 3 x 2 = 12 and 6. Each new (scale, dht, layout) compiles the fused
    forward and backward (20-90 s each on an H100). With the four scales of
    ``shapes.EXPLICIT_SCALES`` a cold ``--grad --dims 128`` pool of ``MIN_CLASSES`` (4) classes
    took 7 min 27 s over 15 compile workers (H100, 2026-11-27), and a batched class alone would
    have taken some 36 min in one process; with two, about half. The compile workers split a
    class into units of these calls (``compile_workers.split_units``); the default budget (3 min)
    keeps the pool at ``MIN_CLASSES``, which is still what the properties would otherwise compile
    one example at a time; a warm TileLang cache (a stored plan) pays none of it.
    """
    shapes = [example]
    if example.cu_seqlens is None:
        shapes.append(first_row(example))
        if backward:
            shapes.append(first_row(ShapeClass.of(example).example(tokens=2 * CP_TOKENS)))
    if backward:
        calls = [(p, with_dht) for p in shapes for with_dht in (True, False)]
    else:
        calls = [(v, True) for p in shapes for v in (p, *variants(p))]
    default = example.shape["K"] ** -0.5  # what FlashQLA makes of scale=None
    scales = [None] + [s for s in COMPILED_SCALES if s != default]
    return [(p.replace(scale=s), with_dht) for s in scales for p, with_dht in calls][1:]  # [0]: the class's own


def class_key(c: ShapeClass) -> ShapeClass:
    """FlashQLA's kernels per class: l2norm is done in torch (``flash_qla/utils/math.py``,
    ``torch.compile``) before any TileLang kernel, so classes differing only in it share them."""
    return c.replace(l2norm=False)


def declarations() -> dict[str, Any]:
    """FlashQLA's ``Implementation.extra``: JIT-compiled per :func:`class_key`, warmed with
    :func:`warm_variants` (also what ``tests/jit_like.QlaLike`` declares)."""
    return jit_compiled(
        compile_classes=class_key,
        warm_variants=warm_variants,
        compile_scales=True,
        backend="flash_qla",  # TileLang kernels, which no hook sees: the adapter says so
        library="flash_qla",
    )


def flash_qla() -> Implementation:
    def load():
        from flash_qla import chunk_gated_delta_rule

        return chunk_gated_delta_rule

    chunk = cuda_library("FlashQLA", "pip install flash-qla (needs tilelang)", load)
    arrays.check_kind("torch")
    return Implementation(
        "flash-qla",
        {"chunk": training_contract(wrap(chunk))},
        "torch",
        "FlashQLA chunk_gated_delta_rule (TileLang, auto intra-card context parallelism)",
        "bfloat16",
        # FlashQLA 0.1.3 asserts K = V = 128 (FLA dispatches to it only then); the NumPy twin of
        # tests/jit_like.QlaLike runs at any size, so this is the real kernel's declaration alone
        extra={**declarations(), "head_dims": (128,)},
    )
