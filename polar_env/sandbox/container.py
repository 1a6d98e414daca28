"""Container sandbox for task images, on Docker or Podman (one implementation: podman's CLI is docker's).

One long-lived container per episode: ``--network none`` (only ``lo``), the proxy's socket dir
bind-mounted read-only at /run/proxy and reached through the forwarder (as in bubblewrap), the
harness install read-only at /opt/harness, memory/pids limits, PID 1 an init that reaps. Commands
run by ``exec`` as the unprivileged sandbox uid; only the setup steps (the workdir's git history
reduced to the base, sandbox/history.py; chown, git snapshot, diff) exec as root, which is why the container
keeps CHOWN/DAC_OVERRIDE/FOWNER and drops every other capability: a non-root uid has no effective
capabilities, and ``no-new-privileges`` stops setuid binaries from getting any. An episode's container also
keeps what its forwarder needs: it runs as root and starts the harness as the sandbox uid, sealed
(``FORWARDER_CAPS``). A container of ``spec.userns`` runs in a user namespace of its own (``--uidmap``: its
root is an unprivileged host uid, a fresh range per container), and only there may the agent be root
(``spec.uid`` 0: a Harbor task whose image's user is root, as Harbor runs it); the forwarder then starts the
harness as root without ``CAP_SYS_PTRACE`` or ``CAP_SETPCAP`` in its bounding set (``ROOT_AGENT_CAPS``: the
container keeps SETPCAP for that drop), so neither the harness nor any tool it runs can trace another process.
A ``spec.host_dirs`` path is a fresh host directory on a tmpfs of its own, bind-mounted in, root's (in
a user namespace: no uid of the container's owns it, not even its root), which only the host hands
over (`host_dir`). HOME and ``/tmp`` are tmpfs mounts of ``spec.disk_bytes`` each, and so, on podman as host
root, is the workdir of a warm container (`WorkdirQuota`). The image's own PATH is kept (its
toolchain lives there); the harness's bin dir goes in front. Root execs run with ``PATH=/usr/bin:/bin``
instead (their sh, chown, head, kill are the system's, never found first in an image PATH directory the
agent may write); an exec given its own ``path`` (a task's verifier: the image's PATH less what the agent
can write, rewards/harbor_verifier.py) runs with that one. The
pid of the keep-alive ``sleep infinity`` (PID 1's child, the init's) is recorded once the container
starts, before anything else runs in it, so what is spared later is that process, not a name. A deadline kills
every process of the sandbox uid in the container, and a failed ``create`` removes the container. The argv
builders are pure, so they are unit tested without an engine; the methods only execute them.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from polar_env.environment import EnvSettings
from polar_env.outcomes import FailureKind
from polar_env.sandbox import history, safe_git
from polar_env.sandbox.base import (
    BUILD_EXCLUDES,
    HARNESS_BIN_DIRS,
    Deadline,
    RunResult,
    Sandbox,
    SandboxSpec,
    bound_s,
    exclude_pathspecs,
    run_process_tree,
)
from polar_env.sandbox.bubblewrap import FORWARDER_INSIDE, FORWARDER_SRC, isolated_forwarder, runs_forwarder
from polar_env.sandbox.bubblewrap import _mount_quota as mount_quota
from polar_env.sandbox.bwrap_argv import SandboxUnavailable
from polar_env.sandbox.forwarder import harness_gid
from polar_env.sandbox.rootfs import host_node
from polar_env.sandbox.seccomp import container_profile
from polar_env.sandbox.views import harness_view, holds_python_packages, unmount

ENGINES = ("docker", "podman")
GIT_DIR_INSIDE = "/var/lib/polar-git"  # the base snapshot's repository: root's, outside the tree, readable
BASE_FILE = f"{GIT_DIR_INSIDE}/POLAR_BASE"  # the base tree's id, in that repository (GIT_DIR=GIT_DIR_INSIDE)
SETUP_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER")  # what the root setup execs need, nothing more
# what an episode's forwarder, run as the container's root, needs to seal the harness it starts as the
# sandbox uid (forwarder.py, "Sealed harness"); a uid's exec gets no capability of the container's
# (forwarder.SUPERVISING_IN_CONTAINER: DAC_OVERRIDE, kept for setup, reads in place of DAC_READ_SEARCH,
# which no container may hold: open_by_handle_at would open the host's files behind its binds)
FORWARDER_CAPS = ("SYS_PTRACE", "SETGID", "SETUID")
ROOT_AGENT_CAPS = ("SETPCAP",)
# in a user namespace of its own, root may change uid (a verifier runs the code under test as another user,
# as under Docker's defaults): SETUID and SETGID there reach no host uid of note
USERNS_CAPS = (
    "SETUID",
    "SETGID",
)  # the forwarder's drop of PTRACE and SETPCAP from a root harness's bounding set
USERNS_SIZE = 65536  # uids and gids mapped into a container's user namespace
HOST_DIRS_BYTES = 256 << 20  # the tmpfs holding a container's host dirs (a verifier's logs, tests, HOME)
FALLBACK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ROOT_PATH = "/usr/bin:/bin"  # root execs' PATH: never the image's
# every child of PID 1 (the init): right after the start, only the keep-alive `sleep infinity`
KEEPALIVE_SCRIPT = (
    'for d in /proc/[0-9]*; do s=$(cat "$d/stat" 2>/dev/null) || continue; s=${s##*) }; '
    'set -- $s; [ "$2" = 1 ] && echo "${d#/proc/}"; done; true'
)
LABELS_ENV = "POLAR_CONTAINER_LABELS"
NODE_DIR_INSIDE = "/opt/polar/bin"  # the host's Node.js binary, for harnesses in images that lack one


class ContainerError(RuntimeError):
    """An engine command failed (engine missing or down, image absent, container gone)."""


class HistoryNotReduced(ContainerError):
    """A task's git repository could not be reduced to its base (sandbox/history.py): the task is refused,
    with a one-line message, as a task defect (masked, never scored)."""

    failure_kind = FailureKind.task_defect


def is_root(user: str | None) -> bool:
    """Whether an exec's ``-u`` names root (``0``, ``root``, ``0:0``)."""
    return user is not None and user.split(":")[0] in ("0", "root")


