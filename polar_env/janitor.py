"""Remove a server's temp state when its process ends, however it ends.

`gym env start` stops its servers with SIGINT and SIGKILLs any that is not gone a second later, so
a server's own shutdown (settling episodes, removing workspaces) may be cut short. A janitor is a
tiny child process in its own session (so neither the terminal's SIGINT nor the server's death
reaches it) that blocks reading a pipe only the server holds; when the server exits — cleanly,
by exception or by SIGKILL — the pipe closes and the janitor removes the paths it was given: first
(as host root) every mount beneath them, deepest first, lazily (a sandbox's tmpfs and its read-only
views, the proxy's socket tmpfs: a removal stops at a mount point and would leave them mounted).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_SCRIPT = """
import os, shutil, subprocess, sys
sys.stdin.buffer.read()
paths = [os.path.realpath(p) for p in sys.argv[1:]]
if os.geteuid() == 0:
    with open("/proc/self/mountinfo") as mounts:
        points = [line.split()[4] for line in mounts]
    for point in sorted(points, key=len, reverse=True):
        if any(point == p or point.startswith(p + "/") for p in paths):
            subprocess.run(["umount", "-l", point], capture_output=True)
for p in paths:
    shutil.rmtree(p, ignore_errors=True)
"""


class Janitor:
    """Holds the pipe; ``release`` (or the process's end) lets the janitor clean up and exit."""

    def __init__(self, *paths: Path):
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SCRIPT, *map(str, paths)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def release(self, wait_s: float = 30.0) -> None:
        """Clean up now (a clean shutdown) and wait for it."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        try:
            self._proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            pass
