"""The staged rollout driver (rollout/runner.py, docs/rollout.md "Stages"): run slots are free while
another episode grades, cancellation in any stage leaves nothing behind, ``collapsed`` holds one
slot over everything, and the proxy's run-slot admission itself.

The episodes are real: the fake harness (reliability_helpers.FAKE_HARNESS, a stdlib script, as a
real CLI cannot be told what to do on cue) in the real bubblewrap sandbox, through the real
forwarder, proxy and driver. Two doubles, each said where it is made: the backend is the
project's ``InstantBackend`` with a counter of concurrent calls (and a short barrier that lets
calls which can overlap overlap), and grading is an ``asyncio``-free, Event-gated function in
place of ``grade_task``, because a real grade cannot be held open on cue (graded on threads, as it
shares state with the backend; tests/rewards/test_grading_workers.py runs real grades in worker processes).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import aiohttp
import pytest
from polar_sandbox_helpers import processes_matching
from proxy_client import make_proxy
from reliability_helpers import FakeHarness, wait_gone

from polar_env.backends.instant import InstantBackend
from polar_env.episodes import EpisodeSettings, sites, stages
from polar_env.episodes.admission import Entry, StageAdmission
from polar_env.episodes.timings import TIMING_KEYS
from polar_env.grades import GradeResult
from polar_env.proxy.app import ProxyServer
from polar_env.proxy.run_slots import RunEnded, RunSlots
from polar_env.rewards import grader
from polar_env.rollout.plan import RolloutPlan
from polar_env.rollout.runner import EpisodeRunner, run_rollouts
from polar_env.sandbox.base import Deadline, run_process_tree
from polar_env.tasks.loader import load_tasks
from polar_env.trajectory.models import EpisodeTimings

bwrap = pytest.mark.needs("bwrap")


# -- the proxy's admission, alone ---------------------------------------------------------------
async def test_run_slots_admit_calls_sessions_in_their_run_first_and_hand_over_on_leave():
    slots = RunSlots(1)
    assert await slots.enter("a") == 0.0
    booted = asyncio.ensure_future(slots.called("b"))  # the driver's prepare stage waits for b's first call
    await asyncio.sleep(0.01)
    assert not booted.done()
    b = asyncio.ensure_future(slots.enter("b"))  # first calls, in arrival order
    c = asyncio.ensure_future(slots.enter("c"))
    await asyncio.sleep(0.01)
    assert slots.holders == {"a"} and slots.waiting == 2 and not b.done()
    assert booted.done()  # b has called (it waits for its slot, not for its boot)
    a_again = asyncio.ensure_future(
        slots.enter("a")
    )  # a's next call: a holder's call waits too (one slot)...
    await asyncio.sleep(0.01)
    slots.leave("a")  # ...but a is in its run stage: it goes ahead of b and c's first calls
    await asyncio.sleep(0.01)
    assert a_again.done() and not b.done() and slots.holders == {"a"}
    slots.leave("a")
    await asyncio.sleep(0.01)
    assert b.done() and not c.done() and slots.holders == {"b"} and slots.times("b").admitted_at is not None
    assert slots.times("b").waited_s() > 0 and slots.times("a").waited_s() > 0  # both calls' waits counted
    slots.release("c")  # c's episode ended while its call waited: the call fails, b keeps its slot
    with pytest.raises(RunEnded):
        await c
    assert slots.holders == {"b"} and slots.waiting == 0
    assert slots.release("b") is not None and slots.holders == {"b"}  # a call in flight keeps its slot...
    slots.leave("b")  # ...until the backend has answered it
    assert slots.holders == set() and slots.busy == 0
    assert slots.release("b") is None  # idempotent


async def test_a_cancelled_waiting_call_gives_its_place_up_and_never_leaks_a_slot():
    slots = RunSlots(1)
    await slots.enter("a")
    first = asyncio.ensure_future(slots.enter("b"))
    await asyncio.sleep(0)
    first.cancel()  # the harness gave up on one call
    await asyncio.sleep(0.01)
    assert slots.waiting == 0
    later = asyncio.ensure_future(slots.enter("c"))
    await asyncio.sleep(0)
    slots.leave("a")  # granted to c...
    later.cancel()  # ...as c's call is cancelled: the slot is given back, not held by nobody
    with pytest.raises(asyncio.CancelledError):
        await later
    assert slots.busy == 0 and await slots.enter("b") == 0.0 and slots.holders == {"b"}


async def test_a_streamed_call_waiting_for_a_run_slot_gets_keepalives_then_its_answer(
    renderer, tmp_path: Path
):
    """The one run slot is held by another session for 2.5 s: the waiting call's stream opens and
    sends keep-alives (a client with a 1.5 s read timeout stays connected), then the answer; the
    wait is recorded as ``admission_ms``, not as generation."""
    done = renderer.tokenizer.encode("Done.", add_special_tokens=False) + renderer.eos_token_ids[:1]
    proxy = make_proxy(
        renderer,
        InstantBackend(done),
        tmp_path / "ledger",
        admin_secret="admin",
        keepalive_s=0.5,
        max_context=4096,
    )
    await proxy.start(port=0)
    proxy.engine.run_slots = slots = RunSlots(1)
    await slots.enter("other")
    asyncio.get_running_loop().call_later(2.5, slots.leave, "other")
    sid, key = proxy.create_session("s", sampling={"max_tokens": 16})
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(sock_read=1.5)) as http,
            http.post(
                f"{proxy.base_url}/s/{sid}/v1/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={"model": "policy", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
            ) as resp,
        ):
            raw = await resp.read()
        record = proxy.registry.ledger.calls(sid)[0]
    finally:
        await proxy.stop()
    assert raw.count(b": keep-alive\n\n") >= 3 and b"Done." in raw, raw[:300]
    assert record.timings["admission_ms"] >= 2000 and record.timings["generate_ms"] < 1000
    assert slots.holders == set() and slots.times(sid).admitted_at is not None  # answered: the slot went back


async def test_a_deadline_does_not_run_while_its_clock_is_paused():
    """A harness started ahead of its run slot is not timed while its first call waits (the
    driver passes the slot wait as ``paused_s``): 0.3 s of deadline, 1 s paused, a 0.8 s command."""
    waited = Deadline(0.3, paused_s=lambda: 1.0)
    ran = await run_process_tree(["sleep", "0.8"], timeout_s=waited, stdin=None, max_output_bytes=1024)
    assert not ran.timed_out and ran.exit_code == 0
    cut = await run_process_tree(["sleep", "5"], timeout_s=Deadline(0.3), stdin=None, max_output_bytes=1024)
    assert cut.timed_out and cut.duration_s < 5


# -- the stage admission both drivers enter, alone ---------------------------------------------
async def _entered(admission: StageAdmission, entries: list[Entry], done: asyncio.Event) -> None:
    async with admission.episode() as entry:
        entries.append(entry)
        await done.wait()


async def test_stage_admission_gives_a_live_slot_back_when_its_run_ends_and_collapsed_at_the_end():
    """Two live slots (the rollout's run slots + lookahead, the Gym agent's max_concurrent_episodes):
    a third episode waits until one's run stage ends; collapsed, until one leaves (its finish done)."""
    for collapsed in (False, True):
        admission = StageAdmission(live=2, prepare=1, collapsed=collapsed)
        entries: list[Entry] = []
        done = [asyncio.Event() for _ in range(3)]
        tasks = [asyncio.ensure_future(_entered(admission, entries, d)) for d in done]
        await asyncio.sleep(0.01)
        assert len(entries) == 2, collapsed
        entries[0].ran()  # its run stage ended; finishing (grading) now
        await asyncio.sleep(0.01)
        assert len(entries) == (2 if collapsed else 3), collapsed
        done[0].set()  # its finish ended
        await asyncio.sleep(0.01)
        assert len(entries) == 3
        for d in done:
            d.set()
        await asyncio.gather(*tasks)
        async with asyncio.timeout(1), admission.episode(), admission.episode():  # every slot came back
            pass


