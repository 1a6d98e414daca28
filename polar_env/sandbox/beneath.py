"""File operations inside a tree the agent controls that never follow a link (openat2 RESOLVE_BENEATH).

A path is walked one component at a time from a directory descriptor of the tree's root, each
component opened with ``O_NOFOLLOW | O_DIRECTORY`` relative to the last, so a symlink anywhere on
the way (``tests -> /``, a ladder of ``u -> ..``) can never take an operation outside the tree.
Where a reset needs a directory and finds a link or a file, the link is replaced, never followed.
Directories are removed with ``shutil.rmtree(dir_fd=...)``, which does not follow links either.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class NotBeneath(ValueError):
    """A path that is not a plain relative path inside the tree (absolute, ``..``, empty)."""


def components(rel: str) -> list[str]:
    parts = rel.split("/")
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise NotBeneath(f"{rel!r} is not a plain path inside the tree")
    return parts


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _remove_entry(dir_fd: int, name: str) -> None:
    """Remove ``name`` in ``dir_fd`` whatever it is, following nothing."""
    st = _lstat(dir_fd, name)
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


@contextmanager
def parent_dir(root: Path, rel: str, *, create: bool) -> Iterator[int | None]:
    """A descriptor of ``rel``'s parent directory, reached without following links.

    ``create``: missing parents are made, and a parent that is a link or a file is replaced by a
    directory. Otherwise a parent that is missing or not a real directory yields None (nothing of
    the tree lies beneath it).
    """
    parts = components(rel)
    fd = os.open(root, DIR_FLAGS)
    try:
        for name in parts[:-1]:
            st = _lstat(fd, name)
            if st is None or not stat.S_ISDIR(st.st_mode):
                if not create:
                    yield None
                    return
                if st is not None:
                    os.unlink(name, dir_fd=fd)  # a link or a file where a directory belongs: replaced
                os.mkdir(name, 0o755, dir_fd=fd)
            nxt = os.open(name, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def remove(root: Path, rel: str) -> None:
    """Remove ``rel`` (file, link or directory tree) if it lies beneath ``root`` through real directories."""
    with parent_dir(root, rel, create=False) as fd:
        if fd is not None:
            _remove_entry(fd, components(rel)[-1])


def read(root: Path, rel: str) -> bytes | None:
    """The bytes of ``rel`` if it is a regular file beneath ``root`` through real directories, else None."""
    with parent_dir(root, rel, create=False) as fd:
        if fd is None:
            return None
        try:
            f = os.open(
                components(rel)[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd
            )
        except OSError:  # missing, or a link (ELOOP)
            return None
        with os.fdopen(f, "rb") as fh:
            return fh.read() if stat.S_ISREG(os.fstat(f).st_mode) else None


def write(root: Path, rel: str, data: bytes, *, mode: str) -> None:
    """Create ``rel`` afresh with git ``mode`` (100644/100755 file, 120000 link to ``data``)."""
    name = components(rel)[-1]
    with parent_dir(root, rel, create=True) as fd:
        assert fd is not None
        _remove_entry(fd, name)
        if mode == "120000":
            os.symlink(os.fsdecode(data), name, dir_fd=fd)
            return
        out = os.open(
            name,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o755 if mode == "100755" else 0o644,
            dir_fd=fd,
        )
        with os.fdopen(out, "wb") as f:
            f.write(data)


def links(root: Path) -> list[str]:
    """Every symlink under ``root`` (relative paths), found without following any (``os.fwalk``)."""
    out: list[str] = []
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(root, follow_symlinks=False):
        rel = os.path.relpath(dirpath, root)
        for name in dirnames + filenames:
            st = _lstat(dir_fd, name)
            if st is not None and stat.S_ISLNK(st.st_mode):
                out.append(name if rel == "." else f"{rel}/{name}")
    return sorted(out)


def resolves_inside(root: Path, rel: str, max_hops: int = 40) -> bool:
    """Whether ``rel`` resolves inside ``root``, following its in-tree links as the kernel would
    (a chain of links that each look harmless can still climb out: ``v -> u/../../..``)."""
    todo = list(reversed(components(rel)))
    stack: list[str] = []
    hops = 0
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if not stack:
                return False
            stack.pop()
            continue
        stack.append(part)
        with parent_dir(root, "/".join(stack), create=False) as fd:
            st = None if fd is None else _lstat(fd, part)
            if st is None or not stat.S_ISLNK(st.st_mode):
                continue
            target = os.readlink(part, dir_fd=fd)
        hops += 1
        if hops > max_hops or target.startswith("/"):
            return False
        stack.pop()
        todo.extend(reversed(target.split("/")))
    return True
