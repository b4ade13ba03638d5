"""Guarded memory and multi-step decode: the harness, the planted memory bugs, the correct forms."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gdn_verify.api import check
from gdn_verify.core.conventions import FLASHINFER_SPEC, VLLM_SPEC
from gdn_verify.core.implementation import SPEC_FORM, Implementation
from gdn_verify.core.problem import Problem
from gdn_verify.core.property import Violation
from gdn_verify.implementations import planted_memory as pm
from gdn_verify.implementations import speculative as cs
from gdn_verify.properties import NAMES
from gdn_verify.properties.pools import CANARY, LAYOUTS, check_stream, guard
from gdn_verify.properties.strategies import unit_rows

NEW = ("spec_guarded_pool", "guarded_inputs", "output_isolation", "spec_decode_stream")
SPEC_NEW = [name for name in NEW if name.startswith("spec_")]
# A fresh seed each run for the correct forms (printed on failure); fixed seeds for the bugs.
SEED = random.randrange(2**31)


def _run(impl, prop, tmp_path, dtype="float32", n=30, seed=5):
    return check(impl, dtype=dtype, properties=[prop], max_examples=n, seed=seed, cases_dir=tmp_path)[prop]


# the harness ------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_guarded_pool_is_a_view_with_canaries_around_it(layout):
    pool = np.arange(3 * 2 * 4, dtype=np.float32).reshape(3, 2, 4) + 1
    g = guard(pool, "numpy", layout, gap=2)
    assert g.view.shape == pool.shape and np.shares_memory(g.view, g.buffer)
    assert g.view.flags.c_contiguous == (layout == "contiguous")
    np.testing.assert_array_equal(g.view, pool)
    outside = np.setdiff1d(np.arange(g.buffer.size), g.offsets.reshape(-1))
    assert set(np.unique(g.buffer[outside])) == set(CANARY.astype(np.float32))
    g.view[1] = -1.0  # an in-place update is seen through the read-back
    np.testing.assert_array_equal(g.read()[1], -1.0)


@pytest.mark.parametrize(
    "layout, where, band",
    [
        ("contiguous", lambda g: g.offsets.min() - 1, "before slot 0"),
        ("contiguous", lambda g: g.offsets.max() + 1, "after the last slot"),
        ("padded", lambda g: g.offsets[1].max() + 1, "between slots 1 and 2"),
        ("strided", lambda g: g.offsets[0].max() + 1, "between slots 0 and 1"),
    ],
)
def test_a_stray_write_names_its_band(layout, where, band):
    g = guard(np.ones((3, 2, 4), np.float32), "numpy", layout, gap=2)
    g.buffer[int(where(g))] = 0.0
    with pytest.raises(Violation, match=rf"1 canary element {band} overwritten \(the nearest 1 element from ") as exc:
        g.read()
    assert f"({layout} layout)" in str(exc.value)


def _raw_pointer_spec(q, k, v, g, beta, state_pool, cu_seqlens, ssm_state_indices, num_accepted_tokens, **kw):
    """A kernel that ignores the pool's strides: slot s is stored at ``base + s * slot_elems``."""
    work = np.ascontiguousarray(state_pool).copy()
    o = cs.spec_reference(q, k, v, g, beta, work, cu_seqlens, ssm_state_indices, num_accepted_tokens, **kw)
    root = state_pool
    while isinstance(root.base, np.ndarray):
        root = root.base
    start = (state_pool.__array_interface__["data"][0] - root.__array_interface__["data"][0]) // 4
    flat = root.reshape(-1)
    E = work[0].size
    for slot in np.unique(np.asarray(ssm_state_indices)):
        if slot >= 0 and not np.array_equal(work[slot], np.asarray(state_pool[slot])):
            flat[start + slot * E : start + (slot + 1) * E] = work[slot].reshape(-1)
    return o