def keepalive_pid(out: bytes) -> int | None:
    """The keep-alive's pid from `KEEPALIVE_SCRIPT`'s output; None when PID 1 has no child (no init:
    PID 1 is the keep-alive itself)."""
    pids = out.decode().split()
    if len(pids) > 1:
        raise ContainerError(
            f"PID 1 has {len(pids)} children right after the start, not one keep-alive: {pids}"
        )
    return int(pids[0]) if pids else None


def git_snapshot_script(workdir: str, git_dir: str = GIT_DIR_INSIDE) -> str:
    """Shell run inside the container (as root): record the base tree in a repository only root can
    write, outside the tree (`safe_git`: the tree's own ``.git`` config, hooks and attributes never apply,
    and nothing is written into any home's git config)."""
    git = safe_git.shell_function(git_dir, workdir, f"{git_dir}/base.index")
    return (
        f"{git}; mkdir -p -m 0755 {git_dir} && cd {shlex.quote(workdir)} && g init -q && "
        f"{safe_git.shell_neutralise(git_dir)} && g add -A . && g write-tree > {git_dir}/POLAR_BASE"
    )


def git_diff_script(workdir: str, exclude: Sequence[str], git_dir: str = GIT_DIR_INSIDE) -> str:
    specs = " ".join(shlex.quote(s) for s in exclude_pathspecs(exclude))
    git = safe_git.shell_function(git_dir, workdir, f"{git_dir}/now.index")
    return (
        f"{git}; cd {shlex.quote(workdir)} && rm -f {git_dir}/now.index && g add -A . && "
        f"now=$(g write-tree) && "
        f"g diff --binary --no-color --no-ext-diff --no-textconv $(cat {git_dir}/POLAR_BASE) $now -- {specs}"
    )


class RunsAsUser(Protocol):
    """What ``lock_as_root`` needs of a box: a container, or ``sandbox/apptainer.py``'s box (a protocol, not
    an import: that module imports this one)."""

    async def run(self, cmd: Sequence[str], *, user: str | None = None) -> RunResult: ...


async def lock_as_root(box: RunsAsUser, paths: Sequence[str]) -> None:
    """``paths`` in ``box`` handed to root with no write bit for others (links themselves, never followed),
    by a root step in the box: what a grader's ``lock`` does where the box can run one."""
    quoted = " ".join(shlex.quote(p) for p in paths)
    ran = await box.run(["sh", "-c", f"chown -hR 0:0 {quoted} && chmod -R go-w {quoted}"], user="0")
    if ran.exit_code != 0:
        raise ContainerError(f"locking {quoted} failed: {ran.stderr_tail[-500:]}")


