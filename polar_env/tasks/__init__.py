"""Task sets: bundled CI tasks, SWE-bench Verified, JSONL files (see docs/rewards.md)."""

from polar_env.tasks.env import ensure_task_env
from polar_env.tasks.loader import TaskLoadError, load_tasks
from polar_env.tasks.models import Task, TaskEnvironment
from polar_env.tasks.tree import materialize

__all__ = ["Task", "TaskEnvironment", "TaskLoadError", "ensure_task_env", "load_tasks", "materialize"]
