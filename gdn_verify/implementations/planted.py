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

from gdn_verify.core.conventions import export_state, pack, unpack_output
from gdn_verify.core.implementation import SPEC_FORM, ConfigurationError, Implementation
from gdn_verify.core.reference import segment_sums, unit_lower_inverse
from gdn_verify.implementations import numpy_impl
from gdn_verify.implementations.spec import spec_reads_first_slot


def _packed(kw: dict, pad: int = 1):
    return pack(
        kw["q"],
        kw["k"],
        kw["v"],
        kw["g"],
        kw["beta"],
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


# Token-loop switches that round the state after every token: to bfloat16, float16, or (None)
# the input dtype. Only bf16_state is a planted bug; the others are error models of
# gdn_verify.runners.causes.
ROUNDED_STATE: dict[str, Any] = {"bf16_state": ml_dtypes.bfloat16, "fp16_state": np.float16, "input_dtype_state": None}


def token_loop(bug: str, **kw):
    """Float32 token loop with one arithmetic bug switched on (also the error models' switches
    ``alpha_as_g``, ``fp16_state``, ``input_dtype_state``)."""
    p = _packed(kw)
    S = p.initial_state.copy()
    N, L, HV, V = p.v.shape
    o = np.empty((N, L, HV, V), np.float32)
    for t in range(L):
        if bug == "gate_without_exp":
            decay = p.g[:, t]
        elif bug == "alpha_as_g":  # exp applied to a decay that is already linear: exp(exp(g))
            with np.errstate(over="ignore"):
                decay = np.exp(np.exp(p.g[:, t]))
        else:
            decay = np.exp(p.g[:, t])
        beta = p.beta[:, t, :, None] ** (2 if bug == "beta_twice" else 1)
        k_t = p.k[:, t, :, None, :]
        if bug == "output_before_update":
            o[:, t] = p.scale * (p.q[:, t, :, None, :] @ (S * decay[..., None, None]))[:, :, 0]
        if bug != "decay_after_update":
            S = S * decay[..., None, None]
        u = beta * (p.v[:, t] - (k_t @ S)[:, :, 0])
        S = S + k_t.swapaxes(-1, -2) * u[:, :, None, :]
        if bug == "decay_after_update":
            S = S * decay[..., None, None]
        if bug in ROUNDED_STATE:
            S = S.astype(ROUNDED_STATE[bug] or np.asarray(kw["v"]).dtype).astype(np.float32)
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
            else:
                gamma = np.exp(segment_sums(g))
        gamma = np.where(causal, gamma, 0.0).astype(np.float32)
        A = np.tril(beta[..., None] * (k @ k.swapaxes(-1, -2)) * gamma, -1)
        T = unit_lower_inverse(A)
        W = T @ ((beta * np.exp(G))[..., None] * k)
        U = T @ (beta[..., None] * v)
        v_new = U - W @ S
        o_chunk = p.scale * (np.exp(G)[..., None] * (q @ S) + ((q @ k.swapaxes(-1, -2)) * gamma) @ v_new)
        o[:, start : start + C] = np.moveaxis(o_chunk, 1, 2)
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
    "spec_reads_first_slot": (
        "speculative decoding starts from ssm_state_indices[n, 0], ignoring the accepted count",
        spec_reads_first_slot,
    ),
}


def implementation(bug: str) -> Implementation:
    """``planted:BUG``; a ``spec_`` bug is a speculative-decoding form, the others native."""
    if bug not in BUGS:
        raise ConfigurationError("impl", f"planted:{bug}: unknown bug; choose from {', '.join(BUGS)}")
    description, fn = BUGS[bug]
    form = SPEC_FORM if bug.startswith("spec_") else "default"
    return Implementation(f"planted:{bug}", {form: fn}, description=description)
