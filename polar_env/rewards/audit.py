"""What ``polar tasks audit`` found per task, kept on this node: whether the tested code can control the
task's reward without solving it. ``polar rollout`` reads it to warn about (or, with
``--refuse-controllable``, refuse) such tasks before training on them (docs/tasks.md, "Auditing tasks").

A verdict is keyed by everything it depends on (the task, the grader's code: `gold_runs.gold_key`), so
a changed task or grader is audited again; it sits beside the gold runs (`gold_runs.gold_dir`).
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from polar_env.rewards.gold_runs import gold_dir, gold_key
from polar_env.tasks.models import Task

Verdict = Literal["resists", "controllable", "unknown"]
CheckVerdict = Literal["resists", "controls", "not_applicable", "unknown"]


class CheckResult(BaseModel):
    """One known way to control the reward, run against the task."""

    verdict: CheckVerdict
    detail: str = ""


class TaskAudit(BaseModel):
    task_id: str
    verdict: Verdict
    checks: dict[str, CheckResult] = Field(default_factory=dict)
    audited_at: float = Field(default_factory=time.time)

    @classmethod
    def of(cls, task_id: str, checks: dict[str, CheckResult]) -> TaskAudit:
        """``controllable`` if any check controls the reward; ``unknown`` if one could not tell; else
        ``resists``."""
        verdicts = {c.verdict for c in checks.values()}
        verdict: Verdict = (
            "controllable" if "controls" in verdicts else "unknown" if "unknown" in verdicts else "resists"
        )
        return cls(task_id=task_id, verdict=verdict, checks=checks)

    def line(self) -> str:
        said = ", ".join(f"{name}: {c.verdict}" for name, c in self.checks.items())
        return f"{self.task_id}: {self.verdict.upper()} ({said})"


def _path(task: Task):
    return gold_dir() / f"{gold_key(task, 'audit')}.audit.json"


def save(task: Task, audit: TaskAudit) -> None:
    path = _path(task)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_text(audit.model_dump_json())


def load(task: Task) -> TaskAudit | None:
    """The task's stored verdict, None when it was never audited (or since changed)."""
    try:
        return TaskAudit.model_validate_json(_path(task).read_bytes())
    except (OSError, ValidationError, ValueError):
        return None
