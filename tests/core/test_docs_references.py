"""Every repository file and module README.md and docs/*.md name exists, so a page never sends a
reader to a file that moved. What counts as a reference, in code spans (fenced blocks are examples,
left out):

- a path whose first part is a top-level folder of the repository (``polar_env/proxy/app.py``,
  ``tests/test_x.py``, ``configs/``), or a package of ``polar_env`` with a file extension or a closing
  ``/`` (``proxy/app.py``, ``sandbox/``: read under ``polar_env/``); ``{a,b}`` is expanded, a
  ``:line`` or ``::test`` suffix dropped, a placeholder (``<harness>``, ``*``) makes it a pattern, not
  a path. So another project's path names its root (``<task>/tests/test.sh``), and a repository file
  is written as a path (``proxy/engine.py``), not as a bare name (``engine.py``: not checked), but in
  a table row that starts with a package (``| `proxy/` | ...``, docs/architecture.md's parts), where
  a bare file or folder name (``engine.py``, ``terminal/``) is read under that package;
- a dotted name that starts with ``polar_env.`` or with a package or module of it
  (``proxy.engine.EngineConfig``): its longest module prefix exists and the next part is defined at
  the top of that module;
- "`name` in `path.py`": that file defines ``name`` at its top;
- and a markdown link to a relative target (``[x](rollout.md)``): the target exists.
"""

from __future__ import annotations

import ast
import functools
import itertools
import re
from pathlib import Path

import pytest
from repo_paths import REPO

ROOT = REPO
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGE = ROOT / "polar_env"
TOP_FOLDERS = {
    p.name
    for p in ROOT.iterdir()
    if p.is_dir()
    and not p.name.startswith(".")
    and p.name not in {"build", "node_modules"}
    and not p.name.endswith(".egg-info")
} | {".ci"}
INNER = {p.stem for p in PACKAGE.iterdir() if (p / "__init__.py").exists() or p.suffix == ".py"} - {
    "__init__"
}  # packages and top modules
EXTENSIONS = (
    ".py",
    ".md",
    ".json",
    ".jsonl",
    ".yaml",
    ".yml",
    ".toml",
    ".sh",
    ".html",
    ".txt",
    ".tsv",
    ".lock",
)
FENCE = re.compile(r"^ *```.*?^ *```", re.S | re.M)
SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
NAME_IN = re.compile(r"`(\w+)` in `([\w/]+\.py)`")
DOTTED = re.compile(r"(?:polar_env\.)?([a-z_][a-z0-9_]*)(?:\.[A-Za-z_]\w*)+")


def words(page: Path) -> list[str]:
    """The whitespace-separated words of the page's code spans, stripped of the punctuation around them."""
    text = FENCE.sub("", page.read_text())
    return [word.strip("\"'(),;") for span in SPAN.findall(text) for word in span.split()]


def expand(word: str) -> list[str]:
    """``docs/benchmarks.{json,md}`` -> both names."""
    parts = re.split(r"\{([^{}]*)\}", word)
    choices = [[part] if i % 2 == 0 else part.split(",") for i, part in enumerate(parts)]
    return ["".join(combo) for combo in itertools.product(*choices)]


def path_problem(word: str) -> str | None:
    """Why ``word`` names a missing repository path, or None (it exists, or is no path)."""
    word = word.split(":")[0]
    hidden = word.startswith(".") and not word.startswith(".ci/")  # a harness's state dir (`.codex/`)
    pattern = re.search(r"[<>*$…]|\.\.\.", word)
    if "/" not in word or hidden or pattern or word.startswith(("/", "~", "http")):
        return None
    first = word.split("/")[0]
    if first in TOP_FOLDERS:
        bases = [ROOT]
    elif (PACKAGE / first / "__init__.py").exists() and (word.endswith("/") or word.endswith(EXTENSIONS)):
        bases = [PACKAGE]
    else:
        return None  # a URL route, a path inside a sandbox or an image, a word with a slash
    missing = [name for name in expand(word) if not any((base / name).exists() for base in bases)]
    return f"{word}: no {', '.join(missing)} in the repository" if missing else None


@functools.cache
def top_names(module: Path) -> frozenset[str]:
    """The names a module defines or imports at its top level."""
    names: set[str] = set()
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return frozenset(names)


