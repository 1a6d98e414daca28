"""Agent patches: extract them from a sandbox tree, apply them to a fresh one (`git apply` only).

Extraction diffs the working tree (untracked files included) against the tree's root commit,
the only commit a task tree starts with, so commits the agent made are still counted. A
throwaway repository and index keep the agent's own untouched and its settings unused. Harness state and build
noise are excluded; `--binary` keeps binary edits applicable.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from polar_env.grades import ApplyMethod
from polar_env.harness_adapters.registry import NOISE_EXCLUDES
from polar_env.sandbox import safe_git
from polar_env.sandbox.base import exclude_pathspecs
from polar_env.tasks.tree import git


def base_commit(tree: Path) -> str:
    """The tree's root commit (the task base), whatever the agent committed on top."""
    roots = git(tree, "rev-list", "--max-parents=0", "HEAD").stdout.decode().split()
    if len(roots) != 1:
        raise RuntimeError(f"{tree}: expected exactly one root commit, found {len(roots)}")
    return roots[0]


def tree_patch(tree: Path) -> str:
    """`git diff --binary` of the tree against its base, noise excluded ("" if unchanged).

    git runs on a throwaway repository whose objects borrow the tree's (``alternates``), as
    `polar_env.sandbox.safe_git` runs it: the tree's own config, hooks, index and attributes play no part.
    """
    base = base_commit(tree)
    with tempfile.TemporaryDirectory() as tmp:
        git_dir = Path(tmp) / "git"
        safe_git.run_git(git_dir, tree, "init", "-q")
        (git_dir / "objects" / "info" / "alternates").write_text(f"{(tree / '.git' / 'objects').resolve()}\n")
        safe_git.neutralise(git_dir)
        index = Path(tmp) / "index"
        safe_git.run_git(git_dir, tree, "read-tree", base, index=index)
        safe_git.run_git(git_dir, tree, "add", "-A", "--", *exclude_pathspecs(NOISE_EXCLUDES), index=index)
        out = safe_git.run_git(
            git_dir,
            tree,
            "diff",
            "--cached",
            "--binary",
            "--no-color",
            "--no-ext-diff",
            "--no-textconv",
            base,
            index=index,
        ).stdout
    return out.decode("utf-8", "surrogateescape")


def apply_patch(tree: Path, patch: str) -> tuple[ApplyMethod, str]:
    """`git apply` to a tree with its own repository; returns (method, git's output)."""
    proc = git(
        tree,
        "apply",
        "--verbose",
        "--whitespace=nowarn",
        "-",
        check=False,
        input=patch.encode("utf-8", "surrogateescape"),
    )
    log = proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace")
    return (ApplyMethod.git_apply if proc.returncode == 0 else ApplyMethod.none), log
