"""One episode's lifecycle in three stages (docs/rollout.md, "Stages"), the same wherever it runs.

- :func:`begin`: the proxy session opened (the episode exists from here: whatever follows, it is
  either finished or aborted);
- :func:`prepare`: the harness install checked, the workspace opened at the episode's
  :class:`Site` and the harness started in it;
- :func:`run`: the harness talks to the model until it ends. Only this stage's model calls hold
  inference slots: where the proxy has run slots (``TokenEngine.run_slots``, proxy/run_slots.py),
  each call waits there for one and gives it back once answered, so the harness's start-up and
  tools overlap other episodes' calls, and the deadline's clock stands still while a call waits;
- :func:`finish`: patch collection, the drain of calls in flight, classification, the trajectory
  build (off the loop), grading (in the ``Grading`` executor, never the default thread pool).

A :class:`Site` is where the workspace is made and the patch graded: this process
(:class:`LocalSite`: ``polar rollout``'s driver in rollout/runner.py, demo, train, every Ray node),
or the NeMo Gym resources server, which the agent server reaches over HTTP
(agent_server/core.py ``ResourcesSite``). ``run_episode`` is the stages in a row.
Whatever happens (harness crash, timeout, backend failure), a finished episode is a trajectory with
its status, whatever the proxy captured, its failure kind and reward/mask from the run's outcome
table (polar_env.outcomes), and where its time went (``metadata["timings"]``, :data:`TIMING_KEYS`).
A cancelled stage raises and leaves the episode to its caller: :func:`abort` drops it (no harness
process, workspace, open session or run slot left; a rerun runs it again), or :func:`halt` with
``cancelled`` then :func:`finish` records it (masked, as the Gym agent does for a caller gone).
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
from typing import Any, Literal, Protocol, TypeVar

from polar_env import metrics
from polar_env.episodes.workspace import Workspace, WorkspaceRef, open_workspace
from polar_env.grades import GradeResult
from polar_env.harness_adapters.base import HarnessAdapter
from polar_env.harness_adapters.registry import NOISE_EXCLUDES, get_adapter
from polar_env.harness_adapters.runner import HarnessRun, run_episode_in_sandbox
from polar_env.outcomes import (
    DEADLINE_KINDS,
    FailureKind,
    HarnessStatus,
    OutcomeTable,
    classify_episode,
    explain_deadline,
    final_kind,
)
from polar_env.proxy.app import ORIGIN_TAGGED, ProxyServer
from polar_env.proxy.run_slots import RunSlots
from polar_env.rewards.grader import GradingLimits, Submission, grade_submission
from polar_env.rewards.sandbox_exec import grading_timeout_s
from polar_env.rewards.workers import GradingWorkers
from polar_env.sandbox.base import Sandbox, SandboxSpec
from polar_env.tasks.models import HarborRef, Task, patch_files
from polar_env.trajectory import exploits
from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.models import Trajectory
from polar_env.trajectory.records import CallRecord, EpisodeBudget

T = TypeVar("T")
Stage = Literal["prepare", "run", "finish"]
log = logging.getLogger(__name__)
# metadata["timings"] of every trajectory, in seconds: waiting for a prepare slot, preparing, the
# harness's start-up (start to its first model call), waiting for a run slot, the model's time
# (backend calls, overlaps counted once), the rest of the run (tools, the harness's own work),
# then patch + drain + classification, the trajectory build, and grading (with the workspace's close)
TIMING_KEYS = (
    "queued_s",
    "prepare_s",
    "harness_start_s",
    "wait_s",
    "model_s",
    "tool_s",
    "drain_s",
    "build_s",
    "grade_s",
)

PROMPT = """You are working in the repository at /testbed. Resolve the following issue by editing the \
source code (not the tests). When you are done, stop.

