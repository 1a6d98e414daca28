"""The local default sandbox: bubblewrap with no network but the proxy (DESIGN.md §6b).

Layout inside: the read-only host ``/usr`` and ``/etc`` (a generated passwd/group names the
sandbox user), the task copy at ``/testbed``, HOME and ``/tmp`` bound from per-sandbox host dirs
(so adapters can write config before and read state after a run), the harness install read-only
at ``/opt/harness``, the proxy's socket dir at ``/run/proxy``, and the forwarder at
``/opt/polar/forwarder.py``. ``--unshare-all`` leaves only ``lo``. When the host runs as root the
whole bwrap runs under an unprivileged uid (``setpriv``) that owns the task copy; cgroup v1
memory/pids limits apply where the host lets us create child cgroups.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from polar_env.sandbox import gitdiff
from polar_env.sandbox.base import (
    NOISE_EXCLUDES,
    RunResult,
    Sandbox,
    SandboxSpec,
    copy_path,
    run_process_tree,
)

FORWARDER_SRC = Path(__file__).with_name("forwarder.py")
FORWARDER_INSIDE = "/opt/polar/forwarder.py"
CGROUP_V1_ROOT = Path("/sys/fs/cgroup")


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    os.lchown(path, uid, gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.lchown(os.path.join(root, name), uid, gid)


class CgroupLimits:
    """Per-sandbox cgroup v1 memory + pids groups; ``applied`` says which the host accepted."""

    def __init__(self, name: str, memory_bytes: int | None, pids_max: int | None,
                 root: Path = CGROUP_V1_ROOT):
        self.dirs: list[Path] = []
        self.applied: list[str] = []
        self.skipped: dict[str, str] = {}
        wanted = {"memory": ("memory.limit_in_bytes", memory_bytes), "pids": ("pids.max", pids_max)}
        for controller, (knob, value) in wanted.items():
            if value is None:
                continue
            parent = root / controller
            if not (parent / "cgroup.procs").exists():
                self.skipped[controller] = "no cgroup v1 hierarchy"
                continue
            group = parent / "polar" / name
            try:
                group.mkdir(parents=True, exist_ok=True)
                (group / knob).write_text(str(value))
            except OSError as exc:
                self.skipped[controller] = str(exc)
                if group.exists():
                    group.rmdir()
                continue
            self.dirs.append(group)
            self.applied.append(controller)

    def join(self) -> None:
        """Move the calling process into every group (used as a preexec_fn: runs in the child)."""
        for group in self.dirs:
            (group / "cgroup.procs").write_text(str(os.getpid()))

    def kill_all(self) -> None:
        for group in self.dirs:
            try:
                for pid in (group / "cgroup.procs").read_text().split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            except OSError:
                pass

    def remove(self) -> None:
        for group in self.dirs:
            for _ in range(50):
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # busy until the last process is reaped
                    self.kill_all()
                    time.sleep(0.05)
        self.dirs = []


class BubblewrapSandbox(Sandbox):
    """One task copy + private HOME/tmp on the host, entered by a fresh bwrap per command."""

    def __init__(self, spec: SandboxSpec, root: Path, uid: int, gid: int, cgroups: CgroupLimits):
        self.spec = spec
        self.root = root  # host dir: testbed/ home/ tmp/ etc/ git/
        self.uid, self.gid = uid, gid
        self.cgroups = cgroups
        self._destroyed = False

    @property
    def testbed(self) -> Path:
        return self.root / "testbed"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def limits_applied(self) -> list[str]:
        return list(self.cgroups.applied)

    @classmethod
    def create(cls, task_tree: Path | None, *, spec: SandboxSpec) -> BubblewrapSandbox:
        if spec.scratch_root is not None:
            spec.scratch_root.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="polar-bwrap-", dir=spec.scratch_root))
        os.chmod(root, 0o755)
        testbed, home, tmp, etc = root / "testbed", root / "home", root / "tmp", root / "etc"
        if task_tree is not None:
            shutil.copytree(task_tree, testbed, symlinks=True)
        else:
            testbed.mkdir()
        for d in (home, tmp, etc):
            d.mkdir()
        os.chmod(tmp, 0o1777)
        gitdiff.snapshot(testbed, root / "git")
        if os.geteuid() == 0:
            uid = gid = spec.uid
            _chown_tree(testbed, uid, gid)
            _chown_tree(home, uid, gid)
        else:
            uid, gid = os.geteuid(), os.getegid()
        (etc / "passwd").write_text(f"root:x:0:0:root:/root:/bin/bash\n"
                                    f"{spec.user}:x:{uid}:{gid}::{spec.home}:/bin/bash\n")
        (etc / "group").write_text(f"root:x:0:\n{spec.user}:x:{gid}:\n")
        (etc / "hostname").write_text(spec.hostname + "\n")
        cgroups = CgroupLimits(root.name, spec.memory_bytes, spec.pids_max)
        return cls(spec, root, uid, gid, cgroups)

    def bwrap_argv(self, cmd: Sequence[str], env: dict[str, str]) -> list[str]:
        """The full host argv: bwrap, then (as host root) setpriv to the sandbox uid, then ``cmd``.

        As root, bwrap mounts with root's rights (so root-only host dirs can be bound) and no
        user namespace; setpriv then drops to the unprivileged uid with no capabilities at all.
        Unprivileged, bwrap uses a user namespace and the uid stays the caller's.
        """
        s = self.spec
        as_root = os.geteuid() == 0
        argv = ["bwrap"]
        if as_root:
            argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        else:
            argv += ["--unshare-all", "--cap-drop", "ALL", "--uid", str(self.uid), "--gid", str(self.gid)]
        argv += ["--die-with-parent", "--new-session", "--hostname", s.hostname, "--ro-bind", "/usr", "/usr"]
        for link in ("lib", "lib64", "bin", "sbin"):
            if os.path.islink(f"/{link}"):
                argv += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
            elif os.path.isdir(f"/{link}"):
                argv += ["--ro-bind", f"/{link}", f"/{link}"]
        binds = [("--ro-bind", str(self.root / "etc" / "passwd"), "/etc/passwd"),
                 ("--ro-bind", str(self.root / "etc" / "group"), "/etc/group"),
                 ("--ro-bind", str(self.root / "etc" / "hostname"), "/etc/hostname"),
                 ("--bind", str(self.root / "tmp"), "/tmp"),
                 ("--bind", str(self.home), s.home),
                 ("--bind", str(self.testbed), s.workdir),
                 ("--ro-bind", str(FORWARDER_SRC), FORWARDER_INSIDE)]
        if s.harness_dir is not None:
            binds.append(("--ro-bind", str(s.harness_dir), "/opt/harness"))
        if s.proxy_socket_dir is not None:
            binds.append(("--ro-bind", str(s.proxy_socket_dir), "/run/proxy"))
        argv += ["--ro-bind", "/etc", "/etc", "--proc", "/proc", "--dev", "/dev"]
        parents = sorted({str(p) for _, _, dst in binds for p in Path(dst).parents if str(p) not in ("/", "/etc")})
        for parent in parents:  # bwrap would create them 0700, unreadable to the sandbox uid
            argv += ["--perms", "0755", "--dir", parent]
        for flag, src, dst in binds:
            argv += [flag, src, dst]
        argv += ["--remount-ro", "/", "--chdir", s.workdir, "--clearenv"]
        for key, value in {**s.base_env(), **env}.items():
            argv += ["--setenv", key, value]
        argv.append("--")
        if as_root:
            argv += ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                     "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
        return argv + list(cmd)

    async def run(self, cmd: Sequence[str], *, env: dict[str, str] | None = None, timeout_s: float = 600.0,
                  stdin: bytes | None = None, max_output_bytes: int = 1 << 20) -> RunResult:
        if self._destroyed:
            raise RuntimeError("sandbox destroyed")
        argv = self.bwrap_argv(cmd, env or {})
        return await run_process_tree(argv, timeout_s=timeout_s, stdin=stdin, max_output_bytes=max_output_bytes,
                                      preexec_fn=self.cgroups.join if self.cgroups.dirs else None,
                                      on_timeout=self.cgroups.kill_all)

    def host_path(self, inside: str) -> Path:
        """Map a path inside the sandbox to its host location (only the writable binds)."""
        p = Path(os.path.normpath(inside))
        for mount, host in ((Path(self.spec.workdir), self.testbed), (Path(self.spec.home), self.home),
                            (Path("/tmp"), self.root / "tmp")):
            if p == mount or mount in p.parents:
                return host / p.relative_to(mount)
        raise ValueError(f"{inside} is not under {self.spec.workdir}, {self.spec.home} or /tmp")

    async def copy_in(self, src: Path, dst: str) -> None:
        target = self.host_path(dst)
        copy_path(src, target)
        if os.geteuid() == 0:
            if target.is_dir():
                _chown_tree(target, self.uid, self.gid)
            else:
                os.lchown(target, self.uid, self.gid)
            parent = target.parent
            while parent != self.root and self.root in parent.parents:
                os.lchown(parent, self.uid, self.gid)
                parent = parent.parent

    async def copy_out(self, src: str, dst: Path) -> None:
        copy_path(self.host_path(src), dst)

    async def diff(self, exclude: Sequence[str] = NOISE_EXCLUDES) -> bytes:
        return await asyncio.to_thread(gitdiff.diff, self.testbed, self.root / "git", exclude)

    async def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        self.cgroups.kill_all()
        self.cgroups.remove()
        await asyncio.to_thread(shutil.rmtree, self.root, True)