# sh: each argument removed and found gone after (run as root in a container of the image)
REMOVE_PATHS = (
    'for p; do rm -rf -- "$p"; if [ -e "$p" ] || [ -L "$p" ]; then echo "$p stays" >&2; exit 1; fi; done'
)


def copy_out_of_image(engine: str, image: str, paths: Sequence[str], dest: Path) -> None:
    """Each of ``paths`` (absolute, in ``image``) copied to ``dest/<its index>`` on the host, from a container
    created (nothing of it run) for that and removed after; a path the image lacks raises `ContainerError`."""
    box = engine_run([engine, "create", *label_args(), "--network", "none", image, "true"]).decode().strip()
    try:
        for i, path in enumerate(paths):
            engine_run([engine, "cp", f"{box}:{path}", str(dest / str(i))])
    finally:
        engine_run([engine, "rm", "-f", box])


def label_args() -> list[str]:
    """``--label`` flags for every container Polar creates: ``polar_env`` (so ``ps --filter
    label=polar_env`` finds them, a crashed run's leftovers included) and each ``key=value`` of
    ``$POLAR_CONTAINER_LABELS`` (comma-separated: a run's or a job's own tag)."""
    extra = [kv.strip() for kv in EnvSettings.read().container_labels.split(",") if kv.strip()]
    bad = [kv for kv in extra if "=" not in kv or not kv.split("=", 1)[0]]
    if bad:
        raise ValueError(f"${LABELS_ENV} takes comma-separated key=value labels, not {bad[0]!r}")
    return [a for kv in ("polar_env=1", *extra) for a in ("--label", kv)]


