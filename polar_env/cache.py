"""Polar's one on-disk cache: harness installs, the embedded model, task environments and data.

``$POLAR_CACHE`` or ``~/.cache/polar``; point it at a node-local disk on a cluster.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from polar_env.environment import EnvSettings


def cache_root() -> Path:
    return EnvSettings.read().cache or Path.home() / ".cache" / "polar"


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> Path:
    """``data`` at ``path`` (with ``mode``), written whole: a temp file of its own renamed, so concurrent
    writers (processes or threads: each its own temp file) and readers never see a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path
