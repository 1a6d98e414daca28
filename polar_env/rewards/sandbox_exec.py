"""Run the grading command in a network-less bubblewrap sandbox, under limits.

Kept behind one function (`run_sandboxed`) so grading can move to `polar_env.sandbox` (or to
docker/apptainer with the official images) without touching the grader. The isolation is the
episode sandbox's (`polar_env.sandbox.bwrap_argv`, --no-new-privs included); only the mounts
differ: the tree at /testbed, the task venv read-only at /opt/venv, fresh tmpfs /tmp and HOME.

Limits (`GradingLimits`, sized by ``POLAR_GRADING_*``; the grading deadline is one of them, the one
declaration every entry point reads: `grading_timeout_s`): the whole sandbox runs in its own cgroup
(memory, pids: `polar_env.sandbox.cgroups`), and everything the tests can write is a sized tmpfs,
whose pages that cgroup pays for too. A writable tree is copied into a sized tmpfs at /testbed
inside the sandbox (the host copy is only read), so no test writes host disk. As host root, the
tree, the venv, the grader's files and the sandbox root are shown through read-only overlays
(`_shown`), so the sandbox's mountinfo names none of the grader's temp dirs or the venv's path
(which name the task and the kind of run).

As host root each run has a user namespace of its own (``polar_env.sandbox.identity``): the tests
run as a host uid leased for the run, shown as nobody inside, so nothing a graded patch spends of a
per-user budget, or leaves in the kernel, is another run's.

Whether the sandbox started is the supervisor's evidence, not the output's: the first command
inside, before anything of the task's runs (and after the tree copy), writes one byte into a
pipe this process holds, then closes its end. A run without that byte never ran tested code.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from polar_env.environment import EnvSettings
from polar_env.sandbox.base import run_process_tree
from polar_env.sandbox.bubblewrap import _mount_quota as mount_quota
from polar_env.sandbox.bwrap_argv import BwrapCommand, Mount
from polar_env.sandbox.bwrap_argv import SandboxUnavailable as SandboxUnavailable  # what run_sandboxed raises
from polar_env.sandbox.cgroups import CgroupLimits
from polar_env.sandbox.identity import lease, user_namespace
from polar_env.sandbox.output import HEAD_BYTES, TAIL_BYTES, OutputStats
from polar_env.sandbox.views import mount_view, system_view, unmount

SANDBOX_UID = 65534  # nobody: tests never run as root, even when the grader does
TREE_MOUNT = "/testbed"
VIEWS_TMPFS_BYTES = 1 << 20  # a run's views' tmpfs: their mount points only
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
        /``_TIMEOUT_S`` (read by ``EnvSettings``)."""
        env = EnvSettings.read().grading

        def get(name: str, default: int | None) -> int | None:
            value = env.get(name)
            return default if value is None else (int(value) or None)

        d = cls()
        timeout = env.get("TIMEOUT_S")
        return cls(
            get("MEMORY_BYTES", d.memory_bytes),
            get("PIDS_MAX", d.pids_max),
            get("TMPFS_BYTES", d.tmpfs_bytes) or d.tmpfs_bytes,
            float(timeout) if timeout else d.timeout_s,
        )


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


def _sandbox(
    shown: _Shown,
    env: dict[str, str],
    *,
    tree_writable: bool = True,
    tree_mount: str = TREE_MOUNT,
    hostname: str = "sandbox",
    tmpfs_bytes: int | None = None,
    userns: int | None = None,
) -> BwrapCommand:
    """The grading sandbox: the tree at ``tree_mount`` (read-only for strict runs; a sized tmpfs copy
    when writable), the task venv read-only, sized tmpfs, plus grader-owned mounts (the strict
    runner's plugin and report dir)."""
    tree_mounts = (
        [
            Mount(TREE_SOURCE_MOUNT, shown.tree),
            Mount(tree_mount, kind="tmpfs", perms="0777", size=tmpfs_bytes),
        ]
        if tree_writable
        else [Mount(tree_mount, shown.tree)]
    )
    mounts = [
        Mount("/tmp", kind="tmpfs", perms="1777", size=tmpfs_bytes),
        Mount("/home/agent", kind="tmpfs", perms="0777", size=tmpfs_bytes),
        *tree_mounts,
        Mount(VENV_MOUNT, shown.venv),
        *shown.mounts,
    ]
    uid, gid = (SANDBOX_UID, SANDBOX_UID) if os.geteuid() == 0 else (os.geteuid(), os.getegid())
    return BwrapCommand(
        mounts,
        workdir=tree_mount,
        env=env,
        uid=uid,
        gid=gid,
        hostname=hostname,
        system=shown.system,
        userns=userns,
    )


def _start_wrapper(cmd: list[str], started_fd: int, *, copy_to: str | None) -> list[str]:
    """bash that (copies the tree into its tmpfs at ``copy_to``,) reports the start on ``started_fd``,
    closes it, execs ``cmd``."""
    # each top-level entry (dotfiles too), never the mount point itself (root's, its times not ours to set)
    copy = (
        f"shopt -s dotglob nullglob && src=({TREE_SOURCE_MOUNT}/*) && shopt -u dotglob nullglob && "
        f'{{ [ ${{#src[@]}} -eq 0 ] || cp -a "${{src[@]}}" {copy_to}/; }} && '
        if copy_to
        else ""
    )
    return [
        "/bin/bash",
        "-c",
        f'{copy}printf 1 >&{started_fd} && exec {started_fd}>&- && exec "$@"',
        "polar-sandbox",
        *cmd,
    ]


