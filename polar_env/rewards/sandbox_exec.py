"""Run the grading command in a network-less bubblewrap sandbox, under limits.

Kept behind one function (`run_sandboxed`) so grading can move to `polar_env.sandbox` (or to
docker/apptainer with the official images) without touching the grader. The isolation is the
episode sandbox's (`polar_env.sandbox.bwrap_argv`, --no-new-privs included); only the mounts
differ: the tree at /testbed, the task venv read-only at /opt/venv, fresh tmpfs /tmp and HOME.

Limits (`GradingLimits`, sized by ``POLAR_GRADING_*``; the grading deadline is one of them, the one
declaration every entry point reads: `grading_timeout_s`): the whole sandbox runs in its own cgroup
(memory, pids: `polar_env.sandbox.cgroups`), and everything the tests can write is a sized tmpfs,
whose pages that cgroup pays for too. A writable tree is copied into a sized tmpfs at /testbed
inside the sandbox (the host copy is only read), so no test writes host disk. As host root, a
read-only run's tree and the grader's files are staged on a fresh tmpfs first (`_staged`), so the
sandbox's mountinfo shows each at its own path, as the episode sandbox's does, never the grader's
temp dirs (which name the task and the kind of run).

Whether the sandbox started is the supervisor's evidence, not the output's: the first command
inside, before anything of the task's runs (and after the tree copy), writes one byte into a
pipe this process holds, then closes its end. A run without that byte never ran tested code.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from polar_env.sandbox.base import run_process_tree
from polar_env.sandbox.bubblewrap import _mount_quota as mount_quota
from polar_env.sandbox.bwrap_argv import BwrapCommand, Mount
from polar_env.sandbox.bwrap_argv import SandboxUnavailable as SandboxUnavailable  # what run_sandboxed raises
from polar_env.sandbox.cgroups import CgroupLimits
from polar_env.sandbox.output import HEAD_BYTES, TAIL_BYTES, OutputStats

SANDBOX_UID = 65534  # nobody: tests never run as root, even when the grader does
TREE_MOUNT = "/testbed"
TREE_SOURCE_MOUNT = "/opt/polar-tree"  # a writable run's host tree, read-only: copied into /testbed's tmpfs
VENV_MOUNT = "/opt/venv"


@dataclass(frozen=True)
class GradingLimits:
    """What one grading run may use; each ``None`` or 0 means unlimited (the deadline excepted)."""

    memory_bytes: int | None = 4 << 30
    pids_max: int | None = 1024
    tmpfs_bytes: int = 2 << 30  # each of /tmp, HOME and a writable /testbed
    timeout_s: float = 900.0  # the grading deadline: grading's own budget, which outlives the rollout's

    @classmethod
    def from_env(cls) -> GradingLimits:
        """The defaults, each overridable by ``POLAR_GRADING_MEMORY_BYTES``/``_PIDS_MAX``/``_TMPFS_BYTES``
        /``_TIMEOUT_S`` (the only place these variables are read)."""
        def get(name: str, default: int | None) -> int | None:
            value = os.environ.get(f"POLAR_GRADING_{name}")
            return default if value is None else (int(value) or None)
        d = cls()
        timeout = os.environ.get("POLAR_GRADING_TIMEOUT_S")
        return cls(get("MEMORY_BYTES", d.memory_bytes), get("PIDS_MAX", d.pids_max),
                   get("TMPFS_BYTES", d.tmpfs_bytes) or d.tmpfs_bytes,
                   float(timeout) if timeout else d.timeout_s)


def grading_timeout_s(timeout_s: float | None = None) -> float:
    """``timeout_s``, or the grading deadline this process runs with (``POLAR_GRADING_TIMEOUT_S``, else
    the default): what every entry point's config defaults to."""
    return GradingLimits.from_env().timeout_s if timeout_s is None else timeout_s


