"""Polar's resources server logic, free of NeMo Gym so it can be tested and reused on its own.

One episode's life here, in the pieces of ``polar_env.episodes`` (the stages ``polar rollout``
runs in one process): ``seed`` opens the task's workspace (a bubblewrap tree, or a container of the
task's image: ``sandbox``), ``verify`` extracts the agent's patch from it and grades it with the
SWE-bench procedure, ``close`` removes the workspace. The agent server attaches to the workspace
(by root path or container name) to run the harness in it, so both servers must share the host
(NeMo Gym starts the servers of one config on one node).

Rewards: resolved = 1.0, anything else the agent did = 0.0. Failures that are not the policy's
(workspace, test environment, task data) set ``mask_sample``: the sample stays in its GRPO group's
baseline but gets no loss (polar_env.outcomes; the agent applies its run's table over these).

Lifecycle safety: a seed runs as its own task, so a caller that is cancelled (client gone) neither
leaves a half-made workspace behind nor starts a second one; concurrent seeds of one episode share
that task (one sandbox); a close waits for a seed still in flight and removes what it made. Every
host-side trace of a workspace lives under one ``polar-resources-*`` dir per process,
which ``aclose`` removes at shutdown and a janitor (``polar_env.janitor``) removes if the process is
killed first.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from polar_env.episodes.grading import Grading
from polar_env.episodes.settings import GradingSettings, TaskSettings
from polar_env.episodes.sites import sandbox_patch
from polar_env.episodes.workspace import Workspace, attach_workspace, open_workspace, workspace_kind
from polar_env.grades import GradeResult
from polar_env.janitor import Janitor
from polar_env.outcomes import FailureKind, OutcomeTable
from polar_env.rewards.grader import RunDeadline, Submission, grade_submission
from polar_env.safe_text import escape
from polar_env.sandbox.base import Sandbox, SandboxSpec
from polar_env.tasks.loader import load_tasks
from polar_env.tasks.models import Task
from polar_env.wire.gym_resources import SeedSessionResponse, Verdict, WorkspaceKind, WorkspaceMounts


class UnknownTask(LookupError):
    """The request names a task the server's task set does not have (a 404, not an infrastructure failure)."""

    failure_kind = (
        FailureKind.input_error
    )  # the episode's failure kind (episodes.episode.Episode.fail): the request's


class EpisodeConflict(ValueError):
    """The episode id is already closed, or bound to another task (a 409)."""


class PolarResourcesConfig(GradingSettings, TaskSettings):
    """What an operator sets in the Gym config (``resources_servers.polar``): the grading settings
    (``sandbox``, ``grading_timeout``, ``reward_key``: the names `polar rollout` takes) and its own."""

    scratch_root: str | None = None  # where sandbox workspaces live (default: the system temp dir)
    max_concurrent_grades: int = 8  # test runs in flight at once on this host
    sandbox_memory_gb: float | None = 8.0
    sandbox_pids_max: int | None = 4096


class VerifyOutcome(Verdict):
    """A verdict with the patch it graded (the wire carries only its size: ``Verdict.patch_bytes``)."""

    patch: str = ""

    def as_grade(self, task_id: str) -> GradeResult:
        """The grade record the outcome carries (or one naming its failure, where nothing was graded)."""
        grade = (
            GradeResult.model_validate(self.grading)
            if self.grading
            else GradeResult(
                instance_id=task_id,
                failure_kind=FailureKind.from_wire(self.failure_kind),
                error=self.failure_reason or "",
            )
        )
        return grade.model_copy(update={"reward": self.reward, "resolved": self.resolved})

    @classmethod
    def failed(cls, kind: FailureKind, reason: str) -> VerifyOutcome:
        """An outcome with nothing graded (the default table's row for ``kind``)."""
        reward, mask = OutcomeTable().apply(kind)
        return cls(
            reward=reward or 0.0,
            resolved=False,
            mask_sample=mask,
            failure_kind=kind.wire,
            failure_reason=reason,
        )


@dataclass
class _Episode:
    task: Task
    workspace: Workspace


