"""Run-stage admission: at most N model calls at once (docs/rollout.md, "Stages").

The staged rollout driver starts more harnesses than there are run slots (the lookahead), so that
while one harness runs a tool, starts up or exits, another's call keeps the model busy. A call
takes its slot here, inside the engine, just before the backend, and gives it back as soon as the
backend has answered (a streamed answer keeps sending the API's keep-alives while it waits,
proxy/app.py). A session already in its run stage (it had a slot before) goes ahead of first calls,
so episodes that started finish first and a new episode never starves one mid-way; within each
class calls are granted in arrival order. The driver stops a harness's deadline clock while one of
its harness's calls waits (``waited_s``), so waiting is never the policy's.

A call that is not provably the harness's (``harness=False``: origin ``tool`` or ``unknown``, a process
the agent ran with the session's key) is the agent's own: it waits behind every harness call, holds
at most one slot per session at a time, and its waits never stop the clock: a tool process that keeps
calls queued can neither extend its episode nor hold the slots its siblings' harnesses need.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from dataclasses import dataclass


class RunEnded(Exception):
    """The session's run stage ended (released) while its call waited for a slot."""


@dataclass
class SlotTimes:
    """A session's waits for slots (``time.time()``): its first call, its first grant, the seconds
    its calls have waited so far (a wait is counted once, however many of its calls wait at once)."""

    first_call_at: float
    admitted_at: float | None = None
    waited: float = 0.0
    waiting: int = 0  # its calls waiting now
    waiting_since: float = 0.0

    def waited_s(self, now: float | None = None) -> float:
        ongoing = (now or time.time()) - self.waiting_since if self.waiting else 0.0
        return self.waited + max(ongoing, 0.0)

    def start_wait(self) -> None:
        if not self.waiting:
            self.waiting_since = time.time()
        self.waiting += 1

    def end_wait(self) -> None:
        self.waiting -= 1
        if not self.waiting:
            self.waited += max(time.time() - self.waiting_since, 0.0)


class RunSlots:
    """``n`` model calls at once over the sessions of one proxy (``TokenEngine.run_slots``)."""

    def __init__(self, n: int):
        if n < 1:
            raise ValueError(f"run slots must be >= 1 (got {n})")
        self.n = n
        self.busy = 0  # calls holding a slot now; below n no call waits (every leave hands its slot on)
        self.calls: Counter[str] = Counter()  # session -> its calls holding a slot now
        self._later: deque[tuple[str, asyncio.Future[None]]] = deque()  # calls of sessions in their run stage
        self._first: deque[tuple[str, asyncio.Future[None]]] = deque()  # first calls
        self._agent: deque[tuple[str, asyncio.Future[None]]] = deque()  # calls not the harness's: last
        self.agent_calls: Counter[str] = (
            Counter()
        )  # session -> its non-harness calls holding a slot (at most 1)
        self._times: dict[str, SlotTimes] = {}
        self._admitted: dict[str, asyncio.Event] = {}
        self._called: dict[str, asyncio.Event] = {}

    @property
    def holders(self) -> set[str]:
        """Sessions with a call holding a slot now."""
        return {s for s, n in self.calls.items() if n}

    @property
    def waiting(self) -> int:
        return sum(not f.done() for _, f in (*self._later, *self._first, *self._agent))

    async def enter(self, session_id: str, *, harness: bool = True) -> float:
        """Return once this call holds a slot (``leave`` gives it back); the seconds it waited.
        ``harness=False``: a call not provably the harness's (module docstring)."""
        if not harness:
            return await self._enter_agent(session_id)
        times = self._times.setdefault(session_id, SlotTimes(time.time()))
        if (event := self._called.get(session_id)) is not None:
            event.set()
        queue = self._later if times.admitted_at is not None else self._first
        if self.busy < self.n:
            self._grant(session_id)
            return 0.0
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append((session_id, future))
        times.start_wait()
        try:
            return await self._wait(session_id, future, harness=True)
        finally:
            times.end_wait()

    async def _enter_agent(self, session_id: str) -> float:
        """An agent's own call: granted only when no harness call waits and its session holds no other."""
        if self.busy < self.n and not self._harness_waiting() and not self.agent_calls[session_id]:
            self._grant(session_id, harness=False)
            return 0.0
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._agent.append((session_id, future))
        return await self._wait(session_id, future, harness=False)

    async def _wait(self, session_id: str, future: asyncio.Future[None], *, harness: bool) -> float:
        started = time.perf_counter()
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.leave(session_id, harness=harness)  # granted as the call was cancelled: the slot goes on
            future.cancel()
            raise
        return time.perf_counter() - started

    def _harness_waiting(self) -> bool:
        return any(not f.done() for _, f in (*self._later, *self._first))

    def leave(self, session_id: str, *, harness: bool = True) -> None:
        """The call's backend answer is in: its slot goes to the next waiting call."""
        self.busy -= 1
        held = self.calls if harness else self.agent_calls
        held[session_id] -= 1
        if held[session_id] <= 0:
            del held[session_id]
        self._hand_over()

    def _grant(self, session_id: str, *, harness: bool = True) -> None:
        self.busy += 1
        if not harness:  # the agent's own call: no admission of the run stage, no wait on the clock
            self.agent_calls[session_id] += 1
            return
        self.calls[session_id] += 1
        times = self._times.setdefault(session_id, SlotTimes(time.time()))
        if times.admitted_at is None:
            times.admitted_at = time.time()
        if (event := self._admitted.get(session_id)) is not None:
            event.set()

    def _hand_over(self) -> None:
        for queue in (self._later, self._first):
            while queue and self.busy < self.n:
                session_id, future = queue.popleft()
                if not future.done():  # a cancelled call's place is gone with it
                    self._grant(session_id)
                    future.set_result(None)
        if self._harness_waiting():
            return
        skipped: deque[tuple[str, asyncio.Future[None]]] = deque()
        while self._agent and self.busy < self.n:
            session_id, future = self._agent.popleft()
            if future.done():
                continue
            if self.agent_calls[session_id]:  # one at a time per session: its turn comes when that one leaves
                skipped.append((session_id, future))
                continue
            self._grant(session_id, harness=False)
            future.set_result(None)
        self._agent.extendleft(reversed(skipped))

    async def admitted(self, session_id: str) -> None:
        """Return once ``session_id`` has had a slot (its first call reached the backend)."""
        times = self._times.get(session_id)
        if times is not None and times.admitted_at is not None:
            return
        await self._admitted.setdefault(session_id, asyncio.Event()).wait()

    async def called(self, session_id: str) -> None:
        """Return once ``session_id`` has made a model call (its harness has booted)."""
        if session_id in self._times:
            return
        await self._called.setdefault(session_id, asyncio.Event()).wait()

    def times(self, session_id: str) -> SlotTimes | None:
        return self._times.get(session_id)

    def waited_s(self, session_id: str) -> float:
        """Seconds the session's calls have waited for slots so far (0 before any call)."""
        times = self._times.get(session_id)
        return times.waited_s() if times is not None else 0.0

    def release(self, session_id: str) -> SlotTimes | None:
        """The session's run stage is over: a call of its own still waiting fails with ``RunEnded``
        (one in flight keeps its slot until the backend answers); idempotent. Returns its times."""
        self._admitted.pop(session_id, None)
        self._called.pop(session_id, None)
        times = self._times.pop(session_id, None)
        for waiting, future in (*self._later, *self._first, *self._agent):
            if waiting == session_id and not future.done():  # its waiter is awaiting it: it sees the error
                future.set_exception(
                    RunEnded(f"session {session_id}: the run stage ended while its call waited for a slot")
                )
        return times
