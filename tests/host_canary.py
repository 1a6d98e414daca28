"""A host canary directory and the symlink ladder that climbs to it from an agent's tree.

Shared by the host-integrity tests and the Harbor root-agent test: grading must leave the canary
byte-for-byte, mtime and atime the same.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

RUNGS = 16  # more levels than any temp dir is deep: the chain reaches /


def make_canary(root: Path) -> Path:
    """Files and a directory named as reset paths are; atime < mtime so any read moves the atime."""
    canary = root / "canary"
    (canary / "sub").mkdir(parents=True)
    for rel, text in (
        ("test_blueprints.py", "host file\n"),
        ("conftest.py", "host conftest\n"),
        ("sub/keep.txt", "host data\n"),
        ("setup.cfg", "[host]\n"),
    ):
        (canary / rel).write_text(text)
    for path in [*canary.rglob("*"), canary]:
        os.utime(path, ns=(1_000_000_000, 2_000_000_000), follow_symlinks=False)
    return canary


def canary_state(canary: Path) -> dict[str, tuple]:
    """lstat of every entry (atime included) before it is listed or read; this check's own atime moves
    are undone afterwards (which sets ctime past atime: any later read moves the atime again)."""
    stats: dict[Path, os.stat_result] = {}

    def walk(p: Path) -> None:
        stats[p] = p.lstat()
        if p.is_dir() and not p.is_symlink():
            for name in sorted(os.listdir(p)):
                walk(p / name)

    walk(canary)
    state = {}
    for p, st in stats.items():
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else ""
        state[str(p.relative_to(canary))] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_atime_ns, digest)
    for p, st in stats.items():
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
    return state


def ladder_commands(canary: Path) -> list[list[str]]:
    """``ln -s`` commands that build the ladder in a tree's root (run by the agent or by us)."""
    cmds = [["mkdir", "-p", "/".join(["d"] * RUNGS)], ["ln", "-s", "..", "d/u1"]]
    for k in range(2, RUNGS + 1):
        cmds.append(["ln", "-s", f"../u{k - 1}/..", "/".join(["d"] * k) + f"/u{k}"])
    target = "/".join(["d"] * RUNGS) + f"/u{RUNGS}" + str(canary)
    return [
        *cmds,
        ["rm", "-rf", "tests"],
        ["ln", "-s", target, "tests"],
        ["ln", "-s", target + "/sub", "src/flask/sub"],
    ]


def build_ladder(tree: Path, canary: Path) -> None:
    for cmd in ladder_commands(canary):
        if cmd[0] == "mkdir":
            (tree / cmd[2]).mkdir(parents=True)
        elif cmd[0] == "rm":
            shutil.rmtree(tree / cmd[2])
        else:
            os.symlink(cmd[2], tree / cmd[3])
