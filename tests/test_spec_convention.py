"""The speculative-decoding convention: reference passes, slot bugs are caught and named."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_verify.api import check, replay
from gdn_verify.core import conventions
from gdn_verify.core.implementation import ConfigurationError
from gdn_verify.implementations import speculative as cs

PROP = "spec_decode_slots"


def run(fn, tmp_path, dtype="float32", n=40, seed=0):
    result = check(fn, convention="spec", dtype=dtype, properties=[PROP], max_examples=n, seed=seed, cases_dir=tmp_path)
    return result[PROP]


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
    starts = conventions.start_slots(np.asarray(indices), np.asarray(accepted))
    return [t for n in range(len(cu) - 1) if starts[n] < 0 for t in range(cu[n], cu[n + 1])]


def test_negative_index_used_as_an_offset_is_caught(tmp_path):
    def writes_pool_minus_one(q, k, v, g, beta, state_pool, cu_seqlens, ssm_state_indices, num_accepted_tokens, **kw):
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


def test_spec_is_one_more_form_checked_and_replayed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert check("numpy", properties=[PROP], max_examples=10, seed=1).passed  # numpy has a spec form
    result = check("planted:spec_reads_first_slot", max_examples=30, seed=1)
    assert PROP in [r.name for r in result.failures]
    assert all(r.name.startswith("spec_") for r in result.failures)  # the native properties do not apply to it
    assert all(r.status == "unsupported" for r in result.results if not r.name.startswith("spec_"))
    case = result[PROP].failure.case_path
    assert replay(case).status == "failed"  # against the recorded implementation
    assert replay(case, "numpy").status == "passed"
    with pytest.raises(ConfigurationError, match="^convention: "):
        check("numpy", convention="spec")
    with pytest.raises(ConfigurationError, match="^case: "):
        replay("missing.npz", "numpy")
