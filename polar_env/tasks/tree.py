"""Materialise a task's base tree as a git repository with exactly one commit.

One commit with a fixed author and date: the agent sees no future history (the fix cannot be
read from `git log`), `git diff` against it is the agent's patch, and the commit id is the same
on every machine, so `Task.base_commit` can be checked. A repository the archive carries (a ``.git``
anywhere in it, with whatever history it holds) is removed before that commit, as `polar tasks build`
leaves it out of the archives it writes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from polar_env.tasks.models import Task

GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "polar",
    "GIT_AUTHOR_EMAIL": "polar@localhost",
    "GIT_COMMITTER_NAME": "polar",
    "GIT_COMMITTER_EMAIL": "polar@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}


def git(
    tree: Path, *args: str, check: bool = True, input: bytes | None = None
) -> subprocess.CompletedProcess:
    """Run git in `tree` with a fixed identity and no user/system config (reproducible ids)."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tree),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        **GIT_IDENTITY,
    }
    return subprocess.run(
        [
            "git",
            "-c",
            "safe.directory=*",
            "-c",
            "core.autocrlf=false",
            "-c",
            "init.defaultBranch=main",
            *args,
        ],
        cwd=tree,
        env=env,
        input=input,
        capture_output=True,
        check=check,
    )


def init_single_commit(tree: Path) -> str:
    """`git init` + one commit of everything in `tree`; returns the commit id."""
    git(tree, "init", "-q")
    git(tree, "add", "-A", "-f")
    git(tree, "commit", "-q", "--no-verify", "--no-gpg-sign", "-m", "base")
    return git(tree, "rev-parse", "HEAD").stdout.decode().strip()


def strip_single_top(dest: Path) -> None:
    """An archive whose every file sits under one folder (an sdist's ``pkg-1.2.3/``, a GitHub tarball's
    ``repo-<sha>/``) has that folder as the tree's root: move its contents up."""
    entries = list(dest.iterdir())
    if len(entries) != 1 or not entries[0].is_dir() or entries[0].is_symlink():
        return
    top = entries[0].rename(dest / f".polar-top-{entries[0].name}")
    for child in top.iterdir():
        child.rename(dest / child.name)
    top.rmdir()


def drop_repositories(tree: Path) -> None:
    """Every ``.git`` (a repository, a worktree's or submodule's ``.git`` file, a link) under ``tree``
    removed."""
    for root, dirs, files in os.walk(tree):
        for name in [n for n in (*dirs, *files) if n == ".git"]:
            path = Path(root) / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        dirs[:] = [d for d in dirs if d != ".git"]


def materialize(task: Task, dest: Path) -> Path:
    """Unpack a task's base tree archive into `dest` (must not exist) and commit it once."""
    if not task.base_archive:
        raise ValueError(f"{task.instance_id}: no base tree archive (tasks without one run in their image)")
    dest.mkdir(parents=True)
    with tarfile.open(task.base_archive) as tar:
        tar.extractall(dest, filter="data")
    strip_single_top(dest)
    drop_repositories(dest)
    commit = init_single_commit(dest)
    if task.base_commit and commit != task.base_commit:
        raise RuntimeError(
            f"{task.instance_id}: base_commit {task.base_commit} is not the commit of the base tree "
            f"({commit}): base_commit is Polar's one-commit id of the archive, not the upstream "
            f"commit; leave it empty or let `polar tasks build` write it (docs/tasks.md)"
        )
    return dest
