"""Large request bodies are parsed in worker processes, not threads.

Parsing a body is JSON, pydantic validation and the volatile-line rules (proxy/volatile.py): for a
5 MB tool output that is ~200 ms of CPU, most of it in single ``re.sub`` calls that hold the GIL
from start to end. In a worker thread that still stops the event loop (``/health``, every other
session) for the whole call; in a worker process it does not. Only the raw bytes go out and the
decoded request comes back (both pickled, a copy of the text each way), so small bodies, the vast
majority, are parsed in place where that copy would cost more than the parse.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

T = TypeVar("T")
MAX_WORKERS = 2


class ParsePool:
    """Worker processes for parsing, started on first use (a proxy that never sees a large body
    never starts one) with ``spawn``: forking a process that runs tokenizer and backend threads
    can deadlock the child."""

    def __init__(self, max_workers: int = MAX_WORKERS):
        self.max_workers = max(1, min(max_workers, os.cpu_count() or 1))
        self._pool: ProcessPoolExecutor | None = None

    async def run(self, parse: Callable[[bytes], T], raw: bytes) -> T:
        """``parse(raw)`` in a worker process; ``parse`` must be picklable (a module-level function
        or a partial of one), and so must what it returns or raises."""
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.max_workers, mp_context=multiprocessing.get_context("spawn"))
        pool = self._pool
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, parse, raw)
        except BrokenProcessPool:  # a worker died (killed, out of memory): the next body gets a fresh pool
            if self._pool is pool:
                self._pool = None
            pool.shutdown(wait=False)
            raise

    def close(self) -> None:
        """Stop the workers and the pool's own thread, waiting for them (a later body starts a new pool)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