<issue>
{problem}
</issue>"""


@dataclass
class EpisodeConfig:
    harness: str = "pi"
    timeout_s: float = 600.0  # the harness's wall-clock deadline
    grading_timeout_s: float = field(
        default_factory=grading_timeout_s
    )  # grading's own budget, outlives the rollout's
    sampling: dict[str, Any] = field(default_factory=dict)  # sampling the trainer dictates
    model_name: str | None = None  # what the harness asks for (default: the backend's model)
    grade: bool = True
    scratch_root: Path | None = None
    sandbox: str = "auto"  # auto | bubblewrap | docker | podman | apptainer (episodes.workspace)
    outcomes: OutcomeTable = field(default_factory=OutcomeTable)  # reward/mask per failure kind
    budget: EpisodeBudget = field(default_factory=EpisodeBudget)  # per-episode limits the proxy enforces
    reward_key: str | None = (
        None  # a Harbor task's reward.json key that is the reward (rewards/harbor_verifier.py)
    )
    mask_single_call: bool = False  # mask a rollout whose harness made one model call (OpenEnv RFC 006)


@dataclass
class EpisodeResult:
    trajectory: Trajectory
    grade: GradeResult | None
    harness: HarnessRun | None
    patch: str
    failure_kind: FailureKind = FailureKind.none
    calls: list[CallRecord] = field(
        default_factory=list
    )  # the ledger's records the trajectory was built from


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
    status: HarnessStatus
    error: str | None
    failure_kind: FailureKind  # before grading (polar_env.outcomes.final_kind adds the grade's)


class EpisodeTask(Protocol):
    """What an episode reads of its task: a loaded `Task`, or the Gym agent's view of a dataset row
    (the resources server holds the task itself and grades it)."""

    @property
    def instance_id(self) -> str: ...

    @property
    def problem_statement(self) -> str: ...

    @property
    def harbor(self) -> HarborRef | None: ...


def episode_prompt(task: EpisodeTask) -> str:
    """The first user message; identical for every rollout of a task (GRPO groups depend on it).
    A Harbor task's is its instruction.md as written."""
    if task.harbor is not None:
        return task.problem_statement
    return PROMPT.format(problem=task.problem_statement.strip())


def open_session(
    proxy: ProxyServer,
    adapter: HarnessAdapter,
    episode_id: str,
    *,
    task_id: str,
    group_id: str | None = None,
    sampling: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    budget: EpisodeBudget | None = None,
) -> EpisodeSession:
    """A proxy session for the episode; ``proxy`` must listen on a Unix socket (the sandbox's only way
    out)."""
    if proxy.unix_socket is None:
        raise ValueError("the proxy must listen on a Unix socket for sandboxed episodes")
    session_id, key = proxy.create_session(
        episode_id,
        sampling=sampling or {},
        training=True,
        budget=budget,
        metadata={
            "task_id": task_id,
            "group_id": group_id or task_id,
            "harness": adapter.name,
            "harness_version": adapter.version,
            ORIGIN_TAGGED: True,
            **(metadata or {}),
        },
    )
    return EpisodeSession(proxy, adapter, session_id, key, time.time())


def harness_spec(session: EpisodeSession, base: SandboxSpec | None = None) -> SandboxSpec:
    """``base`` with the mounts the harness needs: the proxy's socket dir and the harness install."""
    sock = session.proxy.unix_socket
    assert sock is not None
    return replace(
        base or SandboxSpec(),
        proxy_socket_dir=sock.parent,
        proxy_socket_name=sock.name,
        harness_dir=session.adapter.install_dir(),
    )


async def run_harness(
    session: EpisodeSession, sandbox: Sandbox, prompt: str, *, model_name: str | None, timeout_s: float
) -> HarnessRun:
    """The harness to its end or its deadline (whose clock stops while the session waits for a run slot)."""
    slots = session.proxy.engine.run_slots
    return await run_episode_in_sandbox(
        session.adapter,
        sandbox,
        proxy_socket_dir=sandbox.spec.proxy_socket_dir,
        session_id=session.session_id,
        session_key=session.key,
        model_name=model_name or session.proxy.engine.backend.model,
        prompt=prompt,
        timeout_s=timeout_s,
        origin_key=session.proxy.origin_key,  # the forwarder tags each call's origin
        paused_s=partial(slots.waited_s, session.session_id) if slots is not None else None,
    )


