"""Apptainer sandbox for clusters without Docker (HPC): SWE-bench images run as SIFs or ``docker://``.

Apptainer keeps no container alive between commands, so each ``run`` is one ``apptainer exec``
with ``--containall`` (own PID/IPC namespaces, clean env) and ``--net --network none``. The task
tree lives on the host (extracted from the image's /testbed at create, or copied from
``task_tree``) and is bound at /testbed, so copy and diff are host-side, as in bubblewrap.
`ApptainerBox` is the grader's box of the same image (rewards/image_grading.py), the role a fresh
container plays on podman and docker. Run by host root, every command of the agent (and the grader's
tests) runs as the spec's unprivileged uid (``--security uid:N,gid:N``), never as root, and the tree
and HOME are that uid's; the episode's diff is made by git inside the image, as that uid, with the
tree and the snapshot bound read-only, never by host git on the tree the agent wrote.
"""

from __future__ import annotations

import asyncio
import csv
import io
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path

from polar_env.sandbox import gitdiff, history
from polar_env.sandbox.base import (
    BUILD_EXCLUDES,
    DEFAULT_ENV,
    Deadline,
    RunResult,
    SandboxSpec,
    copy_path,
    run_process_tree,
)
from polar_env.sandbox.bubblewrap import (
    DIFF_GIT,
    DIFF_SCRATCH,
    DIFF_TIMEOUT_S,
    DIFF_TREE,
    FORWARDER_INSIDE,
    FORWARDER_SRC,
)
from polar_env.sandbox.cgroups import CgroupLimits
from polar_env.sandbox.container import (
    GIT_DIR_INSIDE,
    NODE_DIR_INSIDE,
    ROOT_PATH,
    ContainerError,
    HistoryNotReduced,
    is_root,
    lock_as_root,
)
from polar_env.sandbox.host_tree import HostTreeSandbox, chown_tree, copy_tree
from polar_env.sandbox.rootfs import host_node

ENGINE = "apptainer"


def is_apptainer_image(image: str) -> bool:
    """Whether ``image`` is already a reference apptainer takes (a local .sif or a docker:// URI)."""
    return image.startswith("docker://") or image.endswith(".sif")


def apptainer_image(image: str) -> str:
    """A task's ``image`` as apptainer takes it: a local .sif path, or a registry name as docker://."""
    return image if is_apptainer_image(image) else f"docker://{image}"


def user_flags(spec: SandboxSpec, user: str | None = None) -> list[str]:
    """Run by host root, a command runs as the spec's uid (``user`` root: a grader's root step); run
    unprivileged, apptainer runs it as the caller, who is no root."""
    if os.geteuid() != 0 or is_root(user):
        return []
    return ["--security", f"uid:{spec.uid},gid:{spec.uid}"]


def _owner(spec: SandboxSpec) -> tuple[int, int] | None:
    """Who owns what the agent writes: the spec's uid where the host is root."""
    return (spec.uid, spec.uid) if os.geteuid() == 0 else None


def env_flag(key: str, value: str) -> str:
    """One ``--env`` value: apptainer reads the flag as CSV pairs, so a value holding a comma or a quote
    is quoted as one CSV field (it would otherwise become two variables)."""
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow([f"{key}={value}"])
    return out.getvalue()


