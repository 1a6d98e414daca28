"""The one bubblewrap command line, shared by the episode sandbox and the grading sandbox.

Both need the same isolation: every namespace unshared (only ``lo`` exists), the sandbox root's
``/usr`` and ``/etc`` read-only (a minimal Debian, ``polar_env.sandbox.rootfs``: nothing of the
host's packages; as host root shown through overlays that name no host path, ``views.py``), the
host's Node.js as one file, fresh ``/proc`` and ``/dev``, a
cleared environment, a seccomp filter that refuses ptrace between its processes and the kernel
keyring (``polar_env.sandbox.seccomp``), and never root inside. As root, bwrap enters the sandbox's
own user namespace (``userns``: its leased host uid shown as the spec's, ``identity.py``; host root
is mapped to itself, and setpriv runs as that root, with capabilities in that namespace only) and
``setpriv`` drops to the sandbox uid with no capabilities and ``--no-new-privs``; unprivileged,
bwrap's own user namespace keeps the caller's uid and drops every capability. The callers differ
only in their mounts and environment, which they pass as data.

One exception, as root: a ``supervisor`` command (the episode's forwarder) starts with
``SUPERVISOR_CAPS`` as ambient capabilities, where the host's root holds them all (root in a
container may not: then nothing is kept and the harness is not sealed). It clears them before it
starts the harness, so no other process of the sandbox ever holds one
(``polar_env.sandbox.forwarder``, "Sealed harness").
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from polar_env.sandbox.forwarder import SUPERVISING, effective_caps
from polar_env.sandbox.rootfs import NODE_INSIDE, RootfsMissing, host_node, sandbox_root
from polar_env.sandbox.seccomp import program_file

# bwrap reads the filter from a descriptor: a host bash opens it on a free fd (never one a caller
# passes down, such as the grader's), then becomes bwrap with ``--seccomp <that fd>``
_WITH_FILTER = ["/bin/bash", "-c", 'exec {fd}<"$1" && exec "$2" --seccomp "$fd" "${@:3}"', "bash"]
# what the forwarder needs to seal the harness and still prove a call's origin: read the /proc
# entries of processes that are not dumpable, and start the harness under a real gid of its own
# (the names of forwarder.SUPERVISING's bits)
SUPERVISOR_CAPS = ("sys_ptrace", "dac_read_search", "setgid")


def can_seal() -> bool:
    """Whether this process can give a supervisor ``SUPERVISOR_CAPS`` (host root holding them all):
    then the harness runs sealed, and its install is shown to it alone (``views.harness_view``)."""
    return os.geteuid() == 0 and effective_caps() & SUPERVISING == SUPERVISING


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
    supervisor: bool = False  # the first process keeps SUPERVISOR_CAPS (host root only)
    system: Path | None = (
        None  # as host root, a `views.system_view`: /usr (node inside) and /etc shown neutrally
    )
    userns: int | None = (
        None  # as host root, a descriptor of the sandbox's own user namespace (`identity.user_namespace`)
    )

    def argv(self, cmd: Sequence[str]) -> list[str]:
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxUnavailable("bubblewrap (bwrap) is not installed")
        as_root = os.geteuid() == 0
        argv = [*_WITH_FILTER, str(program_file()), bwrap]
        if as_root:
            argv += [
                *(["--userns", str(self.userns)] if self.userns is not None else []),
                "--unshare-ipc",
                "--unshare-pid",
                "--unshare-net",
                "--unshare-uts",
                "--unshare-cgroup-try",
            ]
        else:
            argv += ["--unshare-all", "--cap-drop", "ALL", "--uid", str(self.uid), "--gid", str(self.gid)]
        try:
            root = sandbox_root()
        except RootfsMissing as exc:
            raise SandboxUnavailable(str(exc)) from None
        system = self.system or root
        argv += [
            "--die-with-parent",
            "--new-session",
            "--hostname",
            self.hostname,
            "--ro-bind",
            str(system / "usr"),
            "/usr",
            "--ro-bind",
            str(system / "etc"),
            "/etc",
        ]
        for link in ("lib", "lib64", "bin", "sbin"):  # merged /usr: links into it
            if (root / link).is_symlink():
                argv += ["--symlink", os.readlink(root / link), f"/{link}"]
        if self.system is None and (node := host_node()) is not None:  # a system view holds it already
            argv += ["--ro-bind", str(node), NODE_INSIDE]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        parents = sorted(
            {str(p) for m in self.mounts for p in Path(m.dst).parents}
            - {"/", "/usr", "/etc"}
            - {m.dst for m in self.mounts}
        )
        for parent in parents:  # bwrap would create them 0700, unreadable to the sandbox uid
            argv += ["--perms", "0755", "--dir", parent]
        for mount in self.mounts:
            if mount.perms is not None:
                argv += ["--perms", mount.perms]
            if mount.size is not None and mount.kind == "tmpfs":
                argv += ["--size", str(mount.size)]
            argv += (
                ["--tmpfs", mount.dst]
                if mount.kind == "tmpfs"
                else [f"--{mount.kind}", str(mount.src), mount.dst]
            )
        argv += ["--remount-ro", "/", "--chdir", self.workdir, "--clearenv"]
        for key, value in self.env.items():
            argv += ["--setenv", key, value]
        argv.append("--")
        if as_root:
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                raise SandboxUnavailable("setpriv (util-linux) is needed to drop root inside the sandbox")
            sealing = self.supervisor and can_seal()
            kept = "".join(f",+{cap}" for cap in SUPERVISOR_CAPS) if sealing else ""
            argv += [
                setpriv,
                f"--reuid={self.uid}",
                f"--regid={self.gid}",
                "--clear-groups",
                f"--inh-caps=-all{kept}",
                *([f"--ambient-caps={kept[1:]}"] if kept else []),
                f"--bounding-set=-all{kept}",
                "--no-new-privs",
                "--",
            ]
        return argv + list(cmd)
