"""The grading pool episodes share: grades in worker processes under a limit, trajectory builds on one
thread, both off the event loop that answers every session's model calls."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from polar_env.episodes.admission import StageAdmission
from polar_env.rewards.workers import GradingWorkers

T = TypeVar("T")


class Grading:
    """Where grading runs: ``slots`` grades at once in worker processes (`rewards.workers`: never on the
    loop's interpreter lock, and workspace set-up, on the default thread pool, never queues behind a
    grade); also the one thread the trajectory builds run on. A grade enters its slot through
    ``admission`` (the driver's stage admission; by default one of its own with ``slots`` grade slots)."""

    def __init__(self, slots: int = 1, *, processes: bool = True, admission: StageAdmission | None = None):
        self.slots = slots
        self.admission = admission or StageAdmission(grade=slots)
        self._workers = GradingWorkers(slots, processes=processes)
        self._builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="polar-build")

    async def in_worker(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a grading worker (the caller holds a grade slot: `call`)."""
        return await self._workers.run(fn, *args, **kwargs)

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``await fn(*args)`` in a grade slot (a grade: `grade_episode`)."""
        async with self.admission.grading():
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
