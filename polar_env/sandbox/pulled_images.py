"""The images Polar pulled on this node (``polar tasks pull``), for pruning the least recently used.

A JSON file (``$POLAR_CACHE/images.json``: image -> size in bytes, last use in epoch seconds)
changed under a lock file, so concurrent pulls and episodes on a node keep one list. Only what
is listed is ever removed: images the node had before are not Polar's to prune.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from polar_env.cache import cache_root
from polar_env.sandbox.container import image_exists


class PulledImages:
    """The ledger of images Polar pulled on this node: image -> size in bytes and last use (epoch s)."""

    def __init__(self, path: Path | None = None):
        self.path = path or cache_root() / "images.json"

    @contextmanager
    def _locked(self) -> Iterator[dict[str, dict[str, Any]]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            entries = json.loads(self.path.read_text()) if self.path.exists() else {}
            yield entries
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(entries, indent=1, sort_keys=True))
            tmp.replace(self.path)

    def entries(self) -> dict[str, dict[str, Any]]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def record(self, image: str, size: int) -> None:
        with self._locked() as entries:
            entries[image] = {"size": size, "last_used": time.time()}

    def touch(self, image: str) -> None:
        """An episode used ``image``: it becomes the most recently used (if Polar pulled it)."""
        if image not in self.entries():
            return
        with self._locked() as entries:
            if image in entries:
                entries[image]["last_used"] = time.time()

    def prune(self, engine: str, budget_bytes: int, keep: set[str]) -> list[str]:
        """Remove Polar's least recently used images until the rest fit ``budget_bytes``; never ``keep``."""
        removed = []
        with self._locked() as entries:
            total = sum(e["size"] for e in entries.values())
            for image in sorted(entries, key=lambda i: entries[i]["last_used"]):
                if total <= budget_bytes:
                    break
                if image in keep:
                    continue
                proc = subprocess.run([engine, "rmi", image], capture_output=True, text=True, timeout=600)
                if proc.returncode == 0 or not image_exists(engine, image):
                    total -= entries.pop(image)["size"]
                    removed.append(image)
        return removed
