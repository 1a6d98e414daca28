"""What the sandboxes whose task tree lives on the host (bubblewrap, apptainer) share.

The tree is ``root/testbed`` (bound at the workdir inside), HOME is ``root/home``, and the git
snapshot taken at creation is ``root/git``, outside the tree where the agent cannot reach it. So
mapping paths, copying out, diffing and removing are host-side file operations, the same for both.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from polar_env.sandbox import gitdiff
from polar_env.sandbox.base import BUILD_EXCLUDES, Sandbox, copy_path

TREE_MTIME = 946684800  # 2000-01-01T00:00:00Z, the date of a task's one base commit (tasks/tree.py)


def copy_tree(src: Path, dst: Path, *, mtime: int = TREE_MTIME) -> None:
    """Copy a task tree to ``dst`` (must not exist) as every rollout of the task should see it: entries
    made in sorted name order (a filesystem that lists in creation order then lists them sorted), every
    mtime ``mtime``. A plain copy carries the time it was made and the source's listing order, and a
    harness that lists or ranks files by either (a repo map, a directory tree in its prompt) puts them
    into its first prompt, splitting the task's GRPO group."""
    dst.mkdir()
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        target = dst / entry.name
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
        elif entry.is_dir(follow_symlinks=False):
            copy_tree(Path(entry.path), target, mtime=mtime)
            continue
        else:
            shutil.copy2(entry.path, target)
        os.utime(target, (mtime, mtime), follow_symlinks=False)
    shutil.copymode(src, dst)
    os.utime(dst, (mtime, mtime))


class HostTreeSandbox(Sandbox):
    root: Path  # host dir: testbed/ home/ git/ and what the engine adds
    _destroyed: bool

    @property
    def testbed(self) -> Path:
        return self.root / "testbed"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def git_dir(self) -> Path:
        """The base snapshot (``gitdiff``): never under a path the sandbox can write."""
        return self.root / "git"

    def writable_binds(self) -> list[tuple[Path, Path]]:
        """(path inside, host dir) of each writable bind."""
        return [(Path(self.spec.workdir), self.testbed), (Path(self.spec.home), self.home)]

    def host_path(self, inside: str) -> Path:
        """Map a path inside the sandbox to its host location (only the writable binds; ``..`` resolved
        first, so it cannot climb out of them)."""
        p = Path(os.path.normpath(inside))
        binds = self.writable_binds()
        for mount, host in binds:
            if p == mount or mount in p.parents:
                return host / p.relative_to(mount)
        raise ValueError(f"{inside} is not under {', '.join(str(mount) for mount, _ in binds)}")

    async def copy_out(self, src: str, dst: Path) -> None:
        copy_path(self.host_path(src), dst)

    async def diff(self, exclude: Sequence[str] = BUILD_EXCLUDES) -> bytes:
        return await asyncio.to_thread(gitdiff.diff, self.testbed, self.git_dir, exclude)

    def release(self) -> None:
        """Stop whatever still runs before the tree is removed (nothing to stop by default)."""

    async def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        self.release()
        await asyncio.to_thread(shutil.rmtree, self.root, True)
