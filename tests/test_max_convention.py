"""Modular MAX's ``gated_delta`` convention: the conversion both ways, the NumPy plug-in in MAX's
convention under ``check --convention max``, and the planted MAX-convention bugs.

Round trips run in float64 (``to_max(..., dtype=np.float64)``, a float64 pool), where nothing is
rounded, so MAX's arguments handed to the oracle must give our oracle's answer to float64
rounding; the float32 conversion's one rounding (the decay) is checked against its bound.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gdn_verify import _cli
from gdn_verify.api import check
from gdn_verify.core import max_convention as mc
from gdn_verify.core.implementation import ContractError, Implementation
from gdn_verify.core.oracle import numpy_oracle
from gdn_verify.core.problem import Problem
from gdn_verify.implementations import CONVENTIONS, from_callable, max_numpy
from gdn_verify.properties.strategies import beta_values, gate_values

PLUGIN = "gdn_verify.implementations.max_numpy:gated_delta_recurrence"
BF16 = np.dtype(ml_dtypes.bfloat16)


def make_problem(
    seed=0, H=2, HV=6, K=8, V=8, lengths=(5, 0, 9), batch=None, regime="mixed", state=True, dtype=np.float64
) -> Problem:
    """l2norm on, the default scale (what MAX takes); varlen by ``lengths`` or ``batch`` rows of ``lengths[0]``."""
    rng = np.random.default_rng(seed)
    if batch is None:
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        B, T, N = 1, int(cu[-1]), len(lengths)
    else:
        cu, B, T, N = None, batch, lengths[0], batch
    problem = Problem(
        q=rng.standard_normal((B, T, H, K)),
        k=rng.standard_normal((B, T, H, K)) * 2.0,
        v=rng.standard_normal((B, T, HV, V)),
        g=gate_values(rng, (B, T, HV), regime),
        beta=beta_values(rng, (B, T, HV)),
        initial_state=rng.standard_normal((N, HV, K, V)).astype(np.float32) if state else None,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=cu,
    )
    return problem.astype(dtype)


def native_kwargs(problem: Problem) -> dict:
    kw = problem.kwargs()
    kw.pop("output_final_state")
    return kw


CASES = [
    dict(),
    dict(H=1, HV=4, lengths=(1, 7, 0, 3)),
    dict(H=3, HV=9, K=4, V=16, regime="strong_run"),  # a GQA group of 3
    dict(batch=3, lengths=(11,), regime="spikes"),
    dict(H=2, HV=2, K=16, V=4, state=False, regime="moderate"),
    dict(seed=5, H=4, HV=16, lengths=(40, 1), regime="tiny"),
]


def case_id(case: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in case.items()) or "default"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_problem_to_max_to_the_oracle_is_our_oracle(case):
    problem = make_problem(**case)
    args = mc.to_max(**native_kwargs(problem), pool_dtype=np.float64, dtype=np.float64)
    pool = args.recurrent_state
    o = mc.max_oracle(*args.astuple())
    want_o, want_state = numpy_oracle(problem)
    B, T, HV, V = problem.v.shape
    scale = max(1.0, np.abs(want_o).max(initial=0.0), np.abs(want_state).max())
    assert np.max(np.abs(o.reshape(B, T, HV, V) - want_o), initial=0.0) <= 1e-12 * scale
    assert np.max(np.abs(pool[args.slot_idx.astype(np.int64)] - want_state)) <= 1e-12 * scale
    spare = np.setdiff1d(np.arange(len(pool)), args.slot_idx)
    assert not pool[spare].any(), "spare rows stay zero"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_max_arguments_are_laid_out_as_max_documents(case):
    problem = make_problem(**case).astype(np.float32)
    args = mc.to_max(**native_kwargs(problem))
    B, T, H, K = problem.q.shape
    HV, V = problem.v.shape[2:]
    N = problem.num_sequences
    key_dim = H * K
    qkv = args.qkv_conv_output
    assert qkv.dtype == np.float32 and qkv.shape == (B * T, 2 * key_dim + HV * V)
    assert np.array_equal(qkv[:, :key_dim], problem.q.reshape(B * T, key_dim))  # q at [0, key_dim)
    assert np.array_equal(qkv[:, key_dim : 2 * key_dim], problem.k.reshape(B * T, key_dim))
    assert np.array_equal(qkv[:, 2 * key_dim :], problem.v.reshape(B * T, HV * V))
    assert args.decay_per_token.dtype == np.float32 and args.decay_per_token.shape == (B * T, HV)
    assert np.array_equal(args.beta_per_token, problem.beta.reshape(B * T, HV))
    assert args.slot_idx.dtype == np.uint32 and args.input_row_offsets.dtype == np.uint32
    assert np.array_equal(args.input_row_offsets, problem.bounds)
    assert args.recurrent_state.shape == (2 * N + 1, HV, K, V)
    assert args.heads == (H, HV, K, V)
    back = mc.from_max(*args.astuple())
    assert back.use_qk_l2norm_in_kernel and back.scale is None
    for name in ("q", "k", "v", "beta"):
        assert np.array_equal(getattr(back, name).reshape(-1), getattr(problem, name).reshape(-1))
    if problem.initial_state is not None:
        assert np.array_equal(back.initial_state, problem.initial_state)


def test_the_decay_is_exp_of_the_gate_rounded_once_to_float32():
    g = np.concatenate([gate_values(np.random.default_rng(1), (1, 4000, 1), r).ravel() for r in ("mixed", "tiny")])
    g = np.concatenate([g, [0.0, -1e-12, -87.0, -100.0, -104.0, -1e4]])
    for dtype in (np.float32, BF16, np.float16):
        gd = g.astype(dtype)
        decay = mc.decay_from_gate(gd)
        exact = np.exp(gd.astype(np.float64))
        assert decay.dtype == np.float32
        assert np.all(np.abs(decay - exact) <= 2.0**-24 * exact + 2.0**-150)
        assert np.all(decay[gd.astype(np.float64) < -103.98] == 0)
    back = mc.gate_from_decay(np.array([1.0, 0.5, 0.0], np.float32))
    assert back[0] == 0.0 and back[1] == np.log(0.5) and back[2] == mc.ZERO_DECAY_GATE
    with pytest.raises(ValueError, match="decay_per_token"):
        mc.gate_from_decay(np.array([-0.1]))


def test_a_bfloat16_pool_rounds_the_initial_state_once():
    problem = make_problem(dtype=np.float32)
    args = mc.to_max(**native_kwargs(problem), pool_dtype=BF16)
    assert args.recurrent_state.dtype == BF16
    slots = args.slot_idx.astype(np.int64)
    assert np.array_equal(args.recurrent_state[slots], problem.initial_state.astype(BF16))


@pytest.mark.parametrize(
    "change, reason",
    [
        (dict(use_qk_l2norm_in_kernel=False), "always L2-normalise"),
        (dict(scale=0.5), "1/sqrt"),
        (dict(state_v_first=True), "k-first"),
    ],
)
def test_what_max_cannot_express_is_unsupported_with_the_reason(change, reason):
    problem = make_problem(dtype=np.float32)
    kw = {**native_kwargs(problem), **change}
    if change.get("state_v_first"):
        kw["initial_state"] = np.ascontiguousarray(kw["initial_state"].swapaxes(-1, -2))
    with pytest.raises(NotImplementedError, match=reason):
        mc.to_max(**kw)
    with pytest.raises(NotImplementedError, match=reason):
        mc.native_form(max_numpy.gated_delta_recurrence)(**kw)


def test_float64_inputs_are_unsupported_and_the_default_scale_is_accepted():
    problem = make_problem()
    with pytest.raises(NotImplementedError, match="float32"):
        mc.to_max(**native_kwargs(problem))
    explicit = native_kwargs(problem.astype(np.float32)) | dict(scale=8**-0.5)
    assert mc.to_max(**explicit).qkv_conv_output.shape[0] == problem.q.shape[1]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_numpy_plugin_is_the_oracle_within_float32(case):
    problem = make_problem(**case).astype(np.float32)
    o, state = mc.native_form(max_numpy.gated_delta_recurrence)(**problem.kwargs())
    want_o, want_state = numpy_oracle(problem)
    assert o.dtype == np.float32 and state.dtype == np.float32
    scale = max(1.0, np.abs(want_state).max())
    assert np.max(np.abs(o - want_o), initial=0.0) <= 2e-4 * scale
    assert np.max(np.abs(state - want_state)) <= 2e-4 * scale


def test_the_numpy_plugin_passes_check_in_max_convention(tmp_path):
    properties = [
        "matches_reference",
        "varlen_equals_separate",
        "state_continuation",
        "head_mapping",
        "output_contract",
    ]
    result = check(
        PLUGIN, convention="max", dtype="float32", properties=properties, max_examples=4, seed=3, cases_dir=tmp_path
    )
    statuses = {r.name: (r.status, r.failure and r.failure.message) for r in result.results}
    assert all(status == "passed" for status, _ in statuses.values()), statuses


def test_properties_needing_what_max_lacks_are_unsupported_with_the_reason(tmp_path):
    result = check(
        PLUGIN,
        convention="max",
        dtype="float32",
        properties=["state_layout"],
        max_examples=5,
        seed=1,
        cases_dir=tmp_path,
    )["state_layout"]
    assert result.status == "unsupported"
    assert "L2-normalise" in result.note and "k-first" in result.note


def test_convention_max_is_registered_for_the_cli():
    assert "max" in CONVENTIONS
    args = _cli.build_parser().parse_args(["check", "--impl", PLUGIN, "--convention", "max"])
    assert args.convention == "max"
    impl = from_callable(max_numpy.gated_delta_recurrence, convention="max")
    assert impl.native_forms == ["default"] and impl.default_dtype == "float32"


def test_a_kernel_writing_a_row_no_item_names_breaks_the_contract(tmp_path):
    def writes_next_row(qkv, decay, beta, pool, slot_idx, offsets):
        out = max_numpy.gated_delta_recurrence(qkv, decay, beta, pool, slot_idx, offsets)
        pool[int(slot_idx[0]) + 1] = 1.0  # a stray store one row past the item's slot
        return out

    with pytest.raises(ContractError, match="row 2 changed"):
        mc.native_form(writes_next_row)(**make_problem(dtype=np.float32).kwargs())
    result = check(
        writes_next_row,
        convention="max",
        dtype="float32",
        properties=["matches_reference"],
        max_examples=10,
        seed=2,
        cases_dir=tmp_path,
    )["matches_reference"]
    assert result.status == "failed" and "output contract" in result.failure.message


def test_a_bfloat16_pool_passes_with_its_declared_state_dtype(tmp_path):
    form = mc.native_form(max_numpy.gated_delta_recurrence, pool_dtype=BF16)
    o, state = form(**make_problem(dtype=np.float32).kwargs())
    assert state.dtype == BF16 and o.dtype == np.float32
    impl = Implementation("max-numpy-bf16-pool", {"recurrent": form}, extra={"state_dtype": "bfloat16"})
    result = check(impl, dtype="float32", properties=["matches_reference"], max_examples=4, seed=1, cases_dir=tmp_path)[
        "matches_reference"
    ]
    assert result.status == "passed", result.failure and result.failure.message


@pytest.mark.parametrize("bug", max_numpy.BUGS)
def test_each_planted_max_bug_is_caught_by_the_first_property(bug, tmp_path):
    result = check(f"planted:max_{bug}", dtype="float32", properties=["matches_reference"], seed=7, cases_dir=tmp_path)[
        "matches_reference"
    ]
    assert result.status == "failed"
    want = {"decay_as_log_rate": "decay_as_log_rate", "slot_read_off_by_one": "initial_state_ignored"}[bug]
    assert result.failure.cause_model == want


def test_the_slot_bug_reads_the_spare_row_after_the_slot():
    problem = make_problem(dtype=np.float32, lengths=(4,))
    args = mc.to_max(**native_kwargs(problem))
    buggy = args.recurrent_state.copy()
    max_numpy.with_bug("slot_read_off_by_one")(*args.astuple()[:3], buggy, args.slot_idx, args.input_row_offsets)
    zero_start = problem.replace(initial_state=np.zeros_like(problem.initial_state))
    _, want = numpy_oracle(zero_start)
    assert np.allclose(buggy[1], want[0], atol=1e-4), "started from the zero row 2, stored to row 1"
    with pytest.raises(ValueError, match="unknown"):
        max_numpy.with_bug("decay_as_log_gate")
