"""Catches a test that reads files lying beside the repository (a ``../shared`` the clone does not ship).

A fresh clone must pass on its own, so any read of a path that sits next to the repository and
existed before the session began is an error. Reads of the interpreter, its packages, temporary
directories and caches elsewhere are fine: only the clone's neighbours are watched. Python's audit
hooks (PEP 578) see every ``open``, ``os.listdir`` and ``os.scandir`` made in the test process, so
the check is precise rather than a grep of the test sources; subprocesses are not watched.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

WATCHED_EVENTS = frozenset({"open", "os.listdir", "os.scandir"})
OWN_TEMP_PREFIX = "polar-"


class OutsideReadGuard:
    """Records reads of entries beside ``repo`` that existed when the guard was made."""

    def __init__(self, repo: Path, allowed: tuple[Path, ...] = ()) -> None:
        self.repo = repo.resolve()
        self.parent = self.repo.parent
        roots = {Path(p).resolve() for p in (*allowed, *_interpreter_roots())}
        # a root holding the repository itself would excuse all its neighbours
        self.allowed = tuple(root for root in roots if not _within(self.repo, root))
        # the neighbours at start: anything made later (a tmp dir of the tests) is the tests' own; so
        # are Polar's own temp artefacts (polar-ledgers, polar-seed-*...) when the clone sits in /tmp
        self.neighbours = frozenset(
            name
            for name in os.listdir(self.parent)
            if name != self.repo.name and not name.startswith(OWN_TEMP_PREFIX)
        )
        self.reads: list[str] = []

    def offending(self, path: str | bytes | os.PathLike | int) -> Path | None:
        """``path`` resolved when it lies in an entry beside the repository, else None."""
        if isinstance(path, int):  # a file descriptor: its path was checked when it was opened
            return None
        target = Path(os.fsdecode(path))
        try:
            target = target.resolve()
        except (OSError, RuntimeError):
            return None
        if not _within(target, self.parent) or _within(target, self.repo):
            return None
        if target == self.parent or any(_within(target, root) for root in self.allowed):
            return None
        first = target.relative_to(self.parent).parts[0]
        return target if first in self.neighbours else None

    def audit(self, event: str, args: tuple) -> None:
        if event not in WATCHED_EVENTS or not args or args[0] is None:
            return
        if event == "open" and not _is_read(args):
            return
        bad = self.offending(args[0])
        if bad is not None:
            self.reads.append(str(bad))

    def take(self) -> list[str]:
        """The reads recorded since the last call, and forget them."""
        reads, self.reads = self.reads, []
        return reads


_guards: list[OutsideReadGuard] = []


def _dispatch(event: str, args: tuple) -> None:
    for guard in _guards:
        guard.audit(event, args)


def install(guard: OutsideReadGuard) -> OutsideReadGuard:
    """Start watching with ``guard`` (audit hooks cannot be removed: one hook dispatches to all)."""
    if not _guards and not getattr(sys, "_polar_outside_reads_hook", False):
        sys.addaudithook(_dispatch)
        sys._polar_outside_reads_hook = True  # type: ignore[attr-defined]
    _guards.append(guard)
    return guard


def uninstall(guard: OutsideReadGuard) -> None:
    _guards.remove(guard)


def _is_read(args: tuple) -> bool:
    """True for an ``open`` that reads (a write-only open creates or truncates, it learns nothing)."""
    mode, flags = (args + (None, None))[1:3]
    if isinstance(mode, str):
        return "r" in mode or "+" in mode
    if isinstance(flags, int):
        return flags & os.O_ACCMODE != os.O_WRONLY
    return True


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _interpreter_roots() -> list[Path]:
    """The running interpreter and its packages: a venv may well sit beside the clone."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    roots.update(p for p in sysconfig.get_paths().values() if p)
    return [Path(p) for p in roots]