async def close_session(
    session: EpisodeSession,
    status: HarnessStatus,
    error: str | None,
    *,
    failure: FailureKind | None = None,
    harness: HarnessRun | None = None,
    outcomes: OutcomeTable | None = None,
) -> ClosedSession:
    """Drain in-flight calls (a harness killed mid-call leaves that call to finish recording),
    classify the episode (``failure``: what already failed before the harness could end, e.g. the
    workspace), close the session."""
    proxy = session.proxy
    await proxy.drain(session.session_id)
    calls = proxy.registry.ledger.calls(session.session_id)
    open_session = proxy.registry.get(session.session_id)
    stopped = open_session.stopped if open_session is not None else None
    if stopped is not None:  # the proxy refused a retry loop; the harness ended on that refusal
        status, error = "error", f"stopped: {stopped}"
    floor = (outcomes or OutcomeTable()).min_backend_tokens_per_s
    kind = failure or classify_episode(
        status,
        calls,
        deadline_at=harness.ended_at if harness else None,
        min_backend_tokens_per_s=floor,
        killed_by=harness.signal if harness else None,
    )
    if kind in DEADLINE_KINDS and harness is not None:  # say which deadline kind it is, and why
        error = (
            f"{error}; {explain_deadline(kind, calls, harness.ended_at, floor)}"
            if error
            else explain_deadline(kind, calls, harness.ended_at, floor)
        )
    if kind.outside_policy and status == "completed":
        status, error = "error", error or f"{kind.value}: the episode failed outside the policy"
    info = proxy.registry.close(session.session_id, status)
    return ClosedSession(info, calls, status, error, kind)


async def extract_patch(sandbox: Sandbox) -> str:
    """The agent's patch: the workspace's diff against its base snapshot, harness noise dropped."""
    return (await sandbox.diff(NOISE_EXCLUDES)).decode("utf-8", errors="surrogateescape")


def patch_bytes(patch: str) -> int:
    return len(patch.encode("utf-8", errors="surrogateescape"))


def agent_timeout(task: EpisodeTask, default_s: float) -> float:
    """The harness's deadline: a Harbor task's ``[agent] timeout_sec`` where it sets one."""
    own = task.harbor.config.agent.timeout_sec if task.harbor is not None else None
    return own or default_s


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


async def grade_episode(ep: Episode, grading: Grading | None = None) -> GradeResult:
    """The episode's grade through the one entry point (`rewards.grader.grade_submission`): a Harbor
    task's own verifier in the agent's (still open) container; SWE-bench grading of the patch in a fresh
    tree or container of the kind the episode ran in otherwise, in a grading worker."""
    task, config = ep.task, ep.config
    assert isinstance(task, Task)  # graded here: a loaded task
    kind = ep.ref.kind if ep.ref is not None else "bubblewrap"
    in_place = ep.workspace.sandbox if task.harbor is not None and ep.workspace is not None else None
    grading_it = partial(
        grade_submission,
        task,
        Submission(patch=ep.patch, sandbox=in_place),
        kind=kind,
        limits=GradingLimits.configured(config.grading_timeout_s),
        reward_key=config.reward_key,
        offload=grading.in_worker if grading is not None else None,
    )
    return await (grading.call(grading_it) if grading is not None else grading_it())


class Site(Protocol):
    """Where an episode's workspace is made, its patch collected and graded."""

    async def open(self, ep: Episode, spec: SandboxSpec) -> Workspace:
        """The episode's workspace, with ``spec``'s mounts (proxy socket dir, harness install)."""
        ...

    async def collect(self, ep: Episode) -> str:
        """The agent's patch, once the harness has ended (may close a workspace grading does not need)."""
        ...

    async def grade(self, ep: Episode, trajectory: Trajectory, grading: Grading | None) -> GradeResult:
        """The grade of ``ep.patch`` (``trajectory``: the episode as built, before its reward)."""
        ...


class LocalSite:
    """This process opens the workspace (a bubblewrap tree cloned from the task's warm base, or a
    container of its image) and grades the patch in a fresh one (a Harbor task: in its own)."""

    async def open(self, ep: Episode, spec: SandboxSpec) -> Workspace:
        assert isinstance(ep.task, Task)  # opened here: a loaded task
        return await open_workspace(ep.task, spec, sandbox=ep.config.sandbox)

    async def collect(self, ep: Episode) -> str:
        assert ep.workspace is not None
        patch = await extract_patch(ep.workspace.sandbox)
        if ep.task.harbor is None:  # graded in a fresh tree: this one can go now
            await close_workspace(ep)
        return patch

    async def grade(self, ep: Episode, trajectory: Trajectory, grading: Grading | None) -> GradeResult:
        return await grade_episode(ep, grading)


