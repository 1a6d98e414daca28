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
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from polar_env.rewards.bounded_output import OutputStats, read_bounded
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
    stats: OutputStats = field(default_factory=OutputStats)


def _sandbox(tree: Path, venv: Path, env: dict[str, str], *, tree_writable: bool = True,
             extra_mounts: Sequence[Mount] = (), tree_mount: str = TREE_MOUNT,
             hostname: str = "sandbox") -> BwrapCommand:
    """The grading sandbox: the tree at /testbed (read-only for strict runs), the task venv
    read-only, fresh tmpfs, plus grader-owned mounts (the strict runner's plugin and report dir)."""
    mounts = [Mount("/tmp", kind="tmpfs", perms="1777"), Mount("/home/agent", kind="tmpfs", perms="0777"),
              Mount(tree_mount, tree, "bind" if tree_writable else "ro-bind"), Mount(VENV_MOUNT, venv),
              *extra_mounts]
    uid, gid = (SANDBOX_UID, SANDBOX_UID) if os.geteuid() == 0 else (os.geteuid(), os.getegid())
    return BwrapCommand(mounts, workdir=tree_mount, env=env, uid=uid, gid=gid, hostname=hostname)


def prepare_tree_owner(tree: Path) -> None:
    """Give the sandbox uid the tree (tests write caches and temp files next to the code)."""
    if os.geteuid() != 0:
        return
    for root, dirs, files in os.walk(tree):
        os.chown(root, SANDBOX_UID, SANDBOX_UID)
        for name in dirs + files:
            os.lchown(os.path.join(root, name), SANDBOX_UID, SANDBOX_UID)


def run_sandboxed(
    script: str | Sequence[str],
    *,
    tree: Path,
    venv: Path,
    timeout_s: float,
    env: dict[str, str] | None = None,
    tree_writable: bool = True,
    extra_mounts: Sequence[Mount] = (),
    pass_fds: Sequence[int] = (),
    tree_mount: str = TREE_MOUNT,
    hostname: str = "sandbox",
) -> SandboxRun:
    """Run `script` (bash source, or an argv run as is) in the sandbox; kill it all at the deadline.

    ``tree_mount`` and ``hostname`` differ only in strict grading's perturbed second run.

    Output (stdout and stderr together) is read with bounded memory (`read_bounded`).
    """
    full_env = {
        "PATH": f"{VENV_MOUNT}/bin:/usr/bin:/bin",
        "HOME": "/home/agent",
        "LANG": "C.UTF-8",
        "TZ": "UTC",
        "PYTHONDONTWRITEBYTECODE": "1",
        "VIRTUAL_ENV": VENV_MOUNT,
        **(env or {}),
    }
    cmd = ["/bin/bash", "-c", script] if isinstance(script, str) else list(script)
    argv = _sandbox(tree, venv, full_env, tree_writable=tree_writable, extra_mounts=extra_mounts,
                    tree_mount=tree_mount, hostname=hostname).argv(cmd)
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, pass_fds=tuple(pass_fds))
    result: dict[str, tuple[str, OutputStats]] = {}
    reader = threading.Thread(target=lambda: result.setdefault("out", read_bounded(proc.stdout)), daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        # Killing bwrap's process group tears down its PID namespace and everything in it.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        timed_out = True
    reader.join()
    proc.stdout.close()
    out, stats = result.get("out", ("", OutputStats()))
    return SandboxRun(proc.returncode, out, timed_out, time.monotonic() - start, stats)
