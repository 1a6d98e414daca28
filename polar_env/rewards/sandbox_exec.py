"""Run the grading command in a network-less bubblewrap sandbox.

Kept behind one function (`run_sandboxed`) so grading can move to `polar_env.sandbox` (or to
docker/apptainer with the official images) without touching the grader. Shape from DESIGN §6b:
every namespace unshared (only `lo` exists), read-only system, the tree at /testbed, the task
venv read-only at /opt/venv, and an unprivileged uid when started as root.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SANDBOX_UID = 65534  # nobody: tests never run as root, even when the grader does
TREE_MOUNT = "/testbed"
VENV_MOUNT = "/opt/venv"


class SandboxUnavailable(RuntimeError):
    """bwrap/setpriv missing or failing: an infrastructure fault."""


@dataclass
class SandboxRun:
    returncode: int
    output: str
    timed_out: bool
    seconds: float


def _bwrap_argv(tree: Path, venv: Path, env: dict[str, str]) -> list[str]:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed")
    as_root = os.geteuid() == 0
    # As root a user namespace would map only uid 0 and pin the tests to (namespaced) root;
    # instead keep the host user namespace and drop to an unprivileged uid inside.
    ns = (
        ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        if as_root
        else ["--unshare-all"]
    )
    argv = [bwrap, *ns, "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for link in ("lib", "lib64", "bin", "sbin"):
        if Path(f"/usr/{link}").exists():
            argv += ["--symlink", f"usr/{link}", f"/{link}"]
    argv += ["--ro-bind", "/etc", "/etc", "--proc", "/proc", "--dev", "/dev"]
    argv += ["--perms", "1777", "--tmpfs", "/tmp", "--perms", "0777", "--tmpfs", "/home/agent"]
    argv += [
        "--bind",
        str(tree),
        TREE_MOUNT,
        "--perms",
        "0755",
        "--dir",
        "/opt",
        "--ro-bind",
        str(venv),
        VENV_MOUNT,
    ]
    argv += ["--remount-ro", "/", "--chdir", TREE_MOUNT, "--clearenv"]
    for k, v in env.items():
        argv += ["--setenv", k, v]
    if as_root:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise SandboxUnavailable("setpriv (util-linux) is needed to drop root inside the sandbox")
        argv += [
            setpriv,
            f"--reuid={SANDBOX_UID}",
            f"--regid={SANDBOX_UID}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ]
    return argv


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
    argv = [*_bwrap_argv(tree, venv, full_env), "/bin/bash", "-c", script]
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
