"""The vLLM and FlashInfer MTP/k-major adapters on CPU, with NumPy stand-ins for the kernels.

Each stand-in takes the kernel's own convention (as its signature and docstring document it) and
computes it with the float64 oracle one token at a time; the vLLM stand-in reads its indices the
way the Triton kernel does (a flat, unchecked ``row * width + column``), so the property suite
sees the same hazards the real kernel has. The GPU runs use the real kernels
(`scripts/gpu-machine/gpu_session.sh` phases adapters_check and adapters_fuzz).
"""

from __future__ import annotations

import os
import sys
import types

import numpy as np
import pytest

from gdn_verify.api import check
from gdn_verify.core import reference
from gdn_verify.core.conventions import FLASHINFER_SPEC, VLLM_SPEC
from gdn_verify.core.gating import gates_from_raw
from gdn_verify.core.implementation import SPEC_FORM, ConfigurationError, Implementation
from gdn_verify.implementations import flashinfer as fi
from gdn_verify.implementations import speculative as cs
from gdn_verify.implementations import vllm
from gdn_verify.properties import NAMES

SPEC_PROPS = [name for name in NAMES if name.startswith("spec_")]


def _step(q, k, v, g, beta, state_kv, scale, l2norm):
    """One token of one request: (o [HV, V], new state [HV, K, V]) in float64."""
    o, state = reference.recurrent_gated_delta_rule(
        q[None, None],
        k[None, None],
        v[None, None],
        g[None, None],
        beta[None, None],
        scale=scale,
        initial_state=state_kv[None],
        output_final_state=True,
        use_qk_l2norm_in_kernel=l2norm,
    )
    return o[0, 0], state[0]


def standin_vllm_recurrent(
    q,
    k,
    v,
    g,
    beta=None,
    scale=None,
    initial_state=None,
    inplace_final_state=True,
    cu_seqlens=None,
    ssm_state_indices=None,
    num_accepted_tokens=None,
    use_qk_l2norm_in_kernel=False,
):
    """vLLM's fused_recurrent: state ``[*, HV, V, K]``, slot <= 0 skipped, token t -> column t."""
    assert inplace_final_state and ssm_state_indices is not None and initial_state.ndim == 4
    B, T, H, K = q.shape
    HV = v.shape[2]
    cu = np.arange(B + 1) * T if cu_seqlens is None else np.asarray(cu_seqlens)
    flat_q, flat_k = (x.reshape(B * T, H, K) for x in (q, k))
    flat_v, flat_g, flat_b = v.reshape(B * T, HV, v.shape[3]), g.reshape(B * T, HV), beta.reshape(B * T, HV)
    idx = np.asarray(ssm_state_indices)
    width = 1 if idx.ndim == 1 else idx.shape[1]
    flat_idx = idx.reshape(-1)
    o = np.full(flat_v.shape, np.nan, v.dtype)  # new_empty: padding rows keep whatever was there
    rep = HV // H
    for n in range(len(cu) - 1):
        column = 0 if num_accepted_tokens is None else int(num_accepted_tokens[n]) - 1
        slot = int(flat_idx[n * width + column])  # unchecked, as the kernel reads it
        if slot <= 0:
            continue
        state = initial_state[slot].swapaxes(-1, -2).astype(np.float64)
        for t in range(int(cu[n]), int(cu[n + 1])):
            heads = np.arange(HV) // rep
            o_t, state = _step(
                flat_q[t][heads],
                flat_k[t][heads],
                flat_v[t],
                flat_g[t],
                flat_b[t],
                state,
                scale,
                use_qk_l2norm_in_kernel,
            )
            o[t] = o_t
            dest = int(flat_idx[n * width + t - int(cu[n])])
            if dest > 0:
                initial_state[dest] = state.swapaxes(-1, -2)
    return o.reshape(v.shape), initial_state


def standin_vllm_chunk(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, **kw):
    """vLLM's chunk_gated_delta_rule: the native convention with a k-last state, float32 final state."""
    o, state = reference.chunk_gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        scale=scale,
        initial_state=initial_state,
        output_final_state=True,
        state_v_first=True,
        **kw,
    )
    return o, state.astype(np.float32) if output_final_state else None


