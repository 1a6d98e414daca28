"""Agent patches: extract them from a sandbox tree, apply them to a fresh one (`git apply` only).

Extraction diffs the working tree (untracked files included) against the tree's root commit,
the only commit a task tree starts with, so commits the agent made are still counted. A
throwaway index keeps the agent's own index untouched. Harness state and build noise are
excluded; `--binary` keeps binary edits applicable.
"""

from __future__ import annotations

import subprocess
import tempfile
from enum import StrEnum
from pathlib import Path

from polar_env.harness_adapters.registry import NOISE_EXCLUDES
from polar_env.sandbox.base import exclude_pathspecs
from polar_env.tasks.tree import git


class ApplyMethod(StrEnum):
    # No `patch --fuzz` fallback: it writes paths `git apply` refuses (inside .git/, through symlinks).
    git_apply = "git_apply"
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
        _git_with_index(tree, index, "add", "-A", "--", *exclude_pathspecs(NOISE_EXCLUDES))
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
    """`git apply` to a tree with its own repository; returns (method, git's output)."""
    proc = git(tree, "apply", "--verbose", "--whitespace=nowarn", "-", check=False,
               input=patch.encode("utf-8", "surrogateescape"))
    log = proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace")
    return (ApplyMethod.git_apply if proc.returncode == 0 else ApplyMethod.none), log
