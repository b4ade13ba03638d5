"""One options object for ``check``: ``CheckOptions`` holds what ``gdn_verify.check`` takes, ``check``'s
flags and the plugin's ``--gdn-*`` options set the same fields, and they validate in one place.

A setting added to one of them and not to the others fails here, unless it is listed below with
the reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect

import pytest

from gdn_verify import _cli, api, pytest_plugin, report
from gdn_verify import options as options_module
from gdn_verify.core.implementation import ConfigurationError, Implementation
from gdn_verify.options import CheckCommand, CheckOptions, FuzzOptions, SelftestOptions, flag_name

FIELDS = {f.name for f in dataclasses.fields(CheckOptions)}
CALLBACKS = {"progress", "on_result", "on_compile"}  # check's keywords that are callbacks, not settings
# Flags that are no setting of a check run.
CLI_ONLY = {
    "--impl": "the implementation itself, not a setting of its run",
    "--json": "where the command line writes its results document (the API returns a CheckResult)",
    "--sanitize": "how the command runs: the same check in a child process under compute-sanitizer",
}
PLUGIN_ONLY = {"--gdn-impl": "the implementation itself, not a setting of its run"}
# Settings no flag sets.
LIBRARY_ONLY = {"scale_limits": "a ScaleLimits object that shrinks the scale tier (how tests run it on CPU)"}
# Settings check's flags have and the plugin does not (yet): its items run with the defaults.
NOT_IN_PLUGIN = {
    "max_tokens": "not offered by the plugin yet (a new --gdn-* option is new plugin behaviour)",
    "database": "not offered by the plugin yet (a new --gdn-* option is new plugin behaviour)",
    "cases_dir": "not offered by the plugin yet (a new --gdn-* option is new plugin behaviour)",
    "plans_dir": "not offered by the plugin yet (a new --gdn-* option is new plugin behaviour)",
    "compile_budget": "each item is a check of its own: a budget would re-plan (and recompile) the pool per item",
}


class _PluginParser:
    """Stands in for pytest's parser: the plugin's options, added to an argparse parser as pytest would."""

    def __init__(self) -> None:
        self.parser = argparse.ArgumentParser()
        self.options: set[str] = set()

    def getgroup(self, *args: object, **kwargs: object) -> _PluginParser:
        return self

    def addoption(self, *names: str, **kwargs: object) -> None:
        self.parser.add_argument(*names, **kwargs)  # type: ignore[arg-type]
        self.options.update(names)


def plugin_parser() -> _PluginParser:
    recorder = _PluginParser()
    pytest_plugin.pytest_addoption(recorder)  # type: ignore[arg-type]
    return recorder


def check_flags(command: str = "check") -> dict[str, str]:
    """A subcommand's long options and their destinations."""
    parser = _cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    actions = sub.choices[command]._actions
    return {o: a.dest for a in actions for o in a.option_strings if o.startswith("--") and o != "--help"}


def settings_of(flags: dict[str, str], prefix: str = "") -> set[str]:
    """The fields those flags set (a flag that sets none stays as itself, to be reported)."""
    fields_by_dest = {prefix + flag_name(f): f for f in FIELDS}
    return {fields_by_dest.get(dest, flag) for flag, dest in flags.items()}