async def test_stage_admission_prepares_a_few_at_once_and_none_collapsed():
    admission = StageAdmission(live=3, prepare=1)
    async with admission.episode() as first, admission.episode() as second:
        async with first.preparing():
            waiting = asyncio.ensure_future(second.preparing().__aenter__())
            await asyncio.sleep(0.01)
            assert not waiting.done()  # one prepares at a time
        await asyncio.wait_for(waiting, 1)
    collapsed = StageAdmission(live=1, prepare=1, collapsed=True)
    async with collapsed.episode() as entry, entry.preparing(), entry.preparing():
        pass  # the one collapsed slot covers every stage: no prepare limit of its own


async def test_stage_admission_binds_the_run_slots_and_the_staleness_bound(renderer, tmp_path: Path):
    """``bind``: the proxy's per-call run slots (none collapsed) and the staleness bound over its
    fence, entered inside the live slot: K = 0, one episode a step, so the second waits for version 1."""
    backend = InstantBackend(renderer.tokenizer.encode("hi", add_special_tokens=False))
    proxy = ProxyServer.create(renderer=renderer, backend=backend, data_dir=tmp_path, admin_secret="s")
    proxy.engine.fence.set_version(0)
    StageAdmission(live=2, run=2, collapsed=True).bind(proxy)
    assert proxy.engine.run_slots is None
    admission = StageAdmission(live=2, run=3, max_staleness=0, per_step=1)
    admission.bind(proxy)
    assert proxy.engine.run_slots is not None and proxy.engine.run_slots.n == 3
    async with admission.episode() as first:
        assert first.metadata == {"admitted_at_version": 0}
        second = asyncio.ensure_future(admission.episode().__aenter__())
        await asyncio.sleep(0.05)
        assert not second.done()
        proxy.engine.fence.set_version(1)
        assert (await asyncio.wait_for(second, 1)).metadata == {"admitted_at_version": 1}
    with pytest.raises(ValueError, match="live slots must be >= 1"):
        StageAdmission(live=0)


