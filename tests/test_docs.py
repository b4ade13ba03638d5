"""README.md and docs/*.md stay true to the code: the paths they cite exist, the implementation
names they use are in the registry (and every registered name is documented), every ``--option``
they give a command is one of that command's options, and every property is described.

Each check is a function returning the problems it finds, run on the real pages (no problems)
and on a page with planted mistakes (each found), so that a check that can no longer fail is
noticed too.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from gdn_verify import _cli, api, implementations
from gdn_verify.implementations import planted, planted_grad, planted_memory
from gdn_verify.properties import NAMES as FORWARD_PROPERTIES

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

# First components of repository paths the pages cite (relative to the root), and the packages
# of gdn_verify/ (a path such as `core/shapes.py` is relative to gdn_verify/).
ROOT_DIRS = ("gdn_verify", "cupy_kernels", "properties", "docs", "reports", "scripts", "tests", "benchmarks", ".ci")
PACKAGE_DIRS = tuple(p.name for p in (ROOT / "gdn_verify").iterdir() if p.is_dir() and not p.name.startswith("_"))
SUBCOMMANDS = ("check", "selftest", "replay", "fuzz", "report", "bench", "matrix")
# Implementation names look like these (a span holding only such a word is taken as one).
IMPL_WORD = re.compile(r"^(?:numpy|cupy|oracle|(?:numpy|cupy|fla|flash|flashinfer|vllm)(?:-[a-z0-9]+)+)$")
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


@dataclass
class Snippet:
    """A piece of code a page shows: an inline code span or one line of a fenced block."""

    page: str
    text: str
    section: str  # the nearest `## ` heading above it
    fenced: bool


def _headings_and_blocks(text: str) -> list[tuple[str, str, bool]]:
    """``(section, text, fenced)`` for the prose paragraphs and fenced code blocks of a page."""
    parts: list[tuple[str, str, bool]] = []
    section, fence, block, prose = "", None, [], []
    for line in text.splitlines():
        if fence is None and line.startswith("```"):
            parts.append((section, "\n".join(prose), False))
            fence, block, prose = line, [], []
        elif fence is not None and line.startswith("```"):
            parts.append((section, "\n".join(block), True))
            fence = None
        elif fence is not None:
            block.append(line)
        else:
            if line.startswith("## "):
                parts.append((section, "\n".join(prose), False))
                prose, section = [], line[3:].strip()
            prose.append(line)
    parts.append((section, "\n".join(prose), False))
    return parts


def snippets(page: str, text: str) -> list[Snippet]:
    out = []
    for section, part, fenced in _headings_and_blocks(text):
        if fenced:
            out += [Snippet(page, line, section, True) for line in part.splitlines() if line.strip()]
            continue
        for paragraph in re.split(r"\n\s*\n", part):  # a code span never crosses a paragraph
            out += [Snippet(page, span, section, False) for span in re.findall(r"`([^`]+)`", paragraph)]
    return out


def links(text: str) -> list[str]:
    prose = "\n".join(part for _, part, fenced in _headings_and_blocks(text) if not fenced)
    return re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", prose)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m) for m in re.findall(r"^#+ (.+)$", page.read_text(), re.M)}


# Paths ------------------------------------------------------------------------------------------
def _placeholder(token: str) -> bool:
    """``reports/<date>/...``, ``DIR/x``, ``ops/*.py``: a pattern, not a path."""
    if any(c in token for c in "<>*${}") or "..." in token:
        return True
    return any(re.fullmatch(r"[A-Z][A-Z0-9_-]*", part) for part in token.split("/"))


def path_tokens(snippet: str) -> list[str]:
    """Words of ``snippet`` that name a file or folder of this repository."""
    found = []
    for word in re.split(r"[\s()\[\],;='\"|]+", snippet):
        word = word.rstrip(".:")
        if ":" in word:  # FILE.py:FUNCTION
            word = word.split(":", 1)[0]
        word = word.removeprefix("./")
        first = word.split("/", 1)[0]
        if "/" not in word or _placeholder(word) or (first not in ROOT_DIRS and first not in PACKAGE_DIRS):
            continue
        found.append(word)
    return found


def missing_paths(page: Path, text: str) -> list[str]:
    problems = []
    for s in snippets(page.name, text):
        for token in path_tokens(s.text):
            base = ROOT if token.split("/", 1)[0] in ROOT_DIRS else ROOT / "gdn_verify"
            if not (base / token.rstrip("/")).exists():
                problems.append(f"{page.name}: `{token}` does not exist")
    for target in links(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            problems.append(f"{page.name}: link ({target}) points nowhere")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{page.name}: link ({target}) names no heading of {resolved.name}")
    return problems


# Dotted names: gdn_verify.core.gating, cupy_kernels.decode:spec_decode ---------------------------
def _defines(module: Path, name: str) -> bool:
    source = module.read_text()
    pattern = rf"^\s*(?:def|class)\s+{name}\b|^\s*{name}\s*[:=]|import[^\n]*\b{name}\b|\"{name}\""
    return re.search(pattern, source, re.M) is not None


def missing_dotted(page: Path, text: str) -> list[str]:
    problems = []
    for s in snippets(page.name, text):
        for dotted in re.findall(r"\b(?:gdn_verify|cupy_kernels)(?:\.\w+)+(?::\w+)?", s.text):
            parts = dotted.replace(":", ".").split(".")
            module, rest = None, []
            for i in range(len(parts), 0, -1):
                base = ROOT.joinpath(*parts[:i])
                for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                    if candidate.is_file():
                        module, rest = candidate, parts[i:]
                        break
                if module is not None:
                    break
            if module is None:
                problems.append(f"{page.name}: `{dotted}`: no such module")
            elif rest and not _defines(module, rest[0]):
                problems.append(f"{page.name}: `{dotted}`: {module.relative_to(ROOT)} defines no {rest[0]}")
    return problems


# Implementation names ---------------------------------------------------------------------------
def implementation_names(text: str, page: str = "") -> set[str]:
    """The names a page gives ``--impl``, ``--gdn-impl`` or ``check(...)``, and spans that are one."""
    names = set()
    for s in snippets(page, text):
        names.update(re.findall(r"--(?:gdn-)?impl[ =]([^\s`,;)\]]+)", s.text))
        names.update(re.findall(r"\bcheck\(\s*[\"']([^\"']+)[\"']", s.text))
        word = s.text.strip()
        if not s.fenced and (IMPL_WORD.match(word) or re.fullmatch(r"planted(?:-grad)?:\w+", word)):
            names.add(word)
    return names


def unknown_implementation(name: str) -> str | None:
    """Why ``name`` is not something ``--impl`` accepts, or None."""
    if re.fullmatch(r"[A-Z][A-Z0-9_]*", name) or name in implementations.names():
        return None  # a placeholder (IMPL, A), or a built-in
    prefix = implementations.planted_prefix(name)
    if prefix is not None:
        bug = name.removeprefix(prefix)
        bugs = planted.BUGS if prefix == "planted:" else planted_grad.BUGS
        return None if bug == "BUG" or bug in bugs else f"{name}: no such planted bug"
    if not implementations.is_plugin(name):
        return f"{name}: not a built-in implementation, planted bug or MODULE:FUNCTION"
    module, _, function = name.partition(":")
    path = ROOT / (module.replace(".", "/") + ".py")
    if "/" not in module and not module.endswith(".py") and path.is_file() and not _defines(path, function):
        return f"{name}: {path.relative_to(ROOT)} defines no {function}"
    return None


def registry_from_help() -> list[str]:
    """The built-in names ``check --help`` lists for ``--impl``."""
    (action,) = [a for a in subparsers()["check"]._actions if "--impl" in a.option_strings]
    words = re.split(r",\s*(?:or\s+)?|\s+or\s+", action.help or "")
    return [w for w in words if w and w not in ("planted:BUG", "planted-grad:BUG", "MODULE:FUNCTION")]


# Options ----------------------------------------------------------------------------------------
def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = _cli.build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def options_of(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings if o.startswith("--")}


def option_problems(page: Path, text: str, pytest_options: set[str]) -> list[str]:
    """Options given to one of our commands that it does not have.

    A shell segment naming a subcommand (``gdn-verify check ...``, ``cli.py fuzz ...``, or a span
    starting ``report --quick``) is held to that subcommand's options, one running pytest to
    pytest's (the plugin's and tests/conftest.py's), and a bare option (a span or table cell
    starting with ``--``) to the subcommand of its section (``## `fuzz```) or else to any of
    ours. Other programs' segments (pip, ruff, bash, ...) are not ours to check.
    """
    subs = subparsers()
    by_command = {name: options_of(p) for name, p in subs.items()}
    top = options_of(_cli.build_parser())
    everything = set().union(*by_command.values(), top, pytest_options)
    problems = []
    for s in snippets(page.name, text):
        for segment in re.split(r"&&|\|\||;|(?<!\\)\|(?!\|)|[{}]", s.text):
            words = segment.split()
            if not words:
                continue
            ours = re.search(r"(?:gdn-verify|gdn_verify|cli\.py)\s+(\w+)", segment)
            if ours and ours.group(1) in SUBCOMMANDS:
                allowed, what = by_command[ours.group(1)], f"gdn-verify {ours.group(1)}"
            elif ours or re.search(r"(?:gdn-verify|cli\.py)\s+--", segment):
                allowed, what = top, "gdn-verify"
            elif "pytest" in words or "pytest" in segment.split("-m ")[-1].split():
                allowed, what = pytest_options, "pytest"
            elif words[0] in SUBCOMMANDS and len(words) > 1 and words[1].startswith("--"):
                allowed, what = by_command[words[0]], f"gdn-verify {words[0]}"
            elif words[0].startswith("--"):
                sub = s.section.strip("`")
                if sub in SUBCOMMANDS:
                    allowed, what = by_command[sub] | pytest_options, f"gdn-verify {sub} (its section)"
                else:
                    allowed, what = everything, "any command of ours"
            else:
                continue  # another program's command line
            for option in OPTION.findall(segment):
                if option not in allowed and option != "--help":
                    problems.append(f"{page.name}: {option} is not an option of {what}: `{s.text.strip()}`")
    return problems


# Properties -------------------------------------------------------------------------------------
def documented_properties(text: str) -> set[str]:
    return set(re.findall(r"^\| `([a-z_]+)` \|", text, re.M))


# The tests --------------------------------------------------------------------------------------
class _Recorder:
    """Stands in for pytest's parser: records the option names a ``pytest_addoption`` adds."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def getgroup(self, *args: object, **kwargs: object) -> _Recorder:
        return self

    def addoption(self, *names: str, **kwargs: object) -> None:
        self.names.update(n for n in names if n.startswith("--"))


@pytest.fixture(scope="module")
def pytest_options() -> set[str]:
    """The options pytest gets from the gdn-verify plugin and from tests/conftest.py."""
    from gdn_verify import pytest_plugin

    spec = importlib.util.spec_from_file_location("_gdn_docs_conftest", ROOT / "tests" / "conftest.py")
    assert spec is not None and spec.loader is not None
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    recorder = _Recorder()
    pytest_plugin.pytest_addoption(recorder)  # type: ignore[arg-type]
    conftest.pytest_addoption(recorder)
    return recorder.names


def test_the_readme_is_a_guide_that_links_every_page():
    readme = (ROOT / "README.md").read_text()
    assert readme.count("\n") <= 250, "the README is a guide: move reference material to docs/"
    linked = {target.partition("#")[0] for target in links(readme)}
    assert sorted(f"docs/{p.name}" for p in DOCS.glob("*.md") if f"docs/{p.name}" not in linked) == []


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_cited_path_exists(page):
    text = page.read_text()
    assert missing_paths(page, text) + missing_dotted(page, text) == []


def test_every_implementation_name_is_accepted_by_the_registry():
    problems = []
    for page in PAGES:
        for name in sorted(implementation_names(page.read_text(), page.name)):
            why = unknown_implementation(name)
            if why:
                problems.append(f"{page.name}: {why}")
    assert problems == []


def test_check_help_lists_the_registry_and_the_docs_document_every_name():
    listed = registry_from_help()
    assert sorted(listed) == sorted(implementations.names())
    documented = set().union(*(implementation_names(p.read_text(), p.name) for p in PAGES if p.parent == DOCS))
    text = "\n".join(p.read_text() for p in PAGES if p.parent == DOCS)
    assert [n for n in listed if n not in documented] == []
    assert "planted:BUG" in text and "planted-grad:BUG" in text and "MODULE:FUNCTION" in text


def test_the_commands_page_lists_every_built_in_implementation():
    """``docs/commands.md``'s table of built-in implementations is the one place every name is: the four
    ``max-*`` adapters had been documented in adapters.md alone (issue 49)."""
    section = (DOCS / "commands.md").read_text().split("## Built-in implementations", 1)[1].split("\n## ", 1)[0]
    listed = {name for cell in re.findall(r"^\| ([^|]+) \|", section, re.M) for name in re.findall(r"`([^`]+)`", cell)}
    assert [n for n in implementations.names() if n not in listed] == []
    assert sorted(n for n in listed if unknown_implementation(n)) == []


def test_the_commands_page_counts_the_planted_bugs():
    """The README said 32 planted bugs where ``selftest`` ran 34 (issue 49)."""
    text = (DOCS / "commands.md").read_text()
    assert re.findall(r"`planted\.BUGS`: (\d+) bugs", text) == [str(len(planted.BUGS))]
    assert re.findall(r"the (\d+) planted gradient bugs", text) == [str(len(planted_grad.BUGS))]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_option_exists_for_its_command(page, pytest_options):
    assert {"--gdn-impl", "--gdn-grad", "--runslow"} <= pytest_options
    assert option_problems(page, page.read_text(), pytest_options) == []


def unknown_bugs(text: str) -> list[str]:
    """Words in the third column of a property table (what it catches) that name no planted bug."""
    bugs = set(planted.BUGS) | set(planted_grad.BUGS) | set(planted_memory.BUGS)
    rows = re.findall(r"^\| `[a-z_]+` \|[^|]*\|(.*)\|$", text, re.M)
    return sorted({w for row in rows for w in re.findall(r"`([a-z0-9]+(?:_[a-z0-9]+)+)`", row)} - bugs)


def test_every_property_is_described():
    text = (DOCS / "properties.md").read_text()
    described = documented_properties(text)
    names = set(FORWARD_PROPERTIES) | set(api.grad_names())
    assert sorted(names - described) == [], "properties without a row in docs/properties.md"
    assert sorted(described - names) == [], "rows of docs/properties.md naming no property"
    assert unknown_bugs(text) == [], "planted bugs named in docs/properties.md that do not exist"


BAD_PAGE = """# A page with planted mistakes

## `fuzz`

Run `gdn-verify check --impl numpy-chunk-fla17 --no-such-option` or
`gdn-verify check --impl planted:no_such_bug --dims 64` and `fla-chunky`; `--quick` is a report
option, `cupy_kernels.decode:no_such_launcher` is not a launcher and `gdn_verify.core.no_such`
no module. See `scripts/no_such_script.sh`, [the page](no_such_page.md) and
[a heading](commands.md#no-such-heading).

```bash
pytest --gdn-impl numpy --gdn-no-such-flag
```
"""


def test_the_checks_catch_planted_mistakes(pytest_options):
    page = DOCS / "planted-mistakes.md"  # never written: the checks read the text given
    paths = missing_paths(page, BAD_PAGE)
    assert any("scripts/no_such_script.sh" in p for p in paths)
    assert any("no_such_page.md" in p for p in paths)
    assert any("no-such-heading" in p for p in paths)
    assert any("gdn_verify.core.no_such" in p for p in missing_dotted(page, BAD_PAGE))
    names = implementation_names(BAD_PAGE)
    assert {"numpy-chunk-fla17", "planted:no_such_bug", "fla-chunky"} <= names
    assert all(unknown_implementation(n) for n in ("numpy-chunk-fla17", "planted:no_such_bug", "fla-chunky"))
    assert unknown_implementation("cupy_kernels.decode:no_such_launcher")
    assert unknown_implementation("cupy_kernels.decode:spec_decode") is None
    options = "\n".join(option_problems(page, BAD_PAGE, pytest_options))
    assert "--no-such-option is not an option of gdn-verify check" in options
    assert "--quick is not an option of gdn-verify fuzz" in options
    assert "--gdn-no-such-flag is not an option of pytest" in options
    assert "--dims" not in options
    assert unknown_bugs("| `determinism` | x | `nondeterministic`, `no_such_bug` |") == ["no_such_bug"]
    assert documented_properties("| `matches_reference` | x |\n| `no_such_property` | y |") == {
        "matches_reference",
        "no_such_property",
    }


def test_reports_keep_few_raw_logs_and_cite_each():
    """Measurements live in JSON and markdown; a raw log is kept only where a report cites it,
    and ten at most (102 were tracked on 2026-11-25). The tracked ones, where git can say."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "reports"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split()
        logs = sorted(ROOT / name for name in listed if name.endswith(".log"))
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file is the project's
        logs = sorted((ROOT / "reports").rglob("*.log"))
    uncited = [
        str(log.relative_to(ROOT))
        for log in logs
        if not any(log.name in md.read_text() for md in log.parent.glob("*.md"))
    ]
    assert uncited == [], "cite each kept log in its folder's markdown, or leave it out of git"
    assert len(logs) <= 10, [str(log.relative_to(ROOT)) for log in logs]
