"""The README's Python example runs as printed, its two commands come first (the second is CI's), and the
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


def _two_commands() -> tuple[str, str, int]:
    """The README's two commands (check a kernel, run the tests) and the line the second ends on."""
    text = README.read_text()
    section = text.split("## Two commands", 1)[1]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)[:2]
    assert len(blocks) == 2, "the README's 'Two commands' section needs two bash blocks"
    end = text.index(blocks[1]) + len(blocks[1])
    return blocks[0].strip(), blocks[1].strip(), text[:end].count("\n") + 1


def test_the_two_commands_come_first_and_the_second_is_what_ci_runs():
    install, tests, last_line = _two_commands()
    assert last_line <= 60, f"a newcomer should see both commands within 60 lines, not {last_line}"
    assert len(README.read_text().splitlines()) <= 250, "the README is a guide: reference goes to docs/"
    assert tests == "bash .ci/run"
    # the first installs the package alone (no test extras, no browser) and prints a verdict
    assert install.startswith("python3 -m venv .venv && .venv/bin/pip install -q . && ")
    assert install.endswith("&& .venv/bin/gdn-verify check")
    ci = (README.parent / ".ci" / "run").read_text()
    assert "pytest" in ci and "apt-get" in ci  # the browser is installed by the test command only
    assert "apt-get" not in install


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
