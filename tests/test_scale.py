"""The scale tier on CPU: the same cases, judge and child processes, at limits of a few elements."""

from __future__ import annotations

import pytest

from gdn_verify import api
from gdn_verify.core.implementation import ConfigurationError
from gdn_verify.runners import scale
from tests.scale_plugins import LIMITS

CASES = [c.name for c in scale.plan(LIMITS)]


def run(name: str, cases: list[str] | None = None) -> dict[str, scale.ScaleOutcome]:
    outcomes = scale.run_scale(f"tests.scale_plugins:{name}", "float32", array="numpy", limits=LIMITS, cases=cases)
    return {o.case: o for o in outcomes}


def test_every_case_crosses_its_limit():
    """Each case is just past what it claims to cross (at the default limits: the GPU sizes)."""
    cases = {c.name: c for c in scale.plan()}
    d = cases["decode_batch"]
    assert d.B * d.HV > scale.GRID_LIMIT and d.B * d.HV * d.K * d.V > scale.OFFSET_LIMIT
    assert len(cases["varlen_many_short"].lengths) * 16 > scale.GRID_LIMIT
    assert cases["many_chunks"].T // 64 > scale.GRID_LIMIT
    b = cases["batch_offset"]
    last = max(b.probes)
    assert last * b.T * b.H * b.K >= scale.OFFSET_LIMIT and (last - 1) * b.T * b.H * b.K < scale.OFFSET_LIMIT
    s = cases["long_sequence"]
    assert (s.T // 64) * s.HV * s.K * s.V > scale.OFFSET_LIMIT
    assert all(c.device_bytes("bfloat16", 64) < 60 * 2**30 for c in cases.values())  # fits an H100


def test_a_correct_kernel_passes_every_case():
    outcomes = run("correct")
    assert set(outcomes) == set(CASES)
    assert {o.status for o in outcomes.values()} == {"passed"}, {o.case: o.message for o in outcomes.values()}
    assert all(o.worst is not None and o.worst.ratio <= 1 for o in outcomes.values())


def test_work_skipped_past_the_grid_is_caught_against_the_oracle():
    outcomes = run("skips_past_grid", ["decode_batch", "many_chunks"])
    assert outcomes["decode_batch"].status == "failed"
    assert "float64 oracle" in outcomes["decode_batch"].message
    assert outcomes["many_chunks"].status == "passed"  # one sequence, one head: one block


def test_wrapped_offsets_are_caught_in_later_samples_and_sequences():
    outcomes = run("int32_offsets", ["batch_offset", "varlen_offset", "decode_batch"])
    for name in ("batch_offset", "varlen_offset"):
        assert outcomes[name].status == "failed", name
        assert "probed sequences" in outcomes[name].message
    assert outcomes["decode_batch"].status == "passed"  # 10 tokens: no offset reaches 2^11


def test_a_dead_child_is_a_failure_and_the_run_goes_on():
    outcomes = run("crashes_on_many_sequences", ["decode_batch", "many_chunks"])
    assert outcomes["decode_batch"].status == "failed"
    assert "died" in outcomes["decode_batch"].message and "signal 6" in outcomes["decode_batch"].message
    assert outcomes["many_chunks"].status == "passed"


def test_a_launch_error_is_a_failure_with_the_exception():
    outcomes = run("launch_error", ["decode_batch"])
    assert outcomes["decode_batch"].status == "failed"
    assert "invalid configuration argument" in outcomes["decode_batch"].message
    assert "in launch_error" in outcomes["decode_batch"].detail["traceback"]  # the frame that raised


def test_check_runs_named_scale_cases_alone():
    result = api.check(
        "tests.scale_plugins:launch_error",
        array="numpy",
        properties=["scale_decode_batch", "scale_many_chunks"],
        scale_limits=LIMITS,
    )
    assert [r.name for r in result.results] == ["scale_decode_batch", "scale_many_chunks"]
    assert [r.status for r in result.results] == ["failed", "passed"]
    assert "invalid configuration argument" in result.report()
    assert result.as_dict()["results"][0]["failure"]["problem"].startswith("decode_batch:")


def test_scale_misuse_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="scale: the scale tier needs a GPU"):
        api.check("numpy", scale=True)
    with pytest.raises(ConfigurationError, match=r"properties: unknown \(none given\)"):
        api.check("numpy", properties=[])  # an empty list names nothing: still misuse, not an empty run
    with pytest.raises(ConfigurationError, match="properties: unknown scale_nope"):
        api.check("numpy", properties=["scale_nope"], scale_limits=LIMITS)
    with pytest.raises(ConfigurationError, match="child process"):
        api.check(lambda *a, **k: None, scale=True, scale_limits=LIMITS)