def test_the_fields_are_checks_keywords_with_the_same_defaults():
    parameters = inspect.signature(api.check).parameters
    keywords = {n for n, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert FIELDS == keywords - CALLBACKS
    defaults = {f.name: f.default for f in dataclasses.fields(CheckOptions)}
    assert defaults == {name: parameters[name].default for name in FIELDS}


def test_checks_flags_and_the_plugins_options_set_the_same_fields():
    cli = check_flags()
    assert set(CLI_ONLY) <= set(cli)
    assert settings_of({f: d for f, d in cli.items() if f not in CLI_ONLY}) == FIELDS - set(LIBRARY_ONLY)
    plugin = plugin_parser()
    assert set(PLUGIN_ONLY) <= plugin.options
    dests = {o: o[2:].replace("-", "_") for o in plugin.options if o not in PLUGIN_ONLY}
    assert settings_of(dests, "gdn_") == FIELDS - set(LIBRARY_ONLY) - set(NOT_IN_PLUGIN)
    assert set(NOT_IN_PLUGIN) | set(LIBRARY_ONLY) <= FIELDS


def test_a_flag_that_sets_no_field_is_noticed():
    assert settings_of({"--max-examples": "max_examples", "--cases": "cases", "--colour": "colour"}) == {
        "max_examples",
        "cases_dir",
        "--colour",
    }


SHARED = [
    [],
    [("array", "torch"), ("dtype", "bfloat16"), ("seed", "7"), ("max-examples", "5")],
    [("properties", "matches_reference, determinism"), ("dims", "128,64,128"), ("timeout", "0"), ("scale", None)],
    [("convention", "backward"), ("grad", None), ("timeout", "2.5")],
]


@pytest.mark.parametrize("settings", SHARED, ids=lambda s: " ".join(f for f, _ in s) or "defaults")
def test_the_same_settings_from_the_cli_and_the_plugin_give_equal_options(settings):
    def argv(prefix: str) -> list[str]:
        return [word for flag, value in settings for word in (prefix + flag, value) if word is not None]

    from_cli = CheckOptions.from_flags(vars(_cli.build_parser().parse_args(["check", *argv("--")])))
    from_plugin = pytest_plugin.check_options(plugin_parser().parser.parse_args(argv("--gdn-")))
    assert from_cli == from_plugin
    if not settings:
        assert from_cli == CheckOptions()


def test_flags_are_parsed_and_normalised_once():
    args = _cli.build_parser().parse_args(
        ["check", "--properties", "a, b", "--dims", "128,64,128", "--timeout", "0", "--cases", "c", "--plans", "p"]
        + ["--compile-budget", "90s", "--max-tokens", "128", "--database", "db"]
    )
    options = CheckOptions.from_flags(vars(args))
    assert options.properties == ("a", "b") and options.dims == (64, 128) and options.timeout is None
    assert (options.cases_dir, options.plans_dir, options.compile_budget) == ("c", "p", "90s")
    assert (options.max_tokens, options.database) == (128, "db")
    assert CheckOptions(**options.keywords()) == options


BAD = [
    ("array", "jax"),
    ("dtype", "int8"),
    ("convention", "sideways"),
    ("max_examples", 0),
    ("max_tokens", 10),
    ("dims", (0, 64)),
    ("dims", ["a"]),
    ("timeout", -1.0),
    ("compile_budget", "soon"),
]


@pytest.mark.parametrize("field, value", BAD, ids=[f"{f}={v!r}" for f, v in BAD])
def test_bad_values_are_refused_in_one_place_naming_the_field(field, value):
    with pytest.raises(ConfigurationError) as made:
        CheckOptions(**{field: value})
    assert made.value.field == field
    with pytest.raises(ConfigurationError) as replaced:
        CheckOptions().replace(**{field: value})
    with pytest.raises(ConfigurationError) as checked:
        api.check("numpy", **{field: value})
    assert str(replaced.value) == str(checked.value) == str(made.value)


def test_the_report_passes_its_suite_settings_as_options(tmp_path):
    out = tmp_path / "r"
    options = report.options(
        ["numpy"], dtypes=["float32"], out=out, seed=3, quick=True, properties=["determinism"], dims=(64,)
    )
    expected = CheckOptions(properties=["determinism"], seed=3, max_examples=10, dims=(64,), cases_dir=out / "cases")
    assert options.checks == expected
    with pytest.raises(ConfigurationError) as bad:
        report.options(["numpy"], out=out, dims=(0,))
    assert bad.value.field == "dims"


# The implementation loaded: resolve() checks, once, what needs it ---------------------------


def test_resolve_gives_what_the_run_needs():
    run = CheckOptions(properties=["determinism", "matches_reference"], dims=[128, 64], seed=5).resolve("numpy")
    assert (run.impl.name, run.dtype, run.seed, run.grad) == ("numpy", "float32", 5, False)
    assert run.properties == ("determinism", "matches_reference") and run.scale_cases == ()
    assert (run.limits.head_dims, run.limits.max_tokens, run.limits.dtype) == ((64, 128), 2048, "float32")
    every = CheckOptions().resolve("numpy")
    assert isinstance(every.seed, int) and 0 <= every.seed < 2**31  # drawn, to be shown before the run
    impl = api.implementation("numpy")
    assert every.properties == tuple(p.name for p in api.select(api.catalogue_for(impl), None, impl))


RESOLVE_BAD = [
    ("nonsense", {}, "impl", "unknown"),
    ("numpy", {"properties": ["bogus"]}, "properties", "unknown bogus"),
    ("numpy", {"properties": []}, "properties", "(none given)"),
    ("numpy", {"properties": ["scale_nope"]}, "properties", "the scale cases are"),
    ("numpy", {"scale": True}, "scale", "needs a GPU implementation"),
    ("numpy", {"grad": True, "scale": True}, "scale", "checks the forward pass"),
    ("numpy", {"grad": True}, "grad", "no backward form"),
    ("numpy", {"convention": "backward"}, "convention", "applies to MODULE:FUNCTION"),
]


@pytest.mark.parametrize("impl, settings, field, text", RESOLVE_BAD, ids=[f"{b[0]} {b[1]}" for b in RESOLVE_BAD])
def test_resolve_refuses_what_the_implementation_cannot_run_naming_the_field(impl, settings, field, text):
    with pytest.raises(ConfigurationError) as resolved:
        CheckOptions(**settings).resolve(impl)
    assert resolved.value.field == field and text in resolved.value.message
    with pytest.raises(ConfigurationError) as checked:  # the library's check refuses it in the same place
        api.check(impl, **settings)
    assert str(checked.value) == str(resolved.value)


def test_the_check_command_is_one_object_made_from_the_flags(tmp_path):
    args = _cli.build_parser().parse_args(
        ["check", "--impl", "numpy", "--properties", "determinism", "--seed", "3", "--json", str(tmp_path / "r.json")]
    )
    command = CheckCommand.from_flags(vars(args))
    assert command.check.options == CheckOptions.from_flags(vars(args))
    assert (command.check.impl.name, command.check.properties, command.check.seed) == ("numpy", ("determinism",), 3)
    assert command.json == tmp_path / "r.json" and not command.sanitize and command.default_impl is None
    (tmp_path / "taken").mkdir()
    with pytest.raises(ConfigurationError) as bad:
        CheckCommand.from_flags(vars(args) | {"json": str(tmp_path / "taken")})
    assert bad.value.field == "json" and "is a directory" in bad.value.message
    default = CheckCommand.from_flags(vars(args) | {"impl": None})
    assert default.default_impl is not None and default.check.impl.name in ("numpy", "cupy")


def test_the_command_line_validates_once_then_hands_the_check_down(monkeypatch, capsys, tmp_path):
    """From the flags to the verdict: the settings are checked once (one CheckOptions made), the
    implementation loaded and checked against them once (one resolve: one signature check, one
    scale selection), and what that gave is what runs. Before, the command line and ``api.check``
    each did it, in pieces."""
    calls: dict[str, int] = {}
    ran: list = []

    def counted(owner, name, record=None):
        original = getattr(owner, name)

        def wrapper(*args, **kw):
            calls[name] = calls.get(name, 0) + 1
            result = original(*args, **kw)
            if record is not None:
                record.append(result)
            return result

        monkeypatch.setattr(owner, name, wrapper)

    resolved: list = []
    counted(CheckOptions, "__post_init__")
    counted(CheckOptions, "resolve", resolved)
    counted(options_module, "scale_selection")
    counted(options_module, "implementation")
    counted(Implementation, "check_signatures")
    original_run = api.check_resolved
    monkeypatch.setattr(api, "check_resolved", lambda run, **kw: ran.append(run) or original_run(run, **kw))
    argv = ["check", "--impl", "numpy", "--properties", "determinism", "--max-examples", "2", "--seed", "1"]
    assert _cli.main([*argv, "--cases", str(tmp_path)]) == 0
    assert calls == dict(__post_init__=1, resolve=1, scale_selection=1, implementation=1, check_signatures=1)
    assert ran == resolved and len(ran) == 1
    assert "1 passed" in capsys.readouterr().out


# fuzz and selftest: the same pattern, one object each --------------------------------------
FUZZ_CALLBACKS = {"impl", "progress", "on_result", "on_round", "on_compile"}
OTHERS = [
    # (options, API function, its arguments that are no setting, the command, its flags that are no setting)
    (FuzzOptions, api.fuzz, FUZZ_CALLBACKS, "fuzz", {"impl", "json", "campaigns"}),
    (SelftestOptions, api.selftest, {"on_bug"}, "selftest", {"json"}),
]


@pytest.mark.parametrize("cls, function, arguments, command, flags", OTHERS, ids=[o[3] for o in OTHERS])
def test_fuzz_and_selftest_options_are_their_functions_arguments_and_their_commands_flags(
    cls, function, arguments, command, flags
):
    parameters = inspect.signature(function).parameters
    fields = {f.name: f.default for f in dataclasses.fields(cls)}
    assert set(fields) == set(parameters) - arguments
    assert fields == {name: parameters[name].default for name in fields}
    destinations = set(check_flags(command).values())
    assert {flag_name(name) for name in fields} == destinations - flags


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: FuzzOptions(budget="soon"), "budget"),
        (lambda: FuzzOptions(workers="two"), "workers"),
        (lambda: FuzzOptions(workers=0), "workers"),
        (lambda: FuzzOptions(dims=(0,)), "dims"),
        (lambda: FuzzOptions(compile_budget="soon"), "compile_budget"),
        (lambda: FuzzOptions(properties=["bogus"]).resolve("numpy"), "properties"),  # before any compiling
        (lambda: FuzzOptions(convention="backward").resolve("numpy"), "convention"),
        (lambda: FuzzOptions(workers=2).resolve(lambda **kw: None), "workers"),  # a lambda cannot be rebuilt
        (lambda: SelftestOptions(dtype="int8"), "dtype"),
        (lambda: SelftestOptions(max_examples=0), "max_examples"),
        (lambda: SelftestOptions(timeout=-1), "timeout"),
    ],
)
def test_fuzz_and_selftest_refuse_bad_settings_naming_the_field(make, field):
    with pytest.raises(ConfigurationError) as bad:
        make()
    assert bad.value.field == field


