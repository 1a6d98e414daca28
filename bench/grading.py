"""Grading time per bundled task (gold patch) and rollouts/hour of `polar rollout` (scripted policy).

Grading runs each task's tests in its prepared venv, exactly as the reward module does in an
episode; the first grade of a task may also build that venv, which is timed apart (setup_s).
Rollouts run the real `polar rollout` command (Pi in bubblewrap, the `gold` scripted policy
scored by the embedded model, grading included) as a subprocess, so the figure is end to end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import median


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


def rollouts_per_hour(workdir: Path, concurrency: int, *, limit: int | None, timeout_s: float
                      ) -> dict[str, Any]:
    """Run `polar rollout --policy gold` over the bundled tasks; episodes finished per hour."""
    out = workdir / f"rollout-c{concurrency}"
    cmd = [sys.executable, "-m", "polar_env.cli", "rollout", "--policy", "gold", "--harness", "pi",
           "--tasks", "bundled", "--concurrency", str(concurrency), "--out", str(out), "--timeout", "300"]
    if limit:
        cmd += ["--limit", str(limit)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, timeout=timeout_s)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"polar rollout exited {proc.returncode}: {proc.stderr.decode()[-1500:]}")
    summary = json.loads((out / "summary.json").read_text())
    episodes = summary["episodes"]
    return {"episodes": episodes, "wall_s": elapsed, "rollouts_per_hour": episodes / elapsed * 3600,
            "resolved": summary["resolved"], "status": summary["status"], "concurrency": concurrency}
