"""Snapshot a host-side task tree and diff it later, without touching the tree's own git state.

The snapshot lives in a private git dir outside the tree (the agent cannot see or rewrite it),
captures untracked files too, and the diff is ``git diff --binary`` so binary edits survive.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from polar_env.sandbox.base import BUILD_EXCLUDES, exclude_pathspecs

_IDENT = {"GIT_AUTHOR_NAME": "polar", "GIT_AUTHOR_EMAIL": "polar@localhost",
          "GIT_COMMITTER_NAME": "polar", "GIT_COMMITTER_EMAIL": "polar@localhost",
          "GIT_AUTHOR_DATE": "1970-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "1970-01-01T00:00:00Z"}


def _git(git_dir: Path, tree: Path, *args: str, index: Path) -> bytes:
    git_dir, tree, index = git_dir.resolve(), tree.resolve(), index.resolve()
    env = {**os.environ, **_IDENT, "GIT_INDEX_FILE": str(index), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": os.devnull}
    proc = subprocess.run(["git", "-c", "safe.directory=*", "-c", "core.autocrlf=false",
                           "-c", "core.fileMode=true", f"--git-dir={git_dir}", f"--work-tree={tree}", *args],
                          env=env, cwd=tree, capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"git {args[0]} failed: {proc.stderr.decode(errors='replace')[-2000:]}")
    return proc.stdout


def _tree_id(git_dir: Path, tree: Path, index: Path) -> str:
    _git(git_dir, tree, "add", "-A", "--", ".", index=index)
    return _git(git_dir, tree, "write-tree", index=index).decode().strip()


def snapshot(tree: Path, git_dir: Path) -> str:
    """Record the tree as it is now; returns the base tree id (also stored in ``git_dir/POLAR_BASE``)."""
    subprocess.run(["git", f"--git-dir={git_dir}", "init", "-q"], check=True, capture_output=True)
    base = _tree_id(git_dir, tree, git_dir / "polar-base.index")
    (git_dir / "POLAR_BASE").write_text(base)
    return base


def diff(tree: Path, git_dir: Path, exclude: Sequence[str] = BUILD_EXCLUDES) -> bytes:
    """Binary-safe patch from the snapshot to the tree's current state, noise excluded."""
    base = (git_dir / "POLAR_BASE").read_text().strip()
    index = git_dir / "polar-now.index"
    index.unlink(missing_ok=True)
    now = _tree_id(git_dir, tree, index)
    return _git(git_dir, tree, "diff", "--binary", "--no-color", "--no-ext-diff", base, now, "--",
                *exclude_pathspecs(exclude), index=index)
