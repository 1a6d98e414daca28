"""Agent patches: extract them from a sandbox tree, apply them to a fresh one.

Extraction diffs the working tree (untracked files included) against the tree's root commit,
the only commit a task tree starts with, so commits the agent made are still counted. A
throwaway index keeps the agent's own index untouched. Harness state and build noise are
excluded; `--binary` keeps binary edits applicable.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from enum import StrEnum
from pathlib import Path

from polar_env.tasks.tree import git

# Harness homes, caches and build artefacts: never part of a solution.
NOISE_PATHSPECS = [
    ":(exclude,glob)**/.codex/**",
    ":(exclude,glob)**/.claude/**",
    ":(exclude,glob)**/.pi/**",
    ":(exclude,glob)**/__pycache__/**",
    ":(exclude,glob)**/*.pyc",
    ":(exclude,glob)**/.pytest_cache/**",
    ":(exclude,glob)**/.mypy_cache/**",
    ":(exclude,glob)**/.ruff_cache/**",
    ":(exclude,glob)**/.tox/**",
    ":(exclude,glob)**/*.egg-info/**",
    ":(exclude,glob)**/node_modules/**",
    ":(exclude)build",
    ":(exclude)dist",
]


class ApplyMethod(StrEnum):
    git_apply = "git_apply"
    patch_fuzz = "patch_fuzz"
    none = "none"


def base_commit(tree: Path) -> str:
    """The tree's root commit (the task base), whatever the agent committed on top."""
    roots = git(tree, "rev-list", "--max-parents=0", "HEAD").stdout.decode().split()
    if len(roots) != 1:
        raise RuntimeError(f"{tree}: expected exactly one root commit, found {len(roots)}")
    return roots[0]


def extract_patch(tree: Path) -> str:
    """`git diff --binary` of the tree against its base, noise excluded ("" if unchanged)."""
    base = base_commit(tree)
    with tempfile.TemporaryDirectory() as tmp:
        index = str(Path(tmp) / "index")
        _git_with_index(tree, index, "read-tree", base)
        _git_with_index(tree, index, "add", "-A", "--", ".", *NOISE_PATHSPECS)
        out = _git_with_index(
            tree, index, "diff", "--cached", "--binary", "--no-color", "--no-ext-diff", base
        )
    return out.decode("utf-8", "surrogateescape")


def _git_with_index(tree: Path, index: str, *args: str) -> bytes:
    """git with a throwaway index, so the agent's own index is never touched."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tree),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_INDEX_FILE": index,
    }
    proc = subprocess.run(
        ["git", "-c", "safe.directory=*", "-c", "core.quotepath=false", *args],
        cwd=tree,
        env=env,
        capture_output=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"git {' '.join(args[:2])} failed in {tree}: {proc.stderr.decode(errors='replace')}"
        )
    return proc.stdout


def apply_patch(tree: Path, patch: str) -> tuple[ApplyMethod, str]:
    """Apply with `git apply`, falling back to `patch --fuzz`; returns (method, tool output)."""
    with tempfile.NamedTemporaryFile("wb", suffix=".diff", delete=False) as f:
        f.write(patch.encode("utf-8", "surrogateescape"))
        path = f.name
    try:
        proc = git(tree, "apply", "--verbose", "--whitespace=nowarn", path, check=False)
        log = proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace")
        if proc.returncode == 0:
            return ApplyMethod.git_apply, log
        fuzz = subprocess.run(
            ["patch", "--batch", "--fuzz=5", "-p1", "--no-backup-if-mismatch", "-r", "-", "-i", path],
            cwd=tree,
            capture_output=True,
        )
        log += fuzz.stdout.decode(errors="replace") + fuzz.stderr.decode(errors="replace")
        if fuzz.returncode == 0:
            return ApplyMethod.patch_fuzz, log
        return ApplyMethod.none, log
    finally:
        os.unlink(path)
