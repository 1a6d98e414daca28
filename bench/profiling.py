"""Where Polar's proxy spends a call: py-spy samples of the proxy process over a conversation.

Used by the full run to explain a missed latency target in docs/benchmarks.md. Only the thread
holding the interpreter lock is sampled (``--gil``): the proxy's CPU in Python, not its idle worker
threads. py-spy (PyPI) is optional; without it the profile is skipped with the reason.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import build_history, filler
from bench.paths import PathSet, run_conversation


def py_spy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def summarize_raw(raw: Path, top: int = 14) -> dict[str, Any]:
    """py-spy ``--format raw`` (collapsed stacks) -> the heaviest frames, self and inclusive."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    def share(counter: Counter[str], keep: Any) -> list[dict[str, Any]]:
        rows = [(f, n) for f, n in counter.most_common() if keep(f)][:top]
        return [{"frame": f, "percent": round(100 * n / total, 1)} for f, n in rows]
    return {"samples": total,
            "self": share(own, lambda f: True),
            "polar_inclusive": share(inclusive, lambda f: "polar_env/" in f and "bench/" not in f)}


async def profile_polar(renderer: Any, paths: PathSet, raw: Path, *, size: int, calls: int) -> dict[str, Any]:
    """Sample Polar's proxy process (``paths``) over one ``size``-token conversation of ``calls`` calls."""
    exe = py_spy()
    if exe is None:
        return {"skipped": "py-spy is not installed (pip install py-spy)"}
    polar = paths.paths[1]
    history = build_history(renderer, size, seed=size)
    async with aiohttp.ClientSession() as http:
        spy = subprocess.Popen([exe, "record", "--gil", "--rate", "500", "--format", "raw", "--output", str(raw),
                                "--pid", str(paths.procs[1].proc.pid)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # py-spy attaches
        await run_conversation(http, polar, history, calls, lambda i: {"role": "user", "content": filler(70, i)})
        spy.send_signal(signal.SIGINT)
        _, err = spy.communicate(timeout=60)
    if not raw.exists():
        return {"skipped": f"py-spy wrote no profile: {err.decode()[-500:]}"}
    return {"size": size, "calls": calls, **summarize_raw(raw)}
