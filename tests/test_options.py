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
from gdn_verify.core.implementation import ConfigurationError
from gdn_verify.options import CheckOptions, flag_name

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


def check_flags() -> dict[str, str]:
    """``check``'s long options and their destinations."""
    parser = _cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    actions = sub.choices["check"]._actions
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

    from_cli = _cli.check_options(_cli.build_parser().parse_args(["check", *argv("--")]))
    from_plugin = pytest_plugin.check_options(plugin_parser().parser.parse_args(argv("--gdn-")))
    assert from_cli == from_plugin
    if not settings:
        assert from_cli == CheckOptions()


def test_flags_are_parsed_and_normalised_once():
    args = _cli.build_parser().parse_args(
        ["check", "--properties", "a, b", "--dims", "128,64,128", "--timeout", "0", "--cases", "c", "--plans", "p"]
        + ["--compile-budget", "90s", "--max-tokens", "128", "--database", "db"]
    )
    options = _cli.check_options(args)
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