@dataclass
class Episode:
    """One episode between its stages: what :func:`begin` and :func:`prepare` made, what
    :func:`run` and :func:`finish` use, the stage it is in, and when each stage began and ended
    (``time.time()``)."""

    task: EpisodeTask
    config: EpisodeConfig
    session: EpisodeSession
    site: Site
    prompt: str
    marks: dict[str, float]
    stage: Stage = "prepare"
    workspace: Workspace | None = None  # open from prepare until finish (or abort) closes it
    ref: WorkspaceRef | None = None  # where it was, kept past its close
    harness: asyncio.Future[HarnessRun] | None = None  # started in prepare, awaited in run
    run: HarnessRun | None = None
    failure: FailureKind | None = None  # what failed outside the policy before the harness could end
    failed_in: Stage | None = None  # the stage it failed in
    error: str | None = None
    patch: str = ""
    classified: FailureKind | None = None  # the ledger's verdict, before grading (finish)
    graded_error: str | None = None  # grading that raised (finish)
    slot: Any = None  # the session's run_slots.SlotTimes, once its run stage ended

    def fail(self, exc: BaseException, kind: FailureKind | None = None) -> None:
        """The first failure outside the policy: ``kind``, or the exception's own ``failure_kind``
        (an unknown task is the request's), or the workspace's."""
        if self.failure is None:
            self.failure = kind or getattr(exc, "failure_kind", FailureKind.sandbox_failure)
            self.failed_in, self.error = (
                self.stage,
                f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
            )
            self.marks["failed"] = time.time()


def begin(
    proxy: ProxyServer,
    task: EpisodeTask,
    *,
    episode_id: str,
    group_id: str | None = None,
    config: EpisodeConfig | None = None,
    metadata: dict[str, Any] | None = None,
    queued_at: float | None = None,
    site: Site | None = None,
    prompt: str | None = None,
) -> Episode:
    """The episode's proxy session, opened; ``prompt`` defaults to :func:`episode_prompt`."""
    config = config or EpisodeConfig()
    adapter = get_adapter(config.harness)
    session = open_session(
        proxy,
        adapter,
        episode_id,
        task_id=task.instance_id,
        group_id=group_id,
        sampling=config.sampling,
        metadata=metadata,
        budget=config.budget,
    )
    return Episode(
        task,
        config,
        session,
        site or LocalSite(),
        prompt or episode_prompt(task),
        marks={"queued": queued_at or session.started},
    )


async def prepare(ep: Episode) -> None:
    """Stage 1: workspace, harness started (its first model call then waits for a run slot where
    the proxy has them). A workspace that cannot be made is the episode's failure, not an
    exception: it still ends in a trajectory. Cancelled, the workspace (made or being made) stays
    on ``ep`` for the caller's :func:`abort` or :func:`finish`."""
    ep.stage, ep.marks["prepare"] = "prepare", time.time()
    await asyncio.to_thread(ep.session.adapter.install)
    try:
        spec = harness_spec(ep.session, SandboxSpec(scratch_root=ep.config.scratch_root))
        opening = asyncio.ensure_future(ep.site.open(ep, spec))
        try:
            workspace = await asyncio.shield(opening)  # a cancel must not orphan a tree being made
        except asyncio.CancelledError:
            made = (await asyncio.gather(opening, return_exceptions=True))[0]
            ep.workspace = made if isinstance(made, Workspace) else None
            raise
        ep.workspace, ep.ref = workspace, workspace.ref
        ep.harness = asyncio.ensure_future(
            run_harness(
                ep.session,
                workspace.sandbox,
                ep.prompt,
                model_name=ep.config.model_name,
                timeout_s=agent_timeout(ep.task, ep.config.timeout_s),
            )
        )
    except Exception as exc:  # noqa: BLE001 - a workspace failure still yields a trajectory
        ep.fail(exc)
    ep.marks["started"] = time.time()


async def booted(ep: Episode) -> None:
    """Return once the episode's harness has made its first model call, or ended without one (or
    there are no run slots to tell)."""
    await _slot_or_end(ep, RunSlots.called)


