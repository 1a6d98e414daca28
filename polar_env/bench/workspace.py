"""Workspace creation per episode: ``open_workspace`` + ``close`` in bubblewrap, per task.

``python -m polar_env.bench.workspace --tasks bundled --runs 10`` prints the median and p90 per
task (the first open of a task, which may build its base tree, is timed apart as ``first_s``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from polar_env.bench.common import median, percentile


async def measure(tasks: str = "bundled", runs: int = 10) -> dict[str, Any]:
    from polar_env.episodes.workspace import open_workspace
    from polar_env.sandbox.base import SandboxSpec
    from polar_env.tasks.loader import load_tasks

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="polar-bench-ws-") as tmp:
        spec = SandboxSpec(scratch_root=Path(tmp))
        for task in load_tasks(tasks):
            seconds, clone = [], ""
            for _ in range(runs + 1):
                t0 = time.perf_counter()
                ws = await open_workspace(task, spec, sandbox="bubblewrap")
                await ws.close()
                seconds.append(time.perf_counter() - t0)
                clone = getattr(ws.ref, "clone", "")
            rest = seconds[1:]
            out[task.instance_id] = {"first_s": round(seconds[0], 4), "median_s": round(median(rest), 4),
                                     "p90_s": round(percentile(rest, 90), 4), "runs": runs, "clone": clone}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="bundled")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.tasks, args.runs)), indent=2))


if __name__ == "__main__":
    main()
