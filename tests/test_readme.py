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
