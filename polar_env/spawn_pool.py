"""Worker processes started with ``spawn``, on first use, and replaced when one dies.

Forking a process that runs tokenizer, backend and event-loop threads can deadlock the child, so
these pools spawn. A worker that dies (killed, out of memory) breaks its pool: the call in flight
raises ``BrokenProcessPool`` and the next call gets a fresh pool. The proxy parses large bodies in
one (proxy/offload.py), grading runs in one (rewards/workers.py).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

T = TypeVar("T")


class SpawnPool:
    """Up to ``max_workers`` spawned workers, each started by ``initializer``."""

    def __init__(self, max_workers: int, initializer: Callable[[], None] | None = None):
        self.max_workers = max_workers
        self.initializer = initializer
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker: ``fn`` (a module-level function or a partial of one), its arguments
        and what it returns or raises must be picklable."""
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    self.max_workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=self.initializer,
                )
            pool = self._pool
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        except BrokenProcessPool:
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            raise

    def close(self, *, wait: bool) -> None:
        """Drop queued calls; ``wait`` for the one in flight and the workers to end, or not (a later call
        starts a new pool)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=wait, cancel_futures=True)
