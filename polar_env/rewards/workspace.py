"""The tree a grading runs on: a copy of the task base whose git state the patch cannot reach.

The base is materialised once per task and process (`base_tree`) and copied per grading. The copy
has no ``.git``: its repository lives beside it in a private directory (``git --git-dir``), so no
path a patch writes can become git configuration, hooks or objects. Every git command the grader
runs here has hooks, fsmonitor, external diff and filters off and no user/system configuration:
nothing from the tree is ever executed on the host.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from polar_env.rewards import path_policy
from polar_env.tasks.models import Task
from polar_env.tasks.tree import GIT_IDENTITY, materialize

SAFE_GIT_CONFIG = (
    "core.hooksPath=/dev/null", "core.fsmonitor=false", "core.autocrlf=false", "core.symlinks=true",
    "core.quotepath=false", "diff.external=", "safe.directory=*", "protocol.allow=never",
)
SYMLINK_MODE = "120000"
GITLINK_MODE = "160000"

_BASES: dict[str, Path] = {}
_BASES_LOCK = threading.Lock()


class PatchRefused(Exception):
    """The patch asks for something no grading allows (the agent's failure, reward 0)."""


def base_tree(task: Task) -> Path:
    """The task's materialised base tree, built once per process (copies are graded, never this)."""
    with _BASES_LOCK:
        path = _BASES.get(task.instance_id)
        if path is None or not path.exists():
            root = Path(tempfile.mkdtemp(prefix=f"polar-base-{task.instance_id}-"))
            atexit.register(shutil.rmtree, root, True)
            tree = materialize(task, root / "tree")
            shutil.move(tree / ".git", root / "git")
            _BASES[task.instance_id] = path = root
        return path


@dataclass
class GradingTree:
    """A fresh copy of the base at ``tree`` with its private repository at ``git_dir``."""

    tree: Path
    git_dir: Path
    base: str

    @classmethod
    def fresh(cls, task: Task, dest: Path) -> GradingTree:
        src = base_tree(task)
        shutil.copytree(src / "tree", dest / "tree", symlinks=True)
        shutil.copytree(src / "git", dest / "git", symlinks=True)
        return cls(dest / "tree", dest / "git", task.base_commit or "HEAD")

    def git(self, *args: str, input: bytes | None = None, check: bool = True,
            index: Path | None = None) -> subprocess.CompletedProcess:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.git_dir), "GIT_CONFIG_NOSYSTEM": "1",
               "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0", **GIT_IDENTITY,
               "GIT_DIR": str(self.git_dir), "GIT_WORK_TREE": str(self.tree)}
        if index is not None:
            env["GIT_INDEX_FILE"] = str(index)
        argv = ["git"]
        for kv in SAFE_GIT_CONFIG:
            argv += ["-c", kv]
        proc = subprocess.run([*argv, *args], cwd=self.tree, env=env, input=input, capture_output=True)
        if check and proc.returncode != 0:
            raise RuntimeError(f"git {args[0]} failed: {proc.stderr.decode(errors='replace')[-2000:]}")
        return proc

    def apply(self, patch: str, *, allow_binary: bool) -> str:
        """`git apply` (no fuzz, no fallback); raises PatchRefused with git's words if it will not."""
        data = patch.encode("utf-8", "surrogateescape")
        numstat = self.git("apply", "--numstat", "-z", "-", input=data, check=False)
        if numstat.returncode != 0:
            raise PatchRefused(numstat.stderr.decode(errors="replace").strip() or "git apply rejected the patch")
        for row in numstat.stdout.decode("utf-8", "surrogateescape").split("\0"):
            if row.startswith("-\t-\t") and not allow_binary:
                raise PatchRefused(f"binary hunk for {row[4:]!r}: this task's fix has none")
        proc = self.git("apply", "--verbose", "--whitespace=nowarn", "-", input=data, check=False)
        log = proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace")
        if proc.returncode != 0:
            raise PatchRefused(log.strip())
        return log

    def changes(self) -> dict[str, str]:
        """Every path that differs from base -> its new git mode ("000000" when deleted).

        Read from the tree itself (a throwaway index, ignored files included), so no patch syntax
        and no ``.gitignore`` can hide a change.
        """
        with tempfile.TemporaryDirectory() as tmp:
            index = Path(tmp) / "index"
            self.git("read-tree", self.base, index=index)
            self.git("add", "-A", "-f", "--", ".", index=index)
            raw = self.git("diff", "--cached", "--raw", "-z", "--no-renames", "--no-ext-diff", self.base,
                           index=index).stdout.decode("utf-8", "surrogateescape")
        fields = raw.split("\0")
        out: dict[str, str] = {}
        for meta, path in zip(fields[0::2], fields[1::2], strict=False):
            if meta.startswith(":"):
                out[path] = meta.split()[1]
        return out

    def check_links(self, changes: dict[str, str]) -> None:
        """Refuse symlinks that leave the tree and nested repositories."""
        root = self.tree.resolve()
        for path, mode in changes.items():
            if mode == GITLINK_MODE:
                raise PatchRefused(f"{path}: a nested repository (gitlink) is not a source change")
            if mode == SYMLINK_MODE:
                target = (self.tree / path).parent / os.readlink(self.tree / path)
                if not os.path.abspath(target).startswith(str(root) + os.sep):
                    raise PatchRefused(f"{path}: symlink leaves the tree ({os.readlink(self.tree / path)})")

    def base_files(self) -> list[str]:
        return self.git("ls-tree", "-r", "--name-only", "-z", self.base).stdout.decode(
            "utf-8", "surrogateescape").split("\0")

    def restore(self, paths: list[str]) -> None:
        """Put ``paths`` back to base (or remove them where base lacks them), parents first."""
        tracked = set(self.base_files())
        for rel in sorted(paths, key=lambda p: (p.count("/"), p)):
            target = self.tree / rel
            if target.is_symlink() or target.is_file():
                target.unlink()
            elif target.is_dir():
                shutil.rmtree(target)
            if rel in tracked:
                self.git("checkout", self.base, "--", rel)

    def import_roots(self, task: Task) -> dict[str, set[str]]:
        return import_roots(task, self.base_files())


def import_roots(task: Task, files: list[str]) -> dict[str, set[str]]:
    """The tree root plus in-tree PYTHONPATH entries -> their top-level module names among ``files`` (base)."""
    roots = {""}
    for entry in task.environment.env.get("PYTHONPATH", "").split(":"):
        if entry.startswith("{testbed}"):
            roots.add(entry.removeprefix("{testbed}").strip("/"))
    return {root: path_policy.top_level_modules(files, root) for root in roots}