def module_problem(word: str) -> str | None:
    """Why a dotted ``polar_env`` name is missing: no module for its prefix, or no such top-level name."""
    match = DOTTED.fullmatch(re.sub(r"\(.*$", "", word))
    if not match or (match.group(1) not in INNER and not word.startswith("polar_env.")):
        return None
    parts = match.group(0).removeprefix("polar_env.").split(".")
    if "." + parts[-1] in EXTENSIONS:
        return None  # a file name (``grades.py``), not a module
    where, rest = PACKAGE, parts
    while rest and ((where / rest[0]).is_dir() or (where / f"{rest[0]}.py").exists()):
        where, rest = where / rest[0], rest[1:]
    if where == PACKAGE:
        return f"{word}: no module polar_env.{parts[0]}"
    module = where / "__init__.py" if where.is_dir() else where.with_suffix(".py")
    if rest and rest[0] not in top_names(module):
        return f"{word}: {module.relative_to(ROOT)} defines no {rest[0]}"
    return None


def row_problems(page: Path) -> list[str]:
    """Bare file and folder names in a table row that starts with a package, read under that package."""
    found = []
    for row in FENCE.sub("", page.read_text()).splitlines():
        package = re.match(r"\| `([a-z_]+)/` \|", row)
        if not package or not (PACKAGE / package.group(1)).is_dir():
            continue
        for word in (w.strip("\"'(),;") for span in SPAN.findall(row[package.end() :]) for w in span.split()):
            if word.rstrip("/") in INNER:
                continue  # another package named from this row (`wire/`)
            if re.fullmatch(r"\w+\.py|\w+/", word) and not (PACKAGE / package.group(1) / word).exists():
                found.append(f"{word} (row {package.group(1)}/): no polar_env/{package.group(1)}/{word}")
    return found


def name_in_problems(page: Path) -> list[str]:
    found = []
    for name, path in NAME_IN.findall(FENCE.sub("", page.read_text())):
        where = next((base / path for base in (ROOT, PACKAGE) if (base / path).is_file()), None)
        if where is not None and name not in top_names(where):
            found.append(f"`{name}` in `{path}`: not defined there")
    return found


def link_problems(page: Path) -> list[str]:
    targets = [t.split("#")[0] for t in LINK.findall(FENCE.sub("", page.read_text()))]
    return [
        f"link {t}: missing"
        for t in targets
        if t and not re.match(r"[a-z]+:", t) and not (page.parent / t).exists()
    ]


def problems(page: Path) -> list[str]:
    found = [p for word in words(page) for check in (path_problem, module_problem) if (p := check(word))]
    return sorted(set(found + row_problems(page) + name_in_problems(page) + link_problems(page)))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_reference_on_the_page_exists(page: Path):
    assert problems(page) == []


WRONG = [
    "`polar_env/proxy/wire.py`",
    "`proxy/codec.py`",
    "`tests/test_gone.py -k x`",
    "`.ci/nope`",
    "`polar_env.proxy.codecs.openai_chat.no_such`",
    "`proxy.wire.sse_frame`",
    "`docs/benchmarks.{json,nope}`",
    "[x](gone.md)",
    "\n| `proxy/` | the codecs (`codec.py`) |",
    "`openai_error` in `proxy/codecs/common.py`",
]


@pytest.mark.parametrize("wrong", WRONG)
def test_a_wrong_reference_is_caught(tmp_path: Path, wrong: str):
    page = tmp_path / "page.md"
    page.write_text(f"See {wrong} and `polar_env/proxy/app.py`.\n")
    assert len(problems(page)) == 1, wrong


def test_the_readmes_layout_lists_every_package_and_harness():
    """README's layout block names each package of ``polar_env`` and each registered harness's module."""
    from polar_env.harness_adapters.registry import ADAPTERS

    block = re.search(r"## Layout\n.*?```\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert block, "README.md has a '## Layout' section with the layout block"
    listed = set(re.findall(r"^  ([a-z_]+)/ ", block.group(1), re.M))
    assert listed == {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    harnesses = {adapter.__module__.rsplit(".", 1)[1] for adapter in ADAPTERS.values()}
    named = set(re.findall(r"\b[a-z_]+\b", block.group(1).split("harness_adapters/")[1].split("install,")[0]))
    assert named == harnesses
