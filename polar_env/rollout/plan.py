"""Which episodes a rollout job owes, and which of them ``--out`` already holds."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from polar_env.episodes.admission import StageAdmission
from polar_env.episodes.settings import EpisodeSettings
from polar_env.rollout.config import RolloutConfig
from polar_env.tasks.models import Task
from polar_env.trajectory.export import read_trajectories

if TYPE_CHECKING:
    from polar_env.rewards.audit import TaskAudit

log = logging.getLogger(__name__)


@dataclass
class RolloutPlan:
    """A rollout job: which episodes, where they go, and the limit of each stage (docs/rollout.md,
    "Stages"): ``run_slots`` model calls at once (the inference concurrency; ``--concurrency`` is its
    old name), ``prepare_slots`` open workspaces and start harnesses at once, ``lookahead`` live
    harnesses beyond the run slots (prepared ahead, or running a tool while others' calls use the
    slots), ``grade_slots`` grade at once (None: ``run_slots`` each), in worker processes
    (``grade_in_processes``; threads of this process for a test double). ``collapsed``:
    one slot held over all stages of an episode, ``run_slots`` of them (the driver before stages,
    kept to compare against). ``episode``: the settings every episode runs with (the config's own);
    ``scratch_root`` and ``grade`` are the runtime's (where workspaces go; tests that grade nothing)."""

    tasks: list[Task]
    samples: int = 1
    run_slots: int = 1
    out: Path = Path("runs/rollout")
    episode: EpisodeSettings = field(default_factory=EpisodeSettings)
    max_staleness: int | None = None  # admission bound in policy versions (proxy/policy.py Admission)
    train_paths: str = "all"  # which chains the GRPO batch trains (trajectory/paths.py)
    prepare_slots: int | None = None
    grade_slots: int | None = None
    lookahead: int | None = None
    collapsed: bool = False
    grade_in_processes: bool = True
    admin: str | None = None  # HOST:PORT of the proxy's admin API (also on TCP), None: its Unix socket only
    gpus: int | None = None  # the GPUs the backend holds, when known: the accepted work per GPU-hour
    scratch_root: Path | None = None  # where workspaces go (default: a temp dir)
    grade: bool = True

    def __post_init__(self) -> None:
        for name in ("run_slots", "prepare_slots", "grade_slots", "lookahead"):
            if (value := getattr(self, name)) is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 (got {value})")

    @property
    def concurrency(self) -> int:
        """``run_slots`` by the name ``--concurrency`` gives it."""
        return self.run_slots

    def limits(self) -> tuple[int, int, int]:
        """(prepare slots, lookahead, grade slots), each defaulting to ``run_slots``."""
        return (
            self.prepare_slots or self.run_slots,
            self.lookahead or self.run_slots,
            self.grade_slots or self.run_slots,
        )

    def admission(self) -> StageAdmission:
        """The stages' limits as the driver enters them: ``run_slots + lookahead`` live episodes
        (collapsed: ``run_slots``, each over all its stages); the staleness bound counting one
        training step as one pass over the plan's episodes."""
        prepare, lookahead, grade = self.limits()
        return StageAdmission(
            live=self.run_slots if self.collapsed else self.run_slots + lookahead,
            prepare=prepare,
            run=self.run_slots,
            grade=grade,
            collapsed=self.collapsed,
            max_staleness=self.max_staleness,
            per_step=len(self.tasks) * self.samples,
        )

    def episodes(self) -> list[tuple[Task, int]]:
        return [(task, k) for task in self.tasks for k in range(self.samples)]


def controllable(tasks: list[Task]) -> list[TaskAudit]:
    """The audits that found a task's reward controllable by the tested code (unaudited tasks: none)."""
    from polar_env.rewards import audit

    return [found for t in tasks if (found := audit.load(t)) is not None and found.verdict == "controllable"]


def plan_from_config(config: RolloutConfig) -> RolloutPlan:
    """The tasks the config selects, each ``samples`` times."""
    from polar_env.tasks.loader import TaskLoadError, load_tasks

    tasks = load_tasks(config.tasks)
    if config.task_ids:
        tasks = [t for t in tasks if t.instance_id in set(config.task_ids)]
    tasks = tasks[: config.limit] if config.limit else tasks
    if not tasks:
        raise TaskLoadError(f"no tasks selected from {config.tasks!r} (check --task-ids / --limit)")
    if flagged := controllable(tasks):  # what `polar tasks audit` found on this node
        said = (
            f"{len(flagged)} task(s) whose reward the tested code can control (polar tasks audit): "
            + "; ".join(a.line() for a in flagged[:5])
        )
        if config.refuse_controllable:
            raise TaskLoadError(f"{said} (--refuse-controllable)")
        log.warning("%s: their rewards teach the policy to control them, not to solve them", said)
    return RolloutPlan(
        tasks=tasks,
        samples=config.samples,
        run_slots=config.run_slots or config.concurrency,
        prepare_slots=config.prepare_slots,
        grade_slots=config.grade_slots,
        lookahead=config.lookahead,
        collapsed=config.collapsed,
        out=config.out,
        episode=config.episode_settings(),
        max_staleness=config.max_staleness,
        train_paths=config.train_paths,
        admin=config.admin,
        gpus=config.gpus,
    )


def episode_key(task_id: str, sample: int) -> str:
    return f"{task_id}.s{sample}"


def finished_keys(out: Path) -> set[str]:
    path = out / "trajectories.jsonl"
    if not path.exists():
        return set()
    return {t.metadata.episode_key or "" for t in read_trajectories(path)}


def pending_episodes(plan: RolloutPlan) -> list[tuple[Task, int]]:
    """The plan's episodes not yet in ``plan.out`` (what a rerun still has to do)."""
    done = finished_keys(plan.out)
    return [(t, k) for t, k in plan.episodes() if episode_key(t.instance_id, k) not in done]


def attempt_session_id(key: str, ledger: Path) -> str:
    """A fresh session id per attempt, so an interrupted attempt's ledger stays as it was."""
    attempt = 0
    while (ledger / "sessions" / f"{key}.a{attempt}").exists():
        attempt += 1
    return f"{key}.a{attempt}"
