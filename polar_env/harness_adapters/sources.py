"""Where a harness comes from: an npm package or a Python venv, pinned, installed once into the cache.

An adapter declares one source; the source knows how to install itself into
``<cache>/harnesses/<name>-<version>`` and how the CLI is launched once that directory is mounted
read-only at /opt/harness in a sandbox. Executables land in ``node_modules/.bin`` (npm), which the
sandbox puts first on ``PATH`` (``sandbox.base.HARNESS_BIN_DIRS``), or ``bin`` (venv), which it
does not: the venv's python would shadow the task's for the agent's own commands.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

HARNESS_MOUNT = "/opt/harness"
INSTALLED_MARKER = ".polar-installed"
LOCKS_DIR = Path(__file__).parent / "locks"


class InstallSource(Protocol):
    """What every source offers; ``spec`` is the exact pinned requirement (shown by doctor and the docs)."""

    kind: str
    version: str

    @property
    def spec(self) -> str: ...

    @property
    def identity(self) -> str:
        """What the install marker records: an install made from another one is redone."""
        ...

    def install_commands(self, dest: Path) -> list[list[str]]: ...

    def executable_in(self, dest: Path) -> Path: ...

    @property
    def launcher(self) -> list[str]: ...


@dataclass(frozen=True)
class NpmPackage:
    """``npm install --prefix <dest> <package>@<version>``; the CLI is ``node_modules/.bin/<bin_name>``."""

    package: str
    version: str  # pinned exactly; bump deliberately (first prompts change with it)
    bin_name: str
    kind: str = "npm"

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"

    @property
    def identity(self) -> str:
        return self.spec

    def install_commands(self, dest: Path) -> list[list[str]]:
        return [["npm", "install", "--prefix", str(dest), "--no-audit", "--no-fund", "--loglevel=error", self.spec]]

    def executable_in(self, dest: Path) -> Path:
        return dest / "node_modules" / ".bin" / self.bin_name

    @property
    def launcher(self) -> list[str]:
        return [f"{HARNESS_MOUNT}/node_modules/.bin/{self.bin_name}"]


@dataclass(frozen=True)
class PythonVenv:
    """A venv at ``<dest>`` made by ``python`` with ``<package>==<version>`` (plus pinned ``extras``) in it.

    The venv's interpreter links to ``python``, which must exist at the same path inside the sandbox
    (``/usr/bin/python3`` does in bubblewrap). pip writes the host path of the venv into each console
    script's ``#!`` line, so the launcher runs the script through the venv's interpreter instead.
    """

    package: str
    version: str  # pinned exactly
    entry_point: str  # console script in the venv's bin/
    extras: tuple[str, ...] = ()  # further requirements, each pinned (``name==version``)
    python: str = "/usr/bin/python3"
    # ``locks/<lock>``: pip constraints pinning every dependency (a floating LiteLLM or SDK would
    # change first prompts between installs, and is a supply-chain door into every sandbox)
    lock: str | None = None
    kind: str = "python-venv"

    @property
    def spec(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def identity(self) -> str:
        if self.lock is None:
            return self.spec
        return f"{self.spec} lock:{hashlib.sha256((LOCKS_DIR / self.lock).read_bytes()).hexdigest()[:16]}"

    def install_commands(self, dest: Path) -> list[list[str]]:
        pip = [str(dest / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-input",
               "--disable-pip-version-check"]
        constraints = ["-c", str(LOCKS_DIR / self.lock)] if self.lock else []
        return [[self.python, "-m", "venv", str(dest)], [*pip, *constraints, self.spec, *self.extras]]

    def executable_in(self, dest: Path) -> Path:
        return dest / "bin" / self.entry_point

    @property
    def launcher(self) -> list[str]:
        return [f"{HARNESS_MOUNT}/bin/python", f"{HARNESS_MOUNT}/bin/{self.entry_point}"]


def is_installed(source: InstallSource, dest: Path) -> bool:
    marker = dest / INSTALLED_MARKER
    return marker.exists() and marker.read_text() == f"{source.identity}\n" and source.executable_in(dest).exists()


def install(source: InstallSource, dest: Path, *, timeout_s: float = 1800) -> Path:
    """Install once; a file lock makes concurrent callers wait for the first, and the marker is
    written only after every step succeeded, so a half-finished install is redone."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_installed(source, dest):
            return dest
        shutil.rmtree(dest, ignore_errors=True)  # a half-finished earlier attempt
        dest.mkdir()
        for cmd in source.install_commands(dest):
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            if proc.returncode != 0:
                shutil.rmtree(dest, ignore_errors=True)
                raise RuntimeError(f"installing {source.spec} ({source.kind}) failed at {cmd[:3]}:\n"
                                   f"{proc.stderr[-4000:]}")
        (dest / INSTALLED_MARKER).write_text(f"{source.identity}\n")
        os.chmod(dest, 0o755)
    return dest
