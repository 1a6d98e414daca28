"""One episode's stages (docs/rollout.md, "Stages"), the same wherever it runs.

- :func:`begin`: the proxy session opened (the episode exists from here: whatever follows, it is
  either finished or aborted);
- :func:`prepare`: the harness install checked, the workspace opened at the episode's
  :class:`~polar_env.episodes.episode.Site` and the harness started in it;
- :func:`run`: the harness talks to the model until it ends. Only this stage's model calls hold
  inference slots: where the proxy has run slots (``TokenEngine.run_slots``, proxy/run_slots.py),
  each call waits there for one and gives it back once answered, so the harness's start-up and
  tools overlap other episodes' calls, and the deadline's clock stands still while a call waits;
- :func:`finish`: patch collection, the drain of calls in flight, classification, the trajectory
  build (off the loop), grading (in the ``Grading`` executor, never the default thread pool).

A Site is where the workspace is made and the patch graded: this process
(:class:`~polar_env.episodes.sites.LocalSite`: ``polar rollout``'s driver in rollout/runner.py, demo,
train, every Ray node), or the NeMo Gym resources server, which the agent server reaches over HTTP
(agent_server/core.py ``ResourcesSite``). ``run_episode`` is the stages in a row.
Whatever happens (harness crash, timeout, backend failure), a finished episode is a trajectory with
its status, whatever the proxy captured, its failure kind and reward/mask from the run's outcome
table (polar_env.outcomes), and where its time went (``metadata["timings"]``,
polar_env.episodes.timings). A cancelled stage raises and leaves the episode to its caller:
:func:`abort` drops it (no harness process, workspace, open session or run slot left; a rerun runs it
again), or :func:`halt` with ``cancelled`` then :func:`finish` records it (masked, as the Gym agent
does for a caller gone).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from polar_env import metrics
from polar_env.episodes.episode import Episode, EpisodeResult, Site, close_workspace
from polar_env.episodes.grading import Grading
from polar_env.episodes.session import close_session, harness_spec, open_session, run_harness
from polar_env.episodes.settings import EpisodeConfig
from polar_env.episodes.sites import LocalSite, patch_bytes
from polar_env.episodes.task import EpisodeTask, agent_timeout, episode_prompt, exploit_context
from polar_env.episodes.timings import episode_timings
from polar_env.episodes.workspace import Workspace
from polar_env.harness_adapters.registry import get_adapter
from polar_env.outcomes import FailureKind, final_kind
from polar_env.proxy.app import ProxyServer
from polar_env.proxy.run_slots import RunSlots
from polar_env.sandbox.base import SandboxSpec
from polar_env.tasks.models import Task
from polar_env.trajectory import exploits
from polar_env.trajectory.chains import build_trajectory

log = logging.getLogger(__name__)


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


async def abort(ep: Episode) -> None:
    """A cancelled episode, in any stage: the harness's process tree killed, its run slot freed,
    the workspace removed, the session closed (``error``); no trajectory (a rerun runs it again)."""
    await halt(ep)
    await close_workspace(ep)
    proxy, sid = ep.session.proxy, ep.session.session_id
    if (session := proxy.registry.get(sid)) is not None and session.info.closed_at is None:
        await proxy.drain(sid, timeout_s=1.0)
        proxy.registry.close(sid, "error")


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
