"""One episode's lifecycle in three stages (docs/rollout.md, "Stages").

- :func:`prepare`: the harness install checked, the proxy session opened, the workspace opened and
  the harness started in it;
- :func:`run`: the harness talks to the model until it ends. Only this stage's model calls hold
  inference slots: where the proxy has run slots (``TokenEngine.run_slots``, proxy/run_slots.py),
  each call waits there for one and gives it back once answered, so the harness's start-up and
  tools overlap other episodes' calls, and the deadline's clock stands still while a call waits;
- :func:`finish`: patch extraction, the drain of calls in flight, classification, grading (in the
  ``Grading`` executor, never the default thread pool) and the trajectory build (off the loop).

``run_episode`` is the three in a row (``polar rollout``'s driver, rollout/runner.py, runs them
with a limit per stage). The NeMo Gym servers split an episode across two processes and call the
pieces: :func:`open_session`, :func:`run_harness`, :func:`close_session`, :func:`extract_patch`.
Whatever happens (harness crash, timeout, backend failure), an episode ends in a trajectory with its
status, whatever the proxy captured, its failure kind and reward/mask from the run's outcome table
(polar_env.outcomes), and where its time went (``metadata["timings"]``, :data:`TIMING_KEYS`). A
cancelled episode (any stage) leaves no harness process, workspace, open session or run slot.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from polar_env.episodes.workspace import Workspace, open_workspace
from polar_env.harness_adapters.base import HarnessAdapter
from polar_env.harness_adapters.registry import NOISE_EXCLUDES, get_adapter
from polar_env.harness_adapters.runner import HarnessRun, run_episode_in_sandbox
from polar_env.outcomes import FailureKind, OutcomeTable, classify_episode, final_kind
from polar_env.proxy.app import ORIGIN_TAGGED, ProxyServer
from polar_env.proxy.run_slots import RunSlots
from polar_env.rewards.grading import GradeResult, grading_timeout_s
from polar_env.rewards.image_grading import grade_task
from polar_env.sandbox.base import Sandbox, SandboxSpec
from polar_env.tasks.models import Task
from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.models import Trajectory
from polar_env.trajectory.records import CallRecord, EpisodeBudget

T = TypeVar("T")
log = logging.getLogger(__name__)
# metadata["timings"] of every trajectory, in seconds: waiting for a prepare slot, preparing, the
# harness's start-up (start to its first model call), waiting for a run slot, the model's time
# (backend calls, overlaps counted once), the rest of the run (tools, the harness's own work),
# then patch + drain + classification, grading, and the trajectory build
TIMING_KEYS = ("queued_s", "prepare_s", "harness_start_s", "wait_s", "model_s", "tool_s", "drain_s", "grade_s",
               "build_s")

PROMPT = """You are working in the repository at /testbed. Resolve the following issue by editing the \
source code (not the tests). When you are done, stop.

<issue>
{problem}
</issue>"""


@dataclass
class EpisodeConfig:
    harness: str = "pi"
    timeout_s: float = 600.0  # the harness's wall-clock deadline
    grading_timeout_s: float = field(default_factory=grading_timeout_s)  # grading's own budget, outlives the rollout's
    sampling: dict[str, Any] = field(default_factory=dict)  # sampling the trainer dictates
    model_name: str | None = None  # what the harness asks for (default: the backend's model)
    grade: bool = True
    scratch_root: Path | None = None
    sandbox: str = "auto"  # auto | bubblewrap | docker | podman | apptainer (episodes.workspace)
    outcomes: OutcomeTable = field(default_factory=OutcomeTable)  # reward/mask per failure kind
    budget: EpisodeBudget = field(default_factory=EpisodeBudget)  # per-episode limits the proxy enforces
    reward_key: str | None = None  # a Harbor task's reward.json key that is the reward (rewards/harbor_verifier.py)


@dataclass
class EpisodeResult:
    trajectory: Trajectory
    grade: GradeResult | None
    harness: HarnessRun | None
    patch: str
    failure_kind: FailureKind = FailureKind.none


@dataclass
class EpisodeSession:
    """An open proxy session for one episode, and the harness that will use it."""

    proxy: ProxyServer
    adapter: HarnessAdapter
    session_id: str
    key: str
    started: float


@dataclass
class ClosedSession:
    info: Any  # the registry's SessionInfo
    calls: list[Any]
    status: str
    error: str | None
    failure_kind: FailureKind  # before grading (polar_env.outcomes.final_kind adds the grade's)


def episode_prompt(task: Task) -> str:
    """The first user message; identical for every rollout of a task (GRPO groups depend on it).
    A Harbor task's is its instruction.md as written."""
    if task.harbor is not None:
        return task.problem_statement
    return PROMPT.format(problem=task.problem_statement.strip())