MEMCHECK_REPORT = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at decode_kernel+0x1a0 in recurrent.cu:212
=========     by thread (3,0,0) in block (7,0,0)
=========     Address 0x7f00001000 is out of bounds
=========     and is 4 bytes after the nearest allocation at 0x7f00000000 of size 4096 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========     Host Frame: [0x2f2]
=========
========= ERROR SUMMARY: 1 error
"""


def test_memchecks_first_error_is_read_from_its_report():
    from gdn_verify.runners import sanitize

    error = sanitize.first_error("check output\n" + MEMCHECK_REPORT)
    assert error.startswith("Invalid __global__ write of size 4 bytes; at decode_kernel+0x1a0 in recurrent.cu:212")
    assert "4 bytes after the nearest allocation" in error and "Host Frame" not in error
    assert sanitize.first_error("========= ERROR SUMMARY: 0 errors\n") == ""


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["cupy", "fla-recurrent"])
def test_the_torch_path_on_a_gpu_at_small_limits(cp, impl):
    """The cases as torch tensors on the device, with the float64 GPU oracle, at limits of a few
    thousand elements: the same code path as the full tier, in seconds."""
    from gdn_verify import implementations

    try:
        implementations.resolve(impl)
    except ConfigurationError as exc:
        pytest.skip(str(exc))
    small = scale.ScaleLimits(grid=8, offset=2**14, chunk=64, head_dim=16)
    outcomes = scale.run_scale(impl, "bfloat16", limits=small, timeout=600)
    assert {o.status for o in outcomes} == {"passed"}, {o.case: o.message for o in outcomes}


def test_the_reference_cache_pays_the_oracle_once_per_problem(tmp_path, monkeypatch):
    from gdn_verify.core.oracle import numpy_oracle
    from gdn_verify.core.shapes import ShapeClass

    calls = []

    def counting(problem):
        calls.append(1)
        return numpy_oracle(problem)

    problem = ShapeClass(1, 2, 8, 8, "float32", True, True, False).example()
    other = problem.replace(v=problem.v * 2)
    monkeypatch.setenv(scale.CACHE_ENV, str(tmp_path))
    first = scale.cached_reference(problem, counting)
    per_problem = len(calls)  # the oracle and the condition estimate's perturbed runs
    again = scale.cached_reference(problem, counting)
    assert len(calls) == per_problem and (first[0][0] == again[0][0]).all()
    assert first[1].output_rms == again[1].output_rms
    scale.cached_reference(other, counting)  # different inputs: a different entry
    assert len(calls) == 2 * per_problem
    monkeypatch.delenv(scale.CACHE_ENV)
    scale.cached_reference(problem, counting)  # no cache configured: always computed
    assert len(calls) == 3 * per_problem


def test_a_speculative_only_implementation_is_unsupported_with_the_reason():
    """The cases call the native form; FlashInfer's MTP kernel (spec form only) died in every child
    (H100, 2026-11-26) until this was said up front."""
    result = api.check("planted:spec_reads_first_slot", properties=["scale_decode_batch"], scale_limits=LIMITS)
    [row] = result.results
    assert row.status == "unsupported" and "native (FLA-convention) form" in row.note


# Kernels without GVA: the cases adapt --------------------------------------------------------------
GVA_CASES = [c.name for c in scale.plan(LIMITS) if c.H != c.HV]


@pytest.mark.parametrize("plugin", ["no_gva_refuses", "no_gva_heads_of_q"])
def test_a_kernel_without_gva_runs_every_case_with_h_equal_hv(plugin):
    """A kernel that refuses HV != H, or (like FLA releases before GVA) returns q's head count, is
    run with H = HV: the same tokens, value heads and state elements, so the same limits are
    crossed, and the outcome says it was adapted (an IndexError in take_pairs, H200 2026-12-04)."""
    outcomes = run(plugin, GVA_CASES + ["many_chunks"])
    assert {o.status for o in outcomes.values()} == {"passed"}, {o.case: o.message for o in outcomes.values()}
    for name in GVA_CASES:
        adapted = outcomes[name]
        assert "H=16 HV=16" in adapted.describe
        assert "adapted: H = HV = 16, the kernel has no GVA (" in adapted.describe
        assert adapted.detail["adapted"].startswith("H = HV = 16: ")
    assert "adapted" not in outcomes["many_chunks"].detail and "adapted" not in outcomes["many_chunks"].describe
    planned = {c.name: c for c in scale.plan(LIMITS)}
    why = outcomes["decode_batch"].detail["adapted"]
    case = scale.adapted_to_gva(planned["decode_batch"], why)
    assert case.B * case.HV > LIMITS.grid and case.B * case.HV * case.K * case.V > LIMITS.offset  # still crossed


def test_the_adaptation_is_said_in_the_check_result():
    result = api.check(
        "tests.scale_plugins:no_gva_refuses", array="numpy", properties=["scale_decode_batch"], scale_limits=LIMITS
    )
    [row] = result.results
    assert row.status == "passed" and "adapted: H = HV = 16, the kernel has no GVA" in row.note


def test_a_declared_capability_decides_without_a_call():
    from gdn_verify.core.implementation import Implementation

    def never(**kw):
        raise AssertionError("the declaration decides: no probe call")

    case = next(c for c in scale.plan(LIMITS) if c.H != c.HV)
    dev = scale._Device("numpy", 0)
    call = scale.checked_call(never, dev)
    declared = Implementation("declared", {"chunk": never}, extra={"gva": False})
    assert scale.missing_gva(declared, case, "float32", dev, call) == 'it declares no GVA (extra["gva"] = False)'
    assert (
        scale.missing_gva(Implementation("gva", {"chunk": never}, extra={"gva": True}), case, "float32", dev, call)
        is None
    )


def test_a_token_step_adapter_runs_only_the_cases_one_launch_crosses():
    """FlashInfer's decode and vLLM's packed decode are called once per token step with the step's
    rows copied: only the sequence count and the pool grow within a launch. The other cases crossed
    nothing there and cost a launch per token (4.2 million for many_chunks; vllm-packed-decode's tier
    had not finished its first case after 6.5 minutes on an H100, 2026-12-05)."""
    from gdn_verify.core.implementation import Implementation
    from gdn_verify.core.oracle import numpy_oracle
    from tests.scale_plugins import correct

    def never(**kw):
        raise AssertionError("not called: the case crosses nothing in one launch")

    steps = Implementation("steps", {"chunk": never}, extra={"token_steps": True})
    plain = Implementation("plain", {"chunk": never})
    for case in scale.plan(LIMITS):
        why = scale.per_token_launches(steps, case)
        assert scale.per_token_launches(plain, case) is None
        if case.name in scale.TOKEN_STEP_CASES:
            assert why is None, case.name
            continue
        assert why is not None and "launches its kernel once per token step" in why, case.name
        out = scale.run_case(steps, case, "float32", numpy_oracle)
        assert out["status"] == "unsupported" and out["message"] == why
    decode = next(c for c in scale.plan(LIMITS) if c.name == "decode_batch")
    runs = Implementation("steps", {"chunk": correct}, extra={"token_steps": True})
    assert scale.run_case(runs, decode, "float32", numpy_oracle)["status"] == "passed"


def test_a_kernel_failing_with_and_without_gva_is_not_adapted():
    """GVA is not the reason when H = HV fails as well: the case runs as planned and fails for itself."""
    outcomes = run("returns_none", ["decode_batch"])
    assert outcomes["decode_batch"].status == "failed" and "adapted" not in outcomes["decode_batch"].detail


# Returns that break the output contract: clean failures, never an error in our own code ---------------
@pytest.mark.parametrize(
    "plugin, expected",
    [
        ("returns_three", "output contract: expected a pair (o, final_state), got a tuple of 3"),
        ("returns_none", "output contract: expected a pair (o, final_state), got NoneType"),
        ("returns_integer_output", "output contract: o has dtype int32, expected a floating-point dtype"),
        ("returns_one_state_short", "output contract: final_state has shape (9, 16, 4, 4), expected (10, 16, 4, 4)"),
    ],
)
def test_a_return_that_breaks_the_contract_is_a_failure_naming_it(plugin, expected):
    outcome = run(plugin, ["decode_batch"])["decode_batch"]
    assert outcome.status == "failed" and outcome.message.startswith(expected), outcome.message
    assert "traceback" not in outcome.detail  # judged, not crashed


def test_numpy_returned_for_torch_inputs_is_a_contract_failure():
    pytest.importorskip("torch")
    outcomes = scale.run_scale(
        "tests.scale_plugins:returns_numpy_for_torch", "float32", array="torch", limits=LIMITS, cases=["many_chunks"]
    )
    [outcome] = outcomes
    assert outcome.status == "failed"
    assert "output contract: o is a numpy.ndarray, expected a torch (" in outcome.message
    assert "array of shape (1, 40, 1, 4)" in outcome.message


def test_a_state_handed_back_transposed_fails_against_the_oracle():
    """K = V: the v-first state has the k-first shape, so only its values give it away."""
    outcome = run("returns_transposed_state", ["decode_batch"])["decode_batch"]
    assert outcome.status == "failed" and "against the float64 oracle: state error" in outcome.message
