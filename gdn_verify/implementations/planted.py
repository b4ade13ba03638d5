"""Implementations with one planted bug each, for ``cli.py selftest``: every one must be caught.

Each is float32 and correct except for its bug. Bugs that live inside the arithmetic use the
small switchable loops below (a token loop and a chunk loop, deliberately plain); bugs in the
bookkeeping around a kernel wrap the correct NumPy implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from gdn_verify.core import gating
from gdn_verify.core.conventions import export_state, l2norm, pack, unpack_output
from gdn_verify.core.implementation import SPEC_FORM, ConfigurationError, Implementation
from gdn_verify.core.max_convention import native_form
from gdn_verify.core.reference import segment_sums, unit_lower_inverse
from gdn_verify.implementations import max_numpy, numpy_impl
from gdn_verify.implementations.speculative import spec_reads_first_slot, spec_reference


def _packed(kw: dict, pad: int = 1):
    """The loops' float32 inputs, FLA's in-kernel gate options applied first (as ``numpy_impl``
    does): a planted bug differs from a correct kernel by its bug alone under every property. (A
    loop that ignored the options failed ``in_kernel_gate`` for that instead, which "caught"
    ``beta_rounded_bf16`` on 16-bit inputs, where the bug is the identity.)"""
    g, beta = gating.float32_gates(kw["g"], kw["beta"], **{n: kw[n] for n in gating.OPTION_NAMES if n in kw})
    return pack(
        kw["q"],
        kw["k"],
        kw["v"],
        g,
        beta,
        kw.get("scale"),
        kw.get("initial_state"),
        kw.get("use_qk_l2norm_in_kernel", False),
        kw.get("state_v_first", False),
        kw.get("cu_seqlens"),
        dtype=np.float32,
        pad_to_multiple=pad,
    )


def _finish(p, o, S, kw):
    final_state = export_state(p, S).astype(np.float32) if kw.get("output_final_state") else None
    return unpack_output(p, o).astype(np.asarray(kw["v"]).dtype), final_state


def sixteen_bits(dtype) -> np.dtype:
    """The 16-bit type a kernel with ``dtype`` inputs would round to: the input dtype itself when
    it has 16 bits, else bfloat16 (the usual half type of a float32 kernel)."""
    dtype = np.dtype(dtype)
    return dtype if dtype.itemsize == 2 else np.dtype(ml_dtypes.bfloat16)


def _round(x: np.ndarray, dtype) -> np.ndarray:
    return np.asarray(x, np.float32).astype(dtype).astype(np.float32)


# Token-loop switches that round the state after every token: to bfloat16, float16, or (None)
# 16 bits (sixteen_bits of the input dtype). Only bf16_state is a planted bug; the others are
# error models of gdn_verify.runners.causes and forbidden models of the precision contract.
ROUNDED_STATE: dict[str, Any] = {"bf16_state": ml_dtypes.bfloat16, "fp16_state": np.float16, "state16": None}


def token_loop(bug: str, **kw):
    """Float32 token loop with one arithmetic bug switched on (also the error models' switches
    ``alpha_as_g``, ``fp16_state``, ``delta_without_erase`` (the update ``S += beta k v^T``
    without the erase ``-beta k k^T S``: gated linear attention), ``beta_on_write_only``
    (``S += k (beta v - S^T k)``), and the precision contract's ``state16``, ``decay16`` (the
    decay factor ``exp(g)`` rounded to 16 bits) and ``beta16`` (beta rounded to 16 bits inside
    the update)."""
    p = _packed(kw)
    S = p.initial_state.copy()
    N, L, HV, V = p.v.shape
    o = np.empty((N, L, HV, V), np.float32)
    half = sixteen_bits(np.asarray(kw["v"]).dtype)
    for t in range(L):
        if bug == "gate_without_exp":
            decay = p.g[:, t]
        elif bug == "gate_ignored":  # no decay at all
            decay = np.ones_like(p.g[:, t])
        elif bug == "alpha_as_g":  # exp applied to a decay that is already linear: exp(exp(g))
            with np.errstate(over="ignore"):
                decay = np.exp(np.exp(p.g[:, t]))
        elif bug == "decay16":
            decay = _round(np.exp(p.g[:, t]), half)
        elif bug == "log_of_log_gate":  # a linear-decay kernel's log(alpha + 1e-10) of a log-space g
            with np.errstate(invalid="ignore"):
                decay = np.exp(np.log(p.g[:, t] + np.float32(1e-10)))
        else:
            decay = np.exp(p.g[:, t])
        beta = p.beta[:, t, :, None] ** (2 if bug == "beta_twice" else 1)
        if bug == "beta16":
            beta = _round(beta, half)
        k_t = p.k[:, t, :, None, :]
        if bug == "output_before_update":
            o[:, t] = p.scale * (p.q[:, t, :, None, :] @ (S * decay[..., None, None]))[:, :, 0]
        if bug != "decay_after_update":
            S = S * decay[..., None, None]
        if bug == "delta_without_erase":
            u = beta * p.v[:, t]
        elif bug == "beta_on_write_only":
            u = beta * p.v[:, t] - (k_t @ S)[:, :, 0]
        else:
            u = beta * (p.v[:, t] - (k_t @ S)[:, :, 0])
        S = S + k_t.swapaxes(-1, -2) * u[:, :, None, :]
        if bug == "decay_after_update":
            S = S * decay[..., None, None]
        if bug in ROUNDED_STATE:
            S = _round(S, ROUNDED_STATE[bug] or half)
        if bug != "output_before_update":
            o[:, t] = p.scale * (p.q[:, t, :, None, :] @ S)[:, :, 0]
    return _finish(p, o, S, kw)


def chunk_loop(bug: str, chunk_size: int = 16, **kw):
    """Float32 chunked (WY/UT) form, one chunk at a time, with one arithmetic bug switched on."""
    C = chunk_size
    p = _packed(kw, pad=C)
    S = p.initial_state.copy()
    N, L, HV, V = p.v.shape
    o = np.empty((N, L, HV, V), np.float32)
    causal = np.tril(np.ones((C, C), bool), 0 if bug != "intra_chunk_excludes_diagonal" else -1)
    for start in range(0, L, C):
        q, k, v = (np.moveaxis(x[:, start : start + C], 2, 1) for x in (p.q, p.k, p.v))  # [N, HV, C, .]
        g, beta = (np.moveaxis(x[:, start : start + C], 2, 1) for x in (p.g, p.beta))  # [N, HV, C]
        G = np.cumsum(g, axis=-1)
        with np.errstate(all="ignore"):
            if bug == "gamma_ratio_of_exps":  # 0/0 once exp(G) underflows
                gamma = np.exp(G)[..., :, None] / np.exp(G)[..., None, :]
            elif bug == "safe_exp_as_causal_mask":  # exp(where(d <= 0, d, -inf)) as the only mask
                d = G[..., :, None] - G[..., None, :]
                gamma = np.exp(np.where(d <= 0, d, -np.inf))
            else:
                gamma = np.exp(segment_sums(g))
        mask = np.ones((C, C), bool) if bug == "safe_exp_as_causal_mask" else causal
        gamma = np.where(mask, gamma, 0.0).astype(np.float32)
        A = np.tril(beta[..., None] * (k @ k.swapaxes(-1, -2)) * gamma, -1)
        T = unit_lower_inverse(A)
        W = T @ ((beta * np.exp(G))[..., None] * k)
        U = T @ ((beta * np.exp(G) if bug == "wy_decay_on_u" else beta)[..., None] * v)
        v_new = U - W @ S
        o_chunk = p.scale * (np.exp(G)[..., None] * (q @ S) + ((q @ k.swapaxes(-1, -2)) * gamma) @ v_new)
        o[:, start : start + C] = np.moveaxis(o_chunk, 1, 2)
        if bug == "ragged_gate_from_padding":  # the cumsum's padded tail staged as 0: G_last = 0
            padding = (p.token_index[:, start : start + C] < 0)[:, None, :]
            G = np.where(padding, 0.0, G)
        decay_last = 1.0 if bug == "chunk_state_without_decay" else np.exp(G[..., -1])[..., None, None]
        S = decay_last * S + (k * np.exp(G[..., -1:] - G)[..., None]).swapaxes(-1, -2) @ v_new
    return _finish(p, o, S, kw)


def wrong_gva_mapping(**kw):
    """Value head h reads q/k head h % H instead of h // (HV // H)."""
    H, HV = kw["q"].shape[2], kw["v"].shape[2]
    heads = np.arange(HV) % H
    return numpy_impl.chunk_gated_delta_rule(**{**kw, "q": kw["q"][:, :, heads], "k": kw["k"][:, :, heads]})