def test_a_kernel_ignoring_the_pool_strides_writes_between_slots(tmp_path):
    impl = Implementation("raw-pointer", {SPEC_FORM: _raw_pointer_spec})
    result = _run(impl, "spec_guarded_pool", tmp_path)
    assert result.status == "failed"
    assert result.failure.params["layout"] != "contiguous"
    message = result.failure.message
    # the stores land on canaries between slots, or on the wrong slots where a stride lines up
    assert any(words in message for words in ("between slots", "was written", "holds a state off")), message


def test_a_documented_rejection_of_a_non_contiguous_pool_is_a_note(tmp_path):
    def contiguous_only(*args, **kw):
        if not args[5].flags.c_contiguous:
            raise ValueError("state_pool: must be contiguous, got strides " + str(args[5].strides))
        return cs.spec_reference(*args, **kw)

    result = _run(Implementation("contiguous-only", {SPEC_FORM: contiguous_only}), "spec_guarded_pool", tmp_path)
    assert result.status == "passed", result.failure and result.failure.message
    assert "rejected a" in result.note and "must be contiguous" in result.note


def test_an_unexplained_exception_on_a_non_contiguous_pool_is_an_error(tmp_path):
    def crashes(*args, **kw):
        if not args[5].flags.c_contiguous:
            raise ValueError("index out of range")
        return cs.spec_reference(*args, **kw)

    result = _run(Implementation("crashes", {SPEC_FORM: crashes}), "spec_guarded_pool", tmp_path)
    assert result.status == "error" and "index out of range" in result.failure.message


# the planted memory bugs ------------------------------------------------------------------------
CAUGHT = {
    # bug: words the failure message must hold (what was overwritten or lost)
    "spec_writes_past_last_slot": ("canary element", "after the last slot overwritten"),
    "spec_padding_as_last_slot": ("was written although no request's token maps to it",),
    "spec_updates_a_copy": ("the caller's pool was not updated", "updated a copy"),
    "spec_state_cache_bf16": ("state drift after", "the float32-state bound"),
    "normalizes_k_in_place": ("input k was written",),
    "shared_output_buffer": ("the o a call returned changed when the next call ran", "reuses one output buffer"),
    "initial_state_cache_without_dtype": ("call 2 of 3 (initial_state in bfloat16", "a cache keyed without that dtype"),
    "key_tile_from_previous_call": ("a heuristic or launch configuration kept from the previous call",),
}


def test_every_planted_memory_bug_has_its_words():
    assert set(CAUGHT) == set(pm.BUGS)
    assert all(prop in NAMES for _, _, _, prop in pm.BUGS.values())


@pytest.mark.parametrize("bug", list(pm.BUGS))
def test_each_planted_memory_bug_is_caught_by_its_property(bug, tmp_path):
    prop = pm.BUGS[bug][3]
    result = _run(pm.implementation(bug), prop, tmp_path)
    assert result.status == "failed", f"{bug} not caught by {prop}"
    for words in CAUGHT[bug]:
        assert words in result.failure.message, result.failure.message
    if bug == "spec_updates_a_copy":  # only a non-contiguous pool is copied
        assert result.failure.params["layout"] in ("padded", "strided")
        assert result.failure.params["layout"] in result.failure.message


def test_state_drift_is_named_in_bfloat16_where_the_outputs_pass(tmp_path):
    """bfloat16 inputs: every step's outputs are within their tolerance, the carried state is not."""
    result = _run(pm.implementation("spec_state_cache_bf16"), "spec_decode_stream", tmp_path, dtype="bfloat16")
    assert result.status == "failed"
    assert result.failure.message.startswith("state drift after"), result.failure.message


