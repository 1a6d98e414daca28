"""``polar tasks validate``: check every task of a file before training on it (docs/tasks.md)."""

from __future__ import annotations

import argparse
import sys

from polar_env.cli.task_toolkit import validate_task
from polar_env.episodes.workspace import SANDBOX_CHOICES, check_engine, workspace_kind
from polar_env.tasks.loader import TaskLoadError, load_tasks
from polar_env.tasks.runtime import WorkspaceUnavailable, check_image


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Per task: the environment builds, the test patch applies, the gold patch resolves and "
                          "the empty patch does not. Exit 1 if any task is defective.")
    parser.add_argument("file", help="a task file (JSONL), a Harbor task folder (or a folder of them), or 'bundled'")
    parser.add_argument("--sandbox", default="auto", choices=SANDBOX_CHOICES, help="where to grade (as polar eval)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="per test run (s; default: the grading deadline, POLAR_GRADING_TIMEOUT_S)")


def run(args: argparse.Namespace) -> int:
    try:
        tasks = load_tasks(args.file)
        kinds = {t.instance_id: workspace_kind(t, args.sandbox) for t in tasks}
        for task in tasks:
            check_engine(kinds[task.instance_id])
            check_image(task, kinds[task.instance_id])
    except (TaskLoadError, WorkspaceUnavailable) as exc:
        print(f"polar tasks validate: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    defects = 0
    for task in tasks:
        result = validate_task(task, kind=kinds[task.instance_id], timeout_s=args.timeout)
        defects += not result.ok
        print(result.line(), flush=True)
    print(f"{len(tasks) - defects}/{len(tasks)} tasks valid"
          + (": fix the defects above before training on them" if defects else ""))
    return 1 if defects else 0