class PolarResources:
    """Sandboxes and grading for many concurrent episodes (state is per process)."""

    def __init__(self, config: PolarResourcesConfig | None = None, tasks: list[Task] | None = None):
        self.config = config or PolarResourcesConfig()
        self.tasks = {
            t.instance_id: t for t in (tasks if tasks is not None else load_tasks(self.config.tasks))
        }
        self.episodes: dict[str, _Episode] = {}
        self.closed: set[str] = set()
        self._seeding: dict[str, asyncio.Future[_Episode]] = {}
        self.grading = Grading(self.config.max_concurrent_grades)  # in worker processes
        self._scratch: Path | None = None
        self._janitor: Janitor | None = None

    @property
    def scratch(self) -> Path:
        """This process's dir for every workspace (made on first use)."""
        if self._scratch is None:
            root = Path(self.config.scratch_root) if self.config.scratch_root else None
            if root is not None:
                root.mkdir(parents=True, exist_ok=True)
            self._scratch = Path(tempfile.mkdtemp(prefix="polar-resources-", dir=root))
            self._janitor = Janitor(self._scratch)
        return self._scratch

    def sandbox_spec(self) -> SandboxSpec:
        mem = self.config.sandbox_memory_gb
        return SandboxSpec(
            scratch_root=self.scratch,
            memory_bytes=int(mem * 2**30) if mem else None,
            pids_max=self.config.sandbox_pids_max,
        )

    def task(self, task_id: str) -> Task:
        try:
            return self.tasks[task_id]
        except KeyError:
            raise UnknownTask(
                f"unknown task_id {task_id!r} (task set {self.config.tasks!r} has {len(self.tasks)} tasks)"
            ) from None

    async def seed(
        self, episode_id: str, task_id: str, mounts: WorkspaceMounts | None = None
    ) -> SeedSessionResponse:
        """Create the episode's workspace; idempotent per ``episode_id``, also for concurrent calls.
        ``mounts``: the agent's proxy socket dir and harness install (a container mounts them at creation)."""
        if episode_id in self.closed:
            raise EpisodeConflict(f"episode {episode_id!r} was already closed")
        task = self.task(task_id)
        ep = self.episodes.get(episode_id)
        if ep is None:
            pending = self._seeding.get(episode_id)
            if pending is None:
                pending = self._seeding[episode_id] = asyncio.ensure_future(
                    self._create(episode_id, task, mounts)
                )
                pending.add_done_callback(lambda _: self._seeding.pop(episode_id, None))
            ep = await asyncio.shield(pending)  # a cancelled caller leaves the workspace to close()
        if ep.task.instance_id != task_id:
            raise EpisodeConflict(
                f"episode {episode_id!r} is bound to task {ep.task.instance_id!r}, not {task_id!r}"
            )
        ref = ep.workspace.ref
        return SeedSessionResponse(
            episode_id=episode_id,
            task_id=task_id,
            sandbox_root=ref.root,
            uid=ref.uid,
            gid=ref.gid,
            workspace=ref,
        )

    async def _create(self, episode_id: str, task: Task, mounts: WorkspaceMounts | None) -> _Episode:
        workspace = await open_workspace(
            task, self.sandbox_spec(), sandbox=self.config.sandbox, mounts=mounts
        )
        if episode_id in self.closed:  # closed while it was being made: nobody will attach
            await workspace.close()
            raise EpisodeConflict(f"episode {episode_id!r} was closed while it was being seeded")
        ep = self.episodes[episode_id] = _Episode(task=task, workspace=workspace)
        return ep

    async def verify(self, episode_id: str) -> VerifyOutcome:
        """Extract the episode's patch from its workspace and grade it (the agent asks only for
        episodes that failed, if at all, by the policy's doing)."""
        ep = self.episodes.get(episode_id)
        if ep is None:
            return VerifyOutcome.failed(
                FailureKind.lost_session, f"episode {episode_id!r} has no workspace (never seeded or closed)"
            )
        try:
            patch = await sandbox_patch(ep.workspace.sandbox)
        except Exception as exc:  # noqa: BLE001 - a broken workspace is ours, not the policy's
            return VerifyOutcome.failed(FailureKind.sandbox_failure, f"patch extraction failed: {exc}")
        # a Harbor task's own verifier judges the container the agent left
        in_place = ep.workspace.sandbox if ep.task.harbor is not None else None
        return await self.grade_patch(ep.task, patch, ep.workspace.ref.kind, in_place=in_place)

    async def grade_patch(
        self, task: Task, patch: str, kind: WorkspaceKind | None = None, *, in_place: Sandbox | None = None
    ) -> VerifyOutcome:
        """Grade a patch for a task where its episodes run (also the stateless path the verifier fixture
        uses), through the one entry point (`rewards.grader.grade_submission`)."""
        kind = kind or await asyncio.to_thread(workspace_kind, task, self.config.sandbox)
        result: GradeResult = await self.grading.call(
            partial(
                grade_submission,
                task,
                Submission(patch=patch, sandbox=in_place),
                kind=kind,
                deadline=RunDeadline.configured(self.config.grading_timeout),
                reward_key=self.config.reward_key,
                offload=self.grading.in_worker,
            )
        )
        return self._outcome(result, patch)

    @staticmethod
    def _outcome(result: GradeResult, patch: str) -> VerifyOutcome:
        reward, mask = OutcomeTable().apply(result.failure_kind, result.reward)
        patch = escape(patch)
        return VerifyOutcome(
            reward=reward or 0.0,
            resolved=result.resolved,
            mask_sample=mask,
            failure_kind=result.failure_kind.wire,
            failure_reason=escape(result.error) or None,
            patch=patch,
            patch_bytes=len(patch.encode("utf-8", errors="surrogateescape")),
            grading=result.model_dump(mode="json", exclude={"log_tail"}),
        )

    async def close(self, episode_id: str) -> bool:
        """Remove the workspace (after a seed still in flight); safe to repeat, and a later seed is
        refused."""
        self.closed.add(episode_id)
        pending = self._seeding.get(episode_id)
        if pending is not None:
            await asyncio.wait([pending])  # it sees the close and removes what it made
            if not pending.cancelled():
                pending.exception()  # retrieved here too: its callers may all be gone
        ep = self.episodes.pop(episode_id, None)
        if ep is None:
            return False
        await ep.workspace.close()
        return True

    async def close_episodes(self) -> int:
        """Close every episode, also those still being seeded; how many there were."""
        open_ids = set(self.episodes) | set(self._seeding)
        for episode_id in open_ids:
            await self.close(episode_id)
        return len(open_ids)

    async def aclose(self) -> None:
        """Server shutdown: close every episode, then the grading pool and the janitor (which removes
        the scratch root, however long that takes; it does so also if the server is killed first)."""
        await self.close_episodes()
        await asyncio.to_thread(self.grading.close)
        if self._janitor is not None:
            await asyncio.to_thread(self._janitor.release)
            self._scratch = self._janitor = None

    @property
    def open_episodes(self) -> int:
        return len(self.episodes) + len(self._seeding)


