"""Backwards with one planted gradient bug each, for the gradient checks: every one must be caught.

Each is the float32 NumPy backward of ``numpy_grad`` (:func:`numpy_grad.backward`, the token-by-
token adjoint organised in chunks of 64 like FLA's) with one switch turned on, and correct
otherwise; its forward (form ``"chunk"``) is the correct float32 NumPy forward. The switches
live in the one backward (``numpy_grad.ENGINE_BUGS`` inside the adjoint, ``WRAPPER_BUGS`` around
it), so a bug is never a copy of the oracle. Each models a mistake that shipped in, or is one
edit away from, a production GDN backward:

- ``dht_ignored``: the final state's cotangent is treated as 0 (a backward that never reads
  ``dht``, or an autograd ``Function`` that drops its second incoming gradient);
- ``dh0_dropped``: ``dh0`` comes back as zeros (a kernel that never stores its carried cotangent);
- ``dv_missing_beta``: ``dv = du`` instead of ``beta du`` (the WY backward's beta factor lost);
- ``dbeta_uses_v``: ``dbeta = du . v`` instead of ``du . (v - D^T k)`` (the prediction term lost);
- ``dg_wrt_decay``: ``dg`` taken with respect to ``exp(g)`` instead of ``g`` (the factor
  ``exp(g)`` dropped: a gate passed as the linear decay ``alpha`` to a backward written for
  log-space ``g``);
- ``chunk_boundary_decay_missing``: the state cotangent crosses each chunk boundary (every 64
  tokens) without the decay of the chunk's first token (an off-by-one in the chunk-level
  ``exp(g_last)`` of the reverse state passing);
- ``dh0_undecayed``: ``dh0`` misses the first token's decay (the same off-by-one at the start);
- ``dg_chunk_end_missing``: FLA's per-chunk ``b_dg_last`` term (``<h, dh> exp(G_last)`` and
  the inter-chunk ``k . dk``) left out of ``dg``;
- ``dg_cumsum16``: ``dg``'s per-token terms and their reverse chunk-local cumsum kept in 16 bits
  (the input dtype; bfloat16 for float32 inputs), e.g. a ``dg`` buffer allocated like a 16-bit
  tensor: FLA keeps both in float32;
- ``l2norm_backward_skipped``: with ``use_qk_l2norm_in_kernel`` the gradients are returned with
  respect to the normalised q and k (``l2norm_bwd`` not applied);
- ``gva_first_head_only``: with GVA, ``dq`` and ``dk`` take the first value head of each group
  instead of the sum over the group (a ``[:, :, ::G]`` where ``.view(..., G, K).sum(3)`` was meant);
- ``dk_doubled``: one of ``dk``'s two halves (``D_t dp_t``, the WY backward's ``dk2``) counted
  twice (``dk.add_(dk2)`` applied to a ``dk`` that already held it);
- ``varlen_tail_unwritten``: the gradients of the tokens after ``cu_seqlens[-1]`` are left as
  whatever the output buffer held (``torch.empty``; NaN here, the checks' poison);
- ``dh0_unwritten_without_dht``: asked for ``dh0`` with no ``dht`` given, the backward leaves
  ``dh0`` as its buffer was allocated (NaN here, the checks' poison): a kernel that writes ``dh0``
  only on the path that starts the reverse pass from ``dht`` (FlashQLA 596ece2);
- ``nondeterministic_dk``: ``dk``'s sum over the value heads of a group and over its two halves
  runs in a random order each call (atomics into a float32 buffer): identical calls differ in
  the last bits. Within tolerance by construction; caught by ``grad_determinism``.
"""

from __future__ import annotations

from collections.abc import Callable

from gdn_verify.core.implementation import ConfigurationError, Implementation
from gdn_verify.implementations import numpy_impl
from gdn_verify.implementations.numpy_grad import numpy_grad_backward


def _bug(name: str) -> Callable:
    return numpy_grad_backward(bug=name)


