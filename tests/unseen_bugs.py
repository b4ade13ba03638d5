"""Bugs written apart from the error models: does a named cause generalise to a kernel it never saw?

The planted bugs of ``gdn_verify.implementations.planted`` share code with the error models that
name them, so the selftest's "right" count measures the confirmation step, not whether a model
recognises the same mistake made by someone else. These 19 kernels are one plain float32 token
loop of their own (nothing shared with ``planted``, ``numpy_impl`` or the models), each with one
mistake switched on: twelve of mistakes the catalogue had before 2026-12 and seven it had not.
The module has the planted-bug interface (``BUGS``, ``RIGHT_CAUSES``, ``implementation``), so
``runners.selftest.run_selftest(..., bugs=unseen_bugs)`` runs them.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from gdn_verify.core.implementation import Implementation


def _normalised(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + np.float32(1e-6))


def loop(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    cu_seqlens=None,
    state_v_first=False,
    *,
    mistake: str = "",
):
    """The gated delta rule one token at a time in float32, per (sequence, value head), with one
    ``mistake`` (empty: none)."""
    q, k, v, g, beta = (np.asarray(x, np.float32) for x in (q, k, v, g, beta))
    B, T, H, K = q.shape
    HV, V = v.shape[2:]
    if use_qk_l2norm_in_kernel:
        q, k = _normalised(q), _normalised(k)
    if mistake == "qk_swapped":
        q, k = k, q
    s = np.float32(K**-0.5 if scale is None else scale)
    if mistake == "unscaled_output":
        s = np.float32(1.0)
    if mistake == "scale_from_v" and scale is None:
        s = np.float32(V**-0.5)
    flat = {
        name: x.reshape((B * T,) + x.shape[2:]) for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("b", beta))
    }
    heads = np.arange(HV) % H if mistake == "gva_modulo" else np.arange(HV) // (HV // H)
    bounds = np.arange(B + 1) * T if cu_seqlens is None else np.asarray(cu_seqlens, np.int64)
    N = len(bounds) - 1
    o = np.zeros((B * T, HV, V), np.float32)
    final = np.zeros((N, HV, K, V), np.float32)
    for n in range(N):  # every value head at once: S [HV, K, V]
        S = np.zeros((HV, K, V), np.float32)
        if initial_state is not None and mistake != "h0_ignored":
            h0 = np.asarray(initial_state, np.float32)[n]
            S = h0.swapaxes(-1, -2).copy() if state_v_first else h0.copy()
            if mistake == "state_other_layout":  # the k-first buffer read as a v-first one
                S = h0.reshape(HV, V, K).swapaxes(-1, -2).copy()
        if mistake == "carried_across" and n > 0:
            S = final[n - 1].copy()
        before_last = S
        for t in range(bounds[n], bounds[n + 1]):
            qt, kt, vt = flat["q"][t, heads], flat["k"][t, heads], flat["v"][t]  # [HV, K], [HV, K], [HV, V]
            gt, bt = flat["g"][t][:, None, None], flat["b"][t][:, None]
            decay = {"no_exp": gt, "gate_ignored": np.ones_like(gt), "gate_sign": np.exp(-gt)}.get(mistake)
            decay = np.exp(gt) if decay is None else decay
            b_use = {"beta_squared": bt * bt, "beta_ignored": np.ones_like(bt)}.get(mistake, bt)
            before_last = S
            if mistake == "read_before_write":
                o[t] = s * np.einsum("hk,hkv->hv", qt, decay * S)
            if mistake != "decay_after_write":
                S = decay * S
            read = np.einsum("hk,hkv->hv", kt, S)
            if mistake == "no_erase":
                u = b_use * vt
            elif mistake == "beta_write_only":
                u = b_use * vt - read
            else:
                u = b_use * (vt - read)
            S = S + kt[:, :, None] * u[:, None, :]
            if mistake == "decay_after_write":
                S = decay * S
            if mistake == "bf16_state":
                S = S.astype(ml_dtypes.bfloat16).astype(np.float32)
            if mistake != "read_before_write":
                o[t] = s * np.einsum("hk,hkv->hv", qt, S)
        final[n] = before_last if mistake == "final_before_last_token" else S
    out = o.reshape(B, T, HV, V).astype(np.asarray(v).dtype)
    if not output_final_state:
        return out, None
    if state_v_first or mistake in ("state_other_layout", "final_state_transposed"):
        final = np.ascontiguousarray(final.swapaxes(-1, -2))
    return out, final


def _with(mistake: str):
    def run(**kw):
        return loop(**kw, mistake=mistake)

    run.__name__ = mistake
    return run


# name -> (description, the error models that name it rightly)
CATALOGUE: dict[str, tuple[str, tuple[str, ...]]] = {
    # mistakes the catalogue already modelled
    "no_exp": ("the decay is g, not exp(g)", ("gate_without_exp",)),
    "beta_squared": ("beta applied twice", ("beta_twice",)),
    "beta_ignored": ("beta taken as 1", ("beta_ignored",)),
    "decay_after_write": ("the state decays after the update", ("decay_after_update",)),
    "read_before_write": (
        "o_t reads the state before token t's update",
        ("output_before_update", "intra_chunk_excludes_diagonal_c16", "intra_chunk_excludes_diagonal_c64"),
    ),
    "h0_ignored": ("the initial state is not read", ("initial_state_ignored",)),
    "gva_modulo": ("value head h reads q/k head h % H", ("wrong_gva_mapping",)),
    "carried_across": ("each sequence starts from the previous one's final state", ("state_across_sequences",)),
    "final_before_last_token": ("the final state misses the last token", ("off_by_one_final_state",)),
    "bf16_state": ("the state rounded to bfloat16 after every token", ("bf16_state", "state16")),
    "scale_from_v": ("the default scale V^-0.5", ("scale_from_value_dim",)),
    # mistakes it did not
    "gate_ignored": ("no decay at all: the gate ignored", ("gate_ignored",)),
    "gate_sign": ("the decay exp(-g): the gate's sign flipped", ("gate_sign_flipped",)),
    "state_other_layout": (
        "the state read and written v-first where k-first is asked for",
        ("state_transposed", "final_state_transposed"),
    ),
    "final_state_transposed": ("the final state handed back v-first", ("final_state_transposed",)),
    "no_erase": ("no erase term: S += beta k v^T (gated linear attention)", ("delta_without_erase",)),
    "beta_write_only": ("beta scales the write, not the erase", ("beta_on_write_only",)),
    "qk_swapped": ("q and k exchanged", ("qk_swapped",)),
    "unscaled_output": ("the output not multiplied by the scale", ("scale_not_applied", "scale_default_one")),
}

BUGS = {name: (description, _with(name)) for name, (description, _) in CATALOGUE.items()}
RIGHT_CAUSES = {name: right for name, (_, right) in CATALOGUE.items()}
NEW = ("gate_ignored", "gate_sign", "state_other_layout", "final_state_transposed", "no_erase", "beta_write_only",
       "qk_swapped", "unscaled_output")  # fmt: skip


def implementation(bug: str) -> Implementation:
    description, fn = BUGS[bug]
    return Implementation(f"unseen:{bug}", {"loop": fn}, description=description)
