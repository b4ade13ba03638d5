"""Process properties (optional_dtypes, shape_class_return): the planted caches caught and named,
correct implementations passing, and the draws doing what the properties need of them."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings

from gdn_verify.api import check
from gdn_verify.core.implementation import Implementation
from gdn_verify.implementations import numpy_impl
from gdn_verify.implementations import planted_memory as pm
from gdn_verify.properties.process import (
    optional_dtype_cases,
    optional_dtypes_of,
    other_problem,
    read_as_exact,
    shape_class,
    shape_return_cases,
)
from gdn_verify.properties.strategies import Limits

SEED = random.randrange(2**31)  # correct implementations pass under any seed (printed on failure)
PROPS = ("optional_dtypes", "shape_class_return")


def _run(impl, prop, tmp_path, dtype="float32", n=15, seed=5):
    return check(impl, dtype=dtype, properties=[prop], max_examples=n, seed=seed, cases_dir=tmp_path)[prop]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("prop", PROPS)
def test_the_numpy_implementation_passes(prop, dtype, tmp_path):
    result = _run("numpy", prop, tmp_path, dtype=dtype, seed=SEED)
    assert result.status == "passed", f"seed {SEED}: {result.failure and result.failure.message}"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_cache_keyed_without_the_initial_state_dtype_is_caught_on_the_second_call(dtype, tmp_path):
    result = _run(pm.implementation("initial_state_cache_without_dtype"), "optional_dtypes", tmp_path, dtype=dtype)
    assert result.status == "failed"
    second = "bfloat16" if dtype == "float32" else dtype
    message = result.failure.message
    assert message.startswith(f"call 2 of 3 (initial_state in {second}, after a call with it in float32"), message
    assert "a cache keyed without that dtype" in message


DECLARED = {"A_log": ("float32", "half"), "dt_bias": ("half", "float32")}


def test_a_cache_keyed_without_the_dtype_of_a_log_is_caught_where_declared(tmp_path):
    """FlashInfer PR #4219's bug: A_log and dt_bias declared as taken in two dtypes."""
    impl = Implementation("cache", {"chunk": pm.InitialStateCacheWithoutDtype()}, extra={"optional_dtypes": DECLARED})
    result = _run(impl, "optional_dtypes", tmp_path)
    assert result.status == "failed"
    assert re_call_2(result.failure.message, ("A_log", "dt_bias")), result.failure.message
    right = Implementation("numpy", {"chunk": numpy_impl.chunk_gated_delta_rule}, extra={"optional_dtypes": DECLARED})
    assert _run(right, "optional_dtypes", tmp_path, seed=SEED).status == "passed", f"seed {SEED}"


def re_call_2(message: str, names: tuple[str, ...]) -> bool:
    return any(message.startswith(f"call 2 of 3 ({name} in ") for name in names)


def test_the_cache_bug_passes_when_every_call_has_one_dtype(tmp_path):
    """Called only with float32 initial states (as every other property calls it), the planted cache
    is right: what optional_dtypes catches is the dtype change, not the plug-in."""
    impl = pm.implementation("initial_state_cache_without_dtype")
    done = check(impl, dtype="float32", properties=["matches_reference", "state_continuation"], max_examples=10,
                 seed=3, cases_dir=tmp_path)  # fmt: skip
    assert all(r.status == "passed" for r in done.results), done.as_dict()


def test_a_dtype_refusal_naming_the_dtype_is_a_note(tmp_path):
    def float32_state_only(**kw):
        if kw["initial_state"] is not None and np.asarray(kw["initial_state"]).dtype != np.float32:
            raise TypeError(f"initial_state: dtype must be float32, got {np.asarray(kw['initial_state']).dtype}")
        return numpy_impl.chunk_gated_delta_rule(**kw)

    result = _run(Implementation("f32-state", {"chunk": float32_state_only}), "optional_dtypes", tmp_path)
    assert result.status == "passed" and "dtype must be float32" in result.note


def test_declared_pairs_resolve_half_to_the_inputs_16_bit_type():
    impl = Implementation("x", {"chunk": numpy_impl.chunk_gated_delta_rule})
    assert optional_dtypes_of(impl, "float32") == {"initial_state": ("float32", "bfloat16")}
    assert optional_dtypes_of(impl, "float16") == {"initial_state": ("float32", "float16")}
    same = Implementation(
        "y", {"chunk": numpy_impl.chunk_gated_delta_rule}, extra={"optional_dtypes": {"A_log": ("half", "bfloat16")}}
    )
    assert optional_dtypes_of(same, "bfloat16") == {}  # one dtype: nothing to tell apart
    with pytest.raises(ValueError, match="optional_dtypes"):
        optional_dtypes_of(
            Implementation("z", {}, extra={"optional_dtypes": {"scale": ("float32", "half")}}), "float32"
        )


@settings(max_examples=30, database=None, deadline=None)
@given(optional_dtype_cases(Limits(), Implementation("x", {"chunk": numpy_impl.chunk_gated_delta_rule})))
def test_the_optional_argument_is_exact_in_both_dtypes(case):
    """One oracle serves all three calls only if the values survive both dtypes."""
    problem, params = case
    state = np.asarray(problem.initial_state, np.float32)
    for d in params["dtypes"]:
        assert np.array_equal(read_as_exact(state, d), state)


@settings(max_examples=30, database=None, deadline=None)
@given(shape_return_cases(Limits(dtype="float32")))
def test_the_two_calls_are_of_different_shape_classes(case):
    problem, params = case
    assert shape_class(other_problem(params["other"], "float32")) != shape_class(problem)


@pytest.mark.parametrize("seed", [5, 6])
def test_a_tile_kept_from_the_previous_call_is_caught_and_named(seed, tmp_path):
    result = _run(pm.implementation("key_tile_from_previous_call"), "shape_class_return", tmp_path, seed=seed)
    assert result.status == "failed"
    message = result.failure.message
    assert message.startswith(
        ("call 1 of 3 (class X, after the calls", "call 2 of 3 (class Y", "call 3 of 3 (class X again")
    ), message
    assert "a heuristic or launch configuration kept from the previous call" in message


def test_a_path_that_depends_on_the_previous_call_is_named_bitwise(tmp_path):
    """Within tolerance but not bitwise the first call's result: the third call is named."""

    class Nudged:
        def __init__(self):
            self.previous = None

        def __call__(self, **kw):
            o, s = numpy_impl.chunk_gated_delta_rule(**kw)
            K = np.shape(kw["q"])[-1]
            if self.previous is not None and self.previous != K and o.size:
                o = o.copy()
                o.reshape(-1)[0] = np.nextafter(o.reshape(-1)[0], np.float32(np.inf))
            self.previous = K
            return o, s

    result = _run(Implementation("nudged", {"chunk": Nudged()}), "shape_class_return", tmp_path)
    assert result.status == "failed"
    assert "returned a o that differs from call 1's" in result.failure.message