# -- real episodes through the driver ----------------------------------------------------------
class CountingBackend(InstantBackend):
    """The test double for the model server: answers at once, after letting calls that can
    overlap do so (waiting for a partner up to 3 s while a grade is held, 0.3 s otherwise), and
    counts concurrent calls. With a ``gate`` (the collapsed driver, which has no run slots), the
    calls of all but the first session wait here until that session's grade is held."""

    def __init__(self, token_ids: list[int]):
        super().__init__(token_ids)
        self.inflight = self.max_inflight = 0
        self._more = asyncio.Event()
        self.watch: GatedGrade | None = None
        self.gate = False

    @property
    def barrier_s(self) -> float:
        held = self.watch is not None and self.watch.held.is_set() and not self.watch.release.is_set()
        return 3.0 if held else 0.3

    async def generate(self, prompt_ids, sampling, *, session_id=None):
        if self.watch is not None and self.gate:
            await self.watch.first_grades(session_id)
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        self._more.set()
        self._more = asyncio.Event()
        try:
            if self.inflight < 2:
                try:
                    await asyncio.wait_for(self._more.wait(), self.barrier_s)
                except TimeoutError:
                    pass
            if self.watch is not None:
                self.watch.saw(self.inflight)
            return await super().generate(prompt_ids, sampling, session_id=session_id)
        finally:
            self.inflight -= 1


class GatedSlots(RunSlots):
    """The proxy's run slots, with the staged driver's test gate in front: the calls of all but
    the first session arrive once that session's grade is held, so they all fall inside the hold
    however fast the first episode's finish stage was on a loaded machine (waiting before the
    slot, where a real harness's later call would be, not in it)."""

    def __init__(self, n: int, backend: CountingBackend):
        super().__init__(n)
        self.backend = backend

    async def enter(self, session_id: str, *, harness: bool = True) -> float:
        if self.backend.watch is not None:  # a test that holds no grade sets it to None
            await self.backend.watch.first_grades(session_id)
        return await super().enter(session_id, harness=harness)


class GatedGrade:
    """The test double for ``grade_task``: the first grade is held (a threading.Event, as grading
    runs in its executor's thread) until the backend has answered ``release_after`` calls
    meanwhile; records the most concurrent backend calls seen while it was held."""

    def __init__(self, release_after: int):
        self.release_after = release_after
        self.held = threading.Event()
        self.release = threading.Event()
        self.answered_while_held = self.max_while_held = 0
        self.graded = 0
        self.held_s = 0.0
        self.first_session: str | None = None
        self._lock = threading.Lock()

    async def first_grades(self, session_id: str | None) -> None:
        """Return at once for the first session that asks; for the others once the grade is held."""
        self.first_session = self.first_session or session_id
        if session_id != self.first_session:
            for _ in range(1200):  # the hold begins once the first episode grades (at most 60 s)
                if self.held.is_set():
                    return
                await asyncio.sleep(0.05)

    def saw(self, inflight: int) -> None:
        if self.held.is_set() and not self.release.is_set():
            self.max_while_held = max(self.max_while_held, inflight)
            self.answered_while_held += 1
            if self.answered_while_held >= self.release_after:
                self.release.set()

    def __call__(self, task, patch, *, kind, timeout_s, **_):
        with self._lock:
            first, self.graded = self.graded == 0, self.graded + 1
        if first:
            self.held.set()
            started = time.monotonic()
            self.release.wait(60)
            self.held_s = time.monotonic() - started
        return GradeResult(instance_id=task.instance_id, resolved=True, reward=1.0)