class ApptainerSandbox(HostTreeSandbox):
    engine = "apptainer"

    def __init__(
        self,
        spec: SandboxSpec,
        image: str,
        root: Path,
        extra_ro_mounts: Sequence[tuple[str, str]] = (),
        isolate_network: bool = True,
    ):
        self.spec = spec
        self.image = image  # a .sif path or docker://swebench/sweb.eval...
        self.root = root  # host dir: testbed/ home/ git/
        self.extra_ro_mounts = list(extra_ro_mounts)
        self.isolate_network = isolate_network  # --network none needs root or --fakeroot on most sites
        self.clone = ""  # how the tree was copied from its warm base ("reflink" or "copy")
        self._destroyed = False

    def exec_argv(self, cmd: Sequence[str], env: dict[str, str]) -> list[str]:
        s = self.spec
        argv = [
            self.engine,
            "exec",
            "--containall",
            "--cleanenv",
            "--writable-tmpfs",
            "--no-mount",
            "cwd",
            "--hostname",
            s.hostname,
            "--home",
            f"{self.root / 'home'}:{s.home}",
            "--pwd",
            s.workdir,
            *user_flags(s),
        ]
        if self.isolate_network:
            argv += ["--net", "--network", "none"]
        binds = [f"{self.testbed}:{s.workdir}", f"{FORWARDER_SRC}:{FORWARDER_INSIDE}:ro"]
        full_env = {**s.base_env(), **env}
        if s.harness_dir is not None:
            binds.append(f"{s.harness_dir}:/opt/harness:ro")
            if (
                node := host_node()
            ) is not None:  # an npm harness in an image without Node.js, as in a container
                binds.append(f"{node}:{NODE_DIR_INSIDE}/node:ro")
                full_env["PATH"] = f"{NODE_DIR_INSIDE}:{full_env['PATH']}"
        if s.proxy_socket_dir is not None:
            binds.append(f"{s.proxy_socket_dir}:/run/proxy:ro")
        binds += [f"{src}:{dst}:ro" for src, dst in self.extra_ro_mounts]
        for bind in binds:
            argv += ["--bind", bind]
        for key, value in full_env.items():
            argv += ["--env", env_flag(key, value)]
        return argv + [self.image, *cmd]

    def diff_argv(self, scratch: Path, exclude: Sequence[str] = BUILD_EXCLUDES) -> list[str]:
        """git in the image, as the agent's uid, on the tree and the snapshot bound read-only (and the base's
        objects a borrowed snapshot reads, where they are on the host), writing only ``scratch``."""
        argv = [
            self.engine,
            "exec",
            "--containall",
            "--cleanenv",
            "--no-mount",
            "cwd",
            "--pwd",
            DIFF_TREE,
            *user_flags(self.spec),
        ]
        if self.isolate_network:
            argv += ["--net", "--network", "none"]
        binds = [
            f"{self.testbed}:{DIFF_TREE}:ro",
            f"{self.git_dir}:{DIFF_GIT}:ro",
            f"{scratch}:{DIFF_SCRATCH}",
            *(f"{path}:{path}:ro" for path in gitdiff.alternates_of(self.git_dir)),
        ]
        for bind in binds:
            argv += ["--bind", bind]
        for key, value in gitdiff.sandboxed_diff_env(DIFF_TREE, DIFF_GIT, DIFF_SCRATCH).items():
            argv += ["--env", env_flag(key, value)]
        return argv + [
            self.image,
            "/bin/sh",
            "-c",
            gitdiff.diff_script(gitdiff.base_of(self.git_dir), exclude),
        ]

    def extract_argv(self, dest: Path) -> list[str]:
        """Copy the image's own /testbed out to the host (the SWE-bench base checkout)."""
        return [
            self.engine,
            "exec",
            "--containall",
            "--bind",
            f"{dest}:/polar-out",
            self.image,
            "cp",
            "-a",
            f"{self.spec.workdir}/.",
            "/polar-out/",
        ]

    def reduce_argv(self, tree: Path, target: history.HistoryTarget) -> list[str]:
        """The copied-out ``tree``'s git history reduced to ``target`` by the image's git, the tree bound at
        the workdir and nothing else (sandbox/history.py): never the host's git on a tree an image brought."""
        return [
            self.engine,
            "exec",
            "--containall",
            "--cleanenv",
            "--no-mount",
            "cwd",
            "--net",
            "--network",
            "none",
            "--bind",
            f"{tree}:{self.spec.workdir}",
            "--pwd",
            "/",
            self.image,
            "/bin/sh",
            "-c",
            history.reduce_script(self.spec.workdir, target),
        ]

    @classmethod
    def create(
        cls,
        task_tree: Path | None,
        *,
        spec: SandboxSpec,
        image: str = "",
        extra_ro_mounts: Sequence[tuple[str, str]] = (),
        isolate_network: bool = True,
        snapshot: Path | None = None,
    ) -> ApptainerSandbox:
        """A sandbox of ``image`` with a copy of ``task_tree`` (with ``snapshot``: the warm base's git
        dir, borrowed, tasks/base_trees.py), or the image's own tree copied out now."""
        if not image:
            raise ValueError("ApptainerSandbox needs an image (a .sif or docker://...)")
        if spec.scratch_root is not None:
            spec.scratch_root.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="polar-apptainer-", dir=spec.scratch_root))
        sb = cls(spec, image, root, extra_ro_mounts, isolate_network)
        (root / "home").mkdir()
        if (owner := _owner(spec)) is not None:
            os.chown(root / "home", *owner)
        if task_tree is not None:
            sb.clone = copy_tree(task_tree, sb.testbed, owner=owner)
        else:
            sb.testbed.mkdir()
            try:
                extract_image_tree(image, spec, sb.testbed)
                reduce_image_tree(image, spec, sb.testbed)
                if owner is not None:
                    chown_tree(sb.testbed, *owner)
            except RuntimeError:
                shutil.rmtree(root, ignore_errors=True)
                raise
        if snapshot is not None and task_tree is not None:
            gitdiff.borrow_snapshot(snapshot, sb.git_dir)
        else:
            gitdiff.snapshot(sb.testbed, sb.git_dir)
        return sb

    async def run(
        self,
        cmd: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        timeout_s: float | Deadline = 600.0,
        stdin: bytes | None = None,
        max_output_bytes: int = 1 << 20,
    ) -> RunResult:
        return await run_process_tree(
            self.exec_argv(cmd, env or {}),
            timeout_s=timeout_s,
            stdin=stdin,
            max_output_bytes=max_output_bytes,
        )

    async def copy_in(self, src: Path, dst: str) -> None:
        target = self.host_path(dst)
        copy_path(src, target)
        if (owner := _owner(self.spec)) is not None:
            chown_tree(target, *owner)

    async def diff(self, exclude: Sequence[str] = BUILD_EXCLUDES) -> bytes:
        """The episode's patch, made by git inside the image (`diff_argv`), never by host git on the tree
        the agent wrote."""
        scratch = Path(tempfile.mkdtemp(prefix="diff-", dir=self.root))
        try:
            if (owner := _owner(self.spec)) is not None:
                os.chown(scratch, *owner)
            proc = await asyncio.to_thread(
                subprocess.run, self.diff_argv(scratch, exclude), capture_output=True, timeout=DIFF_TIMEOUT_S
            )
        finally:
            await asyncio.to_thread(shutil.rmtree, scratch, True)
        if proc.returncode != 0:
            raise RuntimeError(
                f"git diff in the image failed ({proc.returncode}): "
                f"{proc.stderr.decode(errors='replace')[-2000:]}"
            )
        return proc.stdout


