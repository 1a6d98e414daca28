"""Run the grading command in a network-less bubblewrap sandbox.

Kept behind one function (`run_sandboxed`) so grading can move to `polar_env.sandbox` (or to
docker/apptainer with the official images) without touching the grader. The isolation is the
episode sandbox's (`polar_env.sandbox.bwrap_argv`, --no-new-privs included); only the mounts
differ: the tree at /testbed, the task venv read-only at /opt/venv, fresh tmpfs /tmp and HOME.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from polar_env.sandbox.bwrap_argv import BwrapCommand, Mount
from polar_env.sandbox.bwrap_argv import SandboxUnavailable as SandboxUnavailable  # what run_sandboxed raises

SANDBOX_UID = 65534  # nobody: tests never run as root, even when the grader does
TREE_MOUNT = "/testbed"
VENV_MOUNT = "/opt/venv"


@dataclass
class SandboxRun:
    returncode: int
    output: str
    timed_out: bool
    seconds: float


def _sandbox(tree: Path, venv: Path, env: dict[str, str]) -> BwrapCommand:
    """The grading sandbox: the tree writable at /testbed, the task venv read-only, fresh tmpfs."""
    mounts = [Mount("/tmp", kind="tmpfs", perms="1777"), Mount("/home/agent", kind="tmpfs", perms="0777"),
              Mount(TREE_MOUNT, tree, "bind"), Mount(VENV_MOUNT, venv)]
    uid, gid = (SANDBOX_UID, SANDBOX_UID) if os.geteuid() == 0 else (os.geteuid(), os.getegid())
    return BwrapCommand(mounts, workdir=TREE_MOUNT, env=env, uid=uid, gid=gid)


def prepare_tree_owner(tree: Path) -> None:
    """Give the sandbox uid the tree (tests write caches and temp files next to the code)."""
    if os.geteuid() != 0:
        return
    for root, dirs, files in os.walk(tree):
        os.chown(root, SANDBOX_UID, SANDBOX_UID)
        for name in dirs + files:
            os.lchown(os.path.join(root, name), SANDBOX_UID, SANDBOX_UID)


def run_sandboxed(
    script: str, *, tree: Path, venv: Path, timeout_s: float, env: dict[str, str] | None = None
) -> SandboxRun:
    """Run `script` with bash in the sandbox; kill the whole sandbox at the deadline."""
    full_env = {
        "PATH": f"{VENV_MOUNT}/bin:/usr/bin:/bin",
        "HOME": "/home/agent",
        "LANG": "C.UTF-8",
        "TZ": "UTC",
        "PYTHONDONTWRITEBYTECODE": "1",
        "VIRTUAL_ENV": VENV_MOUNT,
        **(env or {}),
    }
    argv = _sandbox(tree, venv, full_env).argv(["/bin/bash", "-c", script])
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        # Killing bwrap's process group tears down its PID namespace and everything in it.
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        timed_out = True
    return SandboxRun(proc.returncode, out.decode("utf-8", "replace"), timed_out, time.monotonic() - start)