def standin_mtp(
    q,
    k,
    v,
    initial_state,
    initial_state_indices,
    A_log,
    a,
    dt_bias,
    b,
    scale=None,
    output=None,
    ssm_state_indices=None,
    disable_state_update=None,
    use_qk_l2norm=True,
    output_state_indices=None,
):
    """FlashInfer's gated_delta_rule_mtp: negative read index = padding (output left as allocated)."""
    B, T, H, K = q.shape
    HV = v.shape[2]
    assert disable_state_update is False and initial_state.dtype == np.float32
    assert A_log.dtype == np.float32 and initial_state.shape[1:] == (HV, v.shape[3], K)
    if ssm_state_indices is not None:
        assert T >= 2 and ssm_state_indices.shape == (B, T) and ssm_state_indices.dtype == np.int32
    out = np.zeros(v.shape, v.dtype) if output is None else output
    g, beta = gates_from_raw(A_log, a.astype(np.float64), dt_bias, b.astype(np.float64))
    heads = np.arange(HV) // (HV // H)
    for i in range(B):
        read = int(initial_state_indices[i])
        if read < 0:
            continue
        state = initial_state[read].swapaxes(-1, -2).astype(np.float64)
        for t in range(T):
            o_t, state = _step(
                q[i, t][heads], k[i, t][heads], v[i, t], g[i, t], beta[i, t], state, scale, use_qk_l2norm
            )
            out[i, t] = o_t
            if ssm_state_indices is not None:
                initial_state[int(ssm_state_indices[i, t])] = state.swapaxes(-1, -2)
        if ssm_state_indices is None:
            write = read if output_state_indices is None else int(output_state_indices[i])
            if write >= 0:
                initial_state[write] = state.swapaxes(-1, -2)
    return out, initial_state


def standin_decode_kmajor(q, k, v, state, A_log, a, dt_bias, b, scale=None, use_qk_l2norm=True):
    """FlashInfer's gated_delta_rule_decode: k-major state ``[B, HV, K, V]`` updated in place."""
    assert q.shape[1] == 1 and state.shape == (q.shape[0], v.shape[2], q.shape[3], v.shape[3])
    o, new_state = reference.decode_gated_delta_rule(
        q,
        k,
        v,
        np.ascontiguousarray(state.swapaxes(-1, -2)),
        A_log,
        a,
        dt_bias,
        b,
        scale=scale,
        use_qk_l2norm=use_qk_l2norm,
    )
    state[...] = new_state.swapaxes(-1, -2)
    return o, state


def _check(impl, props, tmp_path, n=15, seed=3):
    return check(impl, dtype="float32", properties=props, max_examples=n, seed=seed, cases_dir=tmp_path)


def test_vllm_spec_adapter_passes_the_slot_properties_but_bounds(tmp_path):
    impl = Implementation(
        "standin-vllm-spec", {SPEC_FORM: vllm.spec_adapter(standin_vllm_recurrent)}, extra={"spec_rules": VLLM_SPEC}
    )
    result = _check(impl, SPEC_PROPS, tmp_path)
    statuses = {r.name: r.status for r in result.results}
    assert statuses.pop("spec_accepted_bounds") == "failed"  # vLLM's unchecked num_accepted_tokens - 1
    message = result["spec_accepted_bounds"].failure.message
    assert "without an error" in message
    assert set(statuses.values()) == {"passed"}, result.as_dict()


def test_vllm_spec_null_slot_is_never_written_and_padding_rows_are_free(tmp_path):
    def writes_null(*args, **kw):  # a kernel storing through the null slot 0
        o = vllm.spec_adapter(standin_vllm_recurrent)(*args, **kw)
        args[5][0] = 0.0
        return o

    impl = Implementation("null-writer", {SPEC_FORM: writes_null}, extra={"spec_rules": VLLM_SPEC})
    failure = _check(impl, ["spec_decode_slots"], tmp_path)["spec_decode_slots"].failure
    assert failure is not None and "slot 0 was written" in failure.message


def test_flashinfer_mtp_adapter_passes_every_slot_property(tmp_path):
    impl = Implementation(
        "standin-mtp", {SPEC_FORM: fi.mtp_adapter(standin_mtp)}, extra={"spec_rules": FLASHINFER_SPEC}
    )
    result = _check(impl, SPEC_PROPS, tmp_path)
    statuses = {r.name: r.status for r in result.results}
    # the draft-less step has one token per request: outside MTP's T >= 2
    assert statuses.pop("spec_draftless_step") == "unsupported"
    assert statuses.pop("spec_batch_mix") == "unsupported"  # so has a batch mix's one-token row
    assert set(statuses.values()) == {"passed"}, result.as_dict()


def test_flashinfer_mtp_padding_rows_written_are_caught(tmp_path):
    def zero_padding(**kw):  # a kernel writing zeros over the caller's padding rows
        out, pool = standin_mtp(**kw)
        out[np.asarray(kw["initial_state_indices"]) < 0] = 0
        return out, pool

    impl = Implementation(
        "zeroing-mtp", {SPEC_FORM: fi.mtp_adapter(zero_padding)}, extra={"spec_rules": FLASHINFER_SPEC}
    )
    failure = _check(impl, ["spec_poisoned_output"], tmp_path, n=40)["spec_poisoned_output"].failure
    assert failure is not None and "as allocated" in failure.message


