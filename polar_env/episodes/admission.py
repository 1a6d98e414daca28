"""Stage admission: how many episodes may be in each stage at once (docs/rollout.md, "Stages").

The one object both drivers enter an episode's stages through: ``polar rollout``'s
``EpisodeRunner`` (rollout/runner.py) and the NeMo Gym agent server (agent_server/core.py). Each
driver says its limits; the order of entry, what each limit covers and when it is given back are
decided here, once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, nullcontext
from typing import Any

from polar_env import metrics
from polar_env.proxy.app import ProxyServer
from polar_env.proxy.policy import Admission
from polar_env.proxy.run_slots import RunSlots


class StageAdmission:
    """The limits of an episode's stages, entered in this order (None: no limit):

    - ``live``: episodes between their start and the end of their run stage (live harnesses): the
      rollout's ``run_slots + lookahead``, the Gym agent's ``max_concurrent_episodes``. ``collapsed``:
      the slot is held over every stage, finish included (the rollout's driver before stages);
    - the policy-staleness bound, inside the live slot (``max_staleness``: an episode starts within K
      versions of the training step it feeds, ``per_step`` episodes a step; proxy/policy.py ``Admission``);
    - ``prepare``: of the live episodes, how many open their workspace and boot their harness at once
      (up to its first model call: a dozen harnesses starting together on a few cores each take
      several times as long);
    - ``run``: model calls at once, the proxy's per-call admission (proxy/run_slots.py): a harness in
      a tool leaves its slot to another's call. Installed on the proxy by :meth:`bind`;
    - ``grade``: grades at once (``Grading`` enters :meth:`grading` around each grade).

    Collapsed, only ``live`` and ``grade`` hold: one slot per episode over all its stages."""

    def __init__(
        self,
        *,
        live: int | None = None,
        prepare: int | None = None,
        run: int | None = None,
        grade: int | None = None,
        collapsed: bool = False,
        max_staleness: int | None = None,
        per_step: int = 1,
    ):
        for name, value in (("live", live), ("prepare", prepare), ("run", run), ("grade", grade)):
            if value is not None and value < 1:
                raise ValueError(f"{name} slots must be >= 1 (got {value})")
        self.live, self.prepare, self.run, self.grade = live, prepare, run, grade
        self.collapsed = collapsed
        self.max_staleness, self.per_step = max_staleness, per_step
        self.staleness: Admission | None = None  # made by bind, over the proxy's policy fence
        self._live = _semaphore(live)
        self._prepare = None if collapsed else _semaphore(prepare)
        self._grade = _semaphore(grade)

    def bind(self, proxy: ProxyServer) -> None:
        """The proxy the episodes run through: its run slots, the staleness bound over its policy
        fence, and the inference slots /metrics' busy fraction is counted over."""
        if self.run is not None and not self.collapsed:
            proxy.engine.run_slots = RunSlots(self.run)
        if self.max_staleness is not None:
            self.staleness = Admission(proxy.engine.fence, self.max_staleness, self.per_step)
        metrics.BUSY.start(self.run or self.live or 1)

    @asynccontextmanager
    async def episode(self) -> AsyncIterator[Entry]:
        """One episode's passage: a live slot, then the staleness bound; every slot it still holds is
        given back when it leaves (a cancel included)."""
        entry = Entry(self)
        try:
            await entry.enter()
            yield entry
        finally:
            entry.release()

    def grading(self) -> Any:
        """``async with`` it around a grade: a grade slot."""
        return self._grade if self._grade is not None else nullcontext()


class Entry:
    """One episode inside a :class:`StageAdmission`: when it was queued, the policy version it was
    admitted at, and the live slot it holds until its run stage ends."""

    def __init__(self, admission: StageAdmission):
        self.admission = admission
        self.queued_at = time.time()  # the driver took the episode (the start of its ``queued_s``)
        self.version: int | None = None
        self._holds_live = False

    async def enter(self) -> None:
        a = self.admission
        if a._live is not None:
            await a._live.acquire()
            self._holds_live = True
        if a.staleness is not None:
            self.version = await a.staleness.admit()

    @property
    def metadata(self) -> dict[str, Any]:
        """What the trajectory records of its admission: the policy version, under a staleness bound."""
        return {} if self.admission.staleness is None else {"admitted_at_version": self.version}

    @asynccontextmanager
    async def preparing(self) -> AsyncIterator[None]:
        """The prepare stage's slot (its workspace opened, its harness booted)."""
        prepare = self.admission._prepare
        if prepare is None:
            yield
            return
        async with prepare:
            yield

    def ran(self) -> None:
        """The run stage ended: the live slot goes to the next episode (collapsed: kept to the end)."""
        if not self.admission.collapsed:
            self.release()

    def release(self) -> None:
        if self._holds_live:
            self._holds_live = False
            assert self.admission._live is not None
            self.admission._live.release()


def _semaphore(n: int | None) -> asyncio.Semaphore | None:
    return asyncio.Semaphore(n) if n is not None else None
