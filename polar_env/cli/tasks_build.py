"""``polar tasks build``: a Polar task from a SWE-bench-schema row and its base tree (docs/tasks.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from polar_env.cli.task_toolkit import TaskDefect, build_task, write_rows
from polar_env.tasks.env import EnvBuildError
from polar_env.tasks.loader import TaskLoadError, load_jsonl


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Archive the base tree beside the task file, record its base_commit, and derive "
        "FAIL_TO_PASS / PASS_TO_PASS by running the tests on the base tree and on the gold patch."
    )
    parser.add_argument("row", type=Path, help="the row: a .json object (or a one-line .jsonl)")
    parser.add_argument(
        "--base",
        type=Path,
        required=True,
        help="the base tree: a directory, a .tar.gz/.tgz/.tar archive or an sdist",
    )
    parser.add_argument("--out", type=Path, required=True, help="the task file (JSONL) to add the task to")
    parser.add_argument(
        "--grading-timeout",
        type=float,
        default=None,
        help="per test run (s; default: the grading deadline, POLAR_GRADING_TIMEOUT_S)",
    )


def _row(path: Path) -> dict:
    if not path.is_file():
        raise TaskLoadError(f"row file {path} does not exist: pass a SWE-bench-schema row as .json or .jsonl")
    text = path.read_text()
    rows = (
        json.loads(text)
        if path.suffix == ".json"
        else [json.loads(x) for x in text.splitlines() if x.strip()]
    )
    rows = rows if isinstance(rows, list) else [rows]
    if len(rows) != 1:
        raise TaskLoadError(f"{path} holds {len(rows)} rows; build takes one row and its --base tree")
    return rows[0]


def run(args: argparse.Namespace) -> int:
    try:
        row = _row(args.row)
        if not args.base.exists():
            raise TaskLoadError(
                f"base tree {args.base} does not exist: pass a directory, an archive or an sdist"
            )
        task = build_task(row, args.base, args.out, timeout_s=args.grading_timeout)
        kept = [
            t
            for t in (load_jsonl(args.out) if args.out.is_file() else [])
            if t.instance_id != task.instance_id
        ]
        write_rows([*kept, task], args.out)
    except (TaskLoadError, TaskDefect, EnvBuildError, ValueError) as exc:
        print(f"polar tasks build: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    print(
        f"{task.instance_id}: FAIL_TO_PASS {len(task.FAIL_TO_PASS)}, PASS_TO_PASS {len(task.PASS_TO_PASS)}, "
        f"base_commit {task.base_commit[:12]} -> {args.out}"
    )
    return 0