def _per_sequence(kw: dict, run: Callable[[dict, int, object], tuple]):
    """Call ``run(kwargs_of_sequence_n, n, carried)`` per sequence and reassemble the outputs."""
    cu = kw.get("cu_seqlens")
    if cu is None:
        return numpy_impl.chunk_gated_delta_rule(**kw)
    o_parts, states, carried = [], [], None
    for n in range(len(cu) - 1):
        part = {name: kw[name][:, cu[n] : cu[n + 1]] for name in ("q", "k", "v", "g", "beta")}
        state = None if kw.get("initial_state") is None else kw["initial_state"][n : n + 1]
        sub = {**kw, **part, "initial_state": state, "cu_seqlens": None, "output_final_state": True}
        o, s, carried = run(sub, n, carried)
        o_parts.append(o)
        states.append(s)
    final_state = np.concatenate(states) if kw.get("output_final_state") else None
    return np.concatenate(o_parts, axis=1), final_state


def state_across_sequences(**kw):
    """Each sequence starts from the previous sequence's final state instead of its own."""

    def run(sub, n, carried):
        if carried is not None:
            sub["initial_state"] = carried
        o, s = numpy_impl.chunk_gated_delta_rule(**sub)
        return o, s, s

    return _per_sequence(kw, run)


def off_by_one_final_state(**kw):
    """The final state is the state before the last token of each sequence."""

    def run(sub, n, carried):
        o, s = numpy_impl.chunk_gated_delta_rule(**sub)
        if sub["q"].shape[1] > 0:
            shorter = {**sub, **{name: sub[name][:, :-1] for name in ("q", "k", "v", "g", "beta")}}
            _, s = numpy_impl.chunk_gated_delta_rule(**shorter)
        return o, s, None

    return _per_sequence(kw, run)


