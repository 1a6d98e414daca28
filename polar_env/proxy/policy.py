"""The serving policy's version and the weight-sync fence (docs/training.md, "Asynchronous RL").

A trainer that keeps generating while it updates weights tells the proxy which version serves
(``POST /admin/policy``); every call records the version it was sampled with. Around a weight swap
it closes the fence (``POST /admin/pause``): new generations wait at the fence (a streamed answer
keeps sending the API's keep-alives meanwhile, so a harness sees a slower answer, never an error),
the ones in flight finish (or, when asked, are aborted, recorded and started again after the
swap), then ``POST /admin/resume`` opens it with the new version. A pause that is never resumed
opens by itself after its ``timeout_s``: a trainer that died must not hang every episode.

Where the inference server labels the weights it serves (vLLM's ``/weight_info``, SGLang's
``meta_info.weight_version``), a numeric label is the version (the engine reads it per call and moves
the fence's version to it): nothing has to call ``/admin/policy``. Other labels (vLLM's ``default``
before any sync) are recorded as they are and leave the call to the trainer's version, if any.

The open fence costs an attribute test, a counter and a set entry per call: no task, no lock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from polar_env import metrics

log = logging.getLogger(__name__)
T = TypeVar("T")


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PolicyVersion(_Body):
    """``POST /admin/policy``: the version of the weights the backend serves from now on."""

    version: int = Field(ge=0)


class PauseRequest(_Body):
    """``POST /admin/pause``: close the fence for a weight swap."""

    timeout_s: float = Field(default=300.0, gt=0, le=86400)  # opens by itself after this
    in_flight: Literal["finish", "abort"] = "finish"  # generations already running: wait for them, or abort
    drain_timeout_s: float = Field(default=120.0, gt=0, le=86400)  # how long "finish" waits


class ResumeRequest(_Body):
    """``POST /admin/resume``: open the fence, optionally naming the version now served."""

    version: int | None = Field(default=None, ge=0)


class PauseReport(BaseModel):
    """What one pause did: the trainer swaps weights once ``drained`` is true."""

    drained: bool
    in_flight: int  # generations running when the fence closed
    aborted: int  # of those, aborted (they start again after the resume)
    drain_ms: float


class FenceWindow(BaseModel):
    """One closed period of the fence, as the run's metrics record it."""

    version_before: int | None
    version_after: int | None = None
    in_flight: int = 0  # generations running when it closed (they finished, or were aborted)
    drain_ms: float
    paused_ms: float = 0.0
    held_calls: int = 0  # new generations that waited at the fence
    held_ms_max: float = 0.0
    aborted: int = 0
    timed_out: bool = False  # opened by its timeout, not by a resume


class PolicyState(BaseModel):
    """``GET /admin/policy``."""

    version: int | None
    paused: bool
    generating: int
    waiting: int
    windows: list[FenceWindow]


