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

from bench.common import build_history, cpu_seconds, filler
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

    return {
        "samples": total,
        "self": share(own, lambda f: True),
        "polar_inclusive": share(inclusive, lambda f: "polar_env/" in f and "bench/" not in f),
    }


async def profile_polar(renderer: Any, paths: PathSet, raw: Path, *, size: int, calls: int) -> dict[str, Any]:
    """Sample Polar's proxy process (``paths``) over one ``size``-token conversation of ``calls`` calls."""
    exe = py_spy()
    if exe is None:
        return {"skipped": "py-spy is not installed (pip install py-spy)"}
    polar = paths.paths[1]
    history = build_history(renderer, size, seed=size)
    async with aiohttp.ClientSession() as http:
        spy = subprocess.Popen(
            [
                exe,
                "record",
                "--gil",
                "--rate",
                "500",
                "--format",
                "raw",
                "--output",
                str(raw),
                "--pid",
                str(paths.procs[1].proc.pid),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(1.0)  # py-spy attaches
        await run_conversation(
            http, polar, history, calls, lambda i: {"role": "user", "content": filler(70, i)}
        )
        spy.send_signal(signal.SIGINT)
        _, err = spy.communicate(timeout=60)
    if not raw.exists():
        return {"skipped": f"py-spy wrote no profile: {err.decode()[-500:]}"}
    return {"size": size, "calls": calls, **summarize_raw(raw)}


IDLE_FRAMES = ("Runner.run (asyncio/runners.py", "select (selectors.py")  # the loop waiting, not working


def _self_shares(raw: Path) -> dict[str, float]:
    """py-spy raw stacks -> each leaf frame's share of the working samples (the loop's idle wait left out)."""
    own: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            leaf = stack.split(";")[-1]
            if not leaf.startswith(IDLE_FRAMES):
                own[leaf] += int(count)
    total = sum(own.values()) or 1
    return {frame: n / total for frame, n in own.items()}


async def profile_growth(
    paths: PathSet,
    workdir: Path,
    *,
    turns: int = 200,
    window: int = 60,
    append_words: int = 150,
    rate: int = 1000,
) -> dict[str, Any]:
    """Where the growth family's extra CPU per call goes: the proxy's CPU per call (schedstat) over
    ``window`` calls early in one ``turns``-call session and over as many at its end, split by
    py-spy's samples of each window into each frame's ms per call."""
    exe = py_spy()
    if exe is None:
        return {"skipped": "py-spy is not installed (pip install py-spy)"}
    pid = paths.procs[1].proc.pid
    windows = {"early": (5, 5 + window), "late": (turns - window, turns)}
    spies: dict[str, subprocess.Popen[bytes]] = {}
    cpu: dict[str, float] = {}
    turn = [0]

    def step() -> None:
        turn[0] += 1
        for name, (start, stop) in windows.items():
            if turn[0] == start:
                spies[name] = subprocess.Popen(
                    [
                        exe,
                        "record",
                        "--gil",
                        "--rate",
                        str(rate),
                        "--format",
                        "raw",
                        "--output",
                        str(workdir / f"growth-{name}.txt"),
                        "--pid",
                        str(pid),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(1.0)  # py-spy attaches; the client waits, no call is in flight
                cpu[name] = cpu_seconds(pid)
            elif turn[0] == stop:
                cpu[name] = (cpu_seconds(pid) - cpu[name]) * 1e3 / window
                spies[name].send_signal(signal.SIGINT)
                spies[name].communicate(timeout=60)

    history = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": filler(append_words, 7)},
    ]
    async with aiohttp.ClientSession() as http:
        await run_conversation(
            http,
            paths.paths[1],
            history,
            turns,
            lambda i: {"role": "user", "content": filler(append_words, 5000 + i)},
            after_each=step,
        )
    ms = {
        name: {f: share * cpu[name] for f, share in _self_shares(workdir / f"growth-{name}.txt").items()}
        for name in windows
    }
    frames = set(ms["early"]) | set(ms["late"])
    rows = sorted(
        (
            {
                "frame": f,
                "early_ms": round(ms["early"].get(f, 0.0), 3),
                "late_ms": round(ms["late"].get(f, 0.0), 3),
            }
            for f in frames
        ),
        key=lambda r: r["late_ms"] - r["early_ms"],
        reverse=True,
    )
    return {
        "turns": turns,
        "window": window,
        "rate": rate,
        "windows": windows,
        "cpu_ms_early": round(cpu["early"], 3),
        "cpu_ms_late": round(cpu["late"], 3),
        "growth": rows[:14],
    }