def open_session(proxy: ProxyServer, adapter: HarnessAdapter, episode_id: str, *, task_id: str,
                 group_id: str | None = None, sampling: dict[str, Any] | None = None,
                 metadata: dict[str, Any] | None = None, budget: EpisodeBudget | None = None) -> EpisodeSession:
    """A proxy session for the episode; ``proxy`` must listen on a Unix socket (the sandbox's only way out)."""
    if proxy.unix_socket is None:
        raise ValueError("the proxy must listen on a Unix socket for sandboxed episodes")
    session_id, key = proxy.create_session(episode_id, sampling=sampling or {}, training=True, budget=budget, metadata={
        "task_id": task_id, "group_id": group_id or task_id, "harness": adapter.name,
        "harness_version": adapter.version, ORIGIN_TAGGED: True, **(metadata or {})})
    return EpisodeSession(proxy, adapter, session_id, key, time.time())


def harness_spec(session: EpisodeSession, base: SandboxSpec | None = None) -> SandboxSpec:
    """``base`` with the mounts the harness needs: the proxy's socket dir and the harness install."""
    sock = session.proxy.unix_socket
    assert sock is not None
    return replace(base or SandboxSpec(), proxy_socket_dir=sock.parent, proxy_socket_name=sock.name,
                   harness_dir=session.adapter.install_dir())


async def run_harness(session: EpisodeSession, sandbox: Sandbox, prompt: str, *, model_name: str | None,
                      timeout_s: float) -> HarnessRun:
    """The harness to its end or its deadline (whose clock stops while the session waits for a run slot)."""
    slots = session.proxy.engine.run_slots
    return await run_episode_in_sandbox(
        session.adapter, sandbox, proxy_socket_dir=sandbox.spec.proxy_socket_dir, session_id=session.session_id,
        session_key=session.key, model_name=model_name or session.proxy.engine.backend.model, prompt=prompt,
        timeout_s=timeout_s, origin_key=session.proxy.origin_key,  # the forwarder tags each call's origin
        paused_s=partial(slots.waited_s, session.session_id) if slots is not None else None)


async def close_session(session: EpisodeSession, status: str, error: str | None, *,
                        failure: FailureKind | None = None, harness: HarnessRun | None = None,
                        outcomes: OutcomeTable | None = None) -> ClosedSession:
    """Drain in-flight calls (a harness killed mid-call leaves that call to finish recording),
    classify the episode (``failure``: what already failed before the harness could end, e.g. the
    workspace), close the session."""
    proxy = session.proxy
    release_slot(session)  # also where the run stage was never told it ended (the Gym agent server)
    await proxy.drain(session.session_id)
    calls = proxy.registry.ledger.calls(session.session_id)
    stopped = proxy.registry.get(session.session_id).stopped
    if stopped is not None:  # the proxy refused a retry loop; the harness ended on that refusal
        status, error = "error", f"stopped: {stopped}"
    floor = (outcomes or OutcomeTable()).min_backend_tokens_per_s
    kind = failure or classify_episode(status, calls, deadline_at=harness.ended_at if harness else None,
                                       min_backend_tokens_per_s=floor, killed_by=harness.signal if harness else None)
    if kind.outside_policy and status == "completed":
        status, error = "error", error or f"{kind.value}: the episode failed outside the policy"
    info = proxy.registry.close(session.session_id, status)
    return ClosedSession(info, calls, status, error, kind)


def release_slot(session: EpisodeSession) -> None:
    """The session's run slot (if it took one) goes to the next waiting session."""
    if (slots := session.proxy.engine.run_slots) is not None:
        slots.release(session.session_id)


