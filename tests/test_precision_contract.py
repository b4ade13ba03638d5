"""The precision contract (docs/precision.md): allowed roundings pass, forbidden ones fail, by margins.

Each model of ``gdn_verify.implementations.precision`` makes one rounding. On problems built to
expose each forbidden one (a float32 initial state, tiny gates and a retained memory, tiny rows
under l2norm, gates summing past a few units), every allowed model stays below half its bound and
every forbidden one lands above three times it, in float32, float16 and bfloat16. The committed
table (``benchmarks/precision_contract.py``) measures the same over generated examples.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from gdn_verify.core import tolerance
from gdn_verify.core.oracle import numpy_oracle
from gdn_verify.core.problem import DTYPES, Problem
from gdn_verify.core.property import Violation
from gdn_verify.implementations import from_callable
from gdn_verify.implementations.precision import BY_NAME, MODELS
from gdn_verify.properties.native import check_matches_reference

DTYPE_NAMES = ("float32", "float16", "bfloat16")


def make(kind: str, dtype: str, seed: int = 0) -> Problem:
    """A problem that exposes one kind of forbidden rounding (H=1, HV=2, K=32, V=16)."""
    rng = np.random.default_rng(seed)
    T = {"state": 0, "retention": 400}.get(kind, 160)
    K, V = 32, 16
    k = rng.standard_normal((1, T, 1, K))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    q = rng.standard_normal((1, T, 1, K))
    g = np.log(rng.uniform(0.9, 1.0, (1, T, 2)))
    beta = rng.uniform(0, 1, (1, T, 2))
    state = None
    l2norm = False
    if kind == "state":  # no tokens: the float32 initial state is the final state, which a 16-bit
        state = rng.standard_normal((1, 2, K, V)).astype(np.float32)  # carried state rounds at once
    elif kind == "retention":  # written in the first 20 tokens, then only read, with decays mostly below 2^-12:
        g = -(10.0 ** rng.uniform(-4.0, -3.3, (1, T, 2)))  # a 16-bit exp(g) is 1, a 16-bit state stalls
        beta[:, 20:] = 0.0
    elif kind == "tiny_rows":  # rows where the l2norm epsilon decides the result
        l2norm = True
        rows = rng.integers(0, T, 20)
        q[:, rows] *= 1e-3 / np.linalg.norm(q[:, rows], axis=-1, keepdims=True)
        k[:, rows] *= 1e-3 / np.linalg.norm(k[:, rows], axis=-1, keepdims=True)
    elif kind == "spike":  # a saturated gate inside a chunk: the chunk-local cumsum reaches 1e4 after it
        g[:, 70] = -1e4
    return Problem(
        q, k, rng.standard_normal((1, T, 2, V)), g, beta, initial_state=state, use_qk_l2norm_in_kernel=l2norm
    ).astype(DTYPES[dtype])


KINDS = ("plain", "state", "retention", "tiny_rows", "spike")


def ratio(model: str, problem: Problem) -> float:
    impl = from_callable(BY_NAME[model].run, "numpy", name=model)
    try:
        return check_matches_reference(impl, problem, {}).ratio
    except Violation as exc:
        return np.inf if exc.measurement is None else exc.measurement.ratio


@pytest.fixture(scope="module")
def problems():
    return {(kind, dtype): make(kind, dtype) for kind in KINDS for dtype in DTYPE_NAMES}


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("model", [m.name for m in MODELS if m.allowed])
def test_allowed_roundings_stay_below_half_the_bound(model, dtype, problems):
    worst = max(ratio(model, problems[kind, dtype]) for kind in KINDS)
    assert worst < 0.5, f"{model} {dtype}: {worst:.3g} of its bound"


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("model", [m.name for m in MODELS if m.allowed is False])
def test_forbidden_roundings_land_above_three_times_the_bound(model, dtype, problems):
    if dtype in BY_NAME[model].identity_for:
        pytest.skip(f"{model} is the identity for {dtype} inputs")
    worst = max(ratio(model, problems[kind, dtype]) for kind in KINDS)
    assert worst > 3.0, f"{model} {dtype}: only {worst:.3g} times its bound"


def test_tf32_is_a_loss_for_float32_inputs_only(problems):
    assert ratio("tf32", problems["plain", "float32"]) > 3.0
    assert max(ratio("tf32", problems[kind, "bfloat16"]) for kind in KINDS) < 0.5


def test_each_allowed_rounding_has_its_own_term():
    p = make("tiny_rows", "bfloat16")
    bound = tolerance.tolerance(p, tolerance.condition(p, numpy_oracle(p)))
    names = [name for name, _ in bound.terms]
    for name, text in tolerance.ROUNDING_TEXT.items():
        assert (text in names) == (name != "underflow")  # bfloat16 has float32's range: no underflow term
    assert "float32 arithmetic" in names and "output rounding" in names
    # the terms are what the bound is made of
    assert sum(values[0] for _, values in bound.terms) == pytest.approx(bound.output_rms)
    assert "W, U, chunk-start states" in bound.breakdown("state")


def test_the_table_script_writes_json_and_markdown(tmp_path):
    from benchmarks.precision_contract import main

    main(
        [
            "--examples",
            "2",
            "--seeds",
            "1",
            "--models",
            "fla16,decay16",
            "--dtypes",
            "bfloat16",
            "--properties",
            "matches_reference",
            "--out",
            str(tmp_path),
        ]
    )
    doc = json.loads((tmp_path / "contract.json").read_text())
    assert {row["model"] for row in doc["rows"]} == {"fla16", "decay16"}
    assert all(row["examples"] == 2 for row in doc["rows"])
    assert "| fla16 | allowed | bfloat16 |" in (tmp_path / "contract.md").read_text()


def test_a_float16_flush_to_zero_of_a_decayed_write_is_an_allowed_rounding():
    # FLA 0.6 in float16 on an H100 (2026-11-25): two tokens, g = -30 then -57, the second key an
    # all-zero row under l2norm. The exact final state is the first write decayed by e^-57 (about
    # 1e-25 of it); FLA stores that decayed write in float16, where it underflows to 0, and returns 0:
    # "state error 1". A float16 store does that by definition; the bound's underflow term covers it.
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 1, 2, 1, 16))
    k[0, 1] = 0.0
    problem = Problem(
        q, k, rng.standard_normal((1, 2, 2, 8)), np.array([[[-30.0, -30.0], [-57.0, -57.0]]]),
        np.full((1, 2, 2), 0.9), use_qk_l2norm_in_kernel=True,
    ).astype(np.float16)  # fmt: skip
    reference = numpy_oracle(problem)
    bound = tolerance.tolerance(problem, tolerance.condition(problem, reference))
    o, state = BY_NAME["fla16"].run(**problem.kwargs())
    assert not np.any(state) and np.all(np.abs(reference[1]) < 1e-20)  # flushed, and what was flushed
    errors = tolerance.measure(o, state, reference[0], reference[1], problem, bound.scales)
    assert errors.state == pytest.approx(1.0)
    assert errors.state < 0.5 * bound.state
    assert dict(bound.terms)["underflow of the intermediates stored in the input dtype"][2] > 1.0