async def admitted(ep: Episode) -> None:
    """Return once the episode has had a run slot, or its harness ended without one (or there are no
    slots)."""
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
    ep.stage = "run"
    try:
        if ep.harness is not None:
            ep.run = await ep.harness
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - the harness could not be run in the workspace
        ep.fail(exc)
    finally:
        _end_run(ep)


def _end_run(ep: Episode) -> None:
    ep.marks.setdefault("ended", time.time())
    slots = ep.session.proxy.engine.run_slots
    if slots is not None and ep.slot is None:
        ep.slot = slots.release(ep.session.session_id)


async def halt(ep: Episode, cancelled: str | None = None) -> None:
    """The harness's process tree killed (and waited for), its run slot freed; ``cancelled``: why,
    recorded as the episode's ``cancelled`` failure (then :func:`finish` records it, masked)."""
    if ep.harness is not None and not ep.harness.done():
        ep.harness.cancel()
    if ep.harness is not None:
        await asyncio.gather(ep.harness, return_exceptions=True)
    _end_run(ep)
    if cancelled is not None:
        ep.fail(asyncio.CancelledError(cancelled), FailureKind.cancelled)
        ep.error = cancelled


async def finish(ep: Episode, grading: Grading | None = None) -> EpisodeResult:
    """Stage 3: patch, drain, classification, trajectory, grade (unless the kind is outside the
    policy), the workspace closed. A grader that crashes makes the episode `infrastructure` (its
    outcome-table verdict: masked), never a lost trajectory: a group keeps its size."""
    config, harness = ep.config, ep.run
    ep.stage = "finish"
    status, error = (
        (harness.status, harness.error) if harness is not None and ep.failure is None else ("error", ep.error)
    )
    try:
        if ep.workspace is not None and ep.failure is None:
            ep.patch = await ep.site.collect(ep)
    except Exception as exc:  # noqa: BLE001 - a workspace failure still yields a trajectory
        ep.fail(exc)
        status, error = "error", ep.error
    result = None
    try:
        closed = await close_session(
            ep.session, status, error, failure=ep.failure, harness=harness, outcomes=config.outcomes
        )
        kind = ep.classified = closed.failure_kind
        ep.marks["build"] = time.time()
        build = partial(build_trajectory, closed.info, closed.calls, status=closed.status, error=closed.error)
        trajectory = await (grading.off_loop(build) if grading is not None else asyncio.to_thread(build))
        ep.marks["grade"] = time.time()
        if config.grade and not kind.outside_policy:  # grading would say nothing about the policy
            try:
                result = await ep.site.grade(ep, trajectory, grading)
            except Exception as exc:  # noqa: BLE001 - a grader that crashed says nothing of the policy either
                log.exception("episode %s: grading failed", ep.session.session_id)
                kind, ep.graded_error = (
                    FailureKind.infrastructure,
                    f"grading failed: {type(exc).__name__}: {exc}",
                )
            else:
                kind = final_kind(kind, result.failure_kind, result.resolved)
    finally:
        await close_workspace(ep)
    ep.marks["done"] = time.time()
    reward, masked = config.outcomes.apply(kind, result.reward if result else None)
    if config.mask_single_call and trajectory.stats.single_call and not masked:
        masked = True  # a degenerate agentic rollout: kept in its group's baseline, no loss
        trajectory.metadata["masked_because"] = "single_call"
    trajectory.reward, trajectory.failure_kind, trajectory.masked = reward, kind, masked
    trajectory.grading = result
    trajectory.error = ep.graded_error or trajectory.error
    trajectory.metadata.update(
        {
            "duration_s": ep.marks["done"] - ep.session.started,
            "patch_bytes": patch_bytes(ep.patch),
            "timings": episode_timings(ep, closed.calls),
        }
    )
    if attempts := exploits.exploit_attempts(
        trajectory, exploit_context(ep.task)
    ):  # an instrument, not a reward rule
        trajectory.metadata[exploits.METADATA_KEY] = attempts
    if (
        workspace := ep.ref
    ) is not None:  # where it ran (and was graded): bubblewrap, or the engine and image
        trajectory.metadata["workspace"] = workspace.kind
        if workspace.clone:  # how its tree was cloned from the task's warm base (tasks/base_trees.py)
            trajectory.metadata["workspace_clone"] = workspace.clone
        if workspace.image:
            trajectory.metadata["image"] = workspace.image
    served, versions = ep.session.proxy.engine.fence.version, trajectory.stats.policy_versions
    metrics.episode_finished(
        failure_kind=kind.value,
        masked=masked,
        resolved=bool(result and result.resolved),
        trainable_tokens=trajectory.stats.trainable_tokens,
        timings=trajectory.metadata["timings"],
        policy_lag=served - versions[0] if served is not None and versions else None,
    )
    return EpisodeResult(
        trajectory=trajectory,
        grade=result,
        harness=harness,
        patch=ep.patch,
        failure_kind=kind,
        calls=closed.calls,
    )


