"""What the sandboxes whose task tree lives on the host (bubblewrap, apptainer) share.

The tree is ``root/testbed`` (bound at the workdir inside), HOME is ``root/home``, and the git
snapshot taken at creation is ``root/git``, outside the tree where the agent cannot reach it. So
mapping paths, copying out, diffing and removing are host-side file operations, the same for both.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import shutil
import stat
from pathlib import Path

from polar_env.sandbox.base import Sandbox, copy_path

TREE_MTIME = 946684800  # 2000-01-01T00:00:00Z, the date of a task's one base commit (tasks/tree.py)
FICLONE = 0x40049409  # linux/fs.h: share the source's extents, copy-on-write (btrfs, XFS, bcachefs)
_NO_REFLINK = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EPERM}


class _TreeCopy:
    """One copy of a tree: every file cloned (reflink) where the filesystems allow, else copied.

    Whether reflink works is found on the first file (one ioctl) and kept for the rest. Neither
    way shares an inode with the source: what the copy's owner writes never reaches the source."""

    def __init__(self, mtime: int, owner: tuple[int, int] | None):
        self.mtime, self.owner = mtime, owner
        self.reflink: bool | None = None  # not tried yet

    @property
    def method(self) -> str:
        return "reflink" if self.reflink else "copy"

    def file(self, src: str, dst: Path, mode: int) -> None:
        fd_in = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fd_out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                if not self._clone(fd_in, fd_out):
                    while os.sendfile(fd_out, fd_in, None, 1 << 30):
                        pass
                if self.owner is not None:
                    os.fchown(fd_out, *self.owner)  # before the mode: a chown clears set-id bits
                os.fchmod(fd_out, stat.S_IMODE(mode))
            finally:
                os.close(fd_out)
        finally:
            os.close(fd_in)

    def _clone(self, fd_in: int, fd_out: int) -> bool:
        if self.reflink is False:
            return False
        try:
            fcntl.ioctl(fd_out, FICLONE, fd_in)
        except OSError as exc:
            if exc.errno not in _NO_REFLINK:
                raise
            if self.reflink is None:  # the filesystems cannot: copy every file from here on
                self.reflink = False
            return False
        self.reflink = True
        return True

    def tree(self, src: Path, dst: Path) -> None:
        dst.mkdir()
        for entry in sorted(os.scandir(src), key=lambda e: e.name):
            target = dst / entry.name
            if entry.is_symlink():
                os.symlink(os.readlink(entry.path), target)
            elif entry.is_dir(follow_symlinks=False):
                self.tree(Path(entry.path), target)
                continue
            else:
                self.file(entry.path, target, entry.stat(follow_symlinks=False).st_mode)
            self._finish(target)
        shutil.copymode(src, dst)
        self._finish(dst)

    def _finish(self, path: Path) -> None:
        if self.owner is not None:
            os.lchown(path, *self.owner)
        os.utime(path, (self.mtime, self.mtime), follow_symlinks=False)


def copy_tree(src: Path, dst: Path, *, mtime: int = TREE_MTIME, owner: tuple[int, int] | None = None) -> str:
    """Copy a task tree to ``dst`` (must not exist) as every rollout of the task should see it: entries
    made in sorted name order (a filesystem that lists in creation order then lists them sorted), every
    mtime ``mtime``, every entry owned by ``owner`` (uid, gid) if given. A plain copy carries the time
    it was made and the source's listing order, and a harness that lists or ranks files by either (a
    repo map, a directory tree in its prompt) puts them into its first prompt, splitting the task's
    GRPO group. File data is cloned (reflink) where the filesystems allow; returns the way used
    ("reflink" or "copy")."""
    copy = _TreeCopy(mtime, owner)
    copy.tree(src, dst)
    return copy.method


def chown_tree(path: Path, uid: int, gid: int) -> None:
    """``path`` and everything under it owned by ``uid``:``gid`` (links themselves, never followed)."""
    os.lchown(path, uid, gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, gid)


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

    def release(self) -> None:
        """Stop whatever still runs before the tree is removed (nothing to stop by default)."""

    async def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        self.release()
        await asyncio.to_thread(shutil.rmtree, self.root, True)
