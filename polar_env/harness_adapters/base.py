"""What every harness adapter declares: package, install, config, command line, summary.

An adapter is data plus three small functions; the runner (runner.py) does the rest. Installs
live in one shared cache (``$POLAR_CACHE`` or ``~/.cache/polar``) as
``harnesses/<name>-<version>`` and are mounted read-only at /opt/harness in every sandbox.
Nothing here is per-rollout except the session id and key, which never reach the prompt.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from polar_env.cache import cache_root

HARNESS_MOUNT = "/opt/harness"
INSTALLED_MARKER = ".polar-installed"


@dataclass(frozen=True)
class HarnessContext:
    """What an adapter needs to point its harness at the proxy, as seen inside the sandbox."""

    session_id: str
    session_key: str
    model_name: str
    port: int
    home: str = "/home/agent"
    workdir: str = "/testbed"
    as_root: bool = False

    @property
    def server_root(self) -> str:
        """The session's URL root; the proxy routes by the ``/s/<id>`` prefix."""
        return f"http://127.0.0.1:{self.port}/s/{self.session_id}"

    @property
    def base_url(self) -> str:
        return f"{self.server_root}/v1"


@dataclass
class HarnessSummary:
    """What the harness's own event stream says about the episode (turns as the harness counts them)."""

    turns: int = 0
    tool_calls: int = 0
    final_message: str | None = None
    finished: bool = False  # the stream's final event said the run completed
    error: str | None = None
    events: int = 0
    unparsed_lines: int = 0
    tool_names: list[str] = field(default_factory=list)


def json_lines(stdout: str) -> tuple[list[dict], int]:
    """Parse a JSONL event stream, tolerating a cut first line (tails) and stray log lines."""
    events, bad = [], 0
    for line in stdout.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(obj, dict):
            events.append(obj)
        else:
            bad += 1
    return events, bad


@dataclass(frozen=True)
class VolatileRule:
    """A line the harness writes into its prompt that differs between rollouts of one task (the date,
    the host's kernel, a per-request hash): the proxy rewrites every match to ``replacement`` in
    messages of ``roles``, so GRPO groups, keyed on first-prompt ids, span days and machines."""

    name: str
    roles: frozenset[str]  # the canonical roles the rule applies to
    pattern: re.Pattern[str]
    replacement: str = ""  # what a match becomes (default: removed)


class HarnessAdapter(ABC):
    name: ClassVar[str]
    package: ClassVar[str]  # npm package
    version: ClassVar[str]  # pinned; bump deliberately (first prompts change with it)
    bin_name: ClassVar[str]  # executable in node_modules/.bin
    noise_dirs: ClassVar[tuple[str, ...]] = ()  # state it may drop in the task tree
    volatile_rules: ClassVar[tuple[VolatileRule, ...]] = ()  # per-day / per-machine prompt lines

    # --- install ---
    def install_dir(self, root: Path | None = None) -> Path:
        return (root or cache_root()) / "harnesses" / f"{self.name}-{self.version}"

    def is_installed(self, root: Path | None = None) -> bool:
        d = self.install_dir(root)
        return (d / INSTALLED_MARKER).exists() and (d / "node_modules" / ".bin" / self.bin_name).exists()

    def install_command(self, root: Path | None = None) -> list[str]:
        return ["npm", "install", "--prefix", str(self.install_dir(root)), "--no-audit", "--no-fund",
                "--loglevel=error", f"{self.package}@{self.version}"]

    def install(self, root: Path | None = None, *, timeout_s: float = 1800) -> Path:
        """Install once; a file lock makes concurrent callers wait for the first."""
        d = self.install_dir(root)
        d.parent.mkdir(parents=True, exist_ok=True)
        with open(d.parent / f".{d.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.is_installed(root):
                return d
            shutil.rmtree(d, ignore_errors=True)  # a half-finished earlier attempt
            d.mkdir()
            proc = subprocess.run(self.install_command(root), capture_output=True, text=True, timeout=timeout_s)
            if proc.returncode != 0:
                shutil.rmtree(d, ignore_errors=True)
                raise RuntimeError(f"npm install {self.package}@{self.version} failed:\n{proc.stderr[-4000:]}")
            (d / INSTALLED_MARKER).write_text(f"{self.package}@{self.version}\n")
            os.chmod(d, 0o755)
        return d

    @property
    def executable(self) -> str:
        """The CLI's path inside the sandbox."""
        return f"{HARNESS_MOUNT}/node_modules/.bin/{self.bin_name}"

    def version_command(self) -> list[str]:
        return [self.executable, "--version"]

    # --- per-episode ---
    @abstractmethod
    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        """Files to write before the run: absolute path inside the sandbox -> content."""

    @abstractmethod
    def env(self, ctx: HarnessContext) -> dict[str, str]:
        """Environment on top of the sandbox's fixed one."""

    @abstractmethod
    def command(self, ctx: HarnessContext, prompt: str) -> list[str]:
        """The headless command line; the prompt is one argv element, stdin is empty."""

    @abstractmethod
    def summarize(self, stdout: str) -> HarnessSummary:
        """Read the harness's JSON event stream (possibly only its tail)."""