@pytest.fixture(scope="module")
def task():
    return next(t for t in load_tasks("bundled") if t.instance_id == "pallets__flask-5014")


def _setup(
    renderer,
    task,
    tmp_path: Path,
    monkeypatch,
    mode: str,
    *,
    samples: int,
    collapsed: bool = False,
    release_after: int = 4,
):
    marker = f"polar-stages-{uuid.uuid4().hex[:10]}"
    harness = FakeHarness(mode, marker, tmp_path / "install")
    monkeypatch.setattr(stages, "get_adapter", lambda name: harness)
    grade = GatedGrade(release_after)
    monkeypatch.setattr(grader, "grade_task", grade)
    backend = CountingBackend(
        renderer.tokenizer.encode("Hello there", add_special_tokens=False) + renderer.eos_token_ids[:1]
    )
    backend.watch, backend.gate = grade, collapsed
    monkeypatch.setattr("polar_env.episodes.admission.RunSlots", lambda n: GatedSlots(n, backend))
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    def factory(data_dir: Path, socket: Path) -> ProxyServer:
        return make_proxy(
            renderer, backend, data_dir, admin_secret="s", max_context=2048, default_max_tokens=16
        )

    # the grade doubles share state with the backend: graded on threads of this process, not in workers
    plan = RolloutPlan(
        tasks=[task],
        samples=samples,
        run_slots=2,
        grade_slots=2,
        collapsed=collapsed,
        grade_in_processes=False,
        out=tmp_path / "out",
        episode=EpisodeSettings(harness="fake", timeout=60),
        scratch_root=scratch,
    )
    return plan, factory, backend, grade, marker, scratch


async def _no_leftovers(marker: str, scratch: Path) -> None:
    assert await wait_gone(processes_matching, marker) == []
    assert list(scratch.iterdir()) == []


@bwrap
@pytest.mark.slow
async def test_run_slots_are_free_while_an_episode_grades(renderer, task, tmp_path: Path, monkeypatch):
    """4 episodes, 2 run slots, 2 calls each: the first to finish is held in grading; the two
    episodes prepared meanwhile take the run slots and the backend sees both at once."""
    plan, factory, backend, grade, marker, scratch = _setup(
        renderer, task, tmp_path, monkeypatch, "give_up", samples=4
    )
    trajectories = await run_rollouts(plan, factory)
    assert grade.held.is_set() and grade.release.is_set()
    assert grade.max_while_held == 2  # the full run concurrency while a grade was held
    assert backend.max_inflight <= 2  # admission is exact: never more than the run slots
    assert len(trajectories) == 4 and all(t.status == "completed" and t.reward == 1.0 for t in trajectories)
    for t in trajectories:
        timings = t.metadata.timings.model_dump()
        assert set(TIMING_KEYS) <= set(timings)
        assert timings["prepare_s"] > 0 and timings["model_s"] > 0
        # the one schema's totals hold their parts: the harness's run its split (a call still in flight
        # when the harness gave up counts in model_s past its end), the whole episode every stage
        ran = sum(timings[k] for k in ("harness_start_s", "wait_s", "model_s", "tool_s"))
        assert timings["harness_start_s"] - 0.001 <= timings["harness_s"] <= ran + 0.001, timings
        after_open = ("prepare_s", "harness_s", "drain_s", "build_s", "grade_s", "close_s")
        stages_s = sum(timings[k] for k in after_open)
        assert timings["total_s"] >= stages_s - 0.001 and timings == EpisodeTimings(**timings).model_dump()
    # the held one's grade time covers the hold (which lasts as long as the other episodes' 4 answers)
    assert max(t.metadata.timings.grade_s for t in trajectories) >= grade.held_s - 0.01 > 0
    await _no_leftovers(marker, scratch)


@bwrap
@pytest.mark.slow
async def test_collapsed_holds_one_slot_over_every_stage(renderer, task, tmp_path: Path, monkeypatch):
    """The same job collapsed: the episode held in grading keeps its slot, so only one run slot
    serves the others meanwhile."""
    plan, factory, backend, grade, marker, scratch = _setup(
        renderer, task, tmp_path, monkeypatch, "give_up", samples=4, collapsed=True, release_after=2
    )
    trajectories = await run_rollouts(plan, factory)
    assert grade.held.is_set() and grade.release.is_set()  # released: two more calls went through meanwhile
    assert grade.max_while_held == 1
    assert len(trajectories) == 4 and all(t.metadata.timings.wait_s == 0.0 for t in trajectories)
    await _no_leftovers(marker, scratch)


