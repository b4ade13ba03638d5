"""The layers import downward only; checked by walking every import statement (lazy ones included).

cupy_kernels                  numpy, cupy (with cupy_backends, part of CuPy's wheel), torch and the
                              standard library only
gdn_verify.core               itself
gdn_verify.properties         core
gdn_verify.implementations    core (and cupy_kernels, the kernels under test)
gdn_verify.runners            core, implementations (properties arrive as objects)
gdn_verify.bench              core, implementations (the peer bench loads the adapters' libraries), cupy_kernels
gdn_verify.api, options, console, pytest_plugin: the library below them; report: the same, on the API
cli.py                        anything; nothing in gdn_verify imports it but __main__
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP = {"api", "options", "console", "pytest_plugin", "__init__"}
ALLOWED = {
    "cupy_kernels": {"cupy_kernels"},
    "core": {"core"},
    "properties": {"core", "properties"},
    "implementations": {"core", "implementations", "cupy_kernels"},
    "runners": {"core", "implementations", "runners"},
    "bench": {"core", "implementations", "bench", "cupy_kernels"},
    "report": {"core", "implementations", "runners", "properties", "report", "top"},  # built on the API
    "top": {"core", "implementations", "runners", "properties", "report", "bench", "api", "console", "top"},
}
# cupy_backends ships in CuPy's own wheel: sources.sm90a_module reaches NVRTC through it.
THIRD_PARTY_FOR_KERNELS = {"numpy", "cupy", "cupy_backends", "torch"}


def layer_of_module(name: str) -> str | None:
    """The layer a dotted module name belongs to (None: not ours)."""
    parts = name.split(".")
    if parts[0] == "cupy_kernels":
        return "cupy_kernels"
    if parts[0] in ("cli", "properties"):
        return parts[0] + " (top-level)"  # never to be imported: gdn_verify._cli, gdn_verify.properties
    if parts[0] != "gdn_verify":
        return None
    if len(parts) == 1:
        return "top"
    if parts[1] == "_cli":
        return "cli"
    return "top" if parts[1] in TOP else parts[1]


def layer_of_file(path: Path) -> str:
    rel = path.relative_to(ROOT)
    if rel.parts[0] == "cupy_kernels":
        return "cupy_kernels"
    if rel.parts[0] == "properties":
        return "properties"
    name = rel.parts[1]
    return "top" if name.removesuffix(".py") in TOP else name


def imports(source: str) -> list[tuple[int, str]]:
    """``(line, module)`` of every absolute import in ``source``, at any depth."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # "from gdn_verify import api" imports gdn_verify.api
            found += [
                (node.lineno, f"{node.module}.{alias.name}" if node.module in ("gdn_verify",) else node.module)
                for alias in node.names
            ]
    return found


def violations(layer: str, source: str, where: str) -> list[str]:
    bad = []
    for line, module in imports(source):
        target = layer_of_module(module)
        root = module.split(".")[0]
        if layer == "cupy_kernels":
            if target is None and root not in THIRD_PARTY_FOR_KERNELS and root not in sys.stdlib_module_names:
                bad.append(f"{where}:{line}: the kernel library imports {module}")
            elif target is not None and target != "cupy_kernels":
                bad.append(f"{where}:{line}: the kernel library imports {module}")
        elif target is not None and target not in ALLOWED[layer]:
            bad.append(f"{where}:{line}: layer {layer} imports {module} (layer {target})")
    return bad


def library_files() -> list[Path]:
    files = [*ROOT.glob("cupy_kernels/*.py"), *ROOT.glob("properties/*.py")]
    files += [
        p
        for p in ROOT.glob("gdn_verify/**/*.py")
        if p.name not in ("__main__.py", "_cli.py") and "properties" not in p.relative_to(ROOT).parts[1:2]
    ]
    return sorted(files)


def test_every_layer_imports_downward_only():
    found = []
    for path in library_files():
        found += violations(layer_of_file(path), path.read_text(), str(path.relative_to(ROOT)))
    assert not found, "\n".join(found)


def test_the_walk_sees_every_library_file():
    names = {str(p.relative_to(ROOT)) for p in library_files()}
    assert {
        "cupy_kernels/chunk.py",
        "gdn_verify/core/verdict.py",
        "properties/native.py",
        "gdn_verify/runners/check.py",
        "gdn_verify/api.py",
    } <= names


@pytest.mark.parametrize(
    "layer, source",
    [
        ("cupy_kernels", "from gdn_verify.core.conventions import sequence_bounds"),
        ("cupy_kernels", "import scipy"),
        ("core", "def f():\n    from gdn_verify.implementations import resolve"),  # lazy imports count
        ("properties", "from gdn_verify.implementations import numpy_impl"),
        ("runners", "from gdn_verify.properties import catalogue"),
        ("runners", "from gdn_verify import api"),
        ("top", "import cli"),
        ("top", "from gdn_verify._cli import main"),
        ("report", "from properties.native import native_properties"),
    ],
)
def test_a_violation_is_reported(layer, source):
    assert violations(layer, source, "x.py")


def test_the_wheel_installs_no_top_level_cli_or_properties():
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "py-modules" not in config
    assert {p.split(".")[0] for p in config["packages"]} == {"gdn_verify", "cupy_kernels"}
    assert (ROOT / "gdn_verify" / "_cli.py").resolve() == ROOT / "cli.py"
    assert (ROOT / "gdn_verify" / "properties").resolve() == ROOT / "properties"
