"""Warm base trees: a task's tree unpacked, committed and snapshotted once per node, cloned per episode.

An episode's workspace used to unpack the task's archive, commit it (``tasks/tree.py``), copy it
and snapshot the copy with git (``gitdiff``): several git processes per episode for the same
bytes. Now the first open of a task on a node builds ``<cache>/<task>-<key>/{tree,git}`` (the
committed tree and its snapshot) and every workspace of that task is a copy of ``tree``
(a reflink clone where the filesystems allow) whose diff borrows ``git`` read-only.

The build is made in a temporary dir and renamed into place under a per-task lock file, so
concurrent opens of a task (threads or processes) build it once and nobody sees half of it. The
cache dir is the host user's, mode 0700, and the tree in it is owned by that user: on a root host
the sandbox uid can neither reach nor write it; unprivileged, the sandbox has no mount of it. A
clone shares no inode with it (a copy or a reflink, never a hard link), so nothing an agent writes
reaches the base.
The key covers the archive's path, size and mtime and the expected commit, so a rebuilt archive
gets a fresh base. An apptainer task's base is its image's tree (``warm_image_base``), copied out of
the image once per node instead of per episode, its git history reduced to the task's base inside
the image (sandbox/history.py).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from polar_env.cache import cache_root
from polar_env.environment import EnvSettings
from polar_env.sandbox import gitdiff
from polar_env.sandbox.apptainer import extract_image_tree, reduce_image_tree
from polar_env.sandbox.base import SandboxSpec
from polar_env.sandbox.history import TO_HEAD, HistoryTarget
from polar_env.sandbox.host_tree import chown_tree
from polar_env.tasks.models import Task
from polar_env.tasks.tree import materialize

LAYOUT = "2"  # bump when what a base dir holds changes


@dataclass(frozen=True)
class BaseTree:
    """A built base: ``tree`` (what every workspace of the task starts from) and its snapshot ``git``."""

    root: Path

    @property
    def tree(self) -> Path:
        return self.root / "tree"

    @property
    def git_dir(self) -> Path:
        return self.root / "git"


def base_cache_dir() -> Path:
    """Where this node's bases live: ``$POLAR_BASE_CACHE``, else ``$POLAR_CACHE/bases``. Put it on
    the workspaces' filesystem (the scratch root's) where that filesystem can reflink (btrfs, XFS)."""
    return EnvSettings.read().base_cache or cache_root() / "bases"


def base_key(task: Task) -> str:
    archive = Path(task.base_archive or "").resolve()
    st = archive.stat()
    digest = hashlib.sha256(
        f"{LAYOUT}\0{archive}\0{st.st_size}\0{st.st_mtime_ns}\0{task.base_commit}".encode()
    )
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', task.instance_id)[:80]}-{digest.hexdigest()[:16]}"


def _private_dir(path: Path) -> None:
    """``path`` exists as a real directory of this user with mode 0700 (refuse anything else: a
    shared temp dir could hold someone else's dir or link there)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise RuntimeError(
            f"{path} is not a directory of uid {os.geteuid()}: refusing it as the base tree cache"
        )
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)


def build_base(task: Task, dest: Path) -> None:
    """Unpack and commit ``task``'s tree at ``dest/tree`` and snapshot it at ``dest/git``."""
    materialize(task, dest / "tree")
    chown_tree(dest / "tree", os.geteuid(), os.getegid())  # root unpacking keeps the archive's owners
    gitdiff.snapshot(dest / "tree", dest / "git")


def warm_base(task: Task, cache: Path) -> BaseTree:
    """``task``'s base in ``cache``, built now if this node has none yet (once, whoever asks at once)."""
    return _warm(cache, base_key(task), partial(build_base, task))


def image_base_key(image: str, workdir: str, target: HistoryTarget = TO_HEAD) -> str:
    """A local .sif by its path, size and mtime; a registry name by the name itself (pin a digest,
    ``name@sha256:...``, for a base that follows a retagged image); and the base its history is reduced to."""
    local = Path(image)
    stamp = f"{local.stat().st_size}\0{local.stat().st_mtime_ns}" if local.is_file() else ""
    digest = hashlib.sha256(f"{LAYOUT}\0{image}\0{workdir}\0{stamp}\0{target.key()}".encode())
    return f"image-{re.sub(r'[^A-Za-z0-9_.-]', '_', image)[-60:]}-{digest.hexdigest()[:16]}"


def warm_image_base(
    image: str,
    workdir: str,
    cache: Path,
    extract: Callable[[Path], None],
    target: HistoryTarget = TO_HEAD,
) -> BaseTree:
    """An image's task tree (its ``workdir``) copied out by ``extract(dest)`` (its git history reduced to
    ``target`` there) and snapshotted once per node: the apptainer workspaces of its tasks clone
    it, as bubblewrap ones clone a task's base."""

    def build(dest: Path) -> None:
        (dest / "tree").mkdir()
        extract(dest / "tree")
        gitdiff.snapshot(dest / "tree", dest / "git")

    return _warm(cache, image_base_key(image, workdir, target), build)


def apptainer_base(image: str, spec: SandboxSpec, target: HistoryTarget = TO_HEAD) -> BaseTree:
    """An apptainer image's own tree (``spec.workdir``), its git history reduced to ``target`` in the
    image (`sandbox/history.py`), warm on this node: its workspaces and its grader's boxes clone it. A
    history that cannot be reduced refuses the task (`HistoryNotReduced`) and leaves no base."""

    def extract(dest: Path) -> None:
        extract_image_tree(image, spec, dest)
        reduce_image_tree(image, spec, dest, target)

    return warm_image_base(image, spec.workdir, base_cache_dir(), extract, target)


def _warm(cache: Path, name: str, build: Callable[[Path], None]) -> BaseTree:
    """The base ``name`` in ``cache``; ``build(dir)`` makes it in a temp dir renamed into place under
    a lock file, so concurrent callers (threads or processes) build it once and none sees half."""
    base = BaseTree(cache / name)
    if base.root.is_dir():
        return base
    _private_dir(cache)
    with open(cache / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if base.root.is_dir():  # built while we waited
            return base
        for stale in cache.glob(f".build-{name}-*"):  # a build whose process died
            shutil.rmtree(stale, ignore_errors=True)
        building = Path(tempfile.mkdtemp(prefix=f".build-{name}-", dir=cache))
        try:
            build(building)
            building.rename(base.root)
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
    return base
