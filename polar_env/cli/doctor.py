"""``polar doctor``: what is installed for harnesses and sandboxes, and the command that fixes each gap."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from polar_env.cache import cache_root
from polar_env.harness_adapters.base import HarnessAdapter
from polar_env.harness_adapters.registry import ADAPTERS


@dataclass
class DoctorRow:
    component: str
    installed: bool
    version: str
    fix_command: str  # empty when nothing to fix
    note: str = ""


def _version(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    out = (proc.stdout.strip() or proc.stderr.strip()).splitlines()
    return out[0].strip() if out and proc.returncode == 0 else ""


def _tool_row(component: str, exe: str, version_argv: list[str], fix: str) -> DoctorRow:
    path = shutil.which(exe)
    version = _version([path, *version_argv]) if path else ""
    return DoctorRow(component, bool(path) and bool(version), version, "" if path and version else fix)


def _cgroup_row() -> DoctorRow:
    root = Path("/sys/fs/cgroup")
    found = [c for c in ("memory", "pids") if (root / c / "cgroup.procs").exists()]
    writable = bool(found) and all(os.access(root / c, os.W_OK) for c in found)
    note = (
        ("v1 " + "+".join(found) + (" (writable)" if writable else " (read-only: limits skipped)"))
        if found
        else "no cgroup v1 memory/pids: sandbox limits skipped"
    )
    return DoctorRow(
        "cgroups",
        writable and len(found) == 2,
        "v1" if found else "",
        "" if writable else "run as root on a host with cgroup v1 memory and pids controllers",
        note,
    )


def _engine_rows() -> list[DoctorRow]:
    """Container engines (optional: tasks with a base archive run in bubblewrap), with the fix for each."""
    from polar_env.episodes.workspace import engine_available
    from polar_env.tasks.images import base_image

    rows = []
    fixes = {
        "podman": "POLAR_SETUP_CONTAINERS=1 bash scripts/setup.sh  # podman, runc, engine config, base image",
        "docker": "install Docker Engine and start its daemon (or use podman)",
        "apptainer": "install Apptainer from your site's packages (none for Debian; for clusters)",
    }
    for engine in ("podman", "docker", "apptainer"):
        row = _tool_row(f"{engine} (optional)", engine, ["--version"], fixes[engine])
        if row.installed and not engine_available(engine):
            row.installed, row.fix_command = (
                False,
                f"{engine} is installed but does not answer: "
                + (
                    "start the Docker daemon"
                    if engine == "docker"
                    else "see /etc/containers/containers.conf in scripts/setup_podman.sh"
                    if engine == "podman"
                    else f"check `{engine} version`"
                ),
            )
        elif row.installed and engine == "podman":
            from polar_env.sandbox.container import image_exists

            base = base_image()
            row.note = f"base image {base}" + (
                "" if image_exists(engine, base) else " missing: python -m polar_env.tasks.images base"
            )
        rows.append(row)
    return rows


def _install_hint(adapter: HarnessAdapter, root: Path | None) -> str:
    try:
        return "polar doctor --install  # or: " + " && ".join(
            " ".join(cmd) for cmd in adapter.install_commands(root)
        )
    except RuntimeError as e:  # what the source needs first (a portable Python's host interpreter)
        return str(e)


def _rootfs_row() -> DoctorRow:
    """The sandbox root every bubblewrap sandbox mounts (``polar_env.sandbox.rootfs``)."""
    from polar_env.sandbox.rootfs import RootfsMissing, rootfs_dir, sandbox_root

    try:
        return DoctorRow("sandbox root", True, str(sandbox_root()), "")
    except RootfsMissing:
        return DoctorRow("sandbox root", False, "", f"run scripts/setup.sh as root (builds {rootfs_dir()})")


def doctor_report(root: Path | None = None) -> list[DoctorRow]:
    rows = [
        _tool_row("node", "node", ["--version"], "apt-get install -y nodejs"),
        _tool_row("npm", "npm", ["--version"], "apt-get install -y npm"),
        _tool_row("bubblewrap", "bwrap", ["--version"], "apt-get install -y bubblewrap"),
        _tool_row("setpriv", "setpriv", ["--version"], "apt-get install -y util-linux"),
        _tool_row("git", "git", ["--version"], "apt-get install -y git"),
        _tool_row(
            "patchelf (portable Python harnesses)", "patchelf", ["--version"], "apt-get install -y patchelf"
        ),
        DoctorRow(
            "python3 (sandbox forwarder)",
            os.path.exists("/usr/bin/python3"),
            _version(["/usr/bin/python3", "--version"]),
            "" if os.path.exists("/usr/bin/python3") else "apt-get install -y python3",
        ),
        _rootfs_row(),
        _cgroup_row(),
        *_engine_rows(),
    ]
    for name, cls in ADAPTERS.items():
        adapter = cls()
        ok = adapter.is_installed(root)
        where = adapter.install_dir(root) if ok else f"pinned {adapter.package} ({adapter.source.kind})"
        rows.append(
            DoctorRow(
                f"harness {name}",
                ok,
                adapter.version if ok else "",
                "" if ok else _install_hint(adapter, root),
                f"{where}; speaks {adapter.wire_api}",
            )
        )
    return rows


def format_table(rows: list[DoctorRow]) -> str:
    header = ("component", "ok", "version", "fix / note")
    lines = [(r.component, "yes" if r.installed else "NO", r.version, r.fix_command or r.note) for r in rows]
    widths = [max(len(x[i]) for x in [header, *lines]) for i in range(3)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
    return "\n".join(fmt.format(*line) for line in [header, *lines])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.add_argument("--cache", type=Path, default=None, help=f"cache root (default {cache_root()})")
    parser.add_argument(
        "--install", action="store_true", help="install missing harnesses (pinned, from npm or PyPI)"
    )


def run(args: argparse.Namespace) -> int:
    """Print the table; exit 1 when a required component (not marked optional) is missing."""
    if args.install:
        for cls in ADAPTERS.values():
            adapter = cls()
            if not adapter.is_installed(args.cache):
                print(f"installing {adapter.package} ...", flush=True)
                adapter.install(args.cache)
    rows = doctor_report(args.cache)
    print(format_table(rows))
    missing = [
        r for r in rows if not r.installed and "optional" not in r.component and r.component != "cgroups"
    ]
    return 1 if missing else 0
