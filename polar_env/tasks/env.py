"""Per-task pinned test environments: one venv per instance under the Polar cache.

Built at setup time (PyPI reachable); the grading sandbox mounts it read-only and has no
network, so an agent cannot `pip install` a fixed release. A built environment is scanned for the
task's answer before it is kept (``tasks/answers.py``): a dependency vendoring another release of
the task's package refuses the task. Every requirement is an exact pin
installed with `--no-deps`, so the environment is the same on every machine.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from polar_env.cache import cache_root
from polar_env.sandbox.rootfs import READY, rootfs_dir
from polar_env.tasks.models import Task

STAMP = "polar-env.json"


class EnvBuildError(RuntimeError):
    """The task environment could not be built (an infrastructure failure, not the agent's)."""


def env_dir(task: Task) -> Path:
    return cache_root() / "envs" / task.instance_id


def _interpreter(version: str) -> str:
    """The documented rule (docs/tasks.md): ``python: "X.Y"`` is Debian's ``/usr/bin/pythonX.Y``,
    because the venv's python symlink must resolve inside the sandboxes, which mount the sandbox
    root's ``/usr`` (``polar_env.sandbox.rootfs``), never the host's ``/usr/local``, pyenv shims or
    any home-directory install."""
    cand = Path(f"/usr/bin/python{version}")
    if cand.exists() and (not (rootfs_dir() / READY).is_file() or (rootfs_dir() / str(cand)[1:]).exists()):
        return str(cand)
    raise EnvBuildError(
        f"python{version} is not Debian's /usr/bin/python{version} here and in the sandbox root "
        f"(the sandboxes mount only that root's /usr): run the task in an image that has it "
        f"(docs/tasks.md)"
    )


def _stamp(task: Task) -> dict:
    spec = task.environment.model_dump(include={"python", "requirements"})
    return {
        "instance_id": task.instance_id,
        "spec_sha256": hashlib.sha256(json.dumps(spec).encode()).hexdigest(),
    }


def env_ready(task: Task) -> bool:
    stamp = env_dir(task) / STAMP
    return stamp.is_file() and json.loads(stamp.read_text()) == _stamp(task)


def ensure_task_env(task: Task) -> Path:
    """Return the task's venv, building it if missing or stale. Safe to call concurrently."""
    target = env_dir(task)
    if env_ready(task):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{task.instance_id}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if env_ready(task):
            return target
        tmp = target.parent / f".{task.instance_id}.building"
        shutil.rmtree(tmp, ignore_errors=True)
        python = _interpreter(task.environment.python)
        _run([python, "-m", "venv", "--without-pip", str(tmp)])
        # pip from the host runs against the new interpreter via --python; the venv itself
        # carries no pip, so nothing inside the sandbox can install packages.
        if task.environment.requirements:
            _run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "--python",
                    str(tmp / "bin" / "python"),
                    "install",
                    "--no-deps",
                    "--disable-pip-version-check",
                    "--no-input",
                    "-q",
                    *task.environment.requirements,
                ]
            )
        (tmp / STAMP).write_text(json.dumps(_stamp(task)))
        _refuse_answers(task, tmp)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return target


def _refuse_answers(task: Task, env: Path) -> None:
    """The tested code reads the environment: one holding the task's answer (its package at another
    version, a gold line: ``tasks/answers.py``) refuses the task (`AnswerReadable`) and is not kept."""
    from polar_env.tasks.answers import View, needles_of, refuse_readable_answers
    from polar_env.tasks.base_trees import base_cache_dir, warm_base

    if task.patch and task.base_archive:
        base = warm_base(task, base_cache_dir()).tree
        refuse_readable_answers(task, needles_of(task, base), [View("its grading environment", env)])


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise EnvBuildError(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