BUGS: dict[str, tuple[str, Callable]] = {
    "dht_ignored": ("the final state's cotangent dht is treated as zero", _bug("dht_ignored")),
    "dh0_dropped": ("dh0 comes back as zeros", _bug("dh0_dropped")),
    "dv_missing_beta": ("dv = du: the factor beta is missing", _bug("dv_missing_beta")),
    "dbeta_uses_v": ("dbeta = du . v instead of du . (v - D^T k)", _bug("dbeta_uses_v")),
    "dg_wrt_decay": ("dg taken with respect to exp(g): the factor exp(g) is missing", _bug("dg_wrt_decay")),
    "chunk_boundary_decay_missing": (
        "the state cotangent crosses each 64-token chunk boundary without the boundary token's decay",
        _bug("chunk_boundary_decay_missing"),
    ),
    "dh0_undecayed": ("dh0 misses the first token's decay", _bug("dh0_undecayed")),
    "dg_chunk_end_missing": (
        "dg's per-chunk end term (<h, dh> exp(G_last) + inter-chunk k . dk) is left out",
        _bug("dg_chunk_end_missing"),
    ),
    "dg_cumsum16": (
        "dg's per-token terms and reverse chunk-local cumsum kept in 16 bits",
        _bug("dg_cumsum16"),
    ),
    "l2norm_backward_skipped": (
        "with the in-kernel l2norm, dq and dk are not taken through its backward",
        _bug("l2norm_backward_skipped"),
    ),
    "gva_first_head_only": (
        "with GVA, dq and dk take the first value head of each group instead of the group's sum",
        _bug("gva_first_head_only"),
    ),
    "dk_doubled": ("dk counts its WY half D_t dp_t twice", _bug("dk_doubled")),
    "varlen_tail_unwritten": (
        "gradients of the tokens after cu_seqlens[-1] are left unwritten (the buffer's NaN)",
        _bug("varlen_tail_unwritten"),
    ),
    "dh0_unwritten_without_dht": (
        "asked for dh0 with no dht given, dh0 is left unwritten (NaN)",
        _bug("dh0_unwritten_without_dht"),
    ),
    "nondeterministic_dk": (
        "dk's sum over value heads and halves runs in a random order each call (float32 atomics)",
        _bug("nondeterministic_dk"),
    ),
}

# The error models that name each bug rightly. The gradient error models are these same switches
# (one per bug, by the bug's name); a bug that only an exact contract catches (the padding's
# zeros, bitwise determinism) has no numeric cause to name.
RIGHT_CAUSES: dict[str, tuple[str, ...]] = {name: (name,) for name in BUGS}
RIGHT_CAUSES["varlen_tail_unwritten"] = ()
RIGHT_CAUSES["nondeterministic_dk"] = ()
RIGHT_CAUSES["dh0_unwritten_without_dht"] = ()  # NaN: no model of a rounding or a term reproduces it

# Where each bug shows (what a problem needs for the bug to change the gradients), for tests and
# the calibration benchmark: "dht" a final-state cotangent, "h0" an initial state, "l2norm" the
# in-kernel l2norm, "gva" HV > H, "varlen_tail" tokens after cu_seqlens[-1], "long" T > 64,
# "gated" gates that decay (moderate: exp(g) well below 1), "float32" float32 inputs (a 16-bit
# rounding is the size of the inputs' own otherwise), "determinism" two identical calls, "no_dht"
# no final-state cotangent given.
REGIMES: dict[str, tuple[str, ...]] = {
    "dht_ignored": ("dht",),
    "dh0_dropped": ("h0",),
    "dv_missing_beta": (),
    "dbeta_uses_v": (),
    "dg_wrt_decay": ("gated",),
    "chunk_boundary_decay_missing": ("long", "gated"),
    "dh0_undecayed": ("h0", "gated"),
    "dg_chunk_end_missing": ("dht",),
    "dg_cumsum16": ("float32",),
    "l2norm_backward_skipped": ("l2norm",),
    "gva_first_head_only": ("gva",),
    "dk_doubled": (),
    "varlen_tail_unwritten": ("varlen_tail",),
    "nondeterministic_dk": ("gva", "determinism"),
    "dh0_unwritten_without_dht": ("h0", "no_dht"),
}


def implementation(bug: str) -> Implementation:
    """``planted-grad:BUG``: the correct float32 forward and the backward with ``bug``."""
    if bug not in BUGS:
        raise ConfigurationError("impl", f"planted-grad:{bug}: unknown bug; choose from {', '.join(BUGS)}")
    description, fn = BUGS[bug]
    return Implementation(
        f"planted-grad:{bug}", {"chunk": numpy_impl.chunk_gated_delta_rule, "backward": fn}, description=description
    )