def attach_sandbox(seeded: SeedSessionResponse, spec: SandboxSpec) -> Sandbox:
    """The agent side: run commands in a workspace ``seed`` created (same host), with the agent's own
    mounts (proxy socket dir, harness install) in ``spec``. The resources server still owns it:
    never ``destroy`` an attached sandbox, ask the resources server to close the episode."""
    return attach_workspace(seeded.ref(), spec)


def aggregate(outcomes: list[dict[str, Any]]) -> dict[str, float]:
    """Resolved rate and trajectory statistics over finished ``/run`` results (or verify responses).

    Gym hands ``compute_metrics`` only the unmasked rollouts; ``masked_metrics`` counts the others."""
    n = len(outcomes)
    if not n:
        return {"num_samples": 0}
    usable = [o for o in outcomes if not _masked(o)]
    out: dict[str, float] = {
        "num_samples": n,
        "resolved_rate": sum(float(o.get("reward", 0.0)) for o in usable) / len(usable) if usable else 0.0,
    }
    for key in (
        "num_turns",
        "num_calls",
        "num_chains",
        "sampled_tokens",
        "trainable_fraction",
        "all_chains_trainable_fraction",
        "timed_out",
        "errored",
    ):
        values = [float(o[key]) for o in outcomes if isinstance(o.get(key), (int, float))]
        if values:
            out[f"mean_{key}"] = sum(values) / len(values)
    return out


def masked_metrics(outcomes: list[dict[str, Any]]) -> dict[str, float]:
    """Over every rollout, masked ones included: how many were masked, and why (failure kind)."""
    masked = [o for o in outcomes if _masked(o)]
    out: dict[str, float] = {
        "num_rollouts": len(outcomes),
        "num_masked": len(masked),
        "masked_fraction": len(masked) / len(outcomes) if outcomes else 0.0,
    }
    for o in masked:
        key = f"masked/{(o.get('failure_kind') or 'unknown').removeprefix('polar:')}"
        out[key] = out.get(key, 0) + 1
    return out


def _masked(o: dict[str, Any]) -> bool:
    return bool(o.get("mask_sample") or (o.get("instance_config") or {}).get("mask_sample"))