def exploit_context(task: EpisodeTask) -> exploits.ExploitContext:
    """What `trajectory.exploits` needs of ``task`` (a Gym agent's view of a row may carry none of it)."""
    return exploits.context(
        getattr(task, "repo", ""),
        patch_files(getattr(task, "patch", "")),
        patch_files(getattr(task, "test_patch", "")),
    )


async def close_workspace(ep: Episode) -> None:
    """The episode's workspace removed (once)."""
    workspace, ep.workspace = ep.workspace, None
    if workspace is not None:
        await workspace.close()


async def abort(ep: Episode) -> None:
    """A cancelled episode, in any stage: the harness's process tree killed, its run slot freed,
    the workspace removed, the session closed (``error``); no trajectory (a rerun runs it again)."""
    await halt(ep)
    await close_workspace(ep)
    proxy, sid = ep.session.proxy, ep.session.session_id
    if (session := proxy.registry.get(sid)) is not None and session.info.closed_at is None:
        await proxy.drain(sid, timeout_s=1.0)
        proxy.registry.close(sid, "error")


def episode_timings(ep: Episode, calls: list[CallRecord]) -> dict[str, float]:
    """Where the episode's time went (:data:`TIMING_KEYS`), from its stage marks, its slot's times
    and its calls' own timings."""
    m = ep.marks
    prepared = m.get("prepare", m["queued"])
    started = m.get("started", prepared)
    ended = m.get("ended", started)
    first_call = (
        ep.slot.first_call_at if ep.slot is not None else min((c.created_at for c in calls), default=None)
    )
    admitted_at = (
        ep.slot.admitted_at if ep.slot is not None and ep.slot.admitted_at is not None else first_call
    )
    spans = sorted(
        (c.created_at + c.timings.get("admission_ms", 0.0) / 1e3, c.created_at + c.timings["total_ms"] / 1e3)
        for c in calls
        if "total_ms" in c.timings
    )
    model = covered = 0.0
    for begin_at, end in spans:  # the union: side calls in parallel count once
        begin_at = max(begin_at, covered)
        if end > begin_at:
            model += end - begin_at
            covered = end
    run_s = ended - admitted_at if admitted_at is not None else 0.0
    first_wait = admitted_at - first_call if first_call is not None and admitted_at is not None else 0.0
    waited = (
        max(ep.slot.waited_s(ended), first_wait) if ep.slot is not None else first_wait
    )  # every call's wait
    out = {
        "queued_s": prepared - m["queued"],
        "prepare_s": started - prepared,
        "harness_start_s": (first_call if first_call is not None else ended) - started,
        "wait_s": waited,
        "model_s": model,
        "tool_s": run_s - model - (waited - first_wait),
        "drain_s": m.get("build", ended) - ended,
        "build_s": m.get("grade", ended) - m.get("build", ended),
        "grade_s": m.get("done", ended) - m.get("grade", ended),
    }
    return {k: round(max(v, 0.0), 4) for k, v in out.items()}


async def run_episode(
    proxy: ProxyServer,
    task: Task,
    *,
    episode_id: str,
    group_id: str | None = None,
    config: EpisodeConfig | None = None,
    metadata: dict[str, Any] | None = None,
    grading: Grading | None = None,
) -> EpisodeResult:
    """Run one rollout of ``task`` in a workspace this process owns: the stages in a row."""
    ep = begin(proxy, task, episode_id=episode_id, group_id=group_id, config=config, metadata=metadata)
    try:
        await prepare(ep)
        await run(ep)
        return await finish(ep, grading)
    except BaseException:
        await abort(ep)
        raise