async def extract_patch(sandbox: Sandbox) -> str:
    """The agent's patch: the workspace's diff against its base snapshot, harness noise dropped."""
    return (await sandbox.diff(NOISE_EXCLUDES)).decode("utf-8", errors="surrogateescape")


def patch_bytes(patch: str) -> int:
    return len(patch.encode("utf-8", errors="surrogateescape"))


def agent_timeout(task: Task, default_s: float) -> float:
    """The harness's deadline: a Harbor task's ``[agent] timeout_sec`` where it sets one."""
    own = task.harbor.config.agent.timeout_sec if task.harbor is not None else None
    return own or default_s


class Grading:
    """Where grading runs: its own threads, ``slots`` at a time, so workspace set-up (the default
    thread pool) never queues behind a grade; also the one thread the trajectory builds run on."""

    def __init__(self, slots: int = 1):
        self.slots = slots
        self._executor = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="polar-grade")
        self._builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="polar-build")
        self._limit: asyncio.Semaphore | None = None  # made on the loop that uses it

    async def grade(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self.call(asyncio.get_running_loop().run_in_executor, self._executor, partial(fn, *args, **kwargs))

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``await fn(*args)`` within the grading limit (a Harbor verifier runs in its container)."""
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
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._builder.shutdown(wait=True, cancel_futures=True)


async def grade_episode(task: Task, patch: str, workspace: Workspace | None, config: EpisodeConfig,
                        grading: Grading | None = None) -> GradeResult:
    """A Harbor task's own verifier in the agent's (still open) container; SWE-bench grading of the
    patch in a fresh tree or container otherwise."""
    if task.harbor is not None:
        from polar_env.rewards.harbor_verifier import verify
        from polar_env.sandbox.container import ContainerSandbox

        assert workspace is not None and isinstance(workspace.sandbox, ContainerSandbox)
        verifying = partial(verify, task, workspace.sandbox, reward_key=config.reward_key)
        return await (grading.call(verifying) if grading is not None else verifying())
    kind = workspace.ref.kind if workspace else "bubblewrap"
    if grading is None:
        return await asyncio.to_thread(grade_task, task, patch, kind=kind, timeout_s=config.grading_timeout_s)
    return await grading.grade(grade_task, task, patch, kind=kind, timeout_s=config.grading_timeout_s)


@dataclass
class Episode:
    """One episode between its stages: what :func:`prepare` made, what :func:`run` and
    :func:`finish` use, and when each stage began and ended (``time.time()``)."""

    task: Task
    config: EpisodeConfig
    session: EpisodeSession
    marks: dict[str, float]
    workspace: Workspace | None = None
    harness: asyncio.Future[HarnessRun] | None = None  # started in prepare, awaited in run
    run: HarnessRun | None = None
    failure: FailureKind | None = None  # a failure outside the harness (the workspace)
    error: str | None = None
    slot: Any = None  # the session's run_slots.SlotTimes, once its run stage ended

    def fail(self, exc: BaseException) -> None:
        self.failure, self.error = FailureKind.sandbox_failure, f"{type(exc).__name__}: {exc}"


async def prepare(proxy: ProxyServer, task: Task, *, episode_id: str, group_id: str | None = None,
                  config: EpisodeConfig | None = None, metadata: dict[str, Any] | None = None,
                  queued_at: float | None = None) -> Episode:
    """Stage 1: session, workspace, harness started (its first model call then waits for a run
    slot where the proxy has them). A workspace that cannot be made is the episode's failure, not
    an exception: it still ends in a trajectory."""
    config = config or EpisodeConfig()
    began = time.time()
    adapter = get_adapter(config.harness)
    await asyncio.to_thread(adapter.install)
    session = open_session(proxy, adapter, episode_id, task_id=task.instance_id, group_id=group_id,
                           sampling=config.sampling, metadata=metadata, budget=config.budget)
    ep = Episode(task, config, session, marks={"queued": queued_at or began, "prepare": began})
    try:
        spec = harness_spec(session, SandboxSpec(scratch_root=config.scratch_root))
        opening = asyncio.ensure_future(open_workspace(task, spec, sandbox=config.sandbox))
        try:
            ep.workspace = await asyncio.shield(opening)  # a cancel must not orphan a tree being made
        except asyncio.CancelledError:
            ep.workspace = (await asyncio.gather(opening, return_exceptions=True))[0]
            if not isinstance(ep.workspace, Workspace):
                ep.workspace = None
            raise
        ep.harness = asyncio.ensure_future(run_harness(
            session, ep.workspace.sandbox, episode_prompt(task), model_name=config.model_name,
            timeout_s=agent_timeout(task, config.timeout_s)))
    except asyncio.CancelledError:
        await abort(ep)
        raise
    except Exception as exc:  # noqa: BLE001 - a workspace failure still yields a trajectory
        ep.fail(exc)
    ep.marks["started"] = time.time()
    return ep


async def booted(ep: Episode) -> None:
    """Return once the episode's harness has made its first model call, or ended without one (or
    there are no run slots to tell)."""
    await _slot_or_end(ep, RunSlots.called)


async def admitted(ep: Episode) -> None:
    """Return once the episode has had a run slot, or its harness ended without one (or there are no slots)."""
    await _slot_or_end(ep, RunSlots.admitted)


async def _slot_or_end(ep: Episode, wait: Callable[[RunSlots, str], Awaitable[None]]) -> None:
    slots = ep.session.proxy.engine.run_slots
    if ep.harness is None or slots is None:
        return
    waiter = asyncio.ensure_future(wait(slots, ep.session.session_id))
    try:
        await asyncio.wait({waiter, ep.harness}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


async def run(ep: Episode) -> None:
    """Stage 2: the harness to its end (or deadline); then its run slot is free."""
    try:
        if ep.harness is not None:
            ep.run = await ep.harness
    except asyncio.CancelledError:
        await abort(ep)
        raise
    except Exception as exc:  # noqa: BLE001 - the harness could not be run in the workspace
        ep.fail(exc)
    finally:
        ep.marks["ended"] = time.time()
        _end_run(ep)


def _end_run(ep: Episode) -> None:
    slots = ep.session.proxy.engine.run_slots
    if slots is not None and ep.slot is None:
        ep.slot = slots.release(ep.session.session_id)


async def finish(ep: Episode, grading: Grading | None = None) -> EpisodeResult:
    """Stage 3: patch, drain, classification, grade (unless the kind is outside the policy), trajectory.
    A grader that crashes makes the episode `infrastructure` (its outcome-table verdict: masked), never
    a lost trajectory: a group keeps its size."""
    try:
        return await _finish(ep, grading)
    except asyncio.CancelledError:
        await abort(ep)
        raise


async def _finish(ep: Episode, grading: Grading | None) -> EpisodeResult:
    task, config, workspace, harness = ep.task, ep.config, ep.workspace, ep.run
    status, error = (harness.status, harness.error) if harness is not None else ("error", ep.error)
    patch = ""
    try:
        if workspace is not None and ep.failure is None:
            patch = await extract_patch(workspace.sandbox)
    except Exception as exc:  # noqa: BLE001 - a workspace failure still yields a trajectory
        ep.fail(exc)
        status, error = "error", ep.error
    finally:
        if workspace is not None and task.harbor is None:  # a Harbor task is verified in its workspace
            ep.workspace = None
            await workspace.close()
    result, graded_error = None, None
    try:
        closed = await close_session(ep.session, status, error, failure=ep.failure, harness=harness,
                                     outcomes=config.outcomes)
        kind = closed.failure_kind
        ep.marks["grade"] = time.time()
        if config.grade and not kind.outside_policy:  # grading would say nothing about the policy
            try:
                result = await grade_episode(task, patch, workspace, config, grading)
            except Exception as exc:  # noqa: BLE001 - a grader that crashed says nothing of the policy either
                log.exception("episode %s: grading failed", ep.session.session_id)
                kind, graded_error = FailureKind.infrastructure, f"grading failed: {type(exc).__name__}: {exc}"
            else:
                kind = final_kind(kind, result.failure_kind, result.resolved)
    finally:
        if workspace is not None and task.harbor is not None:
            ep.workspace = None
            await workspace.close()
    ep.marks["build"] = time.time()
    reward, masked = config.outcomes.apply(kind, result.reward if result else None)
    build = partial(build_trajectory, closed.info, closed.calls, status=closed.status, error=graded_error or closed.error,
                    reward=reward, grading=result.model_dump(mode="json") if result else None)
    trajectory = await (grading.off_loop(build) if grading is not None else asyncio.to_thread(build))
    trajectory.failure_kind, trajectory.masked = kind, masked
    ep.marks["done"] = time.time()
    trajectory.metadata.update({"duration_s": time.time() - ep.session.started, "patch_bytes": patch_bytes(patch),
                                "timings": episode_timings(ep, closed.calls)})
    if workspace is not None:  # where it ran (and was graded): bubblewrap, or the engine and image
        trajectory.metadata["workspace"] = workspace.ref.kind
        if workspace.ref.clone:  # how its tree was cloned from the task's warm base (tasks/base_trees.py)
            trajectory.metadata["workspace_clone"] = workspace.ref.clone
        if workspace.ref.image:
            trajectory.metadata["image"] = workspace.ref.image
    return EpisodeResult(trajectory=trajectory, grade=result, harness=harness, patch=patch, failure_kind=kind)


async def abort(ep: Episode) -> None:
    """A cancelled episode, in any stage: the harness's process tree killed, its run slot freed,
    the workspace removed, the session closed (``error``); no trajectory (a rerun runs it again)."""
    if ep.harness is not None and not ep.harness.done():
        ep.harness.cancel()
    if ep.harness is not None:
        await asyncio.gather(ep.harness, return_exceptions=True)
    _end_run(ep)
    workspace, ep.workspace = ep.workspace, None
    if workspace is not None:
        await workspace.close()
    proxy, sid = ep.session.proxy, ep.session.session_id
    if (session := proxy.registry.get(sid)) is not None and session.info.closed_at is None:
        await proxy.drain(sid, timeout_s=1.0)
        proxy.registry.close(sid, "error")


def episode_timings(ep: Episode, calls: list[CallRecord]) -> dict[str, float]:
    """Where the episode's time went (:data:`TIMING_KEYS`), from its stage marks, its slot's times
    and its calls' own timings."""
    m = ep.marks
    started = m.get("started", m["prepare"])
    ended = m.get("ended", started)
    first_call = ep.slot.first_call_at if ep.slot is not None else min((c.created_at for c in calls), default=None)
    admitted_at = ep.slot.admitted_at if ep.slot is not None and ep.slot.admitted_at is not None else first_call
    spans = sorted((c.created_at + c.timings.get("admission_ms", 0.0) / 1e3, c.created_at + c.timings["total_ms"] / 1e3)
                   for c in calls if "total_ms" in c.timings)
    model = covered = 0.0
    for begin, end in spans:  # the union: side calls in parallel count once
        begin = max(begin, covered)
        if end > begin:
            model += end - begin
            covered = end
    run_s = ended - admitted_at if admitted_at is not None else 0.0
    first_wait = admitted_at - first_call if first_call is not None and admitted_at is not None else 0.0
    waited = max(ep.slot.waited_s(ended), first_wait) if ep.slot is not None else first_wait  # every call's wait
    out = {"queued_s": m["prepare"] - m["queued"], "prepare_s": started - m["prepare"],
           "harness_start_s": (first_call if first_call is not None else ended) - started,
           "wait_s": waited, "model_s": model, "tool_s": run_s - model - (waited - first_wait),
           "drain_s": m.get("grade", ended) - ended,
           "grade_s": m.get("build", ended) - m.get("grade", ended), "build_s": m.get("done", ended) - m.get("build", ended)}
    return {k: round(max(v, 0.0), 4) for k, v in out.items()}


async def run_episode(proxy: ProxyServer, task: Task, *, episode_id: str, group_id: str | None = None,
                      config: EpisodeConfig | None = None, metadata: dict[str, Any] | None = None,
                      grading: Grading | None = None) -> EpisodeResult:
    """Run one rollout of ``task`` in a workspace this process owns: the three stages in a row."""
    ep = await prepare(proxy, task, episode_id=episode_id, group_id=group_id, config=config, metadata=metadata)
    await run(ep)
    return await finish(ep, grading)
