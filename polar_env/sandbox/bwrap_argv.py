"""The one bubblewrap command line, shared by the episode sandbox and the grading sandbox.

Both need the same isolation: every namespace unshared (only ``lo`` exists), the host ``/usr`` and
``/etc`` read-only, fresh ``/proc`` and ``/dev``, a cleared environment, and never root inside. As
root, bwrap keeps the host user namespace (a namespaced root could still own the binds) and
``setpriv`` drops to the sandbox uid with no capabilities and ``--no-new-privs``; unprivileged,
bwrap's own user namespace keeps the caller's uid and drops every capability. The callers differ
only in their mounts and environment, which they pass as data.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal


class SandboxUnavailable(RuntimeError):
    """bwrap or setpriv missing: an infrastructure fault, not the sandboxed command's."""


@dataclass(frozen=True)
class Mount:
    """One mount inside the sandbox: a host path bound at ``dst``, or a fresh tmpfs there."""

    dst: str
    src: Path | str | None = None  # None for a tmpfs
    kind: Literal["bind", "ro-bind", "tmpfs"] = "ro-bind"
    perms: str | None = None  # tmpfs mode, e.g. "1777"
    size: int | None = None  # tmpfs size in bytes (None: the kernel's default, half the RAM)


@dataclass(frozen=True)
class BwrapCommand:
    """Everything that differs between two sandboxes; ``argv(cmd)`` is the host command line."""

    mounts: Sequence[Mount]
    workdir: str
    env: Mapping[str, str]
    uid: int  # the sandbox user (used as root; unprivileged, the caller's own uid is kept)
    gid: int
    hostname: str = "sandbox"

    def argv(self, cmd: Sequence[str]) -> list[str]:
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxUnavailable("bubblewrap (bwrap) is not installed")
        as_root = os.geteuid() == 0
        argv = [bwrap]
        if as_root:
            argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        else:
            argv += ["--unshare-all", "--cap-drop", "ALL", "--uid", str(self.uid), "--gid", str(self.gid)]
        argv += ["--die-with-parent", "--new-session", "--hostname", self.hostname, "--ro-bind", "/usr", "/usr"]
        for link in ("lib", "lib64", "bin", "sbin"):
            if os.path.islink(f"/{link}"):
                argv += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
            elif os.path.isdir(f"/{link}"):
                argv += ["--ro-bind", f"/{link}", f"/{link}"]
        argv += ["--ro-bind", "/etc", "/etc", "--proc", "/proc", "--dev", "/dev"]
        parents = sorted({str(p) for m in self.mounts for p in Path(m.dst).parents if str(p) not in ("/", "/etc")}
                         - {m.dst for m in self.mounts})
        for parent in parents:  # bwrap would create them 0700, unreadable to the sandbox uid
            argv += ["--perms", "0755", "--dir", parent]
        for mount in self.mounts:
            if mount.perms is not None:
                argv += ["--perms", mount.perms]
            if mount.size is not None and mount.kind == "tmpfs":
                argv += ["--size", str(mount.size)]
            argv += ["--tmpfs", mount.dst] if mount.kind == "tmpfs" else [f"--{mount.kind}", str(mount.src), mount.dst]
        argv += ["--remount-ro", "/", "--chdir", self.workdir, "--clearenv"]
        for key, value in self.env.items():
            argv += ["--setenv", key, value]
        argv.append("--")
        if as_root:
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                raise SandboxUnavailable("setpriv (util-linux) is needed to drop root inside the sandbox")
            argv += [setpriv, f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                     "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
        return argv + list(cmd)
