"""``polar tasks export --format harbor``: any task Polar runs, written as a Harbor task folder.

A Harbor task is copied as it is. A SWE-bench-style task becomes the folder Harbor's own SWE-bench
adapters write:

- ``environment/``: the SWE-bench-layout image Polar builds (tasks/images.py: the base tree at
  ``/testbed`` as one commit, the pinned venv at ``/opt/venv``), ``FROM debian:bookworm-slim`` (the
  public image Polar's base is made from; Polar maps it to its local base), run by the non-root user
  ``agent`` (uid 1000: ``[agent] user`` and ``[verifier] user``, as Polar runs SWE tasks); a task
  without a base tree names its image as ``docker_image`` instead;
- ``instruction.md``: the prompt Polar gives the agent;
- ``tests/test.sh``: SWE-bench's procedure in the agent's tree: reset the test patch's files, apply
  ``tests/test.patch``, run the task's test command, read pytest's ``-rA`` summary as SWE-bench's
  pytest parser does, reward 1 when every FAIL_TO_PASS and PASS_TO_PASS test (``tests/expected.json``)
  passes (a runner other than pytest is not parsed: export such tasks' grading is not faithful);
- ``solution/solve.sh``: ``git apply`` of the gold patch.

``task.toml`` uses harbor 0.25's schema (``network_mode = "no-network"``, not the deprecated
``allow_internet``); the conformance test loads every exported folder with ``harbor``'s own task model.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import sys
from pathlib import Path

from polar_env.rewards.sandbox_exec import grading_timeout_s
from polar_env.tasks.images import AGENT_USER, PUBLIC_BASE
from polar_env.tasks.models import Task

SCHEMA_VERSION = "1.1"


def _toml_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def task_toml(task: Task, *, agent_timeout_s: float = 600.0, verifier_timeout_s: float | None = None) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]", "-", task.instance_id)
    statement = task.problem_statement.strip()
    summary = statement.splitlines()[0][:200] if statement else ""
    lines = [
        f'schema_version = "{SCHEMA_VERSION}"',
        "",
        "[task]",
        f'name = "polar/{name}"',
        f"description = {_toml_str(summary)}",
        "",
        "[metadata]",
        f"repo = {_toml_str(task.repo)}",
        f"version = {_toml_str(task.version)}",
        'source = "polar"',
        f"fail_to_pass = {len(task.FAIL_TO_PASS)}",
        "",
        "[verifier]",
        f"timeout_sec = {grading_timeout_s(verifier_timeout_s):.1f}",
        f'user = "{AGENT_USER}"',
        "",
        "[agent]",
        f"timeout_sec = {agent_timeout_s:.1f}",
        f'user = "{AGENT_USER}"',
        "",
        "[environment]",
        "build_timeout_sec = 1800.0",
        'network_mode = "no-network"',
        f"workdir = {_toml_str(task.workdir)}",
    ]
    if not task.base_archive and task.image:
        lines.append(f"docker_image = {_toml_str(task.image)}")
    return "\n".join(lines) + "\n"


# Reads pytest's -rA summary the way SWE-bench's pytest parser does (status, then the id up to the
# first space) and grades as SWE-bench does: every FAIL_TO_PASS and PASS_TO_PASS test passes.
GRADE_PY = """import json, sys
want = json.load(open("/tests/expected.json"))
status = {}
for line in open("/logs/verifier/test_output.txt", errors="replace"):
    parts = line.split()
    if len(parts) > 1 and parts[0] in ("PASSED", "FAILED", "ERROR", "XFAIL", "SKIPPED", "XPASS"):
        status[parts[1]] = parts[0]