def extract_image_tree(image: str, spec: SandboxSpec, dest: Path) -> None:
    """``image``'s own tree (``spec.workdir``: the SWE-bench base checkout) copied out to ``dest``, an
    existing empty dir (once per node and image: tasks/base_trees.py ``warm_image_base``)."""
    try:
        proc = subprocess.run(ApptainerSandbox(spec, image, dest).extract_argv(dest), capture_output=True)
    except FileNotFoundError:
        raise ContainerError(f"{ENGINE} is not installed (polar doctor says how to install it)") from None
    if proc.returncode != 0:
        raise ContainerError(f"apptainer extract failed: {proc.stderr.decode(errors='replace')[-2000:]}")


def reduce_image_tree(
    image: str, spec: SandboxSpec, tree: Path, target: history.HistoryTarget = history.TO_HEAD
) -> str:
    """The git history of ``tree`` (copied out of ``image`` by `extract_image_tree`) reduced to ``target``
    inside the image (`ApptainerSandbox.reduce_argv`); what it did (one line), or `HistoryNotReduced`."""
    try:
        proc = subprocess.run(
            ApptainerSandbox(spec, image, tree).reduce_argv(tree, target), capture_output=True, timeout=1800
        )
    except FileNotFoundError:
        raise ContainerError(f"{ENGINE} is not installed (polar doctor says how to install it)") from None
    if proc.returncode != 0:
        raise HistoryNotReduced(
            history.refusal(proc.stderr.decode(errors="replace"), f"{image} {spec.workdir}")
        )
    return history.reduced_line(proc.stdout.decode(errors="replace"))


