"""The tree a grading runs on: a copy of the task base whose git state the patch cannot reach.

The base is copied once per task and process from the node's warm base (`base_tree`) and copied per grading.
The copy has no ``.git``: its repository lives beside it in a private directory (``git --git-dir``), so no
path a patch writes can become git configuration, hooks or objects, and every git command runs
with the tree's attributes outranked and no user/system configuration (`polar_env.sandbox.safe_git`):
nothing from the tree is ever executed on the host. The host never acts on the tree through a
link: resets walk it with `polar_env.sandbox.beneath` (a symlink in a reset path is replaced,
never followed) and a symlink is judged by where the whole chain of in-tree links resolves.
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
from polar_env.sandbox import beneath, safe_git
from polar_env.tasks.base_trees import base_cache_dir, warm_base
from polar_env.tasks.models import Task
from polar_env.tasks.tree import GIT_IDENTITY

# A patch may change at most this many paths, of at most this many bytes of names in all: the grader
# passes changed paths to git and to container execs as arguments, and past the kernel's argument
# limit (E2BIG) the grade would fail as infrastructure (masked). No fix needs more; refusing is the 0.
MAX_CHANGED_PATHS = 10_000
MAX_PATH_BYTES = 256 << 10
SYMLINK_MODE = "120000"
GITLINK_MODE = "160000"

_BASES: dict[str, Path] = {}
_BASES_LOCK = threading.Lock()


class PatchRefused(Exception):
    """The patch asks for something no grading allows (the agent's failure, reward 0)."""


def path_budget_refusal(paths: list[str] | dict[str, str]) -> str:
    """Why a patch changing ``paths`` is refused (too many paths, or too many bytes of names), or ""."""
    size = sum(len(p.encode("utf-8", "surrogateescape")) + 1 for p in paths)
    if len(paths) > MAX_CHANGED_PATHS or size > MAX_PATH_BYTES:
        return (
            f"the patch changes {len(paths)} paths ({size} bytes of names): more than the grader takes "
            f"({MAX_CHANGED_PATHS} paths, {MAX_PATH_BYTES} bytes)"
        )
    return ""


def base_tree(task: Task) -> Path:
    """The task's base tree with its repository beside it, once per process (copies are graded, never
    this): copied from the node's warm base (`polar_env.tasks.base_trees`), which was unpacked and
    committed once for the node's episodes and gradings alike."""
    with _BASES_LOCK:
        path = _BASES.get(task.instance_id)
        if path is None or not path.exists():
            root = Path(tempfile.mkdtemp(prefix=f"polar-base-{task.instance_id}-"))
            atexit.register(shutil.rmtree, root, True)
            warm = warm_base(task, base_cache_dir())
            shutil.copytree(
                warm.tree,
                root / "tree",
                symlinks=True,
                ignore=lambda d, names: [".git"] if d == str(warm.tree) else [],
            )
            shutil.copytree(warm.tree / ".git", root / "git", symlinks=True)
            safe_git.neutralise(root / "git")
            _BASES[task.instance_id] = path = root
        return path


@dataclass
class GradingTree:
    """A fresh copy of the base at ``tree`` with its private repository at ``git_dir``."""

    tree: Path
    git_dir: Path
    base: str
    origin: Path | None = None  # the untouched base tree it was copied from

    @classmethod
    def fresh(cls, task: Task, dest: Path) -> GradingTree:
        src = base_tree(task)
        shutil.copytree(src / "tree", dest / "tree", symlinks=True)
        shutil.copytree(src / "git", dest / "git", symlinks=True)
        return cls(dest / "tree", dest / "git", task.base_commit or "HEAD", src / "tree")

    def git(
        self, *args: str, input: bytes | None = None, check: bool = True, index: Path | None = None
    ) -> subprocess.CompletedProcess:
        return safe_git.run_git(
            self.git_dir, self.tree, *args, index=index, input=input, check=check, extra_env=GIT_IDENTITY
        )

    def apply(self, patch: str, *, allow_binary: bool) -> str:
        """`git apply` (no fuzz, no fallback); raises PatchRefused with git's words if it will not."""
        data = patch.encode("utf-8", "surrogateescape")
        numstat = self.git("apply", "--numstat", "-z", "-", input=data, check=False)
        if numstat.returncode != 0:
            raise PatchRefused(
                numstat.stderr.decode(errors="replace").strip() or "git apply rejected the patch"
            )
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
            raw = self.git(
                "diff",
                "--cached",
                "--raw",
                "-z",
                "--no-renames",
                "--no-ext-diff",
                "--no-textconv",
                self.base,
                index=index,
            ).stdout.decode("utf-8", "surrogateescape")
        fields = raw.split("\0")
        out: dict[str, str] = {}
        for meta, path in zip(fields[0::2], fields[1::2], strict=False):
            if meta.startswith(":"):
                out[path] = meta.split()[1]
        return out

    def check_links(self, changes: dict[str, str]) -> None:
        """Refuse nested repositories, and symlinks whose chain of in-tree links resolves outside the tree."""
        for path, mode in changes.items():
            if mode == GITLINK_MODE:
                raise PatchRefused(f"{path}: a nested repository (gitlink) is not a source change")
            if mode == SYMLINK_MODE and not beneath.resolves_inside(self.tree, path):
                raise PatchRefused(f"{path}: symlink leaves the tree (through its chain of links)")

    def check_links_after_reset(self) -> None:
        """The reset and the test patch change the tree the first check saw (a link replaced by a real
        directory moves every ``..`` through it): every link of the final tree must resolve inside it,
        before any test runs. Only a link of the base, unchanged and leaving the untouched base too, is
        spared."""
        base_links = {rel: sha for rel, (mode, sha) in self._blobs().items() if mode == SYMLINK_MODE}
        for rel in beneath.links(self.tree):
            if beneath.resolves_inside(self.tree, rel):
                continue
            if (
                self.origin is not None
                and rel in base_links
                and not beneath.resolves_inside(self.origin, rel)
                and os.fsencode(os.readlink(self.tree / rel))
                == self.git("cat-file", "blob", base_links[rel]).stdout
            ):
                continue  # the task's own link, already outside in the untouched base: not the patch's doing
            raise PatchRefused(
                f"{rel}: symlink leaves the tree once the grader's reset is done (through its chain of links)"
            )

    def _blobs(self) -> dict[str, tuple[str, str]]:
        """Base path -> (git mode, blob id) of every file and link of the base."""
        listing = self.git("ls-tree", "-r", "-z", self.base).stdout.decode("utf-8", "surrogateescape")
        blobs = {}
        for row in filter(None, listing.split("\0")):
            meta, rel = row.split("\t", 1)
            mode, kind, sha = meta.split()
            if kind == "blob":
                blobs[rel] = (mode, sha)
        return blobs

    def base_files(self) -> list[str]:
        return (
            self.git("ls-tree", "-r", "--name-only", "-z", self.base)
            .stdout.decode("utf-8", "surrogateescape")
            .split("\0")
        )

    def restore(self, paths: list[str]) -> None:
        """Put ``paths`` back to base (or remove them where base lacks them), parents first.

        Written from the base's blobs through `beneath`: nothing on the way is followed, and a link
        or file where base has a directory is replaced. A path base lacks gets real parent
        directories too (a link or file the agent put there is replaced): the test patch's new files
        must be creatable whatever the agent made of their parents.
        """
        blobs = self._blobs()
        for rel in sorted(paths, key=lambda p: (p.count("/"), p)):
            beneath.remove(self.tree, rel)
            if rel in blobs:
                mode, sha = blobs[rel]
                beneath.write(self.tree, rel, self.git("cat-file", "blob", sha).stdout, mode=mode)
            else:
                with beneath.parent_dir(self.tree, rel, create=True):
                    pass

    def import_roots(self, task: Task) -> dict[str, set[str]]:
        return import_roots(task, self.base_files())


def import_roots(task: Task, files: list[str]) -> dict[str, set[str]]:
    """The tree root plus in-tree PYTHONPATH entries -> their top-level module names among ``files``
    (base)."""
    roots = {""}
    for entry in task.environment.env.get("PYTHONPATH", "").split(":"):
        if entry.startswith("{testbed}"):
            roots.add(entry.removeprefix("{testbed}").strip("/"))
    return {root: path_policy.top_level_modules(files, root) for root in roots}
