"""Grading's worker processes: where a grade runs when a process also serves model calls.

A grade is mostly waiting on its sandbox, but not only: applying the patch, building canaries,
reading reports and logs, diffing trees is Python work that, on a thread, takes the interpreter
lock from the event loop that answers every session's model calls. In worker processes it does
not, and a grader that dies (the kernel's out-of-memory killer, a crash in a C extension) takes its
worker with it, not the rollout: the grade in flight fails with `GraderCrashed` (the episode's
kind is then ``infrastructure``, masked) and the next grade gets a fresh pool (`SpawnPool`). The
workers ignore SIGINT: Ctrl-C is the driver's to handle (it cancels; a grade in flight ends on its
own deadline, as on a thread). The gold runs they share are kept once per node (`gold_runs`).
``processes=False`` grades on threads of this process instead: for a test double that shares
state with the test (said where a test uses it).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import Any, TypeVar

from polar_env.spawn_pool import SpawnPool

T = TypeVar("T")


class GraderCrashed(RuntimeError):
    """The grading worker died during the grade: nothing is known of the patch."""


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class GradingWorkers:
    """Up to ``slots`` grades at once, each in a worker process (or a thread: ``processes=False``)."""

    def __init__(self, slots: int, *, processes: bool = True):
        self._processes = SpawnPool(slots, initializer=_ignore_sigint) if processes else None
        self._threads = None if processes else ThreadPoolExecutor(slots, thread_name_prefix="polar-grade")

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a worker (pickled: a module-level function and its arguments)."""
        call = partial(fn, *args, **kwargs)
        if self._processes is None:
            return await asyncio.get_running_loop().run_in_executor(self._threads, call)
        try:
            return await self._processes.run(call)
        except BrokenProcessPool as exc:
            raise GraderCrashed(f"the grading worker died during the grade ({exc})") from exc

    def close(self) -> None:
        """Drop queued grades; one in flight ends on its own deadline."""
        if self._processes is not None:
            self._processes.close(wait=False)
        elif self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
