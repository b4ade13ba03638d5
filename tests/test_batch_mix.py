"""spec_batch_mix: one-token rows before speculative rows in one call (vLLM PR #51812)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings

from gdn_verify.api import check
from gdn_verify.core.conventions import FLASHINFER_SPEC, NATIVE_SPEC, VLLM_SPEC, SpecRules
from gdn_verify.core.implementation import SPEC_FORM, Implementation
from gdn_verify.implementations import planted
from gdn_verify.implementations import speculative as cs
from gdn_verify.properties.speculative import spec_cases
from gdn_verify.properties.strategies import Limits

SEED = random.randrange(2**31)  # correct forms pass under any seed (printed on failure)


@settings(max_examples=40, database=None, deadline=None)
@given(spec_cases(Limits(dtype="float32"), NATIVE_SPEC, "mix"))
def test_a_mix_puts_one_token_rows_before_a_live_speculative_row(case):
    problem, params = case
    lengths = problem.lengths.tolist()
    first = next(i for i, n in enumerate(lengths) if n > 1)
    assert first >= 1 and all(n == 1 for n in lengths[:first])
    start = params["ssm_state_indices"][first][params["num_accepted_tokens"][first] - 1]
    assert start >= 0  # the first speculative row is live


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_planted_bug_is_caught_and_its_cause_named(dtype, tmp_path):
    impl = planted.implementation("spec_gates_not_regathered")
    result = check(impl, dtype=dtype, properties=["spec_batch_mix"], max_examples=30, seed=1, cases_dir=tmp_path)
    failure = result["spec_batch_mix"].failure
    assert failure is not None
    assert failure.message.startswith("batch mix of requests of [")
    assert "g and beta read at their token offsets less the one-token rows before them" in failure.message


def test_without_one_token_rows_first_the_planted_bug_is_right(tmp_path):
    """The bug needs the mix: every request of two or more tokens, it passes spec_decode_slots."""
    rules = SpecRules(name="two-or-more", min_tokens=2)
    impl = Implementation("no-mix", {SPEC_FORM: planted.spec_gates_not_regathered}, extra={"spec_rules": rules})
    result = check(impl, dtype="float32", properties=["spec_decode_slots"], max_examples=20, seed=SEED,
                   cases_dir=tmp_path)  # fmt: skip
    assert result["spec_decode_slots"].status == "passed", f"seed {SEED}"


@pytest.mark.parametrize("rules", [NATIVE_SPEC, VLLM_SPEC, FLASHINFER_SPEC], ids=lambda r: r.name)
def test_the_reference_passes_under_each_rule_set(rules, tmp_path):
    impl = Implementation(f"ref-{rules.name}", {SPEC_FORM: cs.rules_reference(rules)}, extra={"spec_rules": rules})
    result = check(impl, dtype="float32", properties=["spec_batch_mix"], max_examples=20, seed=SEED, cases_dir=tmp_path)
    status = result["spec_batch_mix"].status
    mixes = not (rules.uniform_lengths or rules.min_tokens > 1)
    assert status == ("passed" if mixes else "unsupported"), f"seed {SEED}: {result.as_dict()}"
