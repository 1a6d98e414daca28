"""Large request bodies are parsed in worker processes, not threads.

Parsing a body is JSON, pydantic validation and the volatile-line rules (proxy/volatile.py): for a
5 MB tool output that is ~200 ms of CPU, most of it in single ``re.sub`` calls that hold the GIL
from start to end. In a worker thread that still stops the event loop (``/health``, every other
session) for the whole call; in a worker process it does not. Only the raw bytes go out and the
decoded request comes back (both pickled, a copy of the text each way), so small bodies, the vast
majority, are parsed in place where that copy would cost more than the parse.
"""

from __future__ import annotations

import os

from polar_env.spawn_pool import SpawnPool

MAX_WORKERS = 2


class ParsePool(SpawnPool):
    """Worker processes for parsing, started on first use (a proxy that never sees a large body
    never starts one); a worker that died fails its body, the next gets a fresh pool."""

    def __init__(self, max_workers: int = MAX_WORKERS):
        super().__init__(max(1, min(max_workers, os.cpu_count() or 1)))
