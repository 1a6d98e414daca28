"""One episode between its stages (polar_env.episodes.stages): its state, the :class:`Site` it runs at,
and the :class:`EpisodeResult` it ends as."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from polar_env.episodes.grading import Grading
from polar_env.episodes.session import EpisodeSession
from polar_env.episodes.settings import EpisodeConfig
from polar_env.episodes.task import EpisodeTask
from polar_env.episodes.workspace import Workspace, WorkspaceRef
from polar_env.grades import GradeResult
from polar_env.harness_adapters.runner import HarnessRun
from polar_env.outcomes import FailureKind
from polar_env.sandbox.base import SandboxSpec
from polar_env.trajectory.models import Trajectory
from polar_env.trajectory.records import CallRecord

Stage = Literal["prepare", "run", "finish"]


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


async def close_workspace(ep: Episode) -> None:
    """The episode's workspace removed (once)."""
    workspace, ep.workspace = ep.workspace, None
    if workspace is not None:
        await workspace.close()
