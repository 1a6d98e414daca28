"""The allowed-path rule: which changed paths of the graded tree count as the project's source.

Decided from the tree after the patch is applied (what changed against base), never from the
patch's headers. A changed path is kept only if it is project source; every other changed path is
restored to base (or removed when base lacks it) before the tests run. A path is NOT project
source when any of these holds (``reason`` names the first that does):

- ``test``: a component is ``test``/``tests``/``testing`` (the last one too: a ``tests`` replaced
  by a symlink or a file is not source), or the file is
  ``conftest.py``, ``test_*.py``, ``*_test.py``, ``*_tests.py`` or ``tests.py``;
- ``runner-config``: ``pytest.ini``, ``.pytest.ini``, ``pytest.toml``, ``.pytest.toml``,
  ``tox.ini``, ``setup.cfg``, ``pyproject.toml``, ``noxfile.py``, ``.coveragerc`` anywhere;
- ``packaging``: ``setup.py``, ``MANIFEST.in``, or anything inside ``*.egg-info``,
  ``*.dist-info``, ``*.egg-link``, ``*.egg`` (metadata that registers entry points, e.g. pytest
  plugins);
- ``startup-hook``: ``sitecustomize.py``, ``usercustomize.py``, ``*.pth``;
- ``bytecode``: ``*.pyc``/``*.pyo``, ``__pycache__`` and anything in it, compiled extensions
  (``*.so``, ``*.pyd``), which Python imports before, or instead of, a ``.py`` source;
- ``shadowing``: a new top-level module or package of an import root (the tree root and every
  in-tree ``PYTHONPATH`` entry of the task): a ``.py`` file directly in the root, or a directory
  holding Python files, whose name was not a top-level module there at base. A patch may change
  and add files inside the project's existing packages, never add a name that could shadow the
  runner, its plugins or the standard library;
- ``vcs``: anything inside ``.git`` (refused outright when applying, listed here for completeness).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from pathlib import PurePosixPath

TEST_DIRS = frozenset({"test", "tests", "testing"})
TEST_FILE_GLOBS = ("conftest.py", "test_*.py", "*_test.py", "*_tests.py", "tests.py")
RUNNER_CONFIG = frozenset(
    {
        "pytest.ini",
        ".pytest.ini",
        "pytest.toml",
        ".pytest.toml",
        "tox.ini",
        "setup.cfg",
        "pyproject.toml",
        "noxfile.py",
        ".coveragerc",
    }
)
PACKAGING_FILES = frozenset({"setup.py", "MANIFEST.in"})
PACKAGING_DIR_SUFFIXES = (".egg-info", ".dist-info", ".egg-link", ".egg")
STARTUP_HOOKS = frozenset({"sitecustomize.py", "usercustomize.py"})
BYTECODE_SUFFIXES = (".pyc", ".pyo", ".so", ".pyd")
MODULE_SUFFIXES = (".py", ".so", ".pyd", ".pyc")


def module_name(entry: str, is_dir: bool) -> str | None:
    """The top-level import name a root entry provides, or None if it is not importable."""
    if is_dir:
        return entry
    for suffix in MODULE_SUFFIXES:
        if entry.endswith(suffix):
            return entry[: -len(suffix)].split(".")[0]
    return None


def top_level_modules(paths: Iterable[str], root: str) -> set[str]:
    """Top-level import names under ``root`` ("" = tree root) given a tree's file list."""
    names: set[str] = set()
    prefix = f"{root}/" if root else ""
    for path in paths:
        if not path.startswith(prefix):
            continue
        parts = path[len(prefix) :].split("/")
        if len(parts) == 1:
            name = module_name(parts[0], is_dir=False)
        else:
            name = parts[0] if path.endswith(MODULE_SUFFIXES) else None
        if name:
            names.add(name)
    return names


def non_source_reason(path: str, import_roots: dict[str, set[str]]) -> str | None:
    """Why ``path`` is not project source (see module doc), or None if it is."""
    parts = PurePosixPath(path).parts
    name = parts[-1]
    lowered = [p.lower() for p in parts]
    if ".git" in lowered:
        return "vcs"
    if TEST_DIRS & set(lowered) or any(fnmatch.fnmatchcase(name, g) for g in TEST_FILE_GLOBS):
        return "test"
    if name in RUNNER_CONFIG:
        return "runner-config"
    if name in PACKAGING_FILES or any(p.endswith(PACKAGING_DIR_SUFFIXES) for p in parts):
        return "packaging"
    if name in STARTUP_HOOKS or name.endswith(".pth"):
        return "startup-hook"
    if "__pycache__" in parts or name.endswith(BYTECODE_SUFFIXES):
        return "bytecode"
    for root, base_names in import_roots.items():
        prefix = f"{root}/" if root else ""
        if not path.startswith(prefix):
            continue
        rest = path[len(prefix) :].split("/")
        new_name = (
            module_name(rest[0], is_dir=False)
            if len(rest) == 1
            else (rest[0] if name.endswith(MODULE_SUFFIXES) else None)
        )
        if new_name and new_name not in base_names:
            return "shadowing"
    return None
