"""The README's Python example runs as printed (docs that match the code)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_python_api_example_runs(tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    example = next(b for b in blocks if "from gdn_verify import check" in b)
    monkeypatch.chdir(tmp_path)  # minimal cases are saved under the current folder
    exec(compile(example, "README.md", "exec"), {})
    assert capsys.readouterr().out.startswith("True {'passed': 2")


def test_the_layout_table_matches_the_tree():
    root = README.parent
    section = README.read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)`", section, re.M)
    assert rows, "no layout table"
    for path in rows:
        assert (root / path).exists(), f"README layout lists {path}, which does not exist"
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
