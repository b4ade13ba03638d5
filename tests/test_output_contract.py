"""The output contract on every path that reads a kernel's return: the properties' calls
(``verdict.run_checked``), the ``output_contract`` property, the speculative-decoding form
(``verdict.spec_output``), ``replay`` and its diagnosis. A return of the wrong arity, type, shape or
dtype is a failure naming what came back and what was expected, never an exception of our own code.
(The scale tier's calls: ``tests/test_scale.py``.)"""

from __future__ import annotations

import numpy as np
import pytest

from gdn_verify import api
from gdn_verify.core.implementation import Implementation
from gdn_verify.core.problem import Problem
from gdn_verify.core.property import Violation
from gdn_verify.core.shapes import ShapeClass
from gdn_verify.core.verdict import run_checked, spec_output
from gdn_verify.implementations import numpy_impl
from gdn_verify.runners import check, diagnose
from gdn_verify.runners.check import RunSettings, run_property


def example() -> Problem:
    """One float32 sequence of 12 tokens, H = 1, HV = 2, K = 4, V = 8 (K != V), with an initial state."""
    return ShapeClass(1, 2, 4, 8, "float32", False, True, False).example(tokens=24, batch=1)


def correct(**kw):
    return numpy_impl.chunk_gated_delta_rule(**kw)


def returning(change):
    """A kernel whose correct ``(o, final_state)`` is handed back as ``change(o, state)``."""

    def run(**kw):
        o, state = correct(**kw)
        return change(o, state)

    return run


BAD_RETURNS = {
    "None": (lambda o, s: None, "expected a pair (o, final_state), got NoneType"),
    "three values": (lambda o, s: (o, s, None), "expected a pair (o, final_state), got a tuple of 3"),
    "a dict": (lambda o, s: {"o": o, "state": s}, "expected a pair (o, final_state), got dict"),
    "q's head count": (lambda o, s: (o[:, :, :1], s[:, :1]), "o has shape (1, 12, 1, 8), expected (1, 12, 2, 8)"),
    "a ragged list": (lambda o, s: ([[1.0, 2.0], [3.0]], s), "o is a list that is not an array"),
    "a scalar": (lambda o, s: (1.0, s), "o has shape (), expected (1, 12, 2, 8)"),
    "integers": (lambda o, s: (o.astype(np.int32), s), "o has dtype int32, expected a floating-point dtype"),
    "complex numbers": (lambda o, s: (o.astype(np.complex64), s), "o has dtype complex64, expected a floating-point"),
    "no state": (lambda o, s: (o, None), "final_state is None although output_final_state=True (expected shape"),
    "the state v-first": (
        lambda o, s: (o, np.ascontiguousarray(s.swapaxes(-1, -2))),
        "final_state has shape (1, 2, 8, 4), expected (1, 2, 4, 8)",
    ),
    "a flat state": (lambda o, s: (o, s.ravel()), "final_state has shape (64,), expected (1, 2, 4, 8)"),
}


@pytest.mark.parametrize("what", BAD_RETURNS)
def test_every_propertys_call_holds_a_return_to_the_contract(what):
    change, expected = BAD_RETURNS[what]
    p = example()
    with pytest.raises(Violation, match="^output contract: ") as info:
        run_checked(Implementation("bad", {"chunk": returning(change)}), p)
    assert expected in str(info.value), str(info.value)


def test_the_contract_property_also_holds_dtypes_and_the_array_kind():
    from gdn_verify.properties.native import check_output_contract

    p = example()
    wider = Implementation("wider", {"chunk": returning(lambda o, s: (o.astype(np.float64), s))})
    with pytest.raises(Violation, match="o has dtype float64, expected the input dtype float32"):
        check_output_contract(wider, p, {})
    run_checked(wider, p)  # a wider float is still comparable: only output_contract judges it
    torch = pytest.importorskip("torch")

    def numpy_for_torch(**kw):
        return correct(**{n: x.cpu().numpy() if isinstance(x, torch.Tensor) else x for n, x in kw.items()})

    def torch_for_torch(**kw):
        return tuple(torch.from_numpy(x) for x in numpy_for_torch(**kw))

    with pytest.raises(Violation, match="o came back as numpy, expected a torch array"):
        check_output_contract(Implementation("np", {"chunk": numpy_for_torch}, array="torch"), p, {})
    run_checked(Implementation("np", {"chunk": numpy_for_torch}, array="torch"), p)  # converted for comparisons
    check_output_contract(Implementation("torch", {"chunk": torch_for_torch}, array="torch"), p, {})


@pytest.mark.parametrize("what", ["None", "three values", "a ragged list", "integers", "a flat state"])
def test_a_check_reports_a_broken_return_as_a_failure(what, tmp_path):
    change, expected = BAD_RETURNS[what]
    impl = Implementation("bad", {"chunk": returning(change)})
    prop = api.catalogue_for(impl)["matches_reference"]
    result = run_property(prop, impl, RunSettings(max_examples=5, seed=0, cases_dir=tmp_path))
    assert result.status == "failed", result.note
    assert result.failure.message.startswith("output contract: ") and result.failure.traceback is None


@pytest.mark.parametrize(
    "ret, expected",
    [
        (lambda o: None, "o has shape None, expected (1, 5, 2, 8)"),
        (lambda o: (o, None), "expected o alone, got a tuple of 2"),
        (lambda o: [[1.0], [2.0, 3.0]], "o is a list that is not an array"),
        (lambda o: o[:, :1], "o has shape (1, 1, 2, 8), expected (1, 5, 2, 8)"),
        (lambda o: o.astype(np.int64), "o has dtype int64, expected a floating-point dtype"),
    ],
)
def test_the_speculative_forms_return_is_held_to_its_contract(ret, expected):
    p = ShapeClass(1, 2, 4, 8, "float32").example(tokens=10, batch=1)
    o = np.zeros(p.v.shape, np.float32)
    assert spec_output(o, p) is not None
    with pytest.raises(Violation, match="^output contract: ") as info:
        spec_output(ret(o), p)
    assert expected in str(info.value)


def test_replay_and_its_diagnosis_report_a_broken_return_and_a_raising_kernel(tmp_path):
    p = example()
    props = api.catalogue_for(Implementation("x", {"chunk": correct}))
    bad = Implementation("bad", {"chunk": returning(BAD_RETURNS["None"][0])})
    replayed = check.replay(p, {}, bad, props["matches_reference"])
    assert (replayed.status, replayed.message) == ("failed", BAD_RETURNS["None"][1].join(("output contract: ", "")))
    where = diagnose.localise(bad, p)
    assert where.kind == "contract" and where.describe().startswith("nothing to localise: output contract: ")

    def raises(**kw):
        raise RuntimeError("kernel exploded")

    boom = Implementation("boom", {"chunk": raises})
    assert check.replay(p, {}, boom, props["matches_reference"]).message == "raised RuntimeError: kernel exploded"
    case = p.save(tmp_path / "case.npz", property="matches_reference", impl="boom", array="numpy", params={})
    assert (
        diagnose.replay_diagnosis(str(case), boom) == "diagnosis: none, the call raised RuntimeError: kernel exploded"
    )
