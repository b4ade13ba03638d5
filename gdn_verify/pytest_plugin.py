"""pytest plugin (``pytest11`` entry point ``gdn_verify``): run the property suite from pytest.

``pytest --gdn-impl MODULE:FUNCTION [--gdn-array numpy|torch|cupy] [--gdn-dtype D]
[--gdn-properties a,b] [--gdn-seed S] [--gdn-max-examples N] [--gdn-dims 64,128]
[--gdn-convention native|spec|backward|max] [--gdn-timeout SECONDS] [--gdn-scale] [--gdn-grad]
[--gdn-all-configs [--gdn-config-kernels NAMES]] [--gdn-backend NAME]`` adds one test item per
property (``gdn-verify::NAME``), in any folder (``--gdn-grad``: the gradient properties, against
the implementation's backward, as ``check --grad``; ``--gdn-all-configs``: each item runs its
property under every autotuner config, as ``check --all-configs``, of the kernels
``--gdn-config-kernels`` names if given; ``--gdn-backend``: every call must run on that backend,
as ``check --backend``; each item records the backends its calls ran on as the user property
``backend``); an item that fails, times out or on which the kernel raised shows the minimal
example (the kernel's traceback too) and the replay command, an unsupported one is skipped with
the reason. A kernel that cannot take the arguments is a usage error before any item runs. For
tests of one's own, the ``gdn_check`` fixture calls :func:`gdn_verify.check` with those options as
defaults::

    def test_my_kernel(gdn_check):
        gdn_check(my_kernel, array="torch", properties=["matches_reference"]).assert_passed()
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import pytest

from gdn_verify import api, console
from gdn_verify.core.implementation import ConfigurationError
from gdn_verify.options import SCALE_PREFIX, CheckOptions, flag_name
from gdn_verify.runners.configs import AGREEMENT


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gdn-verify", "Gated DeltaNet kernel verification")
    group.addoption("--gdn-impl", help="implementation to check: MODULE:FUNCTION or a built-in name")
    group.addoption("--gdn-array", help="array type the implementation takes: numpy, torch, cupy")
    group.addoption("--gdn-dtype", help="input dtype: float64, float32, float16, bfloat16")
    group.addoption("--gdn-properties", help="comma-separated subset of the properties (default: all that apply)")
    group.addoption("--gdn-seed", type=int, help="Hypothesis seed (default: random, shown in the header)")
    group.addoption("--gdn-max-examples", type=int, help="examples per property (default: each property's own)")
    group.addoption("--gdn-dims", help="head sizes K and V to draw, e.g. 64,128")
    group.addoption(
        "--gdn-convention",
        default="native",
        help="native (FLA), spec (speculative decoding), backward (a functional backward: the gradient properties) "
        "or max (Modular MAX's gated_delta convention)",
    )
    group.addoption(
        "--gdn-timeout",
        type=float,
        help="seconds a kernel call may take (default 60; the first call of a new shape gets 10x; 0: no limit)",
    )
    group.addoption(
        "--gdn-scale",
        action="store_true",
        help="add the scale tier's cases (gdn-verify::scale_<case>; GPU implementations only)",
    )
    group.addoption(
        "--gdn-grad",
        action="store_true",
        help="the gradient properties instead, against the implementation's backward (its own with "
        "--gdn-convention backward, else autograd's of a torch function)",
    )
    group.addoption(
        "--gdn-all-configs",
        action="store_true",
        help="run each property under every config of each autotuned Triton kernel, one at a time (as check "
        "--all-configs; default properties: matches_reference, varlen_equals_separate, determinism)",
    )
    group.addoption(
        "--gdn-config-kernels",
        metavar="NAMES",
        help="with --gdn-all-configs: sweep only these autotuned kernels (comma-separated); the others keep "
        "their autotuner's choice",
    )
    group.addoption(
        "--gdn-backend",
        metavar="NAME",
        help="every kernel call must run on this backend (triton, flash_qla, cupy-fused, ...; see "
        "docs/commands.md), else the property fails as a fallback",
    )


def check_options(option: Any) -> CheckOptions:
    """The ``--gdn-*`` options (pytest's ``config.option``) as the run settings (``--gdn-impl`` is not among them)."""
    return CheckOptions.from_flags(vars(option), prefix="gdn_")


def _usage_error(exc: ConfigurationError) -> pytest.UsageError:
    return pytest.UsageError(f"--gdn-{flag_name(exc.field).replace('_', '-')}: {exc.message}")


class PropertySuite(pytest.Collector):
    """The ``gdn-verify`` node: one :class:`PropertyItem` per property (and scale case) selected."""

    def __init__(self, *, suite: dict[str, Any], **kw: Any):
        super().__init__(**kw)
        self.suite = suite

    def collect(self) -> list[pytest.Item]:
        return [PropertyItem.from_parent(self, name=name, prop=name, suite=self.suite) for name in self.suite["names"]]


class PropertyItem(pytest.Item):
    """One property of the suite against the implementation named by ``--gdn-impl``."""

    def __init__(self, *, prop: str, suite: dict[str, Any], **kw: Any):
        super().__init__(**kw)
        self.prop, self.suite = prop, suite

    def runtest(self) -> None:
        impl = self.suite["impl"]
        if self.suite.get("context_lost"):  # every call of this process would fail alike
            pytest.skip(f"not run: the GPU context was lost in {self.suite['context_lost']}; run it in a fresh process")
        # One property per item (a scale case runs alone by its name). The implementation is resolved
        # already: array and convention applied there.
        options = self.suite["options"].replace(properties=[self.prop], scale=False, array=None, convention="native")
        result = api.check(impl, **options.keywords())
        if options.all_configs:
            return _all_configs_verdict(result)
        (r,) = result.results
        if r.backends.calls:
            self.user_properties.append(("backend", r.backends.describe()))
        if r.context_lost:
            self.suite["context_lost"] = self.prop
        if r.status == "unsupported":
            pytest.skip(r.note)
        if r.failure is not None:  # failed, timeout, error, misuse
            # pytest's report names the item and says FAILED: the message starts with what went wrong.
            raise PropertyFailed(console.format_failure(r, result.replay_command(r), headline=False))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, PropertyFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[str, int | None, str]:
        return self.suite["impl"].name, None, f"gdn-verify::{self.prop}"


def _all_configs_verdict(result: api.CheckResult) -> None:
    """One item under ``--gdn-all-configs``: its property under each (kernel, config), and each
    kernel's agreement across configs; every failure shown, each naming its kernel and config."""
    if result.failures:
        raise PropertyFailed("\n".join(console.format_failure(r, result.replay_command(r)) for r in result.failures))
    if all(r.status == "unsupported" for r in result.results if r.config and r.name != AGREEMENT):
        pytest.skip("; ".join(sorted({r.note for r in result.results if r.note})))


class PropertyFailed(AssertionError):
    """A property failed; the message is the minimal example and the replay command."""


def pytest_report_header(config: pytest.Config) -> str | None:
    suite = config.stash.get(_SUITE, None)
    if suite is None:
        return None
    impl, options = suite["impl"], suite["options"]
    header = f"gdn-verify: impl={impl.name}, arrays={impl.array}, dtype={options.dtype}, seed={options.seed}"
    header += ", gradients (the backward)" if options.grad else ""
    header += ", every autotuner config" if options.all_configs else ""
    header += f" of {', '.join(options.config_kernels)}" if options.config_kernels else ""
    return header + (f", backend {options.backend} required" if options.backend else "")


_SUITE = pytest.StashKey[dict]()


def pytest_configure(config: pytest.Config) -> None:
    name = config.getoption("gdn_impl", None)
    if not name:
        return
    try:  # the same checks, in the same place, as check's flags (CheckOptions.resolve)
        run = check_options(config.option).resolve(name)
    except ConfigurationError as exc:
        raise _usage_error(exc) from None
    # Drawn and filled in once, so that the header shows them and every item runs with them.
    options = run.options.replace(seed=run.seed, dtype=run.dtype, grad=run.grad)
    names = [*run.properties, *(SCALE_PREFIX + case for case in run.scale_cases)]
    config.stash[_SUITE] = dict(impl=run.impl, options=options, names=names)


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """The suite is collected as a child of the session, beside the paths given: pytest counts its
    items (``collected 14 items``), ``-k`` and ``-m`` select among them, ``--collect-only`` lists them.
    (Items appended in ``pytest_collection_modifyitems`` ran but were never counted.)"""
    report = yield
    suite = collector.config.stash.get(_SUITE, None)
    if isinstance(collector, pytest.Session) and suite is not None and report.passed:
        report.result.append(PropertySuite.from_parent(collector, name="gdn-verify", nodeid="gdn-verify", suite=suite))
    return report


@pytest.fixture
def gdn_check(request: pytest.FixtureRequest) -> Callable[..., api.CheckResult]:
    """``gdn_check(impl, **kw)``: :func:`gdn_verify.check` with the ``--gdn-*`` options as defaults
    (but ``--gdn-properties`` and ``--gdn-scale``, which select the plugin's own items)."""
    defaults = check_options(request.config.option).replace(properties=None, scale=False).keywords()

    def run(impl: Any, **kw: Any) -> api.CheckResult:
        return api.check(impl, **{**defaults, **kw})

    return run
