"""Grading time per bundled task (gold patch) and rollouts/hour of `polar rollout` (scripted policy).

Grading runs each task's tests in its prepared venv, exactly as the reward module does in an
episode; the first grade of a task may also build that venv, which is timed apart (setup_s).
`loop_lag_while_grading` measures what grading costs the event loop that answers model calls: the
same grades on threads of the loop's process and in worker processes (rewards/workers.py).
Rollouts run the real `polar rollout` command (Pi in bubblewrap, the `gold` scripted policy
scored by the embedded model, grading included) as a subprocess, so the figure is end to end.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import median, percentile


def grade_bundled(runs: int) -> dict[str, Any]:
    from polar_env.rewards.grading import grade
    from polar_env.tasks.env import ensure_task_env
    from polar_env.tasks.loader import load_tasks

    out: dict[str, Any] = {}
    for task in load_tasks("bundled"):
        t0 = time.perf_counter()
        ensure_task_env(task)
        setup_s = time.perf_counter() - t0
        seconds, resolved = [], []
        for _ in range(runs):
            t0 = time.perf_counter()
            result = grade(task, task.patch)
            seconds.append(time.perf_counter() - t0)
            resolved.append(result.resolved)
        if not all(resolved):
            raise RuntimeError(f"{task.instance_id}: the gold patch did not resolve the task")
        out[task.instance_id] = {"grade_s": median(seconds), "setup_s": setup_s, "runs": runs}
    return out


def rollouts_per_hour(
    workdir: Path, concurrency: int, *, limit: int | None, timeout_s: float
) -> dict[str, Any]:
    """Run `polar rollout --policy gold` over the bundled tasks; episodes finished per hour."""
    out = workdir / f"rollout-c{concurrency}"
    cmd = [
        sys.executable,
        "-m",
        "polar_env.cli",
        "rollout",
        "--policy",
        "gold",
        "--harness",
        "pi",
        "--tasks",
        "bundled",
        "--concurrency",
        str(concurrency),
        "--out",
        str(out),
        "--timeout",
        "300",
    ]
    if limit:
        cmd += ["--limit", str(limit)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, timeout=timeout_s)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"polar rollout exited {proc.returncode}: {proc.stderr.decode()[-1500:]}")
    summary = json.loads((out / "summary.json").read_text())
    episodes = summary["episodes"]
    return {
        "episodes": episodes,
        "wall_s": elapsed,
        "rollouts_per_hour": episodes / elapsed * 3600,
        "resolved": summary["resolved"],
        "status": summary["status"],
        "concurrency": concurrency,
    }


async def _lag_while(work: Any, tick_s: float = 0.001) -> tuple[Any, list[float]]:
    """``await work`` while a ticker sleeps ``tick_s`` over and over; each tick's lateness in ms."""
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            t0 = loop.time()
            await asyncio.sleep(tick_s)
            lags.append((loop.time() - t0 - tick_s) * 1000)

    tick = asyncio.ensure_future(ticker())
    try:
        return await work, lags
    finally:
        done.set()
        await tick


async def loop_lag_while_grading(slots: int = 2) -> dict[str, Any]:
    """Each bundled task's gold patch graded ``slots`` at a time through the rollout's `Grading`, on
    threads and then in worker processes, while the loop runs a 1 ms ticker (what a model call's
    answer waits for). A warm-up pass first, so both see warm bases and the node's gold runs."""
    from polar_env.episodes.grading import Grading
    from polar_env.rewards.grader import grade_task
    from polar_env.tasks.loader import load_tasks

    tasks = load_tasks("bundled")
    out: dict[str, Any] = {"slots": slots, "tasks": len(tasks)}
    for mode in ("warm-up", "threads", "processes"):
        grading = Grading(slots, processes=mode != "threads")
        t0 = time.perf_counter()
        try:
            results, lags = await _lag_while(
                asyncio.gather(
                    *(
                        grading.call(partial(grading.in_worker, grade_task, t, t.patch, kind="bubblewrap"))
                        for t in tasks
                    )
                )
            )
        finally:
            grading.close()
        if not all(r.resolved for r in results):
            raise RuntimeError(
                f"{mode}: a gold patch did not resolve: {[r.error for r in results if not r.resolved]}"
            )
        if mode != "warm-up":
            out[mode] = {
                "wall_s": time.perf_counter() - t0,
                "ticks": len(lags),
                "lag_p50_ms": median(lags),
                "lag_p99_ms": percentile(lags, 99),
                "lag_max_ms": max(lags),
                "late_10ms_fraction": sum(lag > 10 for lag in lags) / len(lags),
            }
    return out
