"""The README's Python example runs as printed, its install-and-test line is what CI runs, and the
layout table (docs/development.md) matches the tree: docs that match the code."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
LAYOUT = README.parent / "docs" / "development.md"


def test_the_python_api_example_runs(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    example = next(b for b in blocks if "from gdn_verify import check" in b)
    monkeypatch.chdir(tmp_path)  # minimal cases are saved under the current folder
    exec(compile(example, "README.md", "exec"), {})
    assert capsys.readouterr().out.startswith("True {'passed': 2")


def test_the_install_and_test_line_is_what_ci_runs():
    section = README.read_text().split("### Install and test", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "no install-and-test block"
    ci = (README.parent / ".ci" / "run").read_text().splitlines()
    lines = block.group(1).strip().splitlines()
    assert lines and lines[-1].startswith("python3 -m venv .venv && ")
    for line in lines:
        assert line in ci, f"the README's install-and-test line is not in .ci/run: {line}"


def test_the_layout_table_matches_the_tree():
    root = README.parent
    section = LAYOUT.read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)`", section, re.M)
    assert rows, "no layout table"
    for path in rows:
        assert (root / path).exists(), f"the layout table lists {path}, which does not exist"
    folders = {
        f"gdn_verify/{p.name}/"
        for p in (root / "gdn_verify").iterdir()
        if p.is_dir() and not p.name.startswith("__") and not p.is_symlink()
    }
    top = {
        f"{p.name}/"
        for p in root.iterdir()
        if p.is_dir() and not p.name.startswith(".") and p.name not in ("shared",) and not p.name.endswith(".egg-info")
    }
    assert folders | top <= set(rows) | {"gdn_verify/"}, sorted((folders | top) - set(rows))


def test_every_package_says_what_lives_there():
    root = README.parent
    for init in [
        *root.glob("gdn_verify/*/__init__.py"),
        root / "gdn_verify/__init__.py",
        root / "cupy_kernels/__init__.py",
        root / "properties/__init__.py",
    ]:
        text = init.read_text().lstrip()
        assert text.startswith('"""') and len(text.split('"""')[1].split()) >= 8, f"{init}: no docstring"
