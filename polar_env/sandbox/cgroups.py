"""Memory and pids limits for one sandbox: cgroup v2 where this process can delegate, else cgroup v1.

cgroup v2 (the unified hierarchy most modern hosts run) is preferred: the sandbox gets a leaf group
``<our cgroup>/polar/<name>`` with ``memory.max`` and ``pids.max``. That needs the controllers on
the v2 hierarchy and our cgroup to hand them down (``cgroup.subtree_control``). A cgroup that holds
processes may not (the no-internal-process rule): when this process is the only one in it, as in
a cgroup delegated to it (``systemd-run --scope -p Delegate=yes``, a container's own cgroup), it
moves itself into the leaf ``polar-supervisor`` first, as systemd's delegation rules ask; a cgroup
shared with other processes is left alone. Each controller v2 cannot give is taken from cgroup v1
where that hierarchy exists (hybrid hosts keep memory and pids there). ``versions`` says which
version limits each controller, ``skipped`` why a controller was not limited (docs/harnesses.md).
"""

from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path
from typing import Literal

CGROUP_V1_ROOT = Path("/sys/fs/cgroup")
V2_KNOBS = {"memory": "memory.max", "pids": "pids.max"}
V1_KNOBS = {"memory": "memory.limit_in_bytes", "pids": "pids.max"}
SUPERVISOR = "polar-supervisor"  # this process's own leaf once it delegated the cgroup it started in


def cgroup_v2_dir() -> Path | None:
    """The cgroup v2 directory this process was started in (the parent of ``polar-supervisor`` once it
    moved there), or None when no v2 hierarchy is mounted."""
    mount = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" - ")
        if len(fields) == 2 and fields[1].split()[0] == "cgroup2":
            mount = Path(fields[0].split()[4])
            break
    if mount is None:
        return None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            own = mount / line[3:].lstrip("/")
            return own.parent if own.name == SUPERVISOR else own
    return None


def _hand_down(base: Path, controllers: list[str]) -> None:
    """Make ``base`` hand ``controllers`` to its children; raises OSError saying why it cannot."""
    control = base / "cgroup.subtree_control"
    if set(controllers) <= set(control.read_text().split()):
        return
    enable = " ".join(f"+{c}" for c in controllers)
    try:
        control.write_text(enable)
        return
    except OSError as exc:
        if exc.errno != errno.EBUSY:
            raise
    procs = (base / "cgroup.procs").read_text().split()
    if procs != [str(os.getpid())]:
        raise OSError(errno.EBUSY, f"it holds {len(procs)} processes besides or other than this one")
    supervisor = base / SUPERVISOR
    supervisor.mkdir(exist_ok=True)
    (supervisor / "cgroup.procs").write_text(str(os.getpid()))
    control.write_text(enable)


class CgroupLimits:
    """Per-sandbox memory + pids groups; ``versions`` maps each limited controller to its cgroup version."""

    def __init__(
        self,
        name: str,
        memory_bytes: int | None,
        pids_max: int | None,
        *,
        v1_root: Path = CGROUP_V1_ROOT,
        v2_base: Path | None = None,
    ):
        self.dirs: list[Path] = []
        self.groups: dict[str, Path] = {}  # controller -> the group that limits it
        self.versions: dict[str, Literal["v2", "v1"]] = {}
        self.skipped: dict[str, str] = {}
        self.v2_unavailable: str | None = None  # why cgroup v2 did not limit every controller
        wanted = {c: v for c, v in (("memory", memory_bytes), ("pids", pids_max)) if v is not None}
        self._order = list(wanted)
        if not wanted:
            return
        reasons = self._try_v2(name, wanted, v2_base if v2_base is not None else cgroup_v2_dir())
        if reasons:
            self.v2_unavailable = "; ".join(dict.fromkeys(reasons.values()))
            self._try_v1(name, {c: wanted[c] for c in reasons}, v1_root, reasons)

    @property
    def applied(self) -> list[str]:
        return [c for c in self._order if c in self.versions]

    @property
    def mode(self) -> str | None:
        """``v2``, ``v1``, ``v2+v1`` (each controller through the version that could), None: no limit."""
        return "+".join(v for v in ("v2", "v1") if v in self.versions.values()) or None

    def knob(self, controller: str) -> Path:
        """The file that holds ``controller``'s limit."""
        knobs = V2_KNOBS if self.versions[controller] == "v2" else V1_KNOBS
        return self.groups[controller] / knobs[controller]

    def _try_v2(self, name: str, wanted: dict[str, int], base: Path | None) -> dict[str, str]:
        """Limit, in one v2 leaf, every wanted controller v2 offers here; returns why not, per controller
        left."""
        if base is None:
            return dict.fromkeys(wanted, "no cgroup v2 hierarchy mounted")
        try:
            offered = set((base / "cgroup.controllers").read_text().split())
        except OSError as exc:
            return dict.fromkeys(wanted, f"cgroup v2 at {base}: {exc}")
        reasons = {c: f"cgroup v2 at {base} offers no {c} controller" for c in wanted if c not in offered}
        usable = [c for c in wanted if c in offered]
        if not usable:
            return reasons
        enable = " ".join(f"+{c}" for c in usable)
        parent, leaf = base / "polar", base / "polar" / name
        try:
            _hand_down(base, usable)
            parent.mkdir(exist_ok=True)
            (parent / "cgroup.subtree_control").write_text(enable)
            leaf.mkdir()
            for controller in usable:
                (leaf / V2_KNOBS[controller]).write_text(str(wanted[controller]))
        except OSError as exc:
            if leaf.exists():
                leaf.rmdir()
            return {
                **reasons,
                **dict.fromkeys(
                    usable,
                    f"cgroup v2 at {base} does not delegate {', '.join(usable)} to us: {exc.strerror or exc}",
                ),
            }
        self.dirs.append(leaf)
        self.groups.update(dict.fromkeys(usable, leaf))
        self.versions.update(dict.fromkeys(usable, "v2"))
        return reasons

    def _try_v1(self, name: str, wanted: dict[str, int], root: Path, v2_reasons: dict[str, str]) -> None:
        for controller, value in wanted.items():
            parent = root / controller
            if not (parent / "cgroup.procs").exists():
                self.skipped[controller] = f"{v2_reasons[controller]}; no cgroup v1 {controller} hierarchy"
                continue
            group = parent / "polar" / name
            try:
                group.mkdir(parents=True, exist_ok=True)
                (group / V1_KNOBS[controller]).write_text(str(value))
            except OSError as exc:
                self.skipped[controller] = f"{v2_reasons[controller]}; cgroup v1: {exc}"
                if group.exists():
                    group.rmdir()
                continue
            self.dirs.append(group)
            self.groups[controller] = group
            self.versions[controller] = "v1"

    def join(self) -> None:
        """Move the calling process into every group (used as a preexec_fn: runs in the child)."""
        for group in self.dirs:
            (group / "cgroup.procs").write_text(str(os.getpid()))

    def kill_all(self) -> None:
        for group in self.dirs:
            try:
                if (group / "cgroup.kill").exists():  # v2: the kernel kills the whole group at once
                    (group / "cgroup.kill").write_text("1")
                    continue
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
        self.dirs, self.groups = [], {}
