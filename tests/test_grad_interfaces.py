"""The backward's interfaces: ``check --grad``, ``--convention backward``, ``selftest --grad``, replay of
a gradient case, ``--gdn-grad``, and their misuse (one line, exit 2; ``ConfigurationError`` naming the
argument).

These test the plumbing, fast and on CPU: the gradient properties and the planted gradient bugs
are small stand-ins defined here (installed in place of ``gdn_verify.properties.gradients`` and
``gdn_verify.implementations.planted_grad``), so that what is checked is how the interfaces route
a backward, not the real properties' tolerances (their own tests do that).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
from hypothesis import strategies as st

from gdn_verify import _cli, api, implementations
from gdn_verify.core.gradients import cotangents, problem_gradients, recurrent_gated_delta_rule_backward
from gdn_verify.core.implementation import BACKWARD_FORM, GRADIENTS, ConfigurationError, Implementation
from gdn_verify.core.property import Measurement, Property, Violation
from gdn_verify.implementations import numpy_impl
from gdn_verify.options import CheckOptions
from gdn_verify.properties import strategies as gs

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (the autograd path needs it)")


# Stand-ins --------------------------------------------------------------------------------------
def numpy_backward(
    q, k, v, g, beta, scale=None, initial_state=None, use_qk_l2norm_in_kernel=False, cu_seqlens=None, *, do, dht=None
):
    """A correct functional backward of any array kind NumPy takes: the float64 adjoint, in float32."""
    grads = recurrent_gated_delta_rule_backward(
        q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel, cu_seqlens, do=do, dht=dht
    )
    return tuple(None if grads[n] is None else grads[n].astype(np.float32) for n in GRADIENTS)


def dg_doubled(*args, **kw):
    dq, dk, dv, dg, dbeta, dh0 = numpy_backward(*args, **kw)
    return dq, dk, dv, 2 * dg, dbeta, dh0


def dq_dropped(*args, **kw):
    dq, dk, dv, dg, dbeta, dh0 = numpy_backward(*args, **kw)
    return np.zeros_like(dq), dk, dv, dg, dbeta, dh0


def _check_gradients(impl: Implementation, problem, params: dict) -> Measurement:
    do, dht = cotangents(problem, params["cotangent_seed"], params["with_dht"])
    got = impl.run_backward(problem, do, dht).grads
    want = problem_gradients(problem, do, dht)
    worst, bound = 0.0, 1e-4
    for name in GRADIENTS:
        if want[name] is None:
            continue
        if got[name] is None:
            raise Violation(f"{name} is None")
        error = float(np.max(np.abs(got[name] - want[name]), initial=0.0)) / (1 + np.max(np.abs(want[name]), initial=0))
        if error > bound:
            raise Violation(f"{name} error {error:.3g} > {bound:g}", Measurement(error, bound, f"{name} vs oracle"))
        worst = max(worst, error)
    return Measurement(worst, bound, "gradients vs oracle")


def _check_determinism(impl: Implementation, problem, params: dict) -> Measurement:
    do, dht = cotangents(problem, params["cotangent_seed"], params["with_dht"])
    a, b = impl.run_backward(problem, do, dht).grads, impl.run_backward(problem, do, dht).grads
    if any((a[n] is None) != (b[n] is None) or (a[n] is not None and not np.array_equal(a[n], b[n])) for n in a):
        raise Violation("two identical calls differ")
    return Measurement(0.0, 0.0, "bitwise")


def stub_grad_properties(limits) -> list[Property]:
    # Some tokens (autograd leaves the inputs of an empty problem unused: None, not zeros).
    problems = gs.problems(limits.replace(max_len=12, head_dims=(2, 3, 4))).filter(lambda p: p.lengths.sum() > 0)
    params = st.fixed_dictionaries({"cotangent_seed": st.integers(0, 2**31 - 1), "with_dht": st.booleans()})
    strategy = st.tuples(problems, params)
    return [
        Property("grad_stub_reference", "gradients vs the oracle", lambda impl: strategy, _check_gradients, 8,
                 form=BACKWARD_FORM),
        Property("grad_stub_determinism", "bitwise repeat", lambda impl: strategy, _check_determinism, 3,
                 form=BACKWARD_FORM),
    ]  # fmt: skip


STUB_NAMES = ("grad_stub_reference", "grad_stub_determinism")


def _stub_planted_implementation(bug: str) -> Implementation:
    if bug not in STUB_BUGS:
        raise ConfigurationError("impl", f"planted-grad:{bug}: unknown bug")
    return Implementation(
        f"planted-grad:{bug}",
        {"chunk": numpy_impl.chunk_gated_delta_rule, BACKWARD_FORM: STUB_BUGS[bug][1]},
        description=STUB_BUGS[bug][0],
    )


STUB_BUGS = {"dg_doubled": ("dg times two", dg_doubled), "dq_dropped": ("dq left zero", dq_dropped)}


@pytest.fixture
def stand_ins(monkeypatch, tmp_path):
    """The stand-in gradient properties and planted gradient bugs, in place of the real modules (and
    the current folder a temporary one: minimal cases are saved under it)."""
    monkeypatch.chdir(tmp_path)
    props = types.ModuleType("gdn_verify.properties.gradients")
    props.grad_properties = stub_grad_properties  # type: ignore[attr-defined]
    props.GRAD_NAMES = STUB_NAMES  # type: ignore[attr-defined]
    bugs = types.ModuleType("gdn_verify.implementations.planted_grad")
    bugs.BUGS = STUB_BUGS  # type: ignore[attr-defined]
    bugs.RIGHT_CAUSES = {"dg_doubled": ("dg_doubled",), "dq_dropped": ("dq_dropped",)}  # type: ignore[attr-defined]
    bugs.implementation = _stub_planted_implementation  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gdn_verify.properties.gradients", props)
    monkeypatch.setitem(sys.modules, "gdn_verify.implementations.planted_grad", bugs)
    return props, bugs


PLUGINS = textwrap.dedent("""
    import numpy as np
    from tests.test_grad_interfaces import dg_doubled, numpy_backward

    good = numpy_backward
    bad = dg_doubled

    def no_dht(q, k, v, g, beta, scale=None, initial_state=None, use_qk_l2norm_in_kernel=False,
               cu_seqlens=None, *, do):
        raise AssertionError("never called: cannot take dht")

    def forward_only(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                     use_qk_l2norm_in_kernel=False, cu_seqlens=None):
        raise AssertionError("never called")
