"""Run-stage admission: at most N sessions talk to the model at once (docs/rollout.md, "Stages").

The staged rollout driver starts an episode's harness while it prepares, so the harness's own
start-up overlaps the episodes that are running. Its session takes a run slot at its first model
call: the call waits here, inside the engine (a streamed answer keeps sending the API's keep-alives
meanwhile, proxy/app.py), until a slot is free, and the session keeps it until the driver releases
it (its harness ended, or the episode was cancelled). A session that never calls the model never
takes one. Slots are granted in the order the first calls arrived. The driver tells a harness's
deadline to stop its clock while the session waits (``waited_s``), so waiting is never the policy's.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass


class RunEnded(Exception):
    """The session's run stage ended (released) while its call waited for a slot."""


@dataclass
class SlotTimes:
    """When a session first called the model and when it got its slot (``time.time()``)."""

    first_call_at: float
    admitted_at: float | None = None

    def waited_s(self, now: float | None = None) -> float:
        end = self.admitted_at if self.admitted_at is not None else (now or time.time())
        return max(end - self.first_call_at, 0.0)


class RunSlots:
    """``n`` run slots shared by the sessions of one proxy (``TokenEngine.run_slots``)."""

    def __init__(self, n: int):
        if n < 1:
            raise ValueError(f"run slots must be >= 1 (got {n})")
        self.n = n
        self.holders: set[str] = set()
        self._queue: OrderedDict[str, asyncio.Future[None]] = OrderedDict()
        self._times: dict[str, SlotTimes] = {}
        self._admitted: dict[str, asyncio.Event] = {}

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def enter(self, session_id: str) -> float:
        """Return once ``session_id`` holds a slot (at once when it already does); the seconds waited."""
        if session_id in self.holders:
            return 0.0
        self._times.setdefault(session_id, SlotTimes(time.time()))
        if session_id not in self._queue:
            if len(self.holders) < self.n and not self._queue:
                self._grant(session_id)
                return 0.0
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            future.add_done_callback(_retrieve)
            self._queue[session_id] = future
        started = time.perf_counter()
        # shielded: one cancelled call (a harness that gave up on it) does not give the session's place away
        await asyncio.shield(self._queue[session_id])
        return time.perf_counter() - started

    def _grant(self, session_id: str) -> None:
        self.holders.add(session_id)
        self._times[session_id].admitted_at = time.time()
        if (event := self._admitted.get(session_id)) is not None:
            event.set()

    async def admitted(self, session_id: str) -> None:
        """Return once ``session_id`` holds its slot."""
        if session_id in self.holders:
            return
        await self._admitted.setdefault(session_id, asyncio.Event()).wait()

    def times(self, session_id: str) -> SlotTimes | None:
        return self._times.get(session_id)

    def waited_s(self, session_id: str) -> float:
        """Seconds the session's first call has waited for its slot so far (0 before any call)."""
        times = self._times.get(session_id)
        return times.waited_s() if times is not None else 0.0

    def release(self, session_id: str) -> SlotTimes | None:
        """The session's run stage is over: its slot goes to the next waiting session (a call of
        its own still waiting fails with ``RunEnded``); idempotent. Returns its times."""
        self._admitted.pop(session_id, None)
        times = self._times.pop(session_id, None)
        if (future := self._queue.pop(session_id, None)) is not None and not future.done():
            future.set_exception(RunEnded(f"session {session_id}: the run stage ended while it waited for a slot"))
        if session_id in self.holders:
            self.holders.discard(session_id)
            while self._queue and len(self.holders) < self.n:
                waiting, future = self._queue.popitem(last=False)
                self._grant(waiting)
                future.set_result(None)
        return times


def _retrieve(future: asyncio.Future[None]) -> None:
    """Mark a waiter's exception as seen: its calls may all have been cancelled already."""
    if not future.cancelled():
        future.exception()