def test_native_reference_under_each_rule_set_passes(tmp_path):
    for rules in (VLLM_SPEC, FLASHINFER_SPEC):
        impl = Implementation(f"ref-{rules.name}", {SPEC_FORM: cs.rules_reference(rules)}, extra={"spec_rules": rules})
        result = _check(impl, SPEC_PROPS, tmp_path, n=10)
        mixes = not (rules.uniform_lengths or rules.min_tokens > 1)  # spec_batch_mix needs mixed lengths
        expected = {
            r.name: "unsupported" if r.name == "spec_batch_mix" and not mixes else "passed" for r in result.results
        }
        assert {r.name: r.status for r in result.results} == expected, result.as_dict()


@pytest.mark.parametrize("state_v_first", [False, True])
def test_vllm_native_adapters_match_the_oracle(state_v_first, tmp_path):
    rng = np.random.default_rng(0)
    cu = np.array([0, 3, 3, 9])
    q, k = rng.standard_normal((2, 1, 9, 2, 8))
    v = rng.standard_normal((1, 9, 4, 8))
    g, beta = -rng.random((1, 9, 4)), rng.random((1, 9, 4))
    S0 = rng.standard_normal((3, 4, 8, 8))
    if state_v_first:
        S0 = np.ascontiguousarray(S0.swapaxes(-1, -2))
    kw = dict(initial_state=S0, output_final_state=True, cu_seqlens=cu, state_v_first=state_v_first, scale=0.4)
    want_o, want_s = reference.recurrent_gated_delta_rule(q, k, v, g, beta, **kw)
    for adapter in (vllm.recurrent_adapter(standin_vllm_recurrent, np), vllm.chunk_adapter(standin_vllm_chunk, xp=np)):
        if adapter.__qualname__.startswith("chunk"):
            q16 = q.astype(np.float16)  # the chunked kernel rejects float32
            o, s = adapter(q16, k, v, g, beta, **kw)
            # vLLM's layer hands the kernel float32 g and beta (0.20+): the adapter's only rounding
            g32, beta32 = g.astype(np.float32), beta.astype(np.float32)
            o2, _ = reference.recurrent_gated_delta_rule(q16, k, v, g32, beta32, **kw)
            assert np.allclose(o, o2, atol=1e-10)
            with pytest.raises(NotImplementedError, match="float32"):
                adapter(q, k, v, g, beta, **kw)
            continue
        o, s = adapter(q, k, v, g, beta, **kw)
        assert np.allclose(o, want_o, atol=1e-6) and np.allclose(s, want_s, atol=1e-6)
    with pytest.raises(NotImplementedError, match="scale > 0"):
        vllm.recurrent_adapter(standin_vllm_recurrent, np)(q, k, v, g, beta, **{**kw, "scale": 0.0})


@pytest.mark.parametrize("state_v_first", [False, True])
def test_kmajor_decode_translation_matches_the_oracle(state_v_first):
    rng = np.random.default_rng(1)
    cu = np.array([0, 2, 5])
    q, k = rng.standard_normal((2, 1, 5, 1, 4))
    v = rng.standard_normal((1, 5, 2, 4))
    g = np.log(rng.uniform(0.3, 1.0, (1, 5, 2)).astype(np.float32).astype(np.float64))
    beta = rng.random((1, 5, 2)).astype(np.float32).astype(np.float64)
    S0 = rng.standard_normal((2, 2, 4, 4))
    if state_v_first:
        S0 = np.ascontiguousarray(S0.swapaxes(-1, -2))
    kw = dict(initial_state=S0, output_final_state=True, cu_seqlens=cu, state_v_first=state_v_first)
    o, s = fi.decode_adapter(standin_decode_kmajor, kmajor=True)(q, k, v, g, beta, **kw)
    want_o, want_s = reference.recurrent_gated_delta_rule(q, k, v, g, beta, **kw)
    assert np.allclose(o, want_o, atol=1e-9) and np.allclose(s, want_s, atol=1e-9)


def test_vllm_loader_reports_a_missing_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(vllm.ENV, str(tmp_path))
    with pytest.raises(ImportError, match="missing"):
        vllm.load_ops()


@pytest.mark.parametrize("user, want", [(None, "1"), ("0", "0")])
def test_triton_libraries_load_with_autotuning_cached_unless_the_user_said_no(user, want, monkeypatch):
    """FLA re-benchmarks every autotuned config in every process; the cache must be on when it loads."""
    from gdn_verify.implementations.fla import cuda_library

    if user is None:
        monkeypatch.delenv("TRITON_CACHE_AUTOTUNING", raising=False)
    else:
        monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", user)
    seen = []

    def load():
        seen.append(os.environ.get("TRITON_CACHE_AUTOTUNING"))
        raise ImportError("no such library here")

    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))  # reach load() without torch
    with pytest.raises(ConfigurationError, match="not installed"):
        cuda_library("Lib", "pip install lib", load)
    assert seen == [want]