""")

TORCH_PLUGINS = textwrap.dedent("""
    import torch

    def loop(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
             use_qk_l2norm_in_kernel=False, cu_seqlens=None):
        # A differentiable float32 token loop (batched or varlen; no l2norm).
        if use_qk_l2norm_in_kernel:
            raise NotImplementedError("l2norm")
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        scale = K ** -0.5 if scale is None else scale
        rep = HV // H
        q, k = q.float().repeat_interleave(rep, 2), k.float().repeat_interleave(rep, 2)
        v, g, beta = v.float(), g.float(), beta.float()
        bounds = [(b, 0, T) for b in range(B)] if cu_seqlens is None else [
            (0, int(cu_seqlens[n]), int(cu_seqlens[n + 1])) for n in range(len(cu_seqlens) - 1)]
        outs = [torch.zeros(V, dtype=torch.float32).expand(HV, V)] * (B * T)
        finals = []
        for n, (b, s, e) in enumerate(bounds):
            S = torch.zeros(HV, K, V) if initial_state is None else initial_state[n].float()
            for t in range(s, e):
                S = S * torch.exp(g[b, t])[:, None, None]
                r = v[b, t] - torch.einsum("hkv,hk->hv", S, k[b, t])
                S = S + torch.einsum("hk,hv->hkv", k[b, t], beta[b, t][:, None] * r)
                outs[b * T + t] = scale * torch.einsum("hkv,hk->hv", S, q[b, t])
            finals.append(S)
        o = (torch.stack(outs).reshape(B, T, HV, V) if outs else v * 0).to(v.dtype)  # T = 0: still v's graph
        return o, (torch.stack(finals) if output_final_state else None)
