"""The episode's :class:`~polar_env.episodes.episode.Site` when it is this process (:class:`LocalSite`:
``polar rollout``'s driver, demo, train, every Ray node): the workspace opened here, the patch taken
from it, the grade through the one entry point (`rewards.grader.grade_submission`)."""

from __future__ import annotations

from functools import partial

from polar_env.episodes.episode import Episode, close_workspace
from polar_env.episodes.grading import Grading
from polar_env.episodes.workspace import Workspace, open_workspace
from polar_env.grades import GradeResult
from polar_env.harness_adapters.registry import NOISE_EXCLUDES
from polar_env.rewards.grader import RunDeadline, Submission, grade_submission
from polar_env.sandbox.base import Sandbox, SandboxSpec
from polar_env.tasks.models import Task
from polar_env.trajectory.models import Trajectory


async def sandbox_patch(sandbox: Sandbox) -> str:
    """The agent's patch: the workspace's diff against its base snapshot, harness noise dropped."""
    return (await sandbox.diff(NOISE_EXCLUDES)).decode("utf-8", errors="surrogateescape")


def patch_bytes(patch: str) -> int:
    return len(patch.encode("utf-8", errors="surrogateescape"))


async def grade_episode(ep: Episode, grading: Grading | None = None) -> GradeResult:
    """The episode's grade through the one entry point (`rewards.grader.grade_submission`): a Harbor
    task's own verifier in the agent's (still open) container; SWE-bench grading of the patch in a fresh
    tree or container of the kind the episode ran in otherwise, in a grading worker."""
    task, settings = ep.task, ep.settings
    assert isinstance(task, Task)  # graded here: a loaded task
    kind = ep.ref.kind if ep.ref is not None else "bubblewrap"
    in_place = ep.workspace.sandbox if task.harbor is not None and ep.workspace is not None else None
    grading_it = partial(
        grade_submission,
        task,
        Submission(patch=ep.patch, sandbox=in_place),
        kind=kind,
        deadline=RunDeadline.configured(settings.grading_timeout),
        reward_key=settings.reward_key,
        offload=grading.in_worker if grading is not None else None,
    )
    return await (grading.call(grading_it) if grading is not None else grading_it())


class LocalSite:
    """This process opens the workspace (a bubblewrap tree cloned from the task's warm base, or a
    container of its image) and grades the patch in a fresh one (a Harbor task: in its own)."""

    async def open(self, ep: Episode, spec: SandboxSpec) -> Workspace:
        assert isinstance(ep.task, Task)  # opened here: a loaded task
        return await open_workspace(ep.task, spec, sandbox=ep.settings.sandbox)

    async def collect(self, ep: Episode) -> str:
        assert ep.workspace is not None
        patch = await sandbox_patch(ep.workspace.sandbox)
        if ep.task.harbor is None:  # graded in a fresh tree: this one can go now
            await close_workspace(ep)
        return patch

    async def grade(self, ep: Episode, trajectory: Trajectory, grading: Grading | None) -> GradeResult:
        return await grade_episode(ep, grading)