class PolicyFence:
    """The version now served and the gate every generation passes (one per engine)."""

    def __init__(self, version: int | None = None):
        self.version = version
        if version is not None:
            metrics.POLICY_VERSION.set(version)
        self.windows: list[FenceWindow] = []
        self._gate: asyncio.Event | None = None  # None: open
        self._generating = 0
        self._waiting = 0
        self._idle: asyncio.Event | None = None  # set when the last generation in flight leaves
        self._running: set[asyncio.Task] = set()  # the tasks whose generation is in flight
        self._aborted: set[asyncio.Task] = set()
        self._closed_at = 0.0
        self._oldest_wait = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._changed: asyncio.Event | None = (
            None  # set (and dropped) when the version moves: admission waits on it
        )

    @property
    def paused(self) -> bool:
        return self._gate is not None

    def state(self) -> PolicyState:
        return PolicyState(
            version=self.version,
            paused=self.paused,
            generating=self._generating,
            waiting=self._waiting,
            windows=self.windows,
        )

    def set_version(self, version: int) -> None:
        self.version = version
        metrics.POLICY_VERSION.set(version)
        if self._changed is not None:
            changed, self._changed = self._changed, None
            changed.set()

    async def version_changed(self) -> None:
        """Return once the version moves (a set, or a resume naming one)."""
        if self._changed is None:
            self._changed = asyncio.Event()
        await self._changed.wait()

    async def generate(
        self, make: Callable[[], Awaitable[T]], on_abort: Callable[[], None] | None = None
    ) -> tuple[int | None, T, float]:
        """``await make()`` once the fence is open, never across a swap; returns the version that
        sampled, the result and the milliseconds it waited at the fence. An attempt the fence aborts (it
        cancels the calling task while that task waits inside ``make``, and takes the cancellation back) calls
        ``on_abort`` and runs again after the resume."""
        task = asyncio.current_task()
        assert task is not None  # called from a coroutine
        held_ms = 0.0
        while True:
            if self._gate is not None:
                held_ms += await self._hold()
            version = self.version
            self._generating += 1
            self._running.add(task)
            try:
                return version, await make(), held_ms
            except asyncio.CancelledError:
                if task not in self._aborted:
                    raise
            finally:
                self._running.discard(task)
                if task in self._aborted:
                    self._aborted.discard(task)
                    task.uncancel()
                self._generating -= 1
                if self._generating == 0 and self._idle is not None:
                    self._idle.set()
            if on_abort is not None:
                on_abort()

    async def _hold(self) -> float:
        started = time.perf_counter()
        window = self.windows[-1]
        window.held_calls += 1
        if self._waiting == 0:
            self._oldest_wait = started
        self._waiting += 1
        try:
            while self._gate is not None:
                await self._gate.wait()
        finally:
            self._waiting -= 1
        held_ms = (time.perf_counter() - started) * 1e3
        window.held_ms_max = max(window.held_ms_max, held_ms)
        return held_ms

    async def pause(self, request: PauseRequest | None = None) -> PauseReport:
        """Close the fence; return once the generations in flight finished (or were aborted)."""
        request = request or PauseRequest()
        started = time.perf_counter()
        if self._gate is None:
            self._gate = asyncio.Event()
            self._closed_at = started
            self.windows.append(FenceWindow(version_before=self.version, drain_ms=0.0))
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(request.timeout_s, self._expire)
        in_flight = self._generating
        aborted = 0
        if request.in_flight == "abort":
            for task in self._running:
                self._aborted.add(task)
                task.cancel()
                aborted += 1
        drained = await self._drain(request.drain_timeout_s)
        window = self.windows[-1]
        window.drain_ms = (time.perf_counter() - started) * 1e3
        window.in_flight = max(window.in_flight, in_flight)
        window.aborted += aborted
        return PauseReport(drained=drained, in_flight=in_flight, aborted=aborted, drain_ms=window.drain_ms)

    async def _drain(self, timeout_s: float) -> bool:
        if self._generating == 0:
            return True
        self._idle = asyncio.Event()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return self._generating == 0
        finally:
            self._idle = None
        return True

    def resume(self, version: int | None = None, *, timed_out: bool = False) -> FenceWindow | None:
        """Open the fence (``version``: the one served from now on); returns the window it closes."""
        if version is not None:
            self.set_version(version)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        gate, self._gate = self._gate, None
        if gate is None:
            return None
        window = self.windows[-1]
        now = time.perf_counter()
        window.version_after = self.version
        window.paused_ms = (now - self._closed_at) * 1e3
        if self._waiting:  # the longest wait so far, known before the waiters wake
            window.held_ms_max = max(window.held_ms_max, (now - self._oldest_wait) * 1e3)
        window.timed_out = timed_out
        gate.set()
        return window

    def _expire(self) -> None:
        self._timer = None
        log.warning(
            "the weight-sync fence was not resumed within its timeout: opening it (version %s)", self.version
        )
        self.resume(timed_out=True)


class Admission:
    """Staleness bounded at admission (``--max-staleness K``, AReaL's rule): the ``e``-th episode
    to start belongs to training step ``e // per_step`` and starts only once the policy is within
    ``K`` versions of it, i.e. ``e // per_step <= (version - first version) + K``. An episode that
    started is never held back or thrown away for its age: it finishes, its version spread recorded."""

    def __init__(self, fence: PolicyFence, max_staleness: int, per_step: int):
        if max_staleness < 0 or per_step < 1:
            raise ValueError(
                f"max staleness must be >= 0 and episodes per step >= 1 (got {max_staleness}, {per_step})"
            )
        self.fence, self.max_staleness, self.per_step = fence, max_staleness, per_step
        self.base = fence.version or 0
        self.started = 0
        self.waited_ms = 0.0  # summed over the episodes that waited

    def lag(self, episode: int) -> int:
        """The staleness ``episode`` would have if it started now: the step it feeds minus the policy's
        version."""
        return episode // self.per_step - ((self.fence.version or 0) - self.base)

    async def admit(self) -> int | None:
        """Wait until the next episode may start; returns the version it starts with."""
        episode, self.started = self.started, self.started + 1
        started = time.perf_counter()
        while self.lag(episode) > self.max_staleness:
            await self.fence.version_changed()
        self.waited_ms += (time.perf_counter() - started) * 1e3
        return self.fence.version