def ragged_chunk_reads_next(chunk_size: int = 16, **kw):
    """A sequence's ragged last chunk runs on into the next sequence's tokens (pollutes its state)."""
    cu = kw.get("cu_seqlens")

    def run(sub, n, carried):
        o, s = numpy_impl.chunk_gated_delta_rule(**sub, chunk_size=chunk_size)
        length = sub["q"].shape[1]
        overrun = min((-length) % chunk_size, int(cu[-1] - cu[n + 1]))
        if overrun:
            end = int(cu[n + 1]) + overrun
            longer = {name: kw[name][:, cu[n] : end] for name in ("q", "k", "v", "g", "beta")}
            _, s = numpy_impl.chunk_gated_delta_rule(**{**sub, **longer}, chunk_size=chunk_size)
        return o, s, None

    return _per_sequence(kw, run)


def nan_on_zero_rows(**kw):
    """l2norm without its epsilon: an all-zero (padding) q or k row gives NaN."""
    if kw.get("use_qk_l2norm_in_kernel"):
        with np.errstate(all="ignore"):
            q, k = (np.asarray(x, np.float32) for x in (kw["q"], kw["k"]))
            q = q / np.linalg.norm(q, axis=-1, keepdims=True)
            k = k / np.linalg.norm(k, axis=-1, keepdims=True)
        if not (np.isfinite(q).all() and np.isfinite(k).all()):
            B, T, HV, V = np.shape(kw["v"])
            o = np.full((B, T, HV, V), np.nan, np.asarray(kw["v"]).dtype)
            N = B if kw.get("cu_seqlens") is None else len(kw["cu_seqlens"]) - 1
            K = q.shape[-1]
            shape = (N, HV, V, K) if kw.get("state_v_first") else (N, HV, K, V)
            return o, (np.full(shape, np.nan, np.float32) if kw.get("output_final_state") else None)
    return numpy_impl.chunk_gated_delta_rule(**kw)


