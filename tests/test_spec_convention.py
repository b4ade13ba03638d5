"""The speculative-decoding convention: reference passes, slot bugs are caught and named."""

from __future__ import annotations

import io

import numpy as np
import pytest

from gdn_verify.implementations import spec as cs
from gdn_verify.runners.check import CheckOptions, run_property
from gdn_verify.implementations import ConfigurationError, Implementation
from gdn_verify.spec_runner import check_spec, replay_spec
from gdn_verify.properties.spec import SPEC_PROPERTIES

PROP = SPEC_PROPERTIES["spec_decode_slots"]


def run(fn, tmp_path, dtype="float32", n=40, seed=0):
    impl = fn if isinstance(fn, Implementation) else Implementation("test", {"spec": fn})
    return run_property(PROP, impl, CheckOptions(dtype=dtype, max_examples=n, seed=seed, cases_dir=tmp_path))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reference_implementation_passes(dtype, tmp_path):
    result = run(cs.spec_reference, tmp_path, dtype)
    assert result.status == "passed", result.failure and result.failure.message


def test_reading_the_first_slot_is_caught_and_named(tmp_path):
    result = run(cs.spec_reads_first_slot, tmp_path)
    assert result.status == "failed"
    assert "instead of the accepted slot" in result.failure.message
    params = result.failure.params
    assert any(a > 1 for a in params["num_accepted_tokens"])  # the shrunk case needs an accepted count > 1


def _padding_tokens(cu, indices, accepted):
    starts = cs.start_slots(np.asarray(indices), np.asarray(accepted))
    return [t for n in range(len(cu) - 1) if starts[n] < 0 for t in range(cu[n], cu[n + 1])]


def test_negative_index_used_as_an_offset_is_caught(tmp_path):
    def writes_pool_minus_one(q, k, v, g, beta, state_pool, cu_seqlens, ssm_state_indices, num_accepted_tokens,
                              **kw):
        o = cs.spec_reference(q, k, v, g, beta, state_pool, cu_seqlens, ssm_state_indices, num_accepted_tokens, **kw)
        if _padding_tokens(cu_seqlens, ssm_state_indices, num_accepted_tokens):
            state_pool[-1] = 0.0  # a padding request's -1 index taken as "last slot"
        return o

    result = run(writes_pool_minus_one, tmp_path)
    assert result.status == "failed" and "was written" in result.failure.message


def test_padding_with_outputs_is_caught(tmp_path):
    def pads_with_garbage(q, k, v, g, beta, state_pool, cu_seqlens, ssm_state_indices, num_accepted_tokens, **kw):
        o = cs.spec_reference(q, k, v, g, beta, state_pool, cu_seqlens, ssm_state_indices, num_accepted_tokens, **kw)
        o[:, _padding_tokens(cu_seqlens, ssm_state_indices, num_accepted_tokens)] = 1.0
        return o

    result = run(pads_with_garbage, tmp_path)
    assert result.status == "failed" and "padding request" in result.failure.message


def test_writing_only_the_last_token_slot_is_caught(tmp_path):
    def last_slot_only(q, k, v, g, beta, state_pool, cu_seqlens, ssm_state_indices, num_accepted_tokens, **kw):
        before = state_pool.copy()
        o = cs.spec_reference(q, k, v, g, beta, state_pool, cu_seqlens, ssm_state_indices, num_accepted_tokens, **kw)
        for n in range(len(cu_seqlens) - 1):
            for t in range(cu_seqlens[n + 1] - cu_seqlens[n] - 1):  # intermediate states never stored
                slot = ssm_state_indices[n, t]
                if slot >= 0 and slot != ssm_state_indices[n, cu_seqlens[n + 1] - cu_seqlens[n] - 1]:
                    state_pool[slot] = before[slot]
        return o

    result = run(last_slot_only, tmp_path, n=60)
    assert result.status == "failed" and "holds a state off" in result.failure.message


def test_cli_functions_check_and_replay(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    assert check_spec("spec-numpy", max_examples=10, seed=1, out=out) == 0
    out = io.StringIO()
    assert check_spec("spec-planted:reads_first_slot", max_examples=30, seed=1, out=out) == 1
    case = next(line.split()[4] for line in out.getvalue().splitlines() if "replay:" in line)
    assert "--convention spec" in out.getvalue()
    assert replay_spec(case, "spec-planted:reads_first_slot", out=io.StringIO()) == 1
    assert replay_spec(case, "spec-numpy", out=io.StringIO()) == 0
    with pytest.raises(ConfigurationError):
        check_spec("numpy")
    with pytest.raises(ConfigurationError):
        replay_spec("missing.npz", "spec-numpy")
