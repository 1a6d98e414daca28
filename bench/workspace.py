"""Workspace creation per episode: ``open_workspace`` + ``close`` in bubblewrap, per task, and in
podman for the bundled tasks' images.

``python -m bench.workspace --tasks bundled --runs 10`` (or ``polar bench --only workspace``)
prints the median and p90 per task; the first open of a task, which builds its warm base on this
node (``tasks/base_trees.py``; in podman its warm image, ``sandbox/warm_images.py``), is timed
apart as ``first_s``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import median, percentile
from polar_env.sandbox.base import SandboxSpec
from polar_env.tasks.models import Task

COMMAND = "python -m bench.workspace --tasks bundled --runs 10"
BEFORE_COMMIT = "bba778e"
# median s per episode at BEFORE_COMMIT, same command, this 2-core machine
BEFORE = {
    "marshmallow-code__marshmallow-1359": 0.158,
    "pallets__flask-5014": 0.369,
    "psf__requests-5414": 0.235,
    "psf__requests-6028": 0.243,
    "pytest-dev__pytest-10051": 1.618,
}
BEFORE_LOAD = 1.2  # the 1-minute load average then
CONTAINER_ENGINE = "podman"
CONTAINER_TASKS = ("psf__requests-5414", "pallets__flask-5014")  # the bundled tasks with an image recipe
CONTAINER_BEFORE_COMMIT = "02b1ee6"  # before warm images: each container re-owned and re-snapshotted its tree
# median s per episode at CONTAINER_BEFORE_COMMIT, same command (open + close), this 2-core machine
CONTAINER_BEFORE = {"pallets__flask-5014": 1.25, "psf__requests-5414": 0.828}
CONTAINER_BEFORE_LOAD = 1.3


async def _task(task: Task, spec: SandboxSpec, runs: int, sandbox: str = "bubblewrap") -> dict[str, Any]:
    from polar_env.episodes.workspace import open_workspace

    seconds, clone = [], ""
    for _ in range(runs + 1):
        t0 = time.perf_counter()
        ws = await open_workspace(task, spec, sandbox=sandbox)
        await ws.close()
        seconds.append(time.perf_counter() - t0)
        clone = ws.ref.clone
    rest = seconds[1:]
    return {
        "first_s": round(seconds[0], 4),
        "median_s": round(median(rest), 4),
        "p90_s": round(percentile(rest, 90), 4),
        "clone": clone,
    }


async def measure(tasks: str = "bundled", runs: int = 10) -> dict[str, Any]:
    from polar_env.tasks.loader import load_tasks

    out: dict[str, Any] = {}
    load = os.getloadavg()[0]
    previous = os.environ.get("POLAR_BASE_CACHE")
    with tempfile.TemporaryDirectory(prefix="polar-bench-ws-") as tmp:
        os.environ["POLAR_BASE_CACHE"] = str(Path(tmp) / "bases")  # a fresh cache: first_s includes the build
        try:
            spec = SandboxSpec(scratch_root=Path(tmp) / "scratch")
            for task in load_tasks(tasks):
                out[task.instance_id] = await _task(task, spec, runs)
        finally:
            if previous is None:
                os.environ.pop("POLAR_BASE_CACHE")
            else:
                os.environ["POLAR_BASE_CACHE"] = previous
    return {
        "tasks": out,
        "runs": runs,
        "load_avg_1": [round(load, 1), round(os.getloadavg()[0], 1)],
        "containers": await _containers(runs),
    }


async def _containers(runs: int) -> dict[str, Any]:
    """The same in podman, each bundled task as an image row; its warm image is dropped first, so
    ``first_s`` includes its commit."""
    from polar_env.episodes.workspace import engine_available
    from polar_env.tasks.images import ensure_task_image
    from polar_env.tasks.loader import load_bundled

    if not engine_available(CONTAINER_ENGINE):
        return {"skipped": f"{CONTAINER_ENGINE} is not available (scripts/setup_podman.sh)"}
    load, out = os.getloadavg()[0], {}
    for task in (t for t in load_bundled() if t.instance_id in CONTAINER_TASKS):
        row = task.model_copy(
            update={"image": ensure_task_image(task, CONTAINER_ENGINE), "base_archive": None}
        )
        _drop_warm_image(row)
        out[task.instance_id] = await _task(row, SandboxSpec(), runs, sandbox=CONTAINER_ENGINE)
    return {
        "engine": CONTAINER_ENGINE,
        "tasks": out,
        "load_avg_1": [round(load, 1), round(os.getloadavg()[0], 1)],
    }


def _drop_warm_image(task: Task) -> None:
    import subprocess

    try:
        from polar_env.sandbox.warm_images import warm_image_name
    except ImportError:  # the code before warm images (the `before` figures): nothing to drop
        return
    from polar_env.tasks import runtime

    spec = runtime.container_spec(task, runtime.task_spec(task, SandboxSpec()), CONTAINER_ENGINE)
    # what its history is reduced to is part of the name (earlier code: `history_base`, or neither)
    target = getattr(runtime, "history_target", None) or getattr(runtime, "history_base", None)
    base = (target(task),) if target else ()
    subprocess.run(
        [CONTAINER_ENGINE, "rmi", warm_image_name(CONTAINER_ENGINE, task.image or "", spec, *base)],
        capture_output=True,
        timeout=300,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="bundled")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.tasks, args.runs)), indent=2))


if __name__ == "__main__":
    main()