def default_scale_ignores_argument(**kw):
    """``scale`` is always ``K ** -0.5``, whatever the caller passes."""
    return numpy_impl.chunk_gated_delta_rule(**{**kw, "scale": None})


def state_layout_ignored(**kw):
    """``state_v_first`` is accepted but the state is read and written k-first."""
    return numpy_impl.chunk_gated_delta_rule(**{**kw, "state_v_first": False})


def _reads_v_first(state: np.ndarray) -> np.ndarray:
    """A k-first ``[.., K, V]`` buffer as a kernel that keeps its state v-first sees it: the same
    memory read as ``[.., V, K]`` (the transpose when ``K == V``), returned k-first."""
    return np.ascontiguousarray(
        np.asarray(state).reshape(*state.shape[:-2], state.shape[-1], state.shape[-2]).swapaxes(-1, -2)
    )


def state_other_layout(**kw):
    """The state kept v-first ``[.., V, K]`` whatever the caller asks: a k-first initial state is read
    as v-first memory and the final state handed back v-first (a release of the other layout
    behind an adapter written for this one). Right where ``state_v_first=True`` is asked."""
    if kw.get("state_v_first"):
        return numpy_impl.chunk_gated_delta_rule(**kw)
    h0 = kw.get("initial_state")
    o, state = numpy_impl.chunk_gated_delta_rule(**{**kw, "initial_state": None if h0 is None else _reads_v_first(h0)})
    return o, None if state is None else np.ascontiguousarray(state.swapaxes(-1, -2))


def gate_bias_ignored(**kw):
    """``use_gate_in_kernel`` computes ``-exp(A_log) * softplus(g)``, dropping ``dt_bias``."""
    return numpy_impl.chunk_gated_delta_rule(**{**kw, "dt_bias": None})


def neg_eigval_ignored(**kw):
    """``allow_neg_eigval`` is accepted but beta stays ``sigmoid(b)`` instead of ``2 sigmoid(b)``."""
    return numpy_impl.chunk_gated_delta_rule(**{**kw, "allow_neg_eigval": False})


def nondeterministic(**kw):
    """Results depend on a reduction order that changes between calls (one ulp here and there)."""
    o, s = numpy_impl.chunk_gated_delta_rule(**kw)
    if s is not None and s.size and np.random.default_rng().integers(2):
        flat = s.reshape(-1)
        i = np.argmax(np.abs(flat))  # one ulp on the largest element: invisible to the oracle comparison
        if flat[i] != 0:
            flat[i] = np.nextafter(flat[i], np.float32(np.inf))
    return o, s


def prenormalized(kw: dict, normalize: Callable[[np.ndarray], np.ndarray] = l2norm, dtype=None) -> dict:
    """``kw`` with q and k normalised by ``normalize`` in float32 (stored in ``dtype``, None: float32)
    and the in-kernel l2norm off: a kernel with its own l2norm stage. Unchanged without l2norm."""
    if not kw.get("use_qk_l2norm_in_kernel"):
        return kw
    q, k = (normalize(np.asarray(kw[name], np.float32)) for name in ("q", "k"))
    if dtype is not None:
        q, k = (x.astype(dtype).astype(np.float32) for x in (q, k))
    return {**kw, "q": q, "k": k, "use_qk_l2norm_in_kernel": False}


def _prenormalized(normalize: Callable[[np.ndarray], np.ndarray]) -> Callable[..., tuple]:
    return lambda **kw: numpy_impl.chunk_gated_delta_rule(**prenormalized(kw, normalize))


def l2norm_eps_outside_sqrt(x: np.ndarray) -> np.ndarray:
    """``x / (||x|| + 1e-6)``: the epsilon added to the norm, not inside the square root."""
    return x / (np.linalg.norm(x, axis=-1, keepdims=True) + np.float32(1e-6))


def l2norm_as_rmsnorm(x: np.ndarray) -> np.ndarray:
    """``x / sqrt(mean(x^2) + 1e-6)``: an RMS norm, so ``||x_hat|| = sqrt(K)``."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(1e-6))


def qk_l2norm_ignored(**kw):
    """``use_qk_l2norm_in_kernel=True`` is accepted but q and k are used as given."""
    return numpy_impl.chunk_gated_delta_rule(**{**kw, "use_qk_l2norm_in_kernel": False})


def gate_cumsum_bf16(**kw):
    """FLA's chunked form with its chunk-local gate cumsum in bfloat16."""
    return numpy_impl.chunk_fla_gated_delta_rule(**kw, cumsum_dtype=ml_dtypes.bfloat16)


