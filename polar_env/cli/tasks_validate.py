"""``polar tasks validate``: check every task of a file before training on it (docs/tasks.md)."""

from __future__ import annotations

import argparse
import sys

from polar_env.cli.task_toolkit import validate_task
from polar_env.episodes.workspace import SANDBOX_CHOICES, check_engine, workspace_kinds
from polar_env.tasks.datasets import procedure_of
from polar_env.tasks.loader import TaskLoadError, load_tasks
from polar_env.tasks.models import Task
from polar_env.tasks.runtime import WorkspaceUnavailable, check_image


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Per task: the environment builds, the test patch applies, the gold patch resolves and "
        "the empty patch does not. Exit 1 if any task is defective."
    )
    parser.add_argument(
        "file", help="a task file (JSONL), a Harbor task folder (or a folder of them), or 'bundled'"
    )
    parser.add_argument(
        "--sandbox", default="auto", choices=SANDBOX_CHOICES, help="where to grade (as polar eval)"
    )
    parser.add_argument(
        "--grading-timeout",
        type=float,
        default=None,
        help="per test run (s; default: the grading deadline, POLAR_GRADING_TIMEOUT_S)",
    )


def dataset_line(task: Task) -> str:
    """Which dataset the row is and what is verified for it (tasks/datasets/ ``Procedure``)."""
    if task.harbor is not None:
        return "Harbor task: graded by its own verifier (tests/test.sh)"
    return f"dataset {task.dataset or 'swe-bench'}: {procedure_of(task).summary()}"


def run(args: argparse.Namespace) -> int:
    try:
        tasks = load_tasks(args.file)
        for task in tasks:  # which dataset each row is, and what is verified for it, before any check
            print(f"{task.instance_id}: {dataset_line(task)}", flush=True)
        kinds = workspace_kinds(tasks, args.sandbox)
        for kind in sorted(set(kinds.values())):
            check_engine(kind)
    except (TaskLoadError, WorkspaceUnavailable) as exc:
        print(f"polar tasks validate: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    defects = unchecked = 0
    for task in tasks:
        try:
            check_image(task, kinds[task.instance_id])
        except WorkspaceUnavailable as exc:
            unchecked += 1
            why = str(exc).splitlines()[0].removeprefix(f"{task.instance_id}: ")
            print(f"{task.instance_id}: NOT CHECKED: {why}", flush=True)
            continue
        result = validate_task(task, kind=kinds[task.instance_id], timeout_s=args.grading_timeout)
        defects += not result.ok
        print(result.line(), flush=True)
    checked = len(tasks) - unchecked
    print(
        f"{checked - defects}/{len(tasks)} tasks valid"
        + (f", {unchecked} not checked (no image here)" if unchecked else "")
        + (": fix the defects above before training on them" if defects else "")
    )
    return 1 if defects else 2 if unchecked else 0