class CrashingGrade:
    """The test double for ``grade_task`` that fails as a grader bug would (a grader cannot be made
    to crash on cue)."""

    def __call__(self, task, patch, *, kind, timeout_s, **_):
        raise RuntimeError("grader bug: index out of range")


def grade_in_a_dying_worker(task, patch, *, kind, timeout_s, **_):
    """In place of ``grade_task`` in a real grading worker process, which it ends as the kernel's
    out-of-memory killer would (a real grade cannot be made to be killed on cue)."""
    os.kill(os.getpid(), signal.SIGKILL)


@bwrap
@pytest.mark.slow
@pytest.mark.parametrize("crash", ["grader-raises", "worker-dies"])
async def test_a_grader_crash_is_an_infrastructure_episode_and_leaves_nothing_behind(
    renderer, task, tmp_path: Path, monkeypatch, crash: str
):
    """Both episodes of a group whose grader raises (or whose grading worker is killed) still end as
    trajectories (kept in the group, masked, their kind ``infrastructure`` naming the crash), with no
    process, workspace, open session or run slot left."""
    plan, factory, backend, grade, marker, scratch = _setup(
        renderer, task, tmp_path, monkeypatch, "give_up", samples=2
    )
    if crash == "worker-dies":  # real worker processes, as polar rollout grades
        plan.grade_in_processes = True
        monkeypatch.setattr(grader, "grade_task", grade_in_a_dying_worker)
    else:
        monkeypatch.setattr(grader, "grade_task", CrashingGrade())
    backend.watch = None  # no grade is ever held
    runner = EpisodeRunner(plan, factory, tmp_path / "ledger")
    await runner.start()
    try:
        trajectories = await asyncio.gather(runner.run(task, 0), runner.run(task, 1))
        proxy = runner.proxy
        assert all(s.info.closed_at is not None for s in proxy.registry.all())
        assert proxy.engine.run_slots.holders == set() and proxy.engine.run_slots.waiting == 0
    finally:
        await runner.stop()
    said = (
        "grader bug: index out of range"
        if crash == "grader-raises"
        else "GraderCrashed: the grading worker died"
    )
    assert [t.failure_kind.value for t in trajectories] == ["infrastructure", "infrastructure"]
    assert all(t.masked and said in (t.error or "") for t in trajectories), [t.error for t in trajectories]
    assert all(t.calls for t in trajectories)  # the episode's calls are kept, only the grade is missing
    await _no_leftovers(marker, scratch)


@bwrap
@pytest.mark.slow
@pytest.mark.parametrize("stage", ["prepare", "run", "finish"])
async def test_cancel_in_a_stage_leaves_nothing_behind(
    renderer, task, tmp_path: Path, monkeypatch, stage: str
):
    """A cancelled episode (what Ctrl-C does to every task) in each stage: no harness process,
    workspace directory, open session or run slot is left."""
    plan, factory, backend, grade, marker, scratch = _setup(
        renderer, task, tmp_path, monkeypatch, "hang" if stage == "run" else "give_up", samples=1
    )
    opened = asyncio.Event()
    real_open = sites.open_workspace

    async def opening(*args, **kwargs):  # the real one; the test learns it started
        opened.set()
        return await real_open(*args, **kwargs)

    monkeypatch.setattr(sites, "open_workspace", opening)
    runner = EpisodeRunner(plan, factory, tmp_path / "ledger")
    await runner.start()
    try:
        episode = asyncio.ensure_future(runner.run(task, 0))
        if stage == "prepare":
            await asyncio.wait_for(opened.wait(), 30)
        else:
            while not (runner.stages["run"] if stage == "run" else grade.held.is_set()):
                assert not episode.done(), episode.result()
                await asyncio.sleep(0.05)
            if stage == "run":  # the harness is in its call, or past it, holding a run slot
                while not runner.proxy.registry.ledger.calls(runner.proxy.registry.all()[0].id):
                    await asyncio.sleep(0.05)
        episode.cancel()
        with pytest.raises(asyncio.CancelledError):
            await episode
        proxy = runner.proxy
        assert all(s.info.closed_at is not None for s in proxy.registry.all())
        assert proxy.engine.run_slots.holders == set() and proxy.engine.run_slots.waiting == 0
        await _no_leftovers(marker, scratch)
    finally:
        grade.release.set()
        await runner.stop()
