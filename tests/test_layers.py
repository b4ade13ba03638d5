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

and no two modules import each other, however indirectly (no import circle), lazy imports included.
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


# Import circles ------------------------------------------------------------------------------
# An import inside a function counts: it only hides a circle from the interpreter (both circles
# found here were of that kind), the two modules still cannot be understood, tested or moved
# apart. So do imports under ``if TYPE_CHECKING:``: none closes a circle today. An import edge
# goes to the module named (``from gdn_verify import api``: gdn_verify.api), not to the packages
# above it, whose ``__init__`` Python runs first but which the importer does not depend on.
KNOWN_CIRCLES: list[set[str]] = []  # each with the branch or issue that breaks it; empty since issue 49


def module_files() -> dict[str, Path]:
    """Every module of the installed packages, gdn_verify (its properties included) and cupy_kernels, by name."""
    found = {}
    for package in ("gdn_verify", "cupy_kernels"):
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            if rel.parts[:2] == ("gdn_verify", "_cli"):  # the command line: nothing in the library imports it
                continue
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            found[".".join(parts)] = path
    for path in (ROOT / "properties").glob("*.py"):  # installed as gdn_verify.properties (a symlink here)
        found[".".join(("gdn_verify", "properties", *([] if path.stem == "__init__" else [path.stem])))] = path
    return found


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    """For each module, the modules of ``files`` it imports (at any depth, relative imports resolved)."""

    def known(name: str) -> str | None:  # the module itself, else the nearest package above it
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {known(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    above = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*above, *([node.module] if node.module else [])])
                for alias in node.names:  # "from a import b": the module a.b when there is one, else a
                    targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else known(base))
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            step = next(successors, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_no_module_imports_itself_through_others():
    files = module_files()
    found = circles(import_graph(files))
    new = [sorted(c) for c in found if c not in KNOWN_CIRCLES]
    assert not new, "import circles:\n" + "\n".join(" <-> ".join(c) for c in new)
    stale = [sorted(c) for c in KNOWN_CIRCLES if c not in found]
    assert not stale, f"listed as known but broken now; remove from KNOWN_CIRCLES: {stale}"


def test_the_graph_sees_lazy_relative_and_package_imports():
    files = module_files()
    assert {"gdn_verify.api", "gdn_verify.properties.native", "cupy_kernels.chunk"} <= set(files)
    graph = import_graph(files)
    assert "gdn_verify.options" in graph["gdn_verify.api"]  # "from gdn_verify.options import ..."
    assert "gdn_verify.implementations" in graph["gdn_verify.api"]  # "from gdn_verify import implementations"
    assert "gdn_verify.runners.compile" in graph["gdn_verify.runners.compile_child"]


@pytest.mark.parametrize(
    "sources, circle",
    [
        ({"a": "import b", "b": "def f():\n    import a"}, {"a", "b"}),  # lazy imports count
        ({"a": "from b import x", "b": "from c import y", "c": "from a import z"}, {"a", "b", "c"}),
        # relative imports; "from p import NAME" (no module p.NAME) imports the package p
        ({"p": "from . import q", "p.q": "from p import NAME", "p.r": "from .q import x"}, {"p", "p.q"}),
        ({"p": "x = 1", "p.q": "from p import r", "p.r": "from p import NAME"}, None),  # "from p import r": p.r
        ({"a": "import b", "b": "import c", "c": "x = 1"}, None),
    ],
)
def test_a_circle_is_found(sources, circle, tmp_path):
    files = {}
    for name, source in sources.items():
        is_package = any(other.startswith(name + ".") for other in sources)
        path = tmp_path / Path(*name.split("."), "__init__.py") if is_package else tmp_path / f"{name}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        files[name] = path
    assert circles(import_graph(files)) == ([] if circle is None else [circle])