def test_resolved_fuzz_and_selftest_give_what_the_run_needs():
    run = FuzzOptions(budget="90s", properties=["determinism"], workers="2").resolve("numpy")
    assert (run.impl.name, run.dtype, run.properties, run.workers, run.portable) == (
        "numpy",
        "float32",
        ("determinism",),
        2,
        "numpy",
    )
    assert run.seconds == 90 and run.options.workers == 2 and run.limits.max_tokens == 2048
    selftest = SelftestOptions(seed=4, timeout=0).resolve()
    assert (selftest.seed, selftest.options.timeout, selftest.bugs) == (4, None, None)
    assert 0 <= SelftestOptions().resolve().seed < 2**31


def test_fuzz_from_the_command_line_validates_once(monkeypatch, capsys, tmp_path):
    calls: list[str] = []
    for name in ("__post_init__", "resolve"):
        original = getattr(FuzzOptions, name)
        monkeypatch.setattr(FuzzOptions, name, lambda self, *a, _f=original, _n=name: calls.append(_n) or _f(self, *a))
    argv = ["fuzz", "--impl", "numpy", "--budget", "2s", "--properties", "determinism", "--max-tokens", "64"]
    assert _cli.main([*argv, "--database", str(tmp_path / "db"), "--cases", str(tmp_path / "cases")]) == 0
    assert calls == ["__post_init__", "resolve"]
    assert "fuzz done:" in capsys.readouterr().out