def engine_run(argv: Sequence[str], *, timeout_s: float = 600.0) -> bytes:
    """Run an engine command; its failure becomes a one-line-headed ``ContainerError``."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, timeout=timeout_s)
    except FileNotFoundError:
        raise ContainerError(f"{argv[0]} is not installed (polar doctor says how to install it)") from None
    except subprocess.TimeoutExpired:
        raise ContainerError(f"{shlex.join(argv[:3])} did not finish in {timeout_s:g}s") from None
    if proc.returncode != 0:
        raise ContainerError(
            f"{shlex.join(argv[:3])} failed: {proc.stderr.decode(errors='replace').strip()[-2000:]}"
        )
    return proc.stdout


def image_exists(engine: str, image: str) -> bool:
    try:
        return (
            subprocess.run([engine, "image", "inspect", image], capture_output=True, timeout=60).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def image_env(engine: str, image: str) -> dict[str, str]:
    """The environment the image sets (``ENV`` lines), which every exec in its containers inherits."""
    out = engine_run([engine, "image", "inspect", "--format", "{{json .Config.Env}}", image])
    return dict(item.partition("=")[::2] for item in json.loads(out or b"null") or [])


def image_path(engine: str, image: str) -> str:
    """The PATH the image sets (what its own toolchain needs), or the Debian default."""
    return image_env(engine, image).get("PATH", FALLBACK_PATH)


@dataclass
class WorkdirQuota:
    """A container's workdir on a disk quota. The engine cannot size a container's own overlay on most
    filesystems (``--storage-opt size=`` needs XFS project quotas), so an agent could fill the host's
    disk through its tree. On podman as host root the image is mounted on the host (``podman image
    mount``: read-only, counted, shared by its containers) and the workdir is an overlay volume of the
    image's own tree whose upper and work dirs sit on a tmpfs of ``spec.disk_bytes``: whatever the
    container writes there lands on that tmpfs, and a write past it fails with ENOSPC. Only for a warm
    image (sandbox/warm_images.py), whose tree is already the sandbox uid's: a ``chown -R`` would copy
    every file up."""

    engine: str
    image: str
    lower: Path  # the image's workdir, on the host
    root: Path  # the quota's tmpfs: upper/ and work/

    def volume(self, workdir: str) -> str:
        return f"{self.lower}:{workdir}:O,upperdir={self.root / 'upper'},workdir={self.root / 'work'}"

    @classmethod
    def make(cls, engine: str, image: str, spec: SandboxSpec) -> WorkdirQuota | None:
        """The quota for a container of ``image``, or None where it cannot be had (docker, not root, no
        quota asked, an image without the workdir, a container in a user namespace of its own)."""
        if engine != "podman" or os.geteuid() != 0 or spec.disk_bytes is None or spec.userns:
            # (in a user namespace runc may not mount the overlay: docs/reliability.md, known limits)
            return None
        lower = Path(engine_run([engine, "image", "mount", image]).decode().strip()) / spec.workdir.lstrip(
            "/"
        )
        quota = cls(
            engine, image, lower, Path(tempfile.mkdtemp(prefix="polar-workdir-", dir=spec.scratch_root))
        )
        try:
            if not lower.is_dir():
                raise ContainerError(f"{image} has no {spec.workdir}")
            mount_quota(quota.root, spec.disk_bytes)
            (quota.root / "upper").mkdir()
            (quota.root / "work").mkdir()
        except (ContainerError, SandboxUnavailable, OSError):
            quota.release()
            return None
        return quota

    def release(self) -> None:
        """After the container is gone: the tmpfs unmounted and removed, one mount of the image given back."""
        if os.path.ismount(self.root):
            subprocess.run(["umount", "-l", str(self.root)], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
        subprocess.run([self.engine, "image", "unmount", self.image], capture_output=True, timeout=120)


@dataclass(frozen=True)
class HostProcess:
    """A container's process as the host's /proc shows it."""

    pid: int  # the host's
    inner: int  # the container's
    uid: int  # the host's (real)
    parent_inside: bool  # its parent is in the container too (only an exec's first process has one outside)

    @classmethod
    def read(cls, pid: int, ns: int) -> HostProcess:
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
        ppid = int(status["PPid"])
        try:
            parent_inside = ppid > 0 and os.stat(f"/proc/{ppid}/ns/pid").st_ino == ns
        except OSError:
            parent_inside = False
        return cls(pid, int(status["NSpid"].split()[-1]), int(status["Uid"].split()[0]), parent_inside)


class ContainerSandbox(Sandbox):
    def __init__(
        self,
        spec: SandboxSpec,
        image: str,
        name: str,
        *,
        engine: str = "docker",
        path: str = FALLBACK_PATH,
        extra_ro_mounts: Sequence[tuple[str, str]] = (),
        workdir_quota: WorkdirQuota | None = None,
        userns_base: int | None = None,
        setup_only: bool = False,
    ):
        if engine not in ENGINES:
            raise ValueError(f"unknown container engine {engine!r}; known: {', '.join(ENGINES)}")
        if spec.uid == 0 and not spec.userns and not setup_only:
            raise ValueError(
                "the agent's uid in a container must not be 0 outside a user namespace of its own"
            )
        self.spec = spec
        self.image = image
        self.name = name
        self.engine = engine
        self.path = path  # the image's PATH
        self.extra_ro_mounts = list(extra_ro_mounts)  # e.g. a Node.js install the harness needs
        self.keepalive_pid: int | None = None  # the container's `sleep infinity`, recorded at its start
        self.workdir_quota = workdir_quota
        self.history = (
            ""  # what reducing the workdir's git history did (`reduce_history`), where this container did it
        )
        # the host uid the container's root is (a user namespace's), chosen at random per container
        self.userns_base = (
            userns_base
            if userns_base is not None or not spec.userns
            else (1 << 20) + secrets.randbelow(30000) * USERNS_SIZE
        )
        self.harness_view: Path | None = (
            None  # as host root, the sealed view of the harness install (`seal_harness`)
        )
        self._destroyed = False

    # --- argv builders (pure) ---
    def create_argv(self) -> list[str]:
        s = self.spec
        argv = [
            self.engine,
            "create",
            "--name",
            self.name,
            "--hostname",
            s.hostname,
            "--network",
            "none",
            "--workdir",
            s.workdir,
            "--init",
            "--user",
            "0:0",
            "--cap-drop",
            "ALL",
            *label_args(),
        ]
        forwarder = (
            (*FORWARDER_CAPS, *(ROOT_AGENT_CAPS if s.uid == 0 else ()))
            if s.proxy_socket_dir is not None
            else ()
        )
        own_ns = USERNS_CAPS if self.userns_base is not None else ()
        for cap in dict.fromkeys((*SETUP_CAPS, *forwarder, *own_ns)):
            argv += ["--cap-add", cap]
        if self.userns_base is not None:
            argv += [
                "--uidmap",
                f"0:{self.userns_base}:{USERNS_SIZE}",
                "--gidmap",
                f"0:{self.userns_base}:{USERNS_SIZE}",
            ]
        argv += ["--security-opt", "no-new-privileges"]
        if (profile := container_profile(self.engine)) is not None:  # the engine's default, keyring refused
            argv += ["--security-opt", f"seccomp={profile}"]
        if s.memory_bytes is not None:
            argv += ["--memory", str(s.memory_bytes), "--memory-swap", str(s.memory_bytes)]
        if s.pids_max is not None:
            argv += ["--pids-limit", str(s.pids_max)]
        if s.cpus is not None:
            argv += ["--cpus", f"{s.cpus:g}"]
        if s.storage_bytes is not None:
            argv += ["--storage-opt", f"size={s.storage_bytes}"]
        if s.gpus:
            argv += (
                ["--gpus", str(s.gpus)]
                if self.engine == "docker"
                else [a for i in range(s.gpus) for a in ("--device", f"nvidia.com/gpu={i}")]
            )
        mounts = [(str(FORWARDER_SRC), FORWARDER_INSIDE)]
        if s.harness_dir is not None:
            mounts.append((str(self.harness_view or s.harness_dir), "/opt/harness"))
            if (node := host_node()) is not None:
                mounts.append((str(node), f"{NODE_DIR_INSIDE}/node"))
        if s.proxy_socket_dir is not None:
            mounts.append((str(s.proxy_socket_dir), "/run/proxy"))
        mounts += [(src, dst) for src, dst in self.extra_ro_mounts]
        for src, dst in mounts:
            argv += ["-v", f"{src}:{dst}:ro"]
        # no uid= option (podman refuses it): HOME is chowned by the root setup exec instead
        size = f",size={s.disk_bytes}" if s.disk_bytes is not None else ""
        if (
            self.userns_base is None
        ):  # (in a user namespace the engine cannot copy into a tmpfs: HOME and /tmp
            argv += [
                "--tmpfs",
                f"{s.home}:rw,exec,mode=0755{size}",  # are the image's; docs/reliability.md)
                "--tmpfs",
                f"/tmp:rw,exec,mode=1777{size}",
            ]
        if self.workdir_quota is not None:
            argv += ["-v", self.workdir_quota.volume(s.workdir)]
        for inside in s.host_dirs:
            argv += ["-v", f"{self.host_dir(inside)}:{inside}"]
        for key, value in s.env.items():
            argv += ["-e", f"{key}={value}"]
        return argv + [self.image, "sleep", "infinity"]

    def start_argv(self) -> list[str]:
        return [self.engine, "start", self.name]

    def env(self, extra: dict[str, str]) -> dict[str, str]:
        """The fixed sandbox environment with the image's PATH (harness bin dir first)."""
        env = {**self.spec.base_env(), **extra}
        harness = f"{HARNESS_BIN_DIRS}:{NODE_DIR_INSIDE}:" if self.spec.harness_dir is not None else ""
        env["PATH"] = harness + self.path
        return env

    def exec_argv(
        self,
        cmd: Sequence[str],
        env: dict[str, str],
        *,
        user: str | None = None,
        timeout_s: float | None = None,
        interactive: bool = False,
        path: str | None = None,
    ) -> list[str]:
        """``cmd`` as ``user`` (default: the sandbox uid), with ``path`` as its PATH when given, else
        `ROOT_PATH` for a root exec and the harness's bin dirs plus the image's PATH otherwise."""
        s = self.spec
        argv = [self.engine, "exec"] + (["-i"] if interactive else [])
        argv += ["-u", user or f"{s.uid}:{s.uid}", "-w", s.workdir]
        full_env = self.env(env)
        if path is not None:
            full_env["PATH"] = path
        elif is_root(user):
            full_env["PATH"] = ROOT_PATH
        for key, value in full_env.items():
            argv += ["-e", f"{key}={value}"]
        argv.append(self.name)
        if timeout_s is not None:  # kills the in-container tree even if the client is gone
            argv += ["timeout", "-s", "KILL", str(int(timeout_s) + 1)]
        return argv + list(cmd)

    def kill_user_argv(self, user: str | None = None) -> list[str]:
        """Kill every process of ``user`` (default: the sandbox uid) in the container: ``kill -1`` as that
        user (root here has no CAP_KILL: only a uid can kill its own), again until none is left (one forked
        while the signal went round dies in the next), by the system's /bin/sh, never one found on the
        image's PATH (a directory that user may have written)."""
        return [
            self.engine,
            "exec",
            "-u",
            user or f"{self.spec.uid}:{self.spec.uid}",
            "-e",
            f"PATH={ROOT_PATH}",
            self.name,
            "/bin/sh",
            "-c",
            "i=0; while kill -KILL -1 2>/dev/null && [ $i -lt 100 ]; do i=$((i+1)); done; true",
        ]

    def setup_script(self, snapshot: bool = True, warm: bool = False) -> str:
        """HOME and the workdir made the sandbox uid's, then (``snapshot``) the base tree recorded;
        ``warm``: the image already has both (sandbox/warm_images.py), HOME is all there is to do."""
        s = self.spec
        home = f"mkdir -p {shlex.quote(s.home)} && chown {s.uid}:{s.uid} {shlex.quote(s.home)}"
        if warm:
            return home
        own = f"{home} && chown -hR {s.uid}:{s.uid} {shlex.quote(s.workdir)}"
        return f"{own} && {git_snapshot_script(s.workdir)}" if snapshot else own

    def cp_in_argv(self, src: Path, dst: str) -> list[str]:
        return [self.engine, "cp", f"{src}/." if src.is_dir() else str(src), f"{self.name}:{dst}"]

    def cp_out_argv(self, src: str, dst: Path) -> list[str]:
        return [self.engine, "cp", f"{self.name}:{src}", str(dst)]

    def rm_argv(self) -> list[str]:
        return [self.engine, "rm", "-f", "-t", "0", self.name]

    # --- host-side views (host root: the container's processes and host dirs, no program of the container
    # run) ---
    def host_dirs_root(self) -> Path:
        return Path(tempfile.gettempdir()) / "polar-host-dirs" / self.name

    def host_dir(self, inside: str) -> Path:
        """The host directory bound at ``inside`` (one of ``spec.host_dirs``)."""
        return self.host_dirs_root() / str(self.spec.host_dirs.index(inside))

    def host_uid(self, uid: int) -> int:
        """The host uid of the container's ``uid``."""
        return uid if self.userns_base is None else self.userns_base + uid

    def _make_host_dirs(self) -> None:
        root = self.host_dirs_root()
        root.mkdir(parents=True, mode=0o700)
        mount_quota(root, HOST_DIRS_BYTES)
        root.chmod(0o755)
        for inside in self.spec.host_dirs:
            self.host_dir(inside).mkdir(mode=0o700)

    def _remove_host_dirs(self) -> None:
        root = self.host_dirs_root()
        if os.path.ismount(root):
            subprocess.run(["umount", "-l", str(root)], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)

    def init_pid(self) -> int:
        """The host pid of the container's PID 1."""
        return int(
            engine_run([self.engine, "inspect", "--format", "{{.State.Pid}}", self.name]).decode().strip()
        )

    def host_processes(self) -> list[HostProcess]:
        """Every process in the container's pid namespace but its PID 1, read from the host's /proc."""
        init = self.init_pid()
        ns = os.stat(f"/proc/{init}/ns/pid").st_ino
        found = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or entry.name == str(init):
                continue
            try:
                if os.stat(f"/proc/{entry.name}/ns/pid").st_ino != ns:
                    continue
                found.append(HostProcess.read(int(entry.name), ns))
            except (OSError, ValueError):
                continue  # gone meanwhile
        return found

    def kill_inside(self, uid: int | None = None) -> None:
        """From the host: SIGKILL every process of the container (of its ``uid`` only, where given) but
        PID 1 and the keep-alive, again until none is left (one forked meanwhile dies in a later round).
        No program of the container runs (its root may be the agent's)."""
        host_uid = None if uid is None else self.host_uid(uid)
        for _ in range(100):
            left = [
                p
                for p in self.host_processes()
                if p.inner != self.keepalive_pid and (host_uid is None or p.uid == host_uid)
            ]
            if not left:
                return
            for p in left:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        raise ContainerError(f"{self.name}: processes kept appearing through 100 rounds of kills")

    def seal_harness(self) -> None:
        """As host root, an episode's Python harness install shown by a view the sealed harness alone enters
        (``views.harness_view``: its root the harness group's, mode 0750), mounted in a temp dir of
        its own and bound in place of the install; the forwarder, run as the container's root with
        ``FORWARDER_CAPS``, starts the harness with that group (``forwarder.py``, "Sealed harness"). In a
        user namespace of its own that group is the host gid the container's harness group maps to,
        fresh per container (its layer kept in the same temp dir); a root agent keeps ``CAP_SETGID`` in
        its namespace, so its install is sealed against a plain read only, and scanned
        (``tasks/answers.py``)."""
        s = self.spec
        if (
            os.geteuid() != 0
            or s.harness_dir is None
            or s.proxy_socket_dir is None
            or not holds_python_packages(s.harness_dir)
        ):
            return
        if s.scratch_root is not None:
            s.scratch_root.mkdir(parents=True, exist_ok=True)
        holder = Path(tempfile.mkdtemp(prefix="polar-harness-view-", dir=s.scratch_root))
        try:
            self.harness_view = harness_view(
                s.harness_dir, holder / "harness", self.host_uid(harness_gid(s.uid)), layer_under=holder
            )
        except SandboxUnavailable:
            shutil.rmtree(holder, ignore_errors=True)
            raise

    # --- lifecycle ---
    def reduce_history(self, target: history.HistoryTarget = history.TO_HEAD) -> str:
        """The repository at the workdir reduced to ``target`` (`sandbox/history.py`), by the image's git as
        root in this container; what it did (one line), or `HistoryNotReduced`."""
        try:
            out = engine_run(
                self.exec_argv(["sh", "-c", history.reduce_script(self.spec.workdir, target)], {}, user="0"),
                timeout_s=1800,
            )
        except ContainerError as exc:
            raise HistoryNotReduced(history.refusal(str(exc), f"{self.image} {self.spec.workdir}")) from None
        return history.reduced_line(out.decode(errors="replace"))

    def remove_hidden(self, paths: Sequence[str]) -> None:
        """``paths`` (a dataset's files its harness keeps from the agent: `Procedure.hidden`) removed as
        root, each found gone after (a path that stays fails the setup)."""
        if paths:
            engine_run(self.exec_argv(["sh", "-c", REMOVE_PATHS, "sh", *paths], {}, user="0"))

    @classmethod
    def create(
        cls,
        task_tree: Path | None,
        *,
        spec: SandboxSpec,
        image: str = "",
        engine: str = "docker",
        extra_ro_mounts: Sequence[tuple[str, str]] = (),
        snapshot: bool = True,
        warm: bool = False,
        history_target: history.HistoryTarget = history.TO_HEAD,
        setup_only: bool = False,
        hidden: Sequence[str] = (),
    ) -> ContainerSandbox:
        """Start a container of ``image``; ``task_tree`` (if given) replaces the image's /testbed; without
        ``snapshot`` no base tree is recorded (a container nobody diffs: a separate verifier's);
        ``warm``: ``image`` is a warm image, its tree already the uid's, reduced and recorded; otherwise
        the workdir's git history is reduced to ``history_target`` first (`reduce_history`), ``hidden``
        removed before (`remove_hidden`); ``setup_only``: a
        container nothing but the setup runs in (a warm image's, committed), which may hand the tree to
        root outside a user namespace (a user namespace's shifted owners would be committed)."""
        if not image:
            raise ValueError("a container sandbox needs an image (the task's `image`)")
        path = image_path(engine, image)
        warm = warm and task_tree is None
        sb = cls(
            spec,
            image,
            f"polar-{uuid.uuid4().hex[:12]}",
            engine=engine,
            path=path,
            extra_ro_mounts=extra_ro_mounts,
            setup_only=setup_only,
        )
        try:
            sb.workdir_quota = WorkdirQuota.make(engine, image, spec) if warm else None
            if spec.host_dirs:
                sb._make_host_dirs()
            sb.seal_harness()
            engine_run(sb.create_argv())
            engine_run(sb.start_argv())
            first = (
                f"{sb.setup_script(warm=True)} && {KEEPALIVE_SCRIPT}" if warm else KEEPALIVE_SCRIPT
            )  # one exec
            sb.keepalive_pid = keepalive_pid(engine_run(sb.exec_argv(["sh", "-c", first], {}, user="0")))
            if task_tree is not None:
                engine_run(
                    sb.exec_argv(
                        [
                            "sh",
                            "-c",
                            f"rm -rf {shlex.quote(spec.workdir)}/* {shlex.quote(spec.workdir)}/.[!.]*",
                        ],
                        {},
                        user="0",
                    )
                )
                engine_run(sb.cp_in_argv(task_tree, spec.workdir))
            if not warm:
                sb.remove_hidden(hidden)
                sb.history = sb.reduce_history(history_target)
                engine_run(sb.exec_argv(["sh", "-c", sb.setup_script(snapshot)], {}, user="0"))
        except BaseException:
            sb.remove()
            raise
        return sb

    async def run(
        self,
        cmd: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        timeout_s: float | Deadline = 600.0,
        stdin: bytes | None = None,
        max_output_bytes: int = 1 << 20,
        user: str | None = None,
    ) -> RunResult:
        """``cmd`` as the sandbox uid, or as ``user`` (a grader's root step: `exec_argv`'s root PATH)."""
        if self._destroyed:
            raise RuntimeError("sandbox destroyed")
        path, killed = None, user
        if runs_forwarder(cmd) and user is None and self.spec.proxy_socket_dir is not None:
            # the forwarder as root, with FORWARDER_CAPS, starts the harness as the sandbox uid (sealed)
            cmd = isolated_forwarder([*cmd[:2], "--user", f"{self.spec.uid}:{self.spec.uid}", *cmd[2:]])
            user, path = "0", self.env(env or {})["PATH"]
        argv = self.exec_argv(
            cmd, env or {}, user=user, timeout_s=bound_s(timeout_s), interactive=stdin is not None, path=path
        )
        return await run_process_tree(
            argv,
            timeout_s=timeout_s,
            stdin=stdin,
            max_output_bytes=max_output_bytes,
            on_timeout=lambda: self.kill_all(killed),
        )

    async def provide(self, inside: str) -> None:
        """A container keeps its files between execs: nothing to do (`ApptainerBox.provide` binds a dir)."""

    async def lock(self, paths: Sequence[str]) -> None:
        """The tested code cannot write ``paths`` from now on: handed to root, no write bit for others."""
        await lock_as_root(self, paths)

    def kill_all(self, user: str | None = None) -> None:
        """What the deadline does: nothing of the sandbox uid (or ``user``) survives in the container;
        as host root from the host (`kill_inside`: a root agent's uid is every process's, the keep-alive's
        too, and its programs are its own), else by ``kill -1`` as that user."""
        if os.geteuid() == 0:
            name = (user or str(self.spec.uid)).split(":")[0]
            self.kill_inside(int(name) if name.isdigit() else None)  # a user by name: all of them
            return
        subprocess.run(self.kill_user_argv(user), capture_output=True, timeout=60)

    async def copy_in(self, src: Path, dst: str) -> None:
        parent = str(Path(dst).parent)
        await asyncio.to_thread(engine_run, self.exec_argv(["mkdir", "-p", parent], {}))
        await asyncio.to_thread(engine_run, self.cp_in_argv(src, dst))
        await asyncio.to_thread(
            engine_run,
            self.exec_argv(["chown", "-hR", f"{self.spec.uid}:{self.spec.uid}", dst], {}, user="0"),
        )

    async def copy_out(self, src: str, dst: Path) -> None:
        await asyncio.to_thread(engine_run, self.cp_out_argv(src, dst))

    async def diff(self, exclude: Sequence[str] = BUILD_EXCLUDES) -> bytes:
        return await asyncio.to_thread(
            engine_run,
            self.exec_argv(["sh", "-c", git_diff_script(self.spec.workdir, exclude)], {}, user="0"),
        )

    def remove(self) -> None:
        try:
            subprocess.run(self.rm_argv(), capture_output=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if self.spec.host_dirs:
            self._remove_host_dirs()
        if self.workdir_quota is not None:
            self.workdir_quota.release()
            self.workdir_quota = None
        if self.harness_view is not None:
            unmount(self.harness_view)
            shutil.rmtree(self.harness_view.parent, ignore_errors=True)
            self.harness_view = None

    async def destroy(self) -> None:
        if not self._destroyed:
            self._destroyed = True
            await asyncio.to_thread(self.remove)
