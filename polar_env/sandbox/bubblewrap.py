"""The local default sandbox: bubblewrap with no network but the proxy (docs/architecture.md, "An episode").

Layout inside: the sandbox root's read-only ``/usr`` and ``/etc`` (``polar_env.sandbox.rootfs``, a
minimal Debian, never the host's; a generated passwd/group names the sandbox user), the task copy
at ``/testbed``, HOME and ``/tmp`` bound from per-sandbox host dirs (so adapters can write config
before and read state after a run), the harness install read-only at ``/opt/harness`` (the root and the
install, as host root, through overlays on the sandbox's tmpfs that name no host path:
``polar_env.sandbox.views``; the install's the sealed harness's alone, not the agent's commands':
``forwarder.py``, "Sealed harness"), the proxy's socket dir at ``/run/proxy``, and the forwarder at
``/opt/polar/forwarder.py``. As host root those per-sandbox dirs live on one tmpfs of ``spec.disk_bytes``
mounted at the sandbox's root dir: the quota of everything the episode can write, and bind sources whose paths
(``/testbed``, ``/home``) name nothing of the host in the sandbox's mountinfo. The base snapshot is kept
beside it, off the quota, so a full disk cannot stop the diff. ``--unshare-all`` leaves only ``lo``. When the
host runs as root the sandbox leases a host uid of its own, which owns the task copy and HOME, and every
command runs in a user namespace that uid made, showing it as the spec's uid (``polar_env.sandbox.identity``:
no per-user budget is shared with a sibling), ``setpriv`` dropping to it; memory/pids
limits apply through cgroup v2 where we can delegate, else cgroup v1 (``polar_env.sandbox.cgroups``).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from polar_env.sandbox import gitdiff
from polar_env.sandbox.base import (
    BUILD_EXCLUDES,
    Deadline,
    RunResult,
    SandboxSpec,
    copy_path,
    run_process_tree,
)
from polar_env.sandbox.bwrap_argv import BwrapCommand, Mount, can_seal
from polar_env.sandbox.cgroups import CgroupLimits
from polar_env.sandbox.forwarder import harness_gid
from polar_env.sandbox.host_tree import HostTreeSandbox, chown_tree, copy_tree
from polar_env.sandbox.identity import Identity, attached, lease, user_namespace
from polar_env.sandbox.views import harness_view, holds_python_packages, mount_tmpfs, system_view, unmount

FORWARDER_SRC = Path(__file__).with_name("forwarder.py")
FORWARDER_INSIDE = "/opt/polar/forwarder.py"
HARNESS_GROUP = "harness"  # the name of the effective gid the forwarder gives the harness, in /etc/group
# the diff's own sandbox (``BubblewrapSandbox.diff``)
DIFF_TREE, DIFF_GIT, DIFF_SCRATCH = "/testbed", "/polar/git", "/polar/scratch"
DIFF_TIMEOUT_S = 600.0


def _mount_quota(root: Path, size: int | None) -> None:
    """A tmpfs of ``size`` bytes at ``root`` (host root only: unprivileged, there is no quota)."""
    if size is None or os.geteuid() != 0:
        return
    mount_tmpfs(root, size, "polar-sandbox")


def runs_forwarder(cmd: Sequence[str]) -> bool:
    """Whether ``cmd`` is ``PYTHON FORWARDER_INSIDE ...``: the one command a sandbox starts privileged."""
    return list(cmd[1:2]) == [FORWARDER_INSIDE]


def isolated_forwarder(cmd: Sequence[str]) -> list[str]:
    """``cmd`` (`runs_forwarder`) with its interpreter isolated (``-I``): no ``PYTHON*`` variable, no
    user site, no script dir, so nothing the agent could write (its HOME's site-packages and ``.pth``
    files, a tree on the task's PYTHONPATH) is imported while the forwarder holds its privileges.
    The harness it starts inherits the environment as given."""
    return [cmd[0], "-I", *cmd[1:]]


class BubblewrapSandbox(HostTreeSandbox):
    """One task copy + private HOME/tmp on the host, entered by a fresh bwrap per command."""

    def __init__(
        self,
        spec: SandboxSpec,
        root: Path,
        uid: int,
        gid: int,
        cgroups: CgroupLimits,
        identity: Identity | None = None,
    ):
        self.spec = spec
        self.root = root  # host dir (the quota tmpfs): testbed/ home/ tmp/ etc/ opt/; the snapshot beside it
        self.uid, self.gid = uid, gid  # inside
        self.identity = identity  # as host root, its own host uid (sandbox/identity.py), which owns its files
        self.cgroups = cgroups
        self.clone = ""  # how the task tree was copied in: "reflink" or "copy" ("" for none)
        self.system: Path | None = None  # as host root, the /usr and /etc views (`views.system_view`)
        self.harness: Path | None = spec.harness_dir  # as host root, its view
        self._destroyed = False

    @property
    def limits_applied(self) -> list[str]:
        return [*self.cgroups.applied, *(["disk"] if os.path.ismount(self.root) else [])]

    @property
    def git_dir(self) -> Path:
        return self.root.with_name(self.root.name + ".git")

    @property
    def owner(self) -> tuple[int, int] | None:
        """The host ids its files belong to (None unprivileged: the caller's own)."""
        return (self.identity.host_uid, self.identity.host_gid) if self.identity is not None else None

    @classmethod
    def attach(cls, spec: SandboxSpec, root: Path, uid: int, gid: int) -> BubblewrapSandbox:
        """A sandbox another process opened: its identity is its tree's owner (its opener holds the lease)."""
        owner = (root / "testbed").stat().st_uid
        identity = attached(owner, uid, gid) if os.geteuid() == 0 and owner != os.geteuid() else None
        sb = cls(spec, root, uid, gid, CgroupLimits(root.name, spec.memory_bytes, spec.pids_max), identity)
        sb.show_inputs()
        return sb

    def namespace(self) -> AbstractContextManager[int | None]:
        """The user namespace a command runs in (as host root), its descriptor for bwrap; else None."""
        return user_namespace(self.identity) if self.identity is not None else nullcontext(None)

    @classmethod
    def create(
        cls, task_tree: Path | None, *, spec: SandboxSpec, snapshot: Path | None = None
    ) -> BubblewrapSandbox:
        """A sandbox holding a copy of ``task_tree``. With ``snapshot`` (the git dir
        ``gitdiff.snapshot`` made of ``task_tree``: a warm base, ``tasks/base_trees.py``) the copy
        borrows that snapshot instead of taking its own. The copy is a reflink clone where the
        filesystems allow (``clone`` says which way it was made), never a hard link."""
        if spec.scratch_root is not None:
            spec.scratch_root.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="polar-bwrap-", dir=spec.scratch_root))
        os.chmod(root, 0o755)
        uid, gid = (spec.uid, spec.uid) if os.geteuid() == 0 else (os.geteuid(), os.getegid())
        try:
            identity = lease(uid, gid) if os.geteuid() == 0 else None
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        sb = cls(spec, root, uid, gid, CgroupLimits(root.name, spec.memory_bytes, spec.pids_max), identity)
        try:
            _mount_quota(root, spec.disk_bytes)
            sb._populate(task_tree, snapshot)
        except BaseException:
            sb.release()
            shutil.rmtree(root, ignore_errors=True)
            raise
        return sb

    def _populate(self, task_tree: Path | None, snapshot: Path | None) -> None:
        root, spec = self.root, self.spec
        testbed, home, tmp, etc = self.testbed, self.home, root / "tmp", root / "etc"
        owner = self.owner
        if task_tree is not None:
            self.clone = copy_tree(task_tree, testbed, owner=owner)
        else:
            testbed.mkdir()
            if owner is not None:
                os.lchown(testbed, *owner)
        for d in (home, tmp, etc, root / "opt"):
            d.mkdir()
        os.chmod(tmp, 0o1777)
        shutil.copyfile(FORWARDER_SRC, root / "opt" / "forwarder.py")  # on the quota fs: no repo path inside
        if snapshot is not None and task_tree is not None:
            gitdiff.borrow_snapshot(snapshot, self.git_dir)
        else:
            gitdiff.snapshot(testbed, self.git_dir)
        if owner is not None:
            chown_tree(home, *owner)
        (etc / "passwd").write_text(
            f"root:x:0:0:root:/root:/bin/bash\n{spec.user}:x:{self.uid}:{self.gid}::{spec.home}:/bin/bash\n"
        )
        (etc / "group").write_text(
            f"root:x:0:\n{spec.user}:x:{self.gid}:\n{HARNESS_GROUP}:x:{harness_gid(self.gid)}:\n"
        )
        (etc / "hostname").write_text(spec.hostname + "\n")
        self.show_inputs()

    def show_inputs(self) -> None:
        """As host root (the sandbox's tmpfs mounted), the read-only inputs as views on that tmpfs,
        unmounted with it; a sandbox attached by another process reuses its opener's and adds its own
        harness's (``polar_env.sandbox.views``)."""
        if not os.path.ismount(self.root):
            return
        views = self.root / "views"
        self.system = views if os.path.ismount(views / "usr") else system_view(views)
        if self.spec.harness_dir is not None:
            at = views / f"harness-{hashlib.sha256(str(self.spec.harness_dir).encode()).hexdigest()[:16]}"
            identity, install = (
                self.identity,
                self.spec.harness_dir,
            )  # the forwarder seals the harness it starts
            sealed = (
                identity.host_harness_gid
                if identity and can_seal() and holds_python_packages(install)
                else None
            )
            self.harness = at if os.path.ismount(at) else harness_view(self.spec.harness_dir, at, sealed)

    def bwrap_argv(self, cmd: Sequence[str], env: dict[str, str], userns: int | None = None) -> list[str]:
        """The full host argv: bwrap, then (as host root) setpriv to the sandbox uid, then ``cmd``.

        As root, bwrap mounts with root's rights (so root-only host dirs can be bound) and no
        user namespace; setpriv then drops to the unprivileged uid with no capabilities at all.
        Unprivileged, bwrap uses a user namespace and the uid stays the caller's. The forwarder
        (``cmd`` running ``FORWARDER_INSIDE``) is the one command started as a ``supervisor``.
        """
        s = self.spec
        mounts = [
            Mount("/etc/passwd", self.root / "etc" / "passwd"),
            Mount("/etc/group", self.root / "etc" / "group"),
            Mount("/etc/hostname", self.root / "etc" / "hostname"),
            Mount("/tmp", self.root / "tmp", "bind"),
            Mount(s.home, self.home, "bind"),
            Mount(s.workdir, self.testbed, "bind"),
            Mount(FORWARDER_INSIDE, self.root / "opt" / "forwarder.py"),
        ]
        if self.harness is not None:
            mounts.append(Mount("/opt/harness", self.harness))
        if s.proxy_socket_dir is not None:
            mounts.append(Mount("/run/proxy", s.proxy_socket_dir))
        supervisor = runs_forwarder(cmd)
        command = BwrapCommand(
            mounts,
            workdir=s.workdir,
            env={**s.base_env(), **env},
            uid=self.uid,
            gid=self.gid,
            hostname=s.hostname,
            supervisor=supervisor,
            system=self.system,
            userns=userns,
        )
        return command.argv(isolated_forwarder(cmd) if supervisor else cmd)

    async def run(
        self,
        cmd: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        timeout_s: float | Deadline = 600.0,
        stdin: bytes | None = None,
        max_output_bytes: int = 1 << 20,
    ) -> RunResult:
        if self._destroyed:
            raise RuntimeError("sandbox destroyed")
        with self.namespace() as userns:
            argv = self.bwrap_argv(cmd, env or {}, userns)
            return await run_process_tree(
                argv,
                timeout_s=timeout_s,
                stdin=stdin,
                max_output_bytes=max_output_bytes,
                preexec_fn=self.cgroups.join if self.cgroups.dirs else None,
                on_timeout=self.cgroups.kill_all,
                pass_fds=() if userns is None else (userns,),
            )

    def writable_binds(self) -> list[tuple[Path, Path]]:
        return [*super().writable_binds(), (Path("/tmp"), self.root / "tmp")]

    async def copy_in(self, src: Path, dst: str) -> None:
        target = self.host_path(dst)
        copy_path(src, target)
        if (owner := self.owner) is not None:
            if target.is_dir():
                chown_tree(target, *owner)
            else:
                os.lchown(target, *owner)
            parent = target.parent
            while parent != self.root and self.root in parent.parents:
                os.lchown(parent, *owner)
                parent = parent.parent

    async def diff(self, exclude: Sequence[str] = BUILD_EXCLUDES) -> bytes:
        """The episode's patch, made by git in a bubblewrap of its own, never by host git on the
        tree the agent wrote: the tree and the snapshot read-only, new objects and the index on a
        scratch tmpfs of the episode's disk quota, as the sandbox uid, in the episode's cgroup."""
        base = gitdiff.base_of(self.git_dir)
        alternates = gitdiff.alternates_of(self.git_dir)
        mounts = [
            Mount(DIFF_TREE, self.testbed),
            Mount(DIFF_GIT, self.git_dir),
            *(Mount(str(path), path) for path in alternates),
            Mount(DIFF_SCRATCH, kind="tmpfs", perms="0777", size=self.spec.disk_bytes),
        ]
        env = gitdiff.sandboxed_diff_env(DIFF_TREE, DIFF_GIT, DIFF_SCRATCH)
        with self.namespace() as userns:
            argv = BwrapCommand(
                mounts, workdir=DIFF_TREE, env=env, uid=self.uid, gid=self.gid, userns=userns
            ).argv(["/bin/sh", "-c", gitdiff.diff_script(base, exclude)])
            proc = await asyncio.to_thread(
                subprocess.run,
                argv,
                capture_output=True,
                timeout=DIFF_TIMEOUT_S,
                preexec_fn=self.cgroups.join if self.cgroups.dirs else None,
                pass_fds=() if userns is None else (userns,),
            )
        if proc.returncode != 0:
            raise RuntimeError(
                f"git diff in the sandbox failed ({proc.returncode}): "
                f"{proc.stderr.decode(errors='replace')[-2000:]}"
            )
        return proc.stdout

    def release(self) -> None:
        self.cgroups.kill_all()
        self.cgroups.remove()
        if os.path.ismount(self.root):  # with the views on it
            unmount(self.root)
        shutil.rmtree(self.git_dir, ignore_errors=True)
        if self.identity is not None:  # its uid free for the next sandbox once nothing of it runs
            self.identity.release()
