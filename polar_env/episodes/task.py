"""What an episode reads of its task, and the first user message made of it."""

from __future__ import annotations

from typing import Protocol

from polar_env.tasks.models import HarborRef, patch_files
from polar_env.trajectory import exploits

PROMPT = """You are working in the repository at {workdir}. Resolve the following issue by editing the \
source code (not the tests). When you are done, stop.

<issue>
{problem}
</issue>"""


class EpisodeTask(Protocol):
    """What an episode reads of its task: a loaded `Task`, or the Gym agent's view of a dataset row
    (the resources server holds the task itself and grades it)."""

    @property
    def instance_id(self) -> str: ...

    @property
    def problem_statement(self) -> str: ...

    @property
    def harbor(self) -> HarborRef | None: ...

    @property
    def workdir(self) -> str: ...  # where the repository is (/testbed, a dataset's /<repo> or /app)


def episode_prompt(task: EpisodeTask) -> str:
    """The first user message; identical for every rollout of a task (GRPO groups depend on it).
    A Harbor task's is its instruction.md as written."""
    if task.harbor is not None:
        return task.problem_statement
    return PROMPT.format(workdir=task.workdir, problem=task.problem_statement.strip())


def agent_timeout(task: EpisodeTask, default_s: float) -> float:
    """The harness's deadline: a Harbor task's ``[agent] timeout_sec`` where it sets one."""
    own = task.harbor.config.agent.timeout_sec if task.harbor is not None else None
    return own or default_s


def exploit_context(task: EpisodeTask) -> exploits.ExploitContext:
    """What `trajectory.exploits` needs of ``task`` (a Gym agent's view of a row may carry none of it)."""
    return exploits.context(
        getattr(task, "repo", ""),
        patch_files(getattr(task, "patch", "")),
        patch_files(getattr(task, "test_patch", "")),
    )