def _stream_case(lengths, accepted, C=3, H=1, HV=2, K=4, V=4, seed=0):
    """A hand-made ``spec_decode_stream`` case: ``lengths``/``accepted`` ``[S][N]``, native rules."""
    rng = np.random.default_rng(seed)
    N = len(lengths[0])
    segments = [length for step in lengths for length in step]
    T = sum(segments)
    problem = Problem(
        q=rng.standard_normal((1, T, H, K)).astype(np.float32),
        k=unit_rows(rng, (1, T, H, K)).astype(np.float32),
        v=rng.standard_normal((1, T, HV, V)).astype(np.float32),
        g=-rng.uniform(0, 1, (1, T, HV)).astype(np.float32),
        beta=rng.uniform(0, 1, (1, T, HV)).astype(np.float32),
        cu_seqlens=np.concatenate([[0], np.cumsum(segments)]).astype(np.int64),
    )
    indices = rng.permutation(N * C + 1)[: N * C].reshape(N, C)
    params = dict(
        mode="stream",
        rules="native",
        ssm_state_indices=indices.tolist(),
        lengths=lengths,
        accepted=accepted,
        slots=N * C + 1,
        pool_seed=1,
    )
    return problem, params


def test_a_wrong_slot_in_a_later_step_names_the_step():
    def forgets_acceptance(q, k, v, g, beta, pool, cu, indices, accepted, **kw):
        """Every step reads column 0, whatever was accepted."""
        return cs.spec_reference(q, k, v, g, beta, pool, cu, indices, np.ones_like(np.asarray(accepted)), **kw)

    # step 1 reads column 0 as asked; step 2 must read column 2 (3 accepted) of request 1
    problem, params = _stream_case(lengths=[[3, 3], [2, 3], [1, 1]], accepted=[[1, 1], [1, 3], [1, 1]])
    impl = Implementation("forgets", {SPEC_FORM: forgets_acceptance})
    with pytest.raises(Violation, match=r"^step 2 of 3, request 1: outputs: "):
        check_stream(impl, problem, params)
    check_stream(Implementation("numpy", {SPEC_FORM: cs.spec_reference}), problem, params)  # the case is sound


# the correct forms --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("prop", NEW)
def test_the_numpy_implementation_passes(prop, dtype, tmp_path):
    result = _run("numpy", prop, tmp_path, dtype=dtype, n=15, seed=SEED)
    assert result.status == "passed", f"seed {SEED}: {result.failure and result.failure.message}"


@pytest.mark.parametrize("rules", [VLLM_SPEC, FLASHINFER_SPEC], ids=lambda r: r.name)
def test_the_reference_under_other_rules_passes(rules, tmp_path):
    impl = Implementation(f"ref-{rules.name}", {SPEC_FORM: cs.rules_reference(rules)}, extra={"spec_rules": rules})
    result = check(impl, dtype="float32", properties=SPEC_NEW, max_examples=12, seed=SEED, cases_dir=tmp_path)
    assert all(r.status == "passed" for r in result.results), f"seed {SEED}: {result.as_dict()}"


def test_the_new_properties_are_in_the_catalogue():
    assert set(NEW) <= set(NAMES) and len(NAMES) == 27


# output_isolation ---------------------------------------------------------------------------------
def test_a_shared_output_buffer_misleads_no_other_property(tmp_path):
    """Every other property copies each result as it comes back: the planted cache of one output
    buffer per shape passes them all (output_isolation alone names it, above)."""
    others = ["matches_reference", "linearity", "determinism", "varlen_equals_separate"]
    done = check(pm.implementation("shared_output_buffer"), dtype="float32", properties=others, max_examples=15,
                 seed=3, cases_dir=tmp_path)  # fmt: skip
    assert all(r.status == "passed" for r in done.results), done.as_dict()


def test_a_result_is_a_copy_of_what_the_kernel_returned():
    """Implementation.run copies a NumPy return (and a CPU torch one): the kernel writing its buffer
    later changes nothing already taken."""
    impl = Implementation("shared", {"chunk": pm.shared_output_buffer})
    problem = Problem(
        *(np.ones((1, 3, 1, 2), np.float32) for _ in range(3)), np.zeros((1, 3, 1), np.float32),
        np.full((1, 3, 1), 0.5, np.float32),
    )  # fmt: skip
    first = impl.run(problem)
    raw, _ = impl.call(problem.replace(v=-problem.v))
    assert np.array_equal(raw, -first.o) and np.all(first.o > 0)  # the buffer moved on, the result did not
