"""The one sandbox interface every backend (bubblewrap, docker, apptainer) implements.

A sandbox holds one task tree at a fixed path (``/testbed``) and runs commands in it with a
deadline, a fixed environment and no network except the proxy. Everything a harness reads into
its first request (cwd, HOME, user, hostname, timezone, env) comes from :class:`SandboxSpec`, so
it is identical across the rollouts of a task (docs/architecture.md, "The token path": GRPO groups by
first-prompt ids).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from polar_env.sandbox.output import BoundedOutput, OutputStats

# Build artefacts and caches that are never part of the agent's patch (docs/rewards.md); each
# harness adds its own state dirs (harness_adapters.registry.NOISE_EXCLUDES).
BUILD_EXCLUDES: tuple[str, ...] = (
    "__pycache__",
    "*.pyc",
    "*.pyo",
    "*.egg-info",
    ".pytest_cache",
    "build",
    "dist",
    ".eggs",
    ".tox",
    ".mypy_cache",
    ".ruff_cache",
    "node_modules",
)
# Excluded only at the repository root: a package may hold real source in a nested ``build/`` or
# ``dist/`` (pip's ``operations/build/``), and a fix there must reach the grader.
ROOT_ONLY_EXCLUDES: frozenset[str] = frozenset({"build", "dist", ".eggs"})
# Where an npm harness install keeps its executables (harness_adapters/sources.py). A Python venv's
# bin/ stays off PATH: its launcher is absolute, and on PATH its python/pip would replace the task's
# for every command the agent runs.
HARNESS_BIN_DIRS = "/opt/harness/node_modules/.bin"

DEFAULT_ENV: dict[str, str] = {"TZ": "UTC", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb"}


@dataclass(frozen=True)
class SandboxSpec:
    """Everything that shapes what runs inside; identical specs give identical sandboxes."""

    proxy_socket_dir: Path | None = None  # host dir holding the proxy's Unix socket, bound at /run/proxy
    proxy_socket_name: str = "proxy.sock"
    proxy_port: int = 18080  # loopback port inside the sandbox where the forwarder listens
    harness_dir: Path | None = None  # harness install, mounted read-only at /opt/harness
    workdir: str = "/testbed"
    home: str = "/home/agent"
    user: str = "agent"
    uid: int = 1000  # unprivileged uid the sandbox runs as when the host is root
    hostname: str = "sandbox"
    env: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_ENV))
    memory_bytes: int | None = 8 << 30
    pids_max: int | None = 4096
    cpus: float | None = None  # containers: --cpus (a Harbor task's [environment] cpus)
    storage_bytes: int | None = (
        None  # containers: --storage-opt size= (where the engine's storage supports it)
    )
    gpus: int | None = None  # containers: that many NVIDIA GPUs (podman: CDI devices nvidia.com/gpu=<i>)
    # quota of the writable paths (/testbed, HOME, /tmp together): a sized tmpfs in bubblewrap, sized
    # tmpfs mounts in containers; a write past it fails with ENOSPC
    disk_bytes: int | None = 2 << 30
    scratch_root: Path | None = None  # where per-sandbox host dirs go (default: a temp dir)
    # containers: run in a user namespace of their own (container root is an unprivileged host uid); a
    # Harbor task's container always is, and only such a container may run the agent as root (``uid`` 0)
    userns: bool = False
    # containers: paths backed by fresh host directories (root's, unreadable inside until the host hands
    # them over: a Harbor verifier's /logs/verifier, /tests and HOME; rewards/harbor_verifier.py)
    host_dirs: tuple[str, ...] = ()

    @property
    def socket_path_inside(self) -> str:
        return f"/run/proxy/{self.proxy_socket_name}"

    def base_env(self) -> dict[str, str]:
        """The fixed environment of every command (callers add their own on top)."""
        path = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
        if self.harness_dir is not None:
            path = f"{HARNESS_BIN_DIRS}:{path}"
        return {
            **self.env,
            "HOME": self.home,
            "USER": self.user,
            "LOGNAME": self.user,
            "HOSTNAME": self.hostname,
            "SHELL": "/bin/bash",
            "PATH": path,
            "PWD": self.workdir,
        }


@dataclass
class Deadline:
    """A deadline whose clock stops while ``paused_s()`` grows: a harness is not timed while one of
    its calls waits for a run slot (proxy/run_slots.py). ``bound_s`` is the
    latest it can be, for engines that need a fixed bound (a container's in-container ``timeout``)."""

    timeout_s: float
    paused_s: Callable[[], float] = lambda: 0.0
    max_pause_s: float = 86400.0

    @property
    def bound_s(self) -> float:
        return self.timeout_s + self.max_pause_s

    def left_s(self, elapsed_s: float) -> float:
        return self.timeout_s + min(self.paused_s(), self.max_pause_s) - elapsed_s


def bound_s(timeout: float | Deadline) -> float:
    """The latest a command with this deadline may end."""
    return timeout.bound_s if isinstance(timeout, Deadline) else timeout


@dataclass
class RunResult:
    exit_code: int | None  # None when killed at the deadline
    stdout_tail: str
    stderr_tail: str
    timed_out: bool
    duration_s: float
    stdout_bytes: int = 0  # total bytes written, of which only the tail is kept
    stderr_bytes: int = 0
    output_stats: OutputStats = field(default_factory=OutputStats)  # stdout's (both streams', merged)


class Sandbox(ABC):
    """Create from a task tree, run with a deadline, copy in/out, diff, destroy."""

    spec: SandboxSpec

    @classmethod
    @abstractmethod
    def create(cls, task_tree: Path | None, *, spec: SandboxSpec) -> Sandbox: ...

    @abstractmethod
    async def run(
        self,
        cmd: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        timeout_s: float | Deadline = 600.0,
        stdin: bytes | None = None,
        max_output_bytes: int = 1 << 20,
    ) -> RunResult:
        """Run ``cmd`` in the workdir; the whole process tree dies at ``timeout_s`` (a number, or a
        Deadline)."""

    @abstractmethod
    async def copy_in(self, src: Path, dst: str) -> None:
        """Copy a host file or directory to ``dst`` (an absolute path inside the sandbox)."""

    @abstractmethod
    async def copy_out(self, src: str, dst: Path) -> None:
        """Copy ``src`` (inside the sandbox) to the host path ``dst``."""

    @abstractmethod
    async def diff(self, exclude: Sequence[str] = BUILD_EXCLUDES) -> bytes:
        """Binary-safe ``git diff`` of the workdir against its state at creation."""

    @abstractmethod
    async def destroy(self) -> None:
        """Kill what still runs and remove every host-side trace; idempotent."""


def copy_path(src: Path, dst: Path) -> None:
    """Copy a file or a directory tree (symlinks kept), creating ``dst``'s parent."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst)


def exclude_pathspecs(exclude: Sequence[str]) -> list[str]:
    """Git pathspecs that drop ``exclude`` at any depth (a name matches a dir or a file), except
    ``ROOT_ONLY_EXCLUDES``, dropped at the root only."""
    specs = ["."]
    for pat in exclude:
        if pat in ROOT_ONLY_EXCLUDES:
            specs.append(f":(exclude,literal){pat}")
            continue
        specs.append(f":(exclude,glob)**/{pat}")
        specs.append(f":(exclude,glob)**/{pat}/**")
    return specs


async def _pump(stream: asyncio.StreamReader | None, kept: BoundedOutput) -> None:
    if stream is None:
        return
    while chunk := await stream.read(65536):
        kept.feed(chunk)


async def run_process_tree(
    argv: Sequence[str],
    *,
    timeout_s: float | Deadline,
    stdin: bytes | None,
    max_output_bytes: int,
    env: dict[str, str] | None = None,
    preexec_fn=None,
    on_timeout=None,
    pass_fds: Sequence[int] = (),
    merge_output: bool = False,
    head_bytes: int = 0,
    before_stdin: Callable[[], Awaitable[None]] | None = None,
) -> RunResult:
    """Run a host process in its own session; at the deadline SIGKILL its process group. The one way a
    command runs in a sandbox with a deadline: every engine's ``Sandbox.run`` and the graders' runs.

    ``on_timeout`` (sync) may kill more (a container, a cgroup) before the group is reaped.
    ``pass_fds`` stay open in the child (a supervisor's pipes); ``merge_output`` sends stderr into
    stdout, one stream; ``head_bytes`` keeps that much of its start too (a grader's log:
    `BoundedOutput`), else only the last ``max_output_bytes``; ``before_stdin`` is awaited once the
    process runs and before ``stdin`` is written (a gate: the child waits on its first line).
    """
    start = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_output else subprocess.PIPE,
        env=env,
        start_new_session=True,
        preexec_fn=preexec_fn,
        pass_fds=tuple(pass_fds),
    )
    out, err = BoundedOutput(max_output_bytes, head_bytes), BoundedOutput(max_output_bytes)

    async def feed_stdin() -> None:
        if before_stdin is not None:
            await before_stdin()
        if stdin is not None and proc.stdin is not None:
            try:
                proc.stdin.write(stdin)
                await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError):
                pass
            finally:
                proc.stdin.close()

    work = asyncio.gather(feed_stdin(), _pump(proc.stdout, out), _pump(proc.stderr, err), proc.wait())
    deadline = timeout_s if isinstance(timeout_s, Deadline) else Deadline(timeout_s)
    timed_out = False
    try:
        while (left := deadline.left_s(time.monotonic() - start)) > 0:  # a paused clock moves it on
            try:
                await asyncio.wait_for(asyncio.shield(work), left)
                break
            except TimeoutError:
                continue
        else:
            raise TimeoutError
    except TimeoutError:
        timed_out = True
        if on_timeout is not None:
            on_timeout()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        # Pipes may be held open by escaped grandchildren; do not wait on them forever.
        try:
            await asyncio.wait_for(work, 10)
        except TimeoutError:
            work.cancel()
    except asyncio.CancelledError:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        raise
    text, stats = out.text_and_stats()
    return RunResult(
        exit_code=None if timed_out else proc.returncode,
        stdout_tail=text,
        stderr_tail=err.text(),
        timed_out=timed_out,
        duration_s=time.monotonic() - start,
        stdout_bytes=out.total,
        stderr_bytes=err.total,
        output_stats=stats,
    )
