"""Snapshot a host-side task tree and diff it later, without touching the tree's own git state.

The snapshot lives in a private git dir outside the tree (the agent cannot see or rewrite it),
captures untracked files too, and the diff is ``git diff --binary`` so binary edits survive. git
runs as `polar_env.sandbox.safe_git` does: nothing the tree holds (its ``.git``, ``.gitattributes``)
configures it, so no hook, fsmonitor or filter of the agent's runs on the host. git records links
as links and never follows them.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from polar_env.sandbox import safe_git
from polar_env.sandbox.base import BUILD_EXCLUDES, exclude_pathspecs

_IDENT = {
    "GIT_AUTHOR_NAME": "polar",
    "GIT_AUTHOR_EMAIL": "polar@localhost",
    "GIT_COMMITTER_NAME": "polar",
    "GIT_COMMITTER_EMAIL": "polar@localhost",
    "GIT_AUTHOR_DATE": "1970-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "1970-01-01T00:00:00Z",
}


def _git(git_dir: Path, tree: Path, *args: str, index: Path) -> bytes:
    return safe_git.run_git(
        git_dir.resolve(), tree.resolve(), *args, index=index.resolve(), extra_env=_IDENT
    ).stdout


def _tree_id(git_dir: Path, tree: Path, index: Path) -> str:
    _git(git_dir, tree, "add", "-A", "--", ".", index=index)
    return _git(git_dir, tree, "write-tree", index=index).decode().strip()


def snapshot(tree: Path, git_dir: Path) -> str:
    """Record the tree as it is now; returns the base tree id (also stored in ``git_dir/POLAR_BASE``)."""
    subprocess.run(
        ["git", f"--git-dir={git_dir}", "init", "-q"],
        check=True,
        capture_output=True,
        env=safe_git.git_env(git_dir, tree),
    )
    safe_git.neutralise(git_dir)
    base = _tree_id(git_dir, tree, git_dir / "polar-base.index")
    (git_dir / "POLAR_BASE").write_text(base)
    return base


def borrow_snapshot(base_git: Path, git_dir: Path) -> str:
    """A private git dir for a copy of the tree ``base_git`` snapshotted: the same base id, with the
    base's objects read through ``objects/info/alternates`` (git never writes there). The copy's
    diff stores only its own new objects, and the base is never snapshotted again."""
    (git_dir / "objects" / "info").mkdir(parents=True)
    (git_dir / "refs").mkdir()
    for name in ("HEAD", "config", "POLAR_BASE"):
        shutil.copyfile(base_git / name, git_dir / name)
    (git_dir / "objects" / "info" / "alternates").write_text(f"{(base_git / 'objects').resolve()}\n")
    safe_git.neutralise(git_dir)
    return (git_dir / "POLAR_BASE").read_text().strip()


def base_of(git_dir: Path) -> str:
    """The snapshot's base tree id."""
    return (git_dir / "POLAR_BASE").read_text().strip()


def alternates_of(git_dir: Path) -> list[Path]:
    """The object directories a borrowed snapshot reads through (``borrow_snapshot``)."""
    listed = git_dir / "objects" / "info" / "alternates"
    return [Path(line) for line in listed.read_text().splitlines() if line] if listed.is_file() else []


def diff_script(base: str, exclude: Sequence[str] = BUILD_EXCLUDES) -> str:
    """:func:`diff` as a shell script for a sandbox that sees the tree at ``$GIT_WORK_TREE``, the
    snapshot read-only at ``$GIT_DIR`` (with its objects as ``$GIT_ALTERNATE_OBJECT_DIRECTORIES``),
    and writes only under ``$GIT_OBJECT_DIRECTORY`` and the index (a scratch tmpfs): the patch on stdout."""
    git = shlex.join(safe_git.git_argv())
    specs = shlex.join(exclude_pathspecs(exclude))
    return (
        f'set -e; mkdir -p "$GIT_OBJECT_DIRECTORY"; {git} add -A -- .; now=$({git} write-tree); '
        f'exec {git} diff --binary --no-color --no-ext-diff --no-textconv {shlex.quote(base)} "$now" -- '
        f"{specs}"
    )


def sandboxed_diff_env(tree: str, git_dir: str, scratch: str) -> dict[str, str]:
    """`diff_script`'s environment in a sandbox that sees the tree at ``tree`` and the snapshot at
    ``git_dir`` (both read-only) and may write only ``scratch``: the index and new objects go there."""
    return safe_git.git_env(
        Path(git_dir),
        Path(tree),
        index=Path(f"{scratch}/now.index"),
        extra={
            "HOME": scratch,
            "GIT_OBJECT_DIRECTORY": f"{scratch}/objects",
            "GIT_ALTERNATE_OBJECT_DIRECTORIES": f"{git_dir}/objects",
        },
    )


def diff(tree: Path, git_dir: Path, exclude: Sequence[str] = BUILD_EXCLUDES) -> bytes:
    """Binary-safe patch from the snapshot to the tree's current state, noise excluded."""
    base = base_of(git_dir)
    index = git_dir / "polar-now.index"
    index.unlink(missing_ok=True)
    now = _tree_id(git_dir, tree, index)
    return _git(
        git_dir,
        tree,
        "diff",
        "--binary",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        base,
        now,
        "--",
        *exclude_pathspecs(exclude),
        index=index,
    )
