"""Remove a server's temp state when its process ends, however it ends.

`gym env start` stops its servers with SIGINT and SIGKILLs any that is not gone a second later, so
a server's own shutdown (settling episodes, removing workspaces) may be cut short. A janitor is a
tiny child process in its own session (so neither the terminal's SIGINT nor the server's death
reaches it) that blocks reading a pipe only the server holds; when the server exits — cleanly,
by exception or by SIGKILL — the pipe closes and the janitor removes the paths it was given.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_SCRIPT = "import shutil, sys; sys.stdin.buffer.read(); [shutil.rmtree(p, ignore_errors=True) for p in sys.argv[1:]]"


class Janitor:
    """Holds the pipe; ``release`` (or the process's end) lets the janitor clean up and exit."""

    def __init__(self, *paths: Path):
        self._proc = subprocess.Popen([sys.executable, "-c", _SCRIPT, *map(str, paths)], stdin=subprocess.PIPE,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def release(self, wait_s: float = 30.0) -> None:
        """Clean up now (a clean shutdown) and wait for it."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        try:
            self._proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            pass