""")


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    (tmp_path / "my_grads.py").write_text(PLUGINS)
    (tmp_path / "my_torch.py").write_text(TORCH_PLUGINS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent))
    monkeypatch.chdir(tmp_path)
    for name in ("my_grads", "my_torch"):
        sys.modules.pop(name, None)
    yield tmp_path
    for name in ("my_grads", "my_torch"):
        sys.modules.pop(name, None)


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = _cli.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


# The command line ------------------------------------------------------------------------------
def test_help_lists_the_new_flags(capsys):
    for command, flags in (
        ("check", ("--grad", "backward")),
        ("selftest", ("--grad",)),
        ("replay", ("--convention",)),
    ):
        with pytest.raises(SystemExit):
            _cli.main([command, "--help"])
        text = capsys.readouterr().out
        assert all(flag in text for flag in flags), (command, text)
    args = _cli.build_parser().parse_args(["check", "--grad", "--convention", "backward", "--impl", "m:f"])
    assert args.grad and args.convention == "backward"
    assert _cli.build_parser().parse_args(["selftest", "--grad"]).grad


@pytest.mark.parametrize(
    "args, message",
    [
        (["check", "--grad", "--impl", "numpy"], "--grad: numpy has no backward form; pass --convention backward"),
        (["check", "--grad", "--impl", "my_grads:forward_only"], "--grad: my_grads:forward_only has no backward form"),
        (["check", "--grad", "--impl", "numpy-grad", "--scale"], "--scale: the scale tier checks the forward pass"),
        (["check", "--impl", "my_grads:good", "--convention", "backward", "--scale"], "--scale:"),
        (["check", "--grad", "--impl", "planted-grad:dg_doubled", "--properties", "matches_reference"],
         "--properties: unknown matches_reference; choose from grad_stub_reference, grad_stub_determinism"),
        (["check", "--impl", "my_grads:good", "--convention", "backward", "--properties", "scale_grid"],
         "--properties: unknown scale_grid"),
        (["check", "--impl", "my_grads:no_dht", "--convention", "backward"],
         "--impl: my_grads:no_dht cannot take the backward (--convention backward) arguments"),
        (["check", "--impl", "numpy", "--convention", "backward"], "--convention: applies to MODULE:FUNCTION"),
        (["check", "--impl", "planted-grad:no_such_bug", "--grad"], "--impl: planted-grad:no_such_bug: unknown bug"),
        (["fuzz", "--impl", "my_grads:good", "--convention", "backward", "--budget", "1s"], "--convention: backward"),
    ],
)  # fmt: skip
def test_misuse_exits_2_with_one_line(args, message, plugins, stand_ins, capsys):
    code, _, err = cli(capsys, *args)
    assert code == 2, err
    assert message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_numpy_functional_backward_is_checked_with_convention_backward(plugins, stand_ins, capsys, tmp_path):
    out = tmp_path / "good.json"
    args = ["check", "--impl", "my_grads:good", "--convention", "backward", "--seed", "1", "--json", str(out)]
    code, stdout, err = cli(capsys, *args)
    assert code == 0, stdout + err
    assert "gradients (the backward)" in stdout and "2 passed, 0 failed" in stdout
    doc = json.loads(out.read_text())
    assert doc["grad"] is True and doc["convention"] == "backward" and doc["status"] == "complete"
    assert [r["name"] for r in doc["results"]] == list(STUB_NAMES)

    code, stdout, err = cli(capsys, "check", "--impl", "my_grads:bad", "--convention", "backward", "--seed", "1")
    assert code == 1, stdout + err
    assert "FAILED grad_stub_reference: dg error" in stdout and "minimal example: B=" in stdout
    replay = next(line for line in stdout.splitlines() if "replay:" in line).split("replay: ")[1]
    assert replay.endswith("--impl my_grads:bad --convention backward")
    case = replay.split()[2]
    # the case records the gradient property's name: replay finds it, and calls the backward
    code, stdout, _ = cli(capsys, *replay.split()[1:])
    assert code == 1 and "(grad_stub_reference) with my_grads:bad: failed: dg error" in stdout
    code, stdout, _ = cli(capsys, "replay", case, "--impl", "my_grads:good", "--convention", "backward")
    assert code == 0 and "passed" in stdout
    code, stdout, _ = cli(capsys, "replay", case, "--impl", "my_grads:good")  # backward: the default for NumPy
    assert code == 0 and "passed" in stdout
    code, stdout, _ = cli(capsys, "replay", case, "--impl", "my_grads:bad", "--diagnose")
    assert code == 1 and "not available for a gradient property" in stdout


def test_replay_names_both_catalogues_for_an_unknown_property(plugins, stand_ins, capsys, tmp_path):
    result = api.check("my_grads:bad", convention="backward", seed=1, cases_dir=tmp_path / "cases")
    case = result.failures[0].failure.case_path
    code, _, err = cli(capsys, "replay", str(case), "--property", "bogus")
    assert code == 2 and "matches_reference" in err and "grad_stub_reference" in err
    assert len(err.strip().splitlines()) == 1


def test_selftest_grad_runs_the_planted_gradient_bugs(stand_ins, capsys, tmp_path):
    out = tmp_path / "s.json"
    code, stdout, err = cli(capsys, "selftest", "--grad", "--seed", "1", "--json", str(out))
    assert code == 0, stdout + err
    assert "planted gradient bugs" in stdout and "2 of 2 planted bugs caught" in stdout
    assert "caught  dg_doubled" in stdout and "by grad_stub_reference" in stdout
    doc = json.loads(out.read_text())
    assert doc["impl"] == "planted-grad" and doc["grad"] is True and doc["totals"]["caught"] == 2
    replay = doc["bugs"][0]["caught_by"]["failure"]["replay"]
    assert "--impl planted-grad:dg_doubled" in replay and "--convention" not in replay


# The Python API --------------------------------------------------------------------------------
def test_grad_selects_the_backward_properties(stand_ins):
    impl = api.implementation(numpy_backward, convention="backward")
    assert impl.forms == {BACKWARD_FORM: numpy_backward} and implementations.backward_only(impl)
    with pytest.raises(NotImplementedError):
        impl.default_form  # noqa: B018 - a backward alone has no native form
    # a backward-only implementation: check verifies its gradients without being told
    result = api.check(impl, seed=2, max_examples=3)
    assert result.grad and [r.name for r in result.results] == list(STUB_NAMES) and result.passed
    assert result.as_dict()["grad"] is True and "gradients" in result.report()
    # an implementation with both: the forward by default, the backward with grad=True
    both = implementations.resolve("planted-grad:dg_doubled")
    assert both.name == "planted-grad:dg_doubled" and both.extra["compile_classes"] is False
    assert {p.form for p in api.select(api.catalogue_for(both), None, both)} <= {"native"}
    gradients = api.catalogue_for(both, CheckOptions(grad=True))
    assert [p.name for p in api.select(gradients, None, both)] == list(STUB_NAMES)
    failed = api.check(both, grad=True, seed=1, properties=["grad_stub_reference"])
    assert not failed.passed and "dg error" in failed.failures[0].failure.message
    assert "grad" not in api.check("numpy", properties=["determinism"], max_examples=2).as_dict()


def test_select_maps_each_form_to_its_properties():
    spec = Property("s", "", lambda impl: None, lambda *a: None, form="spec")
    native = Property("n", "", lambda impl: None, lambda *a: None)
    backward = Property("b", "", lambda impl: None, lambda *a: None, form=BACKWARD_FORM)
    available = {p.name: p for p in (spec, native, backward)}

    def selected(forms: dict) -> list[str]:
        return [p.name for p in api.select(available, None, Implementation("x", forms))]

    assert selected({"chunk": numpy_backward, "recurrent": numpy_backward}) == ["n"]
    assert selected({"spec": numpy_backward}) == ["s"]
    assert selected({BACKWARD_FORM: numpy_backward}) == ["b"]
    assert selected({"chunk": numpy_backward, BACKWARD_FORM: numpy_backward}) == ["n", "b"]


def test_library_misuse_names_the_argument(stand_ins):
    cases = [
        (dict(impl="numpy", grad=True), "grad"),
        (dict(impl="numpy", grad=True, scale=True), "scale"),
        (dict(impl=numpy_backward, convention="backward", properties=["matches_reference"]), "properties"),
        (dict(impl=numpy_backward, convention="sideways"), "convention"),
    ]
    for kw, field in cases:
        with pytest.raises(ConfigurationError) as info:
            api.check(**kw)
        assert info.value.field == field and isinstance(info.value, ValueError)
    with pytest.raises(ConfigurationError) as info:
        api.fuzz(numpy_backward, "1s", convention="backward")
    assert info.value.field == "convention"


def test_the_planted_prefixes_are_not_plugins():
    assert implementations.is_plugin("my_module:fn")
    assert not implementations.is_plugin("planted:beta_twice")
    assert not implementations.is_plugin("planted-grad:dg_doubled")
    assert not implementations.is_plugin("numpy-grad")
    assert {"numpy-grad", "numpy-grad16"} <= set(implementations.names())
    assert "backward" in implementations.CONVENTIONS


def test_numpy_grad_builtins_resolve_or_say_why():
    for name in ("numpy-grad", "numpy-grad16"):
        try:
            impl = implementations.resolve(name)
        except ConfigurationError as exc:
            assert exc.field == "impl" and "unavailable here" in exc.message
            assert importlib.util.find_spec("gdn_verify.implementations.numpy_grad") is None
            continue
        assert impl.name == name and BACKWARD_FORM in impl.forms and impl.array == "numpy"
        assert impl.extra["compile_classes"] is False


# torch: the backward through autograd ----------------------------------------------------------
@needs_torch
def test_a_torch_forward_gets_its_backward_from_autograd(plugins, stand_ins, capsys, tmp_path):
    out = tmp_path / "t.json"
    args = ["check", "--grad", "--impl", "my_torch:loop", "--array", "torch", "--dtype", "float32", "--seed", "3"]
    code, stdout, err = cli(capsys, *args, "--max-examples", "4", "--json", str(out))
    assert code == 0, stdout + err
    doc = json.loads(out.read_text())
    assert doc["grad"] is True and doc["convention"] == "native" and doc["array"] == "torch"
    assert doc["totals"]["passed"] == 2
    impl = implementations.with_backward(api.implementation("my_torch:loop", "torch"))
    assert BACKWARD_FORM in impl.forms and impl.native_forms == ["default"]


@needs_torch
def test_replay_of_a_torch_gradient_case_goes_through_autograd(plugins, stand_ins, tmp_path):
    bad = Implementation("my_grads:bad", {BACKWARD_FORM: dg_doubled})
    failed = api.check(bad, seed=1, properties=["grad_stub_reference"], cases_dir=tmp_path / "cases")
    case = failed.failures[0].failure.case_path
    r = api.replay(case, "my_torch:loop", array="torch")
    assert r.form == BACKWARD_FORM and BACKWARD_FORM in r.impl.forms and r.impl.native_forms == ["default"]
    assert r.status in ("passed", "unsupported"), r.message


# The pytest plugin -----------------------------------------------------------------------------
def test_pytest_gdn_grad_adds_one_item_per_gradient_property(plugins, stand_ins):
    conftest = textwrap.dedent("""
        import sys, types
        from tests import test_grad_interfaces as t

        props = types.ModuleType("gdn_verify.properties.gradients")
        props.grad_properties, props.GRAD_NAMES = t.stub_grad_properties, t.STUB_NAMES
        sys.modules["gdn_verify.properties.gradients"] = props
    """)
    (plugins / "conftest.py").write_text(conftest)
    root = str(Path(__file__).resolve().parent.parent)
    import subprocess

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
            cwd=plugins, capture_output=True, text=True, timeout=600,
            env={**__import__("os").environ, "PYTHONPATH": f"{plugins}:{root}"},
        )  # fmt: skip

    done = run("--gdn-impl", "my_grads:bad", "--gdn-convention", "backward", "--gdn-seed", "1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "gdn-verify::grad_stub_reference" in done.stdout and "1 failed, 1 passed" in done.stdout
    done = run("--gdn-impl", "numpy", "--gdn-grad")
    assert done.returncode == 4 and "--gdn-grad: numpy has no backward form" in done.stderr
    done = run("--gdn-impl", "my_grads:good", "--gdn-convention", "backward", "--gdn-scale")
    assert done.returncode == 4 and "--gdn-scale:" in done.stderr


def test_only_grad_empty_sequences_draws_empty_sequences():
    """Properties 1-5 draw sequences of at least one token (a kernel failing only on empty ones
    must not shrink every property to T = 0); grad_empty_sequences always has one, and runs last."""
    from hypothesis import HealthCheck, given, settings

    from gdn_verify.properties.gradients import grad_properties
    from gdn_verify.properties.strategies import Limits

    props = grad_properties(Limits(dtype="float32"))
    assert props[-1].name == "grad_empty_sequences"
    seen = {}

    def smallest_lengths(strategy) -> list[int]:
        found: list[int] = []

        @settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(strategy)
        def draw(case):
            lengths = case[0].lengths
            found.append(int(lengths.min()) if len(lengths) else 0)

        draw()
        return found

    for p in props:
        if p.name != "grad_error_growth":  # long single sequences: non-empty by construction
            seen[p.name] = smallest_lengths(p.strategy(None))
    for name, minima in seen.items():
        if name == "grad_empty_sequences":
            assert all(m == 0 for m in minima), name
        else:
            assert all(m >= 1 for m in minima), (name, minima)
