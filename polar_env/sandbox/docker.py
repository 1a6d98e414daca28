"""Docker sandbox for production SWE-bench images (``swebench/sweb.eval.x86_64.<id>``).

One long-lived container per episode (``--network none``; the proxy's socket dir bind-mounted at
/run/proxy and reached through the forwarder, as in bubblewrap), commands by ``docker exec`` as
an unprivileged uid, ``docker rm -f`` on destroy. The argv builders are pure so they are unit
tested without an engine; the methods only execute them.
"""

from __future__ import annotations

import shlex
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path

from polar_env.sandbox.base import (
    NOISE_EXCLUDES,
    RunResult,
    Sandbox,
    SandboxSpec,
    exclude_pathspecs,
    run_process_tree,
)
from polar_env.sandbox.bubblewrap import FORWARDER_INSIDE, FORWARDER_SRC

BASE_FILE = "/tmp/.polar-base-tree"


def git_snapshot_script(workdir: str) -> str:
    """Shell run inside the container: record the base tree without touching HEAD or the index."""
    return (f"cd {shlex.quote(workdir)} && git config --global --add safe.directory '*' && "
            f"GIT_INDEX_FILE=/tmp/.polar-base.index git add -A . && "
            f"GIT_INDEX_FILE=/tmp/.polar-base.index git write-tree > {BASE_FILE}")


def git_diff_script(workdir: str, exclude: Sequence[str]) -> str:
    specs = " ".join(shlex.quote(s) for s in exclude_pathspecs(exclude))
    return (f"cd {shlex.quote(workdir)} && rm -f /tmp/.polar-now.index && "
            f"GIT_INDEX_FILE=/tmp/.polar-now.index git add -A . && "
            f"now=$(GIT_INDEX_FILE=/tmp/.polar-now.index git write-tree) && "
            f"git diff --binary --no-color --no-ext-diff $(cat {BASE_FILE}) $now -- {specs}")


class DockerSandbox(Sandbox):
    engine = "docker"

    def __init__(self, spec: SandboxSpec, image: str, name: str,
                 extra_ro_mounts: Sequence[tuple[str, str]] = ()):
        self.spec = spec
        self.image = image
        self.name = name
        self.extra_ro_mounts = list(extra_ro_mounts)  # e.g. a Node.js install the harness needs
        self._destroyed = False

    # --- argv builders (pure) ---
    def create_argv(self) -> list[str]:
        s = self.spec
        argv = [self.engine, "create", "--name", self.name, "--hostname", s.hostname, "--network", "none",
                "--workdir", s.workdir, "--init", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
        if s.memory_bytes is not None:
            argv += ["--memory", str(s.memory_bytes), "--memory-swap", str(s.memory_bytes)]
        if s.pids_max is not None:
            argv += ["--pids-limit", str(s.pids_max)]
        mounts = [(str(FORWARDER_SRC), FORWARDER_INSIDE, "ro")]
        if s.harness_dir is not None:
            mounts.append((str(s.harness_dir), "/opt/harness", "ro"))
        if s.proxy_socket_dir is not None:
            mounts.append((str(s.proxy_socket_dir), "/run/proxy", "ro"))
        mounts += [(src, dst, "ro") for src, dst in self.extra_ro_mounts]
        for src, dst, mode in mounts:
            argv += ["-v", f"{src}:{dst}:{mode}"]
        argv += ["--tmpfs", f"{s.home}:uid={s.uid},gid={s.uid},mode=0755"]
        for key, value in s.env.items():
            argv += ["-e", f"{key}={value}"]
        return argv + [self.image, "sleep", "infinity"]

    def start_argv(self) -> list[str]:
        return [self.engine, "start", self.name]

    def exec_argv(self, cmd: Sequence[str], env: dict[str, str], *, user: str | None = None,
                  timeout_s: float | None = None, interactive: bool = False) -> list[str]:
        s = self.spec
        argv = [self.engine, "exec"] + (["-i"] if interactive else [])
        argv += ["-u", user or f"{s.uid}:{s.uid}", "-w", s.workdir]
        for key, value in {**s.base_env(), **env}.items():
            argv += ["-e", f"{key}={value}"]
        argv.append(self.name)
        if timeout_s is not None:  # kills the in-container tree even if the client is gone
            argv += ["timeout", "-s", "KILL", str(int(timeout_s) + 1)]
        return argv + list(cmd)

    def cp_in_argv(self, src: Path, dst: str) -> list[str]:
        return [self.engine, "cp", f"{src}/." if src.is_dir() else str(src), f"{self.name}:{dst}"]

    def cp_out_argv(self, src: str, dst: Path) -> list[str]:
        return [self.engine, "cp", f"{self.name}:{src}", str(dst)]

    def rm_argv(self) -> list[str]:
        return [self.engine, "rm", "-f", self.name]

    # --- lifecycle ---
    def _sh(self, argv: list[str]) -> bytes:
        proc = subprocess.run(argv, capture_output=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv[:3])} failed: {proc.stderr.decode(errors='replace')[-2000:]}")
        return proc.stdout

    @classmethod
    def create(cls, task_tree: Path | None, *, spec: SandboxSpec, image: str = "",
               extra_ro_mounts: Sequence[tuple[str, str]] = ()) -> DockerSandbox:
        """Start a container of ``image``; ``task_tree`` (if given) replaces the image's /testbed."""
        if not image:
            raise ValueError("DockerSandbox needs an image (see swebench_image)")
        sb = cls(spec, image, f"polar-{uuid.uuid4().hex[:12]}", extra_ro_mounts)
        sb._sh(sb.create_argv())
        sb._sh(sb.start_argv())
        if task_tree is not None:
            sb._sh(sb.cp_in_argv(task_tree, spec.workdir))
        sb._sh(sb.exec_argv(["sh", "-c", f"chown -R {spec.uid}:{spec.uid} {shlex.quote(spec.workdir)} && "
                             + git_snapshot_script(spec.workdir)], {}, user="0"))
        return sb

    async def run(self, cmd: Sequence[str], *, env: dict[str, str] | None = None, timeout_s: float = 600.0,
                  stdin: bytes | None = None, max_output_bytes: int = 1 << 20) -> RunResult:
        argv = self.exec_argv(cmd, env or {}, timeout_s=timeout_s, interactive=stdin is not None)
        return await run_process_tree(argv, timeout_s=timeout_s, stdin=stdin, max_output_bytes=max_output_bytes)

    async def copy_in(self, src: Path, dst: str) -> None:
        self._sh(self.cp_in_argv(src, dst))
        self._sh(self.exec_argv(["chown", "-R", f"{self.spec.uid}:{self.spec.uid}", dst], {}, user="0"))

    async def copy_out(self, src: str, dst: Path) -> None:
        self._sh(self.cp_out_argv(src, dst))

    async def diff(self, exclude: Sequence[str] = NOISE_EXCLUDES) -> bytes:
        return self._sh(self.exec_argv(["sh", "-c", git_diff_script(self.spec.workdir, exclude)], {}, user="0"))

    async def destroy(self) -> None:
        if not self._destroyed:
            self._destroyed = True
            subprocess.run(self.rm_argv(), capture_output=True)