class ApptainerBox:
    """A fresh, network-less box of an apptainer image for a grader. Apptainer keeps nothing between
    execs, so every path a grader writes and reads back is a host dir bound in: the task tree at the
    workdir (a copy of the image's own tree, made warm once per node), its base snapshot read-only at
    ``GIT_DIR_INSIDE`` (what the image graders' scripts diff against, as in a container), and each path
    `provide`d. As host root a command runs as the spec's uid (``--security uid:N,gid:N``) and a root
    step as root; unprivileged, both run as the caller, and `lock` binds the paths read-only instead of
    handing them to root: either way the tested code cannot write them. The box's commands share one
    cgroup (memory, pids), killed whole at a deadline."""

    engine = ENGINE

    def __init__(
        self,
        spec: SandboxSpec,
        image: str,
        root: Path,
        binds: dict[str, Path],
        read_only: set[str] | None = None,
        cgroups: CgroupLimits | None = None,
    ):
        self.spec = spec
        self.image = image
        self.root = root  # host dir holding the box's bound dirs
        self.binds = binds  # path inside -> host dir
        self.read_only = read_only if read_only is not None else set()  # binds made read-only
        self.cgroups = cgroups
        self._destroyed = False

    @classmethod
    def create(cls, image: str, *, spec: SandboxSpec, base_tree: Path, base_git: Path) -> ApptainerBox:
        """A box whose tree is a copy of ``base_tree`` (the image's tree, snapshotted in ``base_git``)."""
        if spec.scratch_root is not None:
            spec.scratch_root.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="polar-apptainer-grade-", dir=spec.scratch_root))
        try:
            copy_tree(base_tree, root / "testbed", owner=_owner(spec))
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return cls(
            spec,
            image,
            root,
            {spec.workdir: root / "testbed", GIT_DIR_INSIDE: base_git},
            {GIT_DIR_INSIDE},
            CgroupLimits(f"grade-{root.name}", spec.memory_bytes, spec.pids_max),
        )

    def exec_argv(self, cmd: Sequence[str], env: dict[str, str], *, user: str | None = None) -> list[str]:
        """``cmd`` as the spec's uid (host root) or the caller; ``user`` root: a grader's root step, with
        `ROOT_PATH`. Other commands keep the image's own PATH (its toolchain)."""
        s = self.spec
        argv = [
            self.engine,
            "exec",
            "--containall",
            "--cleanenv",
            "--writable-tmpfs",
            "--no-mount",
            "cwd",
            "--net",
            "--network",
            "none",
            "--hostname",
            s.hostname,
            "--pwd",
            s.workdir,
        ]
        argv += user_flags(s, user)
        for inside, host in sorted(self.binds.items()):
            argv += ["--bind", f"{host}:{inside}" + (":ro" if inside in self.read_only else "")]
        full_env = {**DEFAULT_ENV, **env}
        if is_root(user):
            full_env["PATH"] = ROOT_PATH
        for key, value in full_env.items():
            argv += ["--env", env_flag(key, value)]
        return argv + [self.image, *cmd]

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
        if self._destroyed:
            raise RuntimeError("sandbox destroyed")
        groups = self.cgroups if self.cgroups is not None and self.cgroups.dirs else None
        try:
            return await run_process_tree(
                self.exec_argv(cmd, env or {}, user=user),
                timeout_s=timeout_s,
                stdin=stdin,
                max_output_bytes=max_output_bytes,
                preexec_fn=groups and groups.join,
                on_timeout=groups and groups.kill_all,
            )
        except FileNotFoundError:
            raise ContainerError(
                f"{self.engine} is not installed (polar doctor says how to install it)"
            ) from None

    def _bind_of(self, inside: str) -> tuple[str, Path]:
        """(the bind holding ``inside``, ``inside`` as a host path); ``..`` resolved first."""
        p = Path(os.path.normpath(inside))
        for mount, host in sorted(self.binds.items(), key=lambda kv: -len(kv[0])):
            if p == Path(mount) or Path(mount) in p.parents:
                return mount, host / p.relative_to(mount)
        raise ValueError(f"{inside} is not under a path the box binds ({', '.join(sorted(self.binds))})")

    async def provide(self, inside: str) -> None:
        """``inside`` an empty directory that outlives each exec (a host dir bound there from now on)."""
        host = self.root / f"bind-{uuid.uuid4().hex[:12]}"
        host.mkdir()
        if (owner := _owner(self.spec)) is not None:
            os.chown(host, *owner)
        self.binds[inside] = host

    async def copy_in(self, src: Path, dst: str) -> None:
        """As a container's ``copy_in``: the copy is the spec uid's."""
        target = self._bind_of(dst)[1]
        await asyncio.to_thread(copy_path, src, target)
        if (owner := _owner(self.spec)) is not None:
            await asyncio.to_thread(chown_tree, target, *owner)

    async def lock(self, paths: Sequence[str]) -> None:
        """The tested code cannot write ``paths`` from now on: handed to root (host root), else bound
        read-only."""
        if os.geteuid() != 0:
            self.read_only.update(self._bind_of(p)[0] for p in paths)
            return
        await lock_as_root(self, paths)

    async def destroy(self) -> None:
        if not self._destroyed:
            self._destroyed = True
            if self.cgroups is not None:
                self.cgroups.kill_all()
                self.cgroups.remove()
            await asyncio.to_thread(shutil.rmtree, self.root, True)
