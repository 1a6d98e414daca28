"""Polar's one on-disk cache: harness installs, the embedded model, task environments and data.

``$POLAR_CACHE`` or ``~/.cache/polar``; point it at a node-local disk on a cluster.
"""

from __future__ import annotations

import os
from pathlib import Path

from polar_env.environment import EnvSettings


def cache_root() -> Path:
    return EnvSettings.read().cache or Path.home() / ".cache" / "polar"


def write_atomic(path: Path, data: bytes) -> Path:
    """``data`` at ``path``, written whole: a temp file renamed, so concurrent writers and readers
    never see a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(data)
    tmp.rename(path)
    return path
