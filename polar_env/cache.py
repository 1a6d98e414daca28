"""Polar's one on-disk cache: harness installs, the embedded model, task environments and data.

``$POLAR_CACHE`` or ``~/.cache/polar``; point it at a node-local disk on a cluster.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("POLAR_CACHE") or Path.home() / ".cache" / "polar")
