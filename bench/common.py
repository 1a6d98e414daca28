"""Shared pieces of the benchmarks: statistics, synthetic conversations, server subprocesses."""

from __future__ import annotations

import asyncio
import os
import platform
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from polar_env.chat.messages import Message

REPO = Path(__file__).resolve().parents[1]  # bench/ sits beside polar_env/, outside the package
ADMIN_SECRET = "bench-admin-secret"
ANSWER_TEXT = "OK, continuing with the next step."
WORDS = (
    "the function returns a value when the input list is empty and raises an error otherwise "
    "we parse each line of the log file then collect failing tests by module name and sort them "
    "patch applies cleanly to the repository after the fixture is updated with new paths"
).split()


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


def median(values: list[float]) -> float:
    return percentile(values, 50)


def filler(n_words: int, seed: int) -> str:
    """Deterministic English-like text (so tokenization behaves like prose, not one repeated token)."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def build_history(renderer: Any, target_tokens: int, *, seed: int = 0) -> list[dict[str, str]]:
    """A system prompt, user/assistant pairs and a last user turn, about ``target_tokens`` rendered."""
    system = {"role": "system", "content": "You are a careful coding agent. " + filler(60, seed)}
    last = {"role": "user", "content": "Continue."}

    def pair(i: int) -> list[dict[str, str]]:
        return [
            {"role": "user", "content": filler(300, seed + 2 * i + 1)},
            {"role": "assistant", "content": filler(100, seed + 2 * i + 2)},
        ]

    base = rendered_tokens(renderer, [system, last])
    per_pair = rendered_tokens(renderer, [system, *pair(0), last]) - base
    pairs = [m for i in range(max(0, (target_tokens - base) // per_pair)) for m in pair(i)]
    gap = target_tokens - rendered_tokens(renderer, [system, *pairs, last])
    words = int(gap * 400 / per_pair)  # a pair is 400 words: the last user turn fills the gap
    if words > 0:
        last = {"role": "user", "content": filler(words, seed) + "\nContinue."}
    return [system, *pairs, last]


def rendered_tokens(renderer: Any, messages: list[dict[str, str]]) -> int:
    return len(renderer.render_prompt([Message(**m) for m in messages], []))


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_avg_1_5_15": list(os.getloadavg()),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["mem_gb"] = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return info


def cpu_seconds(pid: int) -> float:
    """CPU time of a process, all threads and child processes, at nanosecond resolution.

    ``/proc/<pid>/task/*/schedstat`` counts on-CPU time exactly, where ``cpu_times()`` ticks at
    10 ms: per-call CPU is what stays meaningful when other jobs load the machine.
    """
    import psutil

    total = 0.0
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for proc in procs:
        try:
            for task in Path(f"/proc/{proc.pid}/task").iterdir():
                total += int((task / "schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError):
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except psutil.NoSuchProcess:
                pass
    return total


@dataclass
class ServerProc:
    """A benchmark server in its own process (backend, Polar proxy or LiteLLM), on 127.0.0.1."""

    proc: subprocess.Popen
    port: int
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def spawn_bench_server(args: list[str], log: Path) -> subprocess.Popen:
    """Start ``python -m bench.servers ARGS``; it prints ``READY <port>`` once listening. ``bench`` is
    not an installed package: the child finds it in the repository, wherever it was started from."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "bench.servers", *args],
        stdout=subprocess.PIPE,
        stderr=open(log, "wb"),
        env=env,
    )


def wait_bench_server(proc: subprocess.Popen, log: Path, *, timeout_s: float = 180) -> ServerProc:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(b"READY "):
            return ServerProc(proc, int(line.split()[1]), log)
    proc.kill()
    raise RuntimeError(f"bench server {proc.args} did not start; see {log}:\n{log.read_text()[-2000:]}")


def start_bench_server(args: list[str], log: Path, *, timeout_s: float = 180) -> ServerProc:
    return wait_bench_server(spawn_bench_server(args, log), log, timeout_s=timeout_s)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Poll ``url`` until it answers 200; give up early if ``proc`` (the server) exits."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline and (proc is None or proc.poll() is None):
            try:
                async with http.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.3)
    raise TimeoutError(f"{url} not healthy after {timeout_s}s")


async def create_polar_session(
    http: aiohttp.ClientSession, base_url: str, session_id: str
) -> tuple[str, str]:
    """A new session's key and its OpenAI base URL (a worker's port with ``--workers``)."""
    async with http.post(
        f"{base_url}/admin/sessions",
        json={"session_id": session_id},
        headers={"Authorization": f"Bearer {ADMIN_SECRET}"},
    ) as resp:
        body = await resp.json()
        if resp.status != 201:
            raise RuntimeError(f"creating session failed: {resp.status} {body}")
        return body["api_key"], body["urls"]["openai"]