def prepare_tree_owner(tree: Path) -> None:
    """Give the sandbox uid the tree (tests write caches and temp files next to the code)."""
    if os.geteuid() != 0:
        return
    for root, dirs, files in os.walk(tree):
        os.chown(root, SANDBOX_UID, SANDBOX_UID)
        for name in dirs + files:
            os.lchown(os.path.join(root, name), SANDBOX_UID, SANDBOX_UID)


@dataclass(frozen=True)
class _Shown:
    """What a run binds: the tree, the venv, the grader's mounts and (as host root) the system views."""

    tree: Path
    venv: Path
    mounts: list[Mount]
    system: Path | None = None


@contextmanager
def _shown(tree: Path, venv: Path, extra_mounts: Sequence[Mount]) -> Iterator[_Shown]:
    """As host root, the tree, the task venv, the grader's dirs and the sandbox root each shown by a
    read-only overlay (`polar_env.sandbox.views`) on a small tmpfs of the run's own: a bind's
    mountinfo names the source's path within its file system, so the tested code would read the
    grader's temp dir (``polar-grade-<task id>-...``, ``polar-perturbed-...``: the task and which
    graded run it is) or the venv's ``envs/<task id>``; an overlay's names only descriptors.
    Unprivileged, the sources are bound as they are."""
    if os.geteuid() != 0:
        yield _Shown(tree, venv, list(extra_mounts))
        return
    with tempfile.TemporaryDirectory(prefix="polar-views-") as tmp:
        root = Path(tmp)
        mount_quota(root, VIEWS_TMPFS_BYTES)
        try:

            def view(src: Path, name: str) -> Path:
                return mount_view([src], root / name) if src.is_dir() else src  # no dir: bwrap names it

            mounts = [
                Mount(m.dst, view(Path(m.src), f"mount{i}"), m.kind, m.perms, m.size)
                if m.src is not None
                else m
                for i, m in enumerate(extra_mounts)
            ]
            yield _Shown(view(tree, "tree"), view(venv, "venv"), mounts, system_view(root / "system"))
        finally:
            unmount(root)


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
    with _shown(tree, venv, extra_mounts) as shown:
        return _run(cmd, shown, full_env, limits, tree_writable, pass_fds, tree_mount, hostname, timeout_s)


@contextmanager
def _own_namespace() -> Iterator[int | None]:
    """As host root, the run's own user namespace (`polar_env.sandbox.identity`: a host uid leased for
    the run, shown as `SANDBOX_UID`): no per-user budget or kernel object of it is another run's."""
    if os.geteuid() != 0:
        yield None
        return
    identity = lease(SANDBOX_UID, SANDBOX_UID)
    try:
        with user_namespace(identity) as fd:
            yield fd
    finally:
        identity.release()


def _run(
    cmd: list[str],
    shown: _Shown,
    full_env: dict[str, str],
    limits: GradingLimits,
    tree_writable: bool,
    pass_fds: Sequence[int],
    tree_mount: str,
    hostname: str,
    timeout_s: float,
) -> SandboxRun:
    with _own_namespace() as userns:
        return _run_in(
            cmd,
            shown,
            full_env,
            limits,
            tree_writable,
            (*pass_fds, *([] if userns is None else [userns])),
            tree_mount,
            hostname,
            timeout_s,
            userns,
        )


def _run_in(
    cmd: list[str],
    shown: _Shown,
    full_env: dict[str, str],
    limits: GradingLimits,
    tree_writable: bool,
    pass_fds: Sequence[int],
    tree_mount: str,
    hostname: str,
    timeout_s: float,
    userns: int | None,
) -> SandboxRun:
    started_r, started_w = os.pipe()
    try:
        argv = _sandbox(
            shown,
            full_env,
            tree_writable=tree_writable,
            tree_mount=tree_mount,
            hostname=hostname,
            tmpfs_bytes=limits.tmpfs_bytes,
            userns=userns,
        ).argv(_start_wrapper(cmd, started_w, copy_to=tree_mount if tree_writable else None))
    except BaseException:
        os.close(started_r)
        os.close(started_w)
        raise
    cgroups = CgroupLimits(
        f"grade-{os.getpid()}-{uuid.uuid4().hex[:8]}", limits.memory_bytes, limits.pids_max
    )
    try:
        # the one runner of commands in a sandbox (`sandbox.base.run_process_tree`): killing bwrap's process
        # group at the deadline tears down its PID namespace and everything in it
        ran = asyncio.run(
            run_process_tree(
                argv,
                timeout_s=timeout_s,
                stdin=None,
                max_output_bytes=TAIL_BYTES,
                head_bytes=HEAD_BYTES,
                merge_output=True,
                pass_fds=(*pass_fds, started_w),
                preexec_fn=cgroups.join if cgroups.dirs else None,
                on_timeout=cgroups.kill_all,
            )
        )
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
    return SandboxRun(
        -9 if ran.exit_code is None else ran.exit_code,
        ran.stdout_tail,
        ran.timed_out,
        ran.duration_s,
        ran.output_stats,
        started=started,
        limits=applied,
    )