def initial_state_ignored_varlen(**kw):
    """With ``cu_seqlens`` the initial state is not read (every sequence starts from zero)."""
    if kw.get("cu_seqlens") is None:
        return numpy_impl.chunk_gated_delta_rule(**kw)
    return numpy_impl.chunk_gated_delta_rule(**{**kw, "initial_state": None})


def empty_sequence_state_zeroed(**kw):
    """A sequence of length 0 returns a zero final state instead of its initial state."""
    o, state = numpy_impl.chunk_gated_delta_rule(**kw)
    if state is not None:
        B, T = np.shape(kw["q"])[:2]
        cu = kw.get("cu_seqlens")
        lengths = np.diff(np.asarray(cu)) if cu is not None else np.full(B, T)
        state = np.array(state)
        state[lengths == 0] = 0.0
    return o, state


def empty_sequence_shifts_outputs(**kw):
    """The output pass numbers the sequences over the non-empty ones only (a chunk index table built
    without the empty ones), and reads that number's ``cu_seqlens`` bounds: after a leading or middle
    empty sequence each later sequence's outputs land on an earlier sequence's bounds, and the last
    ones are never written (zeros here; uninitialised memory in a kernel). A trailing empty sequence
    is harmless. FLA <= 0.4.2's and vLLM's ``chunk_gated_delta_rule`` (H200, 2026-12-05)."""
    o, state = numpy_impl.chunk_gated_delta_rule(**kw)
    cu = kw.get("cu_seqlens")
    if cu is None:
        return o, state
    bounds = np.asarray(cu)
    written = np.zeros_like(o)
    nonempty = [n for n in range(len(bounds) - 1) if bounds[n + 1] > bounds[n]]
    for j in range(len(nonempty)):  # the j-th non-empty sequence's chunks read sequence j's bounds
        written[:, bounds[j] : bounds[j + 1]] = o[:, bounds[j] : bounds[j + 1]]
    return written, state


def inputs_read_as_bf16(**kw):
    """q, k and v read as bfloat16 whatever their dtype (float16 inputs down a path written for
    bfloat16): each element rounded to bfloat16's 8-bit significand before the arithmetic."""
    read = {n: np.asarray(kw[n]).astype(ml_dtypes.bfloat16).astype(np.asarray(kw[n]).dtype) for n in "qkv"}
    return numpy_impl.chunk_gated_delta_rule(**{**kw, **read})