@dataclass
class SandboxRun:
    returncode: int
    output: str
    timed_out: bool
    seconds: float
    stats: OutputStats = field(default_factory=OutputStats)
    started: bool = True  # the sandbox came up and ran its first command (the supervisor's pipe says so)
    limits: dict[str, str] = field(default_factory=dict)  # controller -> cgroup version, or why not limited


def _sandbox(tree: Path, venv: Path, env: dict[str, str], *, tree_writable: bool = True,
             extra_mounts: Sequence[Mount] = (), tree_mount: str = TREE_MOUNT,
             hostname: str = "sandbox", tmpfs_bytes: int | None = None) -> BwrapCommand:
    """The grading sandbox: the tree at ``tree_mount`` (read-only for strict runs; a sized tmpfs copy
    when writable), the task venv read-only, sized tmpfs, plus grader-owned mounts (the strict
    runner's plugin and report dir)."""
    tree_mounts = ([Mount(TREE_SOURCE_MOUNT, tree), Mount(tree_mount, kind="tmpfs", perms="0777", size=tmpfs_bytes)]
                   if tree_writable else [Mount(tree_mount, tree)])
    mounts = [Mount("/tmp", kind="tmpfs", perms="1777", size=tmpfs_bytes),
              Mount("/home/agent", kind="tmpfs", perms="0777", size=tmpfs_bytes),
              *tree_mounts, Mount(VENV_MOUNT, venv), *extra_mounts]
    uid, gid = (SANDBOX_UID, SANDBOX_UID) if os.geteuid() == 0 else (os.geteuid(), os.getegid())
    return BwrapCommand(mounts, workdir=tree_mount, env=env, uid=uid, gid=gid, hostname=hostname)


def _start_wrapper(cmd: list[str], started_fd: int, *, copy_to: str | None) -> list[str]:
    """bash that (copies the tree into its tmpfs at ``copy_to``,) reports the start on ``started_fd``,
    closes it, execs ``cmd``."""
    # each top-level entry (dotfiles too), never the mount point itself (root's, its times not ours to set)
    copy = (f"shopt -s dotglob nullglob && src=({TREE_SOURCE_MOUNT}/*) && shopt -u dotglob nullglob && "
            f'{{ [ ${{#src[@]}} -eq 0 ] || cp -a "${{src[@]}}" {copy_to}/; }} && ' if copy_to else "")
    return ["/bin/bash", "-c", f'{copy}printf 1 >&{started_fd} && exec {started_fd}>&- && exec "$@"',
            "polar-sandbox", *cmd]


def prepare_tree_owner(tree: Path) -> None:
    """Give the sandbox uid the tree (tests write caches and temp files next to the code)."""
    if os.geteuid() != 0:
        return
    for root, dirs, files in os.walk(tree):
        os.chown(root, SANDBOX_UID, SANDBOX_UID)
        for name in dirs + files:
            os.lchown(os.path.join(root, name), SANDBOX_UID, SANDBOX_UID)