bad = [t for t in want["FAIL_TO_PASS"] + want["PASS_TO_PASS"] if status.get(t) not in ("PASSED", "XFAIL")]
print(f"{len(bad)} of the graded tests do not pass", bad[:5])
open("/logs/verifier/reward.txt", "w").write("0\\n" if bad else "1\\n")
"""


def test_script(task: Task) -> str:
    """SWE-bench's grading as a Harbor ``test.sh``, run in the agent's tree after the agent is done."""
    wd = shlex.quote(task.workdir)
    files = " ".join(shlex.quote(f) for f in task.test_files())
    env = "".join(
        f"export {k}={shlex.quote(v.replace('{testbed}', task.workdir))}\n"
        for k, v in task.environment.env.items()
    )
    reset = (
        f"git checkout {shlex.quote(task.base_commit or 'HEAD')} -- {files} 2>/dev/null || true\n"
        if files
        else ""
    )
    return (
        f"#!/bin/bash\n# SWE-bench's procedure for {task.instance_id} (exported by polar tasks export).\n"
        f"cd {wd}\ngit config --global --add safe.directory {wd} 2>/dev/null\n{reset}"
        "if ! git apply -v /tests/test.patch; then echo 'test patch did not apply'; exit 1; fi\n"
        f"{env}{task.full_test_command()} > /logs/verifier/test_output.txt 2>&1\n"
        f"python3 - <<'POLAR_GRADE_EOF'\n{GRADE_PY}POLAR_GRADE_EOF\n"
    )


def solve_script(task: Task) -> str:
    return (
        f"#!/bin/bash\nset -euo pipefail\ncd {shlex.quote(task.workdir)}\n"
        f"git apply <<'POLAR_GOLD_EOF'\n{task.patch}POLAR_GOLD_EOF\n"
    )


def export_task(task: Task, out: Path) -> Path:
    """Write ``task`` as the Harbor folder ``out/<instance_id>``; returns it."""
    dest = out / task.instance_id
    if dest.exists():
        shutil.rmtree(dest)
    if task.harbor is not None:
        shutil.copytree(task.harbor.path, dest, symlinks=True)
        return dest
    (dest / "environment").mkdir(parents=True)
    (dest / "tests").mkdir()
    (dest / "solution").mkdir()
    (dest / "task.toml").write_text(task_toml(task))
    from polar_env.episodes.task import episode_prompt

    (dest / "instruction.md").write_text(episode_prompt(task) + "\n")
    if task.base_archive:
        from polar_env.tasks.images import CA_BUNDLE, PIP_WHEEL, pip_wheel, public_containerfile
        from polar_env.tasks.tree import materialize

        (dest / "environment" / "Dockerfile").write_text(public_containerfile(task))
        if task.environment.requirements:
            shutil.copy2(pip_wheel(), dest / "environment" / PIP_WHEEL)
        materialize(task, dest / "environment" / "testbed")
        if CA_BUNDLE.is_file():
            shutil.copy2(CA_BUNDLE, dest / "environment" / "ca-certificates.crt")
    else:
        (dest / "environment" / "Dockerfile").write_text(
            f"FROM {task.image or PUBLIC_BASE}\nWORKDIR {task.workdir}\n"
        )
    (dest / "tests" / "test.patch").write_text(task.test_patch)
    (dest / "tests" / "expected.json").write_text(
        json.dumps({"FAIL_TO_PASS": task.FAIL_TO_PASS, "PASS_TO_PASS": task.PASS_TO_PASS}, indent=1)
    )
    (dest / "tests" / "test.sh").write_text(test_script(task))
    (dest / "solution" / "solve.sh").write_text(solve_script(task))
    for script in (dest / "tests" / "test.sh", dest / "solution" / "solve.sh"):
        script.chmod(0o755)
    return dest


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write tasks as Harbor task folders (task.toml, instruction.md, environment/, tests/, "
        "solution/) that Harbor, NeMo Gym and OpenEnv read."
    )
    parser.add_argument(
        "--tasks", default="bundled", help="any task source polar rollout takes (docs/tasks.md)"
    )
    parser.add_argument("--format", default="harbor", choices=["harbor"])
    parser.add_argument("--task-ids", nargs="*", default=None)
    parser.add_argument(
        "--out", type=Path, required=True, help="the folder to write one task folder per task into"
    )


def run(args: argparse.Namespace) -> int:
    from polar_env.tasks.loader import TaskLoadError, load_tasks

    try:
        tasks = [t for t in load_tasks(args.tasks) if args.task_ids is None or t.instance_id in args.task_ids]
    except TaskLoadError as exc:
        print(f"polar tasks export: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        print(export_task(task, args.out))
    return 0