def key_dim_tail_truncated(**kw):
    """Key dims past the last full 32-wide tile are dropped (``32 * (K // 32)`` of them kept, K > 32)."""
    K = np.shape(kw["q"])[-1]
    return truncated_keys(kw, 32 * (K // 32) if K > 32 else K)


def truncated_keys(kw: dict, kept: int):
    """The native call with key dims ``kept`` and after dropped (after the in-kernel l2norm over the
    whole row; the default scale still ``K ** -0.5``); the dropped state rows keep their initial state."""
    K = np.shape(kw["q"])[-1]
    if kept == K:
        return numpy_impl.chunk_gated_delta_rule(**kw)
    q, k = (np.asarray(kw[name], np.float32) for name in ("q", "k"))
    if kw.get("use_qk_l2norm_in_kernel"):  # normalised over the whole row, then truncated
        q, k = l2norm(q), l2norm(k)
    state = kw.get("initial_state")
    v_first = kw.get("state_v_first", False)
    if state is not None:
        state = np.asarray(state)[..., :kept] if v_first else np.asarray(state)[..., :kept, :]
    o, out = numpy_impl.chunk_gated_delta_rule(
        **{
            **kw,
            "q": q[..., :kept],
            "k": k[..., :kept],
            "initial_state": state,
            "use_qk_l2norm_in_kernel": False,
            "scale": K**-0.5 if kw.get("scale") is None else kw["scale"],
        }
    )
    if out is not None:  # the dropped rows keep their initial state (zero without one)
        full = np.zeros(out.shape[:-1] + (K,) if v_first else out.shape[:-2] + (K, out.shape[-1]), np.float32)
        if kw.get("initial_state") is not None:
            full[...] = kw["initial_state"]
        if v_first:
            full[..., :kept] = out
        else:
            full[..., :kept, :] = out
        out = full
    return o, out


def scale_from_value_dim(**kw):
    """The default scale is ``V ** -0.5`` instead of ``K ** -0.5``."""
    V = np.shape(kw["v"])[-1]
    return numpy_impl.chunk_gated_delta_rule(**{**kw, "scale": V**-0.5 if kw.get("scale") is None else kw["scale"]})


def spec_gates_not_regathered(
    q, k, v, g, beta, state_pool, cu_seqlens, ssm_state_indices, num_accepted_tokens, scale=None,
    use_qk_l2norm_in_kernel=False,
):  # fmt: skip
    """A batch of one-token (decode) and several-token (speculative) requests is split in two and the
    speculative requests' gates are not gathered again (vLLM PR #51812): a speculative request reads
    ``g`` and ``beta`` from its token offset less the number of one-token requests before it (its
    offset in a batch without them). q, k, v are read at the right offsets; a batch with no
    one-token request before a longer one is right."""
    cu = np.asarray(cu_seqlens, np.int64)
    lengths = np.diff(cu)
    g_read, beta_read = np.array(g), np.array(beta)
    for n in np.flatnonzero(lengths > 1):
        shift = int(np.sum(lengths[:n] == 1))
        if shift:
            g_read[:, cu[n] : cu[n + 1]] = np.asarray(g)[:, cu[n] - shift : cu[n + 1] - shift]
            beta_read[:, cu[n] : cu[n + 1]] = np.asarray(beta)[:, cu[n] - shift : cu[n + 1] - shift]
    return spec_reference(
        q, k, v, g_read, beta_read, state_pool, cu_seqlens, ssm_state_indices, num_accepted_tokens, scale,
        use_qk_l2norm_in_kernel,
    )  # fmt: skip


def _loop(fn, bug):
    return lambda **kw: fn(bug, **kw)


BUGS: dict[str, tuple[str, Callable]] = {
    "gate_without_exp": ("the decay multiplies by g instead of exp(g)", _loop(token_loop, "gate_without_exp")),
    "decay_after_update": (
        "the state decays after the update instead of before",
        _loop(token_loop, "decay_after_update"),
    ),
    "output_before_update": ("o_t reads the state before token t's update", _loop(token_loop, "output_before_update")),
    "beta_twice": ("beta is applied twice (beta^2)", _loop(token_loop, "beta_twice")),
    "bf16_state": ("the state is rounded to bfloat16 after every token", _loop(token_loop, "bf16_state")),
    "wrong_gva_mapping": ("value head h reads q/k head h % H", wrong_gva_mapping),
    "state_across_sequences": ("the state is carried from one sequence into the next", state_across_sequences),
    "off_by_one_final_state": ("the final state misses the last token", off_by_one_final_state),
    "ragged_chunk_reads_next": ("a ragged last chunk reads the next sequence's tokens", ragged_chunk_reads_next),
    "gamma_ratio_of_exps": (
        "gate ratios as exp(G_i)/exp(G_j): NaN on saturated gates",
        _loop(chunk_loop, "gamma_ratio_of_exps"),
    ),
    "chunk_state_without_decay": (
        "state passing omits the chunk's total decay",
        _loop(chunk_loop, "chunk_state_without_decay"),
    ),
    "intra_chunk_excludes_diagonal": (
        "the intra-chunk causal mask drops the current token",
        _loop(chunk_loop, "intra_chunk_excludes_diagonal"),
    ),
    "nan_on_zero_rows": ("l2norm without epsilon: zero rows give NaN", nan_on_zero_rows),
    "scale_ignored": ("the scale argument is ignored", default_scale_ignores_argument),
    "state_layout_ignored": ("state_v_first is accepted but ignored", state_layout_ignored),
    "gate_bias_ignored": ("use_gate_in_kernel drops dt_bias", gate_bias_ignored),
    "neg_eigval_ignored": ("allow_neg_eigval is accepted but ignored", neg_eigval_ignored),
    "nondeterministic": ("results change between identical calls", nondeterministic),
    # Bug classes reported in FLA, vLLM, FlashInfer, SGLang, llama.cpp and others (docs/causes.md).
    "l2norm_eps_outside_sqrt": (
        "l2norm as x / (||x|| + eps) instead of x / sqrt(||x||^2 + eps)",
        _prenormalized(l2norm_eps_outside_sqrt),
    ),
    "l2norm_as_rmsnorm": ("l2norm computed as an RMS norm (mean instead of sum)", _prenormalized(l2norm_as_rmsnorm)),
    "qk_l2norm_ignored": ("use_qk_l2norm_in_kernel is accepted but ignored", qk_l2norm_ignored),
    "beta_rounded_bf16": ("beta rounded to bfloat16 inside the update", _loop(token_loop, "beta16")),
    "gate_cumsum_bf16": ("the chunk-local gate cumsum kept in bfloat16", gate_cumsum_bf16),
    "log_of_log_gate": (
        "log-space g passed to a kernel that takes log(alpha): decay exp(log(g + 1e-10))",
        _loop(token_loop, "log_of_log_gate"),
    ),
    "initial_state_ignored_varlen": ("with cu_seqlens the initial state is ignored", initial_state_ignored_varlen),
    "empty_sequence_state_zeroed": ("a sequence of length 0 returns a zero final state", empty_sequence_state_zeroed),
    "empty_sequence_shifts_outputs": (
        "outputs placed by a sequence number that skips empty sequences",
        empty_sequence_shifts_outputs,
    ),
    "inputs_read_as_bf16": ("q, k and v rounded to bfloat16 whatever their dtype", inputs_read_as_bf16),
    "ragged_gate_from_padding": (
        "a ragged last chunk takes G_last from its zero-staged padding",
        _loop(chunk_loop, "ragged_gate_from_padding"),
    ),
    "key_dim_tail_truncated": ("key dims past the last full 32-wide tile are dropped", key_dim_tail_truncated),
    "wy_decay_on_u": ("the WY form applies exp(G) to U as well as W", _loop(chunk_loop, "wy_decay_on_u")),
    "scale_from_value_dim": ("the default scale is V^-0.5 instead of K^-0.5", scale_from_value_dim),
    "safe_exp_as_causal_mask": (
        "exp(where(d <= 0, d, -inf)) as the only causal mask: g = 0 lets the future in",
        _loop(chunk_loop, "safe_exp_as_causal_mask"),
    ),
    # Seen against released versions of FLA and vLLM on an H200 (2026-12-04): a state in the other
    # release's layout, and a kernel whose gate did nothing.
    "state_other_layout": ("the state read and handed back v-first where k-first is asked for", state_other_layout),
    "gate_ignored": ("the gate is ignored: no decay at all", _loop(token_loop, "gate_ignored")),
    "spec_reads_first_slot": (
        "speculative decoding starts from ssm_state_indices[n, 0], ignoring the accepted count",
        spec_reads_first_slot,
    ),
    "spec_gates_not_regathered": (
        "after one-token rows, a speculative row reads g and beta at its offset less their count",
        spec_gates_not_regathered,
    ),
    # Kernels in Modular MAX's convention (max_numpy.py), run through --convention max's adapter.
    "max_decay_as_log_rate": (
        "MAX convention: the linear decay_per_token read as a log-space rate, the state times exp(-decay)",
        native_form(max_numpy.with_bug("decay_as_log_rate")),
    ),
    "max_slot_read_off_by_one": (
        "MAX convention: the state read from pool row slot_idx[b] + 1 (stored back to slot_idx[b])",
        native_form(max_numpy.with_bug("slot_read_off_by_one")),
    ),
}


# The error models of gdn_verify.runners.causes that name each bug rightly (by model name; a bug
# caught by an exact contract or in the speculative-decoding form has no numeric cause to name).
RIGHT_CAUSES: dict[str, tuple[str, ...]] = {
    "gate_without_exp": ("gate_without_exp",),
    "decay_after_update": ("decay_after_update",),
    # The same observable mistake in two forms: o_t misses token t's own update (exactly, any C).
    "output_before_update": (
        "output_before_update",
        "intra_chunk_excludes_diagonal_c16",
        "intra_chunk_excludes_diagonal_c64",
    ),
    "beta_twice": ("beta_twice",),
    "bf16_state": ("bf16_state", "state16"),
    "wrong_gva_mapping": ("wrong_gva_mapping",),
    "state_across_sequences": ("state_across_sequences",),
    "off_by_one_final_state": ("off_by_one_final_state",),
    "ragged_chunk_reads_next": ("ragged_chunk_reads_next_c16",),
    "gamma_ratio_of_exps": ("gamma_ratio_of_exps",),
    "chunk_state_without_decay": ("chunk_state_without_decay_c16",),
    "intra_chunk_excludes_diagonal": ("intra_chunk_excludes_diagonal_c16", "output_before_update"),
    "nan_on_zero_rows": ("nan_on_zero_rows",),
    "scale_ignored": ("scale_ignored",),
    "state_layout_ignored": ("state_layout_ignored",),
    # Without an initial state reading it v-first changes nothing: only the returned state shows.
    "state_other_layout": ("state_transposed", "final_state_transposed"),
    "gate_ignored": ("gate_ignored",),
    "gate_bias_ignored": ("gate_bias_ignored",),
    "neg_eigval_ignored": ("neg_eigval_ignored",),
    "nondeterministic": (),
    "spec_reads_first_slot": (),
    "spec_gates_not_regathered": (),
    # exp(-exp(g)) is no error model's decay; the row after an item's slot is a spare zero row
    # (max_convention's layout), so the state read is zero: the initial state ignored.
    "max_decay_as_log_rate": ("decay_as_log_rate",),
    "max_slot_read_off_by_one": ("initial_state_ignored",),
    "l2norm_eps_outside_sqrt": ("l2norm_eps_outside_sqrt", "l2norm_without_eps"),
    "l2norm_as_rmsnorm": ("l2norm_as_rmsnorm",),
    "qk_l2norm_ignored": ("qk_l2norm_ignored",),
    "beta_rounded_bf16": ("beta16",),
    "gate_cumsum_bf16": ("cumsum16", "cumsum_bf16"),
    "log_of_log_gate": ("log_of_log_gate",),
    "initial_state_ignored_varlen": ("initial_state_ignored",),
    "empty_sequence_state_zeroed": ("empty_sequence_state_zeroed",),
    "empty_sequence_shifts_outputs": ("empty_sequence_shifts_outputs",),
    "inputs_read_as_bf16": ("inputs_bf16",),
    "ragged_gate_from_padding": ("ragged_gate_from_padding_c16",),
    "key_dim_tail_truncated": ("key_dim_tail_truncated",),
    "wy_decay_on_u": ("wy_decay_on_u_c16",),
    "scale_from_value_dim": ("scale_from_value_dim",),
    "safe_exp_as_causal_mask": ("safe_exp_as_causal_mask_c16",),
}


# Bugs that are no bug on some input dtypes: selftest lists them there as not applicable, unrun.
NOT_A_BUG_ON: dict[str, tuple[tuple[str, ...], str]] = {
    "inputs_read_as_bf16": (("bfloat16",), "bfloat16 inputs read as bfloat16 is the identity"),
    "beta_rounded_bf16": (
        ("float16", "bfloat16"),
        "beta already is 16 bits, so the rounding is the identity; from in-kernel sigmoid logits "
        "it is one rounding of the inputs' own size (docs/precision.md)",
    ),
}


def not_applicable(dtype: str) -> dict[str, str]:
    """The bugs that are no bug on ``dtype`` inputs, with the reason."""
    return {bug: why for bug, (dtypes, why) in NOT_A_BUG_ON.items() if dtype in dtypes}


def implementation(bug: str) -> Implementation:
    """``planted:BUG``; a ``spec_`` bug is a speculative-decoding form, the others native."""
    if bug not in BUGS:
        raise ConfigurationError("impl", f"planted:{bug}: unknown bug; choose from {', '.join(BUGS)}")
    description, fn = BUGS[bug]
    form = SPEC_FORM if bug.startswith("spec_") else "default"
    return Implementation(f"planted:{bug}", {form: fn}, description=description)
