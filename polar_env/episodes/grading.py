"""The grading pool episodes share: grades in worker processes under a limit, trajectory builds on one
thread, both off the event loop that answers every session's model calls."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from polar_env.rewards.workers import GradingWorkers

T = TypeVar("T")


class Grading:
    """Where grading runs: ``slots`` grades at once in worker processes (`rewards.workers`: never on the
    loop's interpreter lock, and workspace set-up, on the default thread pool, never queues behind a
    grade); also the one thread the trajectory builds run on."""

    def __init__(self, slots: int = 1, *, processes: bool = True):
        self.slots = slots
        self._workers = GradingWorkers(slots, processes=processes)
        self._builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="polar-build")
        self._limit: asyncio.Semaphore | None = None  # made on the loop that uses it

    async def in_worker(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a grading worker (the caller holds the grading limit: `call`)."""
        return await self._workers.run(fn, *args, **kwargs)

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``await fn(*args)`` within the grading limit (a grade: `grade_episode`)."""
        if self._limit is None:
            self._limit = asyncio.Semaphore(self.slots)
        async with self._limit:
            return await fn(*args)

    async def off_loop(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn`` off the event loop that answers every session's model calls, one at a time
        (trajectory builds, the rollout's output writes)."""
        return await asyncio.get_running_loop().run_in_executor(self._builder, partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Drop queued grades (a running one ends on its own deadline); finish the write in flight,
        so the outputs are closed after it."""
        self._workers.close()
        self._builder.shutdown(wait=True, cancel_futures=True)
