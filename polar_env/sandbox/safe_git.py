"""git on a tree the agent controls: every setting git would take from that tree is ours.

git reads behaviour from three places a tree can reach: configuration (``.git/config``, user and
system files: hooks, ``core.fsmonitor``, ``filter.*.clean``, ``diff.external``, textconv), and
attributes (``.gitattributes`` anywhere in the tree: filters, ``working-tree-encoding``, eol
conversion). So the repository is always a grader-owned ``GIT_DIR`` outside the tree (its config
is ours), user and system configuration are off, the dangerous keys are pinned on the command line
as well, and ``info/attributes`` (which outranks every ``.gitattributes``) puts every attribute
that could run a program or fail back to its default. A one-line ``.gitattributes`` can then
neither run a program nor make ``git add`` fail.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping
from pathlib import Path

SAFE_GIT_CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "core.autocrlf=false",
    "core.safecrlf=false",
    "core.symlinks=true",
    "core.quotepath=false",
    "core.attributesFile=/dev/null",
    "core.excludesFile=/dev/null",
    "diff.external=",
    "safe.directory=*",
    "protocol.allow=never",
    "submodule.recurse=false",
    "init.defaultBranch=main",
    "core.fileMode=true",
)
# Highest-precedence attributes: no filter, no encoding conversion (it can fail), no diff/merge driver.
# text/eol stay the tree's (they run nothing and cannot fail with core.safecrlf off), as when the base was
# committed.
NEUTRAL_ATTRIBUTES = "* -filter !diff !merge !working-tree-encoding\n"


def git_env(
    git_dir: Path, tree: Path, *, index: Path | None = None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A fresh environment (nothing inherited: no GIT_* of ours leaks in) for git on ``tree``."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(git_dir),
        "LANG": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_DIR": str(git_dir),
        "GIT_WORK_TREE": str(tree),
        "GIT_ATTR_NOSYSTEM": "1",
        **(extra or {}),
    }
    if index is not None:
        env["GIT_INDEX_FILE"] = str(index)
    return env


def git_argv(*args: str) -> list[str]:
    argv = ["git"]
    for kv in SAFE_GIT_CONFIG:
        argv += ["-c", kv]
    return [*argv, *args]


def neutralise(git_dir: Path) -> None:
    """Give a grader-owned repository the attributes that outrank the tree's (idempotent)."""
    info = git_dir / "info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "attributes").write_text(NEUTRAL_ATTRIBUTES)


def run_git(
    git_dir: Path,
    tree: Path,
    *args: str,
    index: Path | None = None,
    input: bytes | None = None,
    check: bool = True,
    extra_env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run git with ``git_dir`` as the repository of ``tree``; raises RuntimeError on failure if ``check``."""
    proc = subprocess.run(
        git_argv(*args),
        cwd=tree,
        env=git_env(git_dir, tree, index=index, extra=extra_env),
        input=input,
        capture_output=True,
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"git {args[0]} failed: {proc.stderr.decode(errors='replace')[-2000:]}")
    return proc


def shell_function(git_dir: str, tree: str, index: str) -> str:
    """The same git as a shell function ``g`` (``g add -A .``), for scripts run inside a container."""
    env = git_env(Path(git_dir), Path(tree), index=Path(index))
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return f'g() {{ env -i {assigns} {shlex.join(git_argv())} "$@"; }}'


def shell_neutralise(git_dir: str) -> str:
    """Shell that writes ``neutralise``'s attributes into ``git_dir`` inside a container."""
    info = shlex.quote(f"{git_dir}/info")
    return f"mkdir -p {info} && printf %s {shlex.quote(NEUTRAL_ATTRIBUTES)} > {info}/attributes"