@contextmanager
def _staged(tree: Path, tree_mount: str, extra_mounts: Sequence[Mount], size: int) -> Iterator[tuple[Path, list[Mount]]]:
    """As host root, a read-only run's tree and grader files copied (``cp -a``) onto a fresh tmpfs, each at
    its path inside the sandbox: a bind's mountinfo names the source's path within its file system, so
    ``/testbed`` then reads as the episode sandbox's does (``polar-sandbox``, root ``/testbed``), never the
    grader's temp dir (``polar-grade-<task id>-...``, ``polar-perturbed-...``). Otherwise nothing is copied.
    The tmpfs is sized as a writable run's: a tree that does not fit did not start (the supervisor then
    asks the base, `grading._base_starts`), never a masked error."""
    if os.geteuid() != 0:
        yield tree, list(extra_mounts)
        return
    with tempfile.TemporaryDirectory(prefix="polar-stage-") as tmp:
        root = Path(tmp)
        mount_quota(root, size)
        try:
            def copy(src: Path, dst: str) -> Path:
                target = root / dst.lstrip("/")
                target.mkdir(parents=True)
                subprocess.run(["cp", "-a", "--", f"{src}/.", str(target)], check=True, capture_output=True)
                return target
            staged = [Mount(m.dst, copy(Path(m.src), m.dst), m.kind, m.perms, m.size)
                      if m.src is not None and Path(m.src).is_dir() else m for m in extra_mounts]
            yield copy(tree, tree_mount), staged
        finally:
            subprocess.run(["umount", "-l", str(root)], capture_output=True)


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
    limits: GradingLimits | None = None,
) -> SandboxRun:
    """Run `script` (bash source, or an argv run as is) in the sandbox; kill it all at the deadline.

    ``tree_mount`` and ``hostname`` differ only in strict grading's perturbed second run.

    Output (stdout and stderr together) is kept with bounded memory (`sandbox.output`: head and tail).
    """
    limits = limits or GradingLimits.from_env()
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
    if tree_writable:  # copied into its tmpfs inside the sandbox already
        return _run(cmd, tree, venv, full_env, limits, tree_writable, extra_mounts, pass_fds, tree_mount, hostname,
                    timeout_s)
    with ExitStack() as stack:
        try:
            staged_tree, staged_mounts = stack.enter_context(_staged(tree, tree_mount, extra_mounts,
                                                                     limits.tmpfs_bytes))
        except subprocess.CalledProcessError as e:  # the tree did not fit the limit, as a writable run's copy
            said = (e.stderr or b"").decode(errors="replace")[-300:]
            return SandboxRun(-1, f"the tree could not be staged: {said}", False, 0.0, started=False)
        return _run(cmd, staged_tree, venv, full_env, limits, tree_writable, staged_mounts, pass_fds, tree_mount,
                    hostname, timeout_s)


def _run(cmd: list[str], tree: Path, venv: Path, full_env: dict[str, str], limits: GradingLimits,
         tree_writable: bool, extra_mounts: Sequence[Mount], pass_fds: Sequence[int], tree_mount: str,
         hostname: str, timeout_s: float) -> SandboxRun:
    started_r, started_w = os.pipe()
    try:
        argv = _sandbox(tree, venv, full_env, tree_writable=tree_writable, extra_mounts=extra_mounts,
                        tree_mount=tree_mount, hostname=hostname, tmpfs_bytes=limits.tmpfs_bytes).argv(
            _start_wrapper(cmd, started_w, copy_to=tree_mount if tree_writable else None))
    except BaseException:
        os.close(started_r)
        os.close(started_w)
        raise
    cgroups = CgroupLimits(f"grade-{os.getpid()}-{uuid.uuid4().hex[:8]}", limits.memory_bytes, limits.pids_max)
    try:
        # the one runner of commands in a sandbox (`sandbox.base.run_process_tree`): killing bwrap's process
        # group at the deadline tears down its PID namespace and everything in it
        ran = asyncio.run(run_process_tree(
            argv, timeout_s=timeout_s, stdin=None, max_output_bytes=TAIL_BYTES, head_bytes=HEAD_BYTES,
            merge_output=True, pass_fds=(*pass_fds, started_w), preexec_fn=cgroups.join if cgroups.dirs else None,
            on_timeout=cgroups.kill_all))
    except BaseException:
        os.close(started_r)
        raise
    finally:
        os.close(started_w)
        cgroups.kill_all()  # whatever escaped the process group (a daemonised child) ends with the run
        cgroups.remove()
    with os.fdopen(started_r, "rb") as f:
        os.set_blocking(started_r, False)
        started = bool(f.read(1))
    applied = {**cgroups.versions, **cgroups.skipped}
    return SandboxRun(-9 if ran.exit_code is None else ran.exit_code, ran.stdout_tail, ran.timed_out, ran.duration_s,
                      ran.output_stats, started=started, limits=applied)
