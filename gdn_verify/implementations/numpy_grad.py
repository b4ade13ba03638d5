"""NumPy backwards of the gated delta rule in the functional convention: float32 and 16-bit models.

One backward, :func:`backward`, written as the token-by-token adjoint of ``docs/gradients.md``
(the oracle's algebra, ``core.gradients``) in a working dtype, with keyword switches; every model
here, every planted gradient bug (``planted_grad.py``) and every probe of the gradient tolerance
model (``core.grad_tolerance``) is that one function (its engine :func:`adjoint`) with different
switches. Per sequence and value head, ``a_t = exp(g_t)``::

    forward   D_t = a_t S_{t-1};  r_t = v_t - D_t^T k_t;  u_t = beta_t r_t;  S_t = D_t + k_t u_t^T
    reverse   dS += scale q_t do_t^T;  du_t = dS^T k_t;  dp_t = -beta_t du_t;  dS <- a_t (dS + k_t dp_t^T)
    batched   dq_t = scale S_t do_t      dk_t = dS_t u_t + D_t dp_t      dv_t = beta_t du_t
              dbeta_t = du_t . r_t       dg_t = <dS_t, D_t> + (D_t^T k_t) . dp_t

The work is organised like a chunked production backward (FLA's ``chunk_gated_delta_rule_bwd``),
``chunk_size`` tokens per chunk, chunks aligned to each sequence's start: the forward keeps the
state entering each chunk (``h``), the reverse pass recomputes a chunk's states from it, and the
state cotangent leaving a chunk (``dh``) is what the chunk's products read. The sequential part
loops over tokens only; everything is vectorised over sequences and value heads.

**The 16-bit model** (``sixteen=`` a 16-bit dtype) rounds, once, what FLA's chunked backward
stores in the input dtype, and nothing else (:data:`SIXTEEN_STAGES`):

- ``qk``: the l2-normalised q and k (``l2norm_fwd``'s output), with ``use_qk_l2norm_in_kernel``;
- ``h``: the state entering each chunk as the chunk's products read it (FLA's ``h``), and
  ``dh``: the state cotangent leaving each chunk as the chunk's products read it (FLA's ``dh``).
  The carried float32 state and the carried float32 state cotangent are *not* rounded: the chunk
  reads ``round(h)``, and the difference ``h - round(h)`` is carried on, decayed, to the next
  chunk (in exact arithmetic this is FLA's ``h_{c+1} = exp(G_C) h_c + K^T (U - W round(h_c))``;
  likewise for ``dh``);
- ``v_new``: each token's write ``u_t`` (FLA's ``v_new = U - W h``, the same vector), stored and
  fed to the state update, so its rounding is carried; ``dv_new``: each token's ``du_t`` (FLA's
  ``dv2``, the cotangent of ``v_new``), stored and fed to the cotangent update, ``dk``, ``dv``
  and ``dbeta``;
- ``dq``, ``dk_state``, ``dk_pred``: the per-value-head parts of ``dq`` and ``dk`` (FLA stores
  ``dq`` and both halves of ``dk`` per value head in the input dtype before the GVA sum and
  ``dk.add_(dk2)``); ``dk_state = dS_t u_t`` is the half of ``chunk_bwd_dqkwg``, ``dk_pred =
  D_t dp_t`` the half of ``prepare_wy_repr_bwd``;
- ``q_operand``, ``k_operand``, ``w_operand``: the reverse pass's product operands, per token
  (``scale q_t`` of the cotangent update, ``k_t`` as ``du_t`` and as the erase update read it:
  FLA's ``q scale exp(G)``, decayed ``k`` and recomputed ``W``, cast to the input dtype for its
  tensor-core products);
- the outputs ``dq, dk, dv, dg, dbeta`` in the input dtype (``dh0`` float32).

Everything else is float32 arithmetic. ``dg_form="cumsum"`` forms ``dg`` as FLA does, per-token
terms then a reverse chunk-local cumsum (float32; ``cumsum_dtype`` for a forbidden 16-bit one).
The per-token term is the derivative with respect to the chunk-local gate cumsum ``G_t``;
``dg_t - dg_{t+1} = do_t . o_t - v_t . dv_t`` exactly, and FLA splits it over its two kernels so
that each part is small where ``dg`` is (strong gates) and the cancelling pairs share their
rounded operands. With ``dS~`` the cotangent carried by the decays alone (no erase terms; from
``dh`` at the chunk's end), ``w_t = dS~_t^T k_t`` and ``e_t = du_t - w_t``::

    dG_t = do_t . o_t - u_t . w_t                  (chunk_bwd_dqkwg: q . dq - k . dk)
         - beta_t (pred_t . w_t + v_t . e_t)       (prepare_wy_repr_bwd: the WY part)
         (+ <S_t, dh> at the chunk's last token: b_dg_last)

and ``dg_t`` is its sum from ``t`` to the chunk's end. (Written as ``do . o - v . dv``, the same
sum in exact arithmetic, the 16-bit ``v_new`` and ``dv2`` would each break an O(1) cancellation.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from gdn_verify.core.adjoint import (  # noqa: F401 - re-exported for planted_grad and the tests
    DG_FORMS,
    ENGINE_BUGS,
    KNOWN_BUGS,
    adjoint,
    assemble,
    cotangent,
    gather,
    rounder,
)
from gdn_verify.core.conventions import pack
from gdn_verify.core.implementation import Implementation
from gdn_verify.implementations import numpy_impl
from gdn_verify.implementations.planted import sixteen_bits


def backward(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    use_qk_l2norm_in_kernel=False,
    cu_seqlens=None,
    *,
    do,
    dht=None,
    work=np.float32,
    sixteen=None,
    chunk_size: int = 64,
    dg_form: str = "direct",
    cumsum_dtype=None,
    bug: str | None = None,
    state_v_first: bool = False,
):
    """Gradients ``(dq, dk, dv, dg, dbeta, dh0)`` of ``sum(do * o) + sum(dht * final_state)``.

    Inputs in FLA's convention (``Implementation.run_backward``); tokens after
    ``cu_seqlens[-1]`` are padding and get exactly zero gradients. ``work``: the working dtype
    (float32; float64 reproduces the oracle); ``sixteen``: a 16-bit dtype to round the stages of
    :data:`SIXTEEN_STAGES` to (see the module docstring; None: no rounding); ``chunk_size``: the
    chunk of the ``h``/``dh`` roundings and of ``dg_form="cumsum"``; ``cumsum_dtype``: the dtype
    of that cumsum (None: ``work``); ``bug``: one of :data:`KNOWN_BUGS` (``planted_grad.py``).
    Returns ``dq, dk, dv`` in the input dtype (q's, v's), ``dg`` in g's, ``dbeta`` in beta's,
    ``dh0`` in the initial state's dtype (at least float32), None without an initial state.
    """
    if bug is not None and bug not in KNOWN_BUGS:
        raise ValueError(f"bug: unknown gradient bug {bug!r}; choose from {', '.join(KNOWN_BUGS)}")
    if dg_form not in DG_FORMS:
        raise ValueError(f"dg_form: expected one of {DG_FORMS}, got {dg_form!r}")
    if not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ValueError(f"chunk_size: must be a positive integer, got {chunk_size!r}")
    work = np.dtype(work)
    dtypes = {name: np.asarray(x).dtype for name, x in (("q", q), ("v", v), ("g", g), ("beta", beta))}
    for name, x in (("q", q), ("v", v)):
        if np.ndim(x) != 4:
            raise ValueError(f"{name}: expected rank 4, got shape {np.shape(x)}")
    B, T, H, K = np.shape(q)
    HV, V = np.shape(v)[2], np.shape(v)[3]
    do = cotangent("do", do, (B, T, HV, V), work)
    # Tokens after cu_seqlens[-1] belong to no sequence: computed without them, their gradients 0.
    end = T
    if cu_seqlens is not None and np.ndim(cu_seqlens) == 1 and np.size(cu_seqlens) >= 1:
        end = min(T, max(0, int(np.asarray(cu_seqlens)[-1])))
    inputs = [np.asarray(x)[:, :end] for x in (q, k, v, g, beta)]
    p = pack(
        *inputs,
        scale,
        initial_state,
        use_qk_l2norm_in_kernel,
        state_v_first,
        cu_seqlens,
        dtype=work,
        pad_to_multiple=int(chunk_size),
    )
    N = p.initial_state.shape[0]
    dS = np.zeros((N, HV, K, V), work)
    if dht is not None:  # checked even where dht_ignored then drops it
        given = cotangent("dht", dht, (N, HV, V, K) if state_v_first else (N, HV, K, V), work)
        if bug != "dht_ignored":
            dS = given.swapaxes(-1, -2) if state_v_first else given
    hook = None
    if sixteen is not None:
        hook = rounder(sixteen)
        if use_qk_l2norm_in_kernel:
            with np.errstate(over="ignore"):
                p = dataclasses.replace(p, q=hook("qk", p.q, 0), k=hook("qk", p.k, 0))
    if bug == "dg_cumsum16":
        dg_form, cumsum_dtype = "cumsum", sixteen_bits(dtypes["v"])
    if bug == "dg_chunk_end_missing":
        dg_form = "cumsum"
    p_do = gather(p, do[:, :end], work)
    # Like a kernel, silently: a value past a 16-bit store's range becomes inf, inf - inf NaN.
    with np.errstate(over="ignore", invalid="ignore"):
        grads = adjoint(
            p,
            p_do,
            dS,
            chunk_size=int(chunk_size),
            hook=hook,
            dg_form=dg_form,
            cumsum_dtype=cumsum_dtype,
            bug=bug if bug in ENGINE_BUGS else None,
        )
        raw_q, raw_k = (x.astype(work) for x in inputs[:2])
        out = assemble(p, grads, raw_q, raw_k, H, use_qk_l2norm_in_kernel, bug)
    result = []
    for name, dtype in (("dq", dtypes["q"]), ("dk", dtypes["q"]), ("dv", dtypes["v"]), ("dg", dtypes["g"])):
        result.append(_padded(out[name], T, dtype, bug))
    result.append(_padded(out["dbeta"], T, dtypes["beta"], bug))
    dh0 = None
    if initial_state is not None:
        state_dtype = np.promote_types(np.float32, np.asarray(initial_state).dtype)
        dh0 = np.zeros_like(out["dh0"], state_dtype) if bug == "dh0_dropped" else out["dh0"].astype(state_dtype)
        if bug == "dh0_unwritten_without_dht" and dht is None:
            dh0 = np.full_like(dh0, np.nan)  # the buffer as allocated (torch.empty; NaN, the checks' poison)
    return (*result, dh0)


def _padded(x: np.ndarray, T: int, dtype, bug: str | None) -> np.ndarray:
    """``x`` ``[B, end, ...]`` in ``dtype``, extended to ``T`` tokens: zeros (written), or with
    ``varlen_tail_unwritten`` whatever an unwritten buffer held (NaN: the poison of the checks)."""
    end = x.shape[1]
    if end == T:
        with np.errstate(over="ignore"):  # beyond the dtype's range: inf, as a kernel's cast returns
            return x.astype(dtype)
    out = np.empty((x.shape[0], T) + x.shape[2:], dtype)
    with np.errstate(over="ignore"):
        out[:, :end] = x
    out[:, end:] = np.nan if bug == "varlen_tail_unwritten" else 0.0
    return out


def _sixteen_of_input(**kw):
    """FLA's 16-bit roundings in the input dtype: with 16-bit inputs round to it; float32 (or
    float64) inputs are stored in their own dtype, so nothing is rounded (the precision contract:
    "in the input dtype")."""
    dtype = np.asarray(kw["v"]).dtype
    return dtype if dtype.itemsize == 2 else None


def numpy_grad_backward(**options) -> Callable:
    """The functional backward :func:`backward` with ``options`` fixed (``sixteen="input"``: the
    input dtype when it has 16 bits, else no rounding)."""

    def fn(
        q,
        k,
        v,
        g,
        beta,
        scale=None,
        initial_state=None,
        use_qk_l2norm_in_kernel=False,
        cu_seqlens=None,
        *,
        do,
        dht=None,
    ):
        kw = dict(
            q=q,
            k=k,
            v=v,
            g=g,
            beta=beta,
            scale=scale,
            initial_state=initial_state,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            cu_seqlens=cu_seqlens,
            do=do,
            dht=dht,
        )
        opts = dict(options)
        if opts.get("sixteen") == "input":
            opts["sixteen"] = _sixteen_of_input(**kw)
        return backward(**kw, **opts)

    return fn


# The built-in models: name -> (description, options of ``backward``).
MODELS: dict[str, tuple[str, dict]] = {
    "numpy-grad": ("float32 token-by-token adjoint (NumPy), dg as the oracle forms it", {}),
    "numpy-grad16": (
        "FLA's chunked backward as a NumPy model: h, dh, v_new, dv2, the dq/dk parts and l2-normalised q/k "
        "stored in the 16-bit input dtype once per chunk, float32 carried state and cotangent, dg as a "
        "float32 reverse chunk-local cumsum (C=64)",
        {"sixteen": "input", "dg_form": "cumsum", "chunk_size": 64},
    ),
}


def numpy_grad_implementation(name: str = "numpy-grad", **options) -> Implementation:
    """``numpy-grad`` or ``numpy-grad16`` (:data:`MODELS`): forms ``{"chunk": numpy_impl's float32
    chunked forward, "backward": the model}``. ``options`` override the model's ``backward`` keywords."""
    if name not in MODELS:
        raise ValueError(f"name: unknown NumPy backward {name!r}; choose from {', '.join(MODELS)}")
    description, defaults = MODELS[name]
    fn = numpy_grad_backward(**{**defaults, **options})
    return Implementation(name, {"chunk": numpy_impl.chunk_gated_delta_rule, "backward": fn}, description=description)
