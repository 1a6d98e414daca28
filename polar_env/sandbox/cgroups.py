"""Memory and pids limits for one sandbox: cgroup v2 where this process can delegate, else cgroup v1.

cgroup v2 (the unified hierarchy most modern hosts run) is preferred: the sandbox gets a leaf group
``<our cgroup>/polar/<name>`` with ``memory.max`` and ``pids.max``. That needs the controllers to be
on the v2 hierarchy and our cgroup to hand them down (``cgroup.subtree_control``), which a cgroup
that still holds processes may refuse unless it is the root. Hybrid hosts keep memory and pids on
v1 (``/sys/fs/cgroup/memory``, ``/sys/fs/cgroup/pids``): then the v1 groups are used. ``mode`` says
which applied; ``skipped`` says why a controller was not limited.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Literal

CGROUP_V1_ROOT = Path("/sys/fs/cgroup")
V2_KNOBS = {"memory": "memory.max", "pids": "pids.max"}
V1_KNOBS = {"memory": "memory.limit_in_bytes", "pids": "pids.max"}


def cgroup_v2_dir() -> Path | None:
    """This process's own cgroup v2 directory, or None when no v2 hierarchy is mounted."""
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
            return mount / line[3:].lstrip("/")
    return None


class CgroupLimits:
    """Per-sandbox memory + pids groups; ``applied`` lists the limited controllers, ``mode`` the version."""

    def __init__(self, name: str, memory_bytes: int | None, pids_max: int | None, *,
                 v1_root: Path = CGROUP_V1_ROOT, v2_base: Path | None = None):
        self.dirs: list[Path] = []
        self.applied: list[str] = []
        self.skipped: dict[str, str] = {}
        self.mode: Literal["v2", "v1"] | None = None
        self.v2_unavailable: str | None = None  # why cgroup v2 was not used
        wanted = {c: v for c, v in (("memory", memory_bytes), ("pids", pids_max)) if v is not None}
        if not wanted:
            return
        reason = self._try_v2(name, wanted, v2_base if v2_base is not None else cgroup_v2_dir())
        if reason is None:
            self.mode = "v2"
            return
        self.v2_unavailable = reason
        self._try_v1(name, wanted, v1_root, v2_reason=reason)
        self.mode = "v1" if self.applied else None

    def _try_v2(self, name: str, wanted: dict[str, int], base: Path | None) -> str | None:
        """Limit every wanted controller in one v2 leaf; None when done, else why not."""
        if base is None:
            return "no cgroup v2 hierarchy mounted"
        try:
            offered = set((base / "cgroup.controllers").read_text().split())
        except OSError as exc:
            return f"cgroup v2 at {base}: {exc}"
        if missing := sorted(set(wanted) - offered):
            return f"cgroup v2 at {base} offers no {', '.join(missing)} controller (held by cgroup v1 here)"
        enable = " ".join(f"+{c}" for c in wanted)
        parent, leaf = base / "polar", base / "polar" / name
        try:
            if not set(wanted) <= set((base / "cgroup.subtree_control").read_text().split()):
                (base / "cgroup.subtree_control").write_text(enable)  # EBUSY when base holds processes
            parent.mkdir(exist_ok=True)
            (parent / "cgroup.subtree_control").write_text(enable)
            leaf.mkdir()
            for controller, value in wanted.items():
                (leaf / V2_KNOBS[controller]).write_text(str(value))
        except OSError as exc:
            if leaf.exists():
                leaf.rmdir()
            return f"cgroup v2 at {base} does not delegate {', '.join(wanted)} to us: {exc}"
        self.dirs.append(leaf)
        self.applied.extend(wanted)
        return None

    def _try_v1(self, name: str, wanted: dict[str, int], root: Path, v2_reason: str) -> None:
        for controller, value in wanted.items():
            parent = root / controller
            if not (parent / "cgroup.procs").exists():
                self.skipped[controller] = f"{v2_reason}; no cgroup v1 {controller} hierarchy"
                continue
            group = parent / "polar" / name
            try:
                group.mkdir(parents=True, exist_ok=True)
                (group / V1_KNOBS[controller]).write_text(str(value))
            except OSError as exc:
                self.skipped[controller] = f"{v2_reason}; cgroup v1: {exc}"
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
        self.dirs = []
