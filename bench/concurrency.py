"""Sustained calls/s of one proxy process with 1..1024 concurrent sessions, instant backend.

The proxy runs in its own process with the in-process instant backend, so the figure is the
proxy's own ceiling (no backend hop). ``workers=N`` measures the layout of ``polar proxy serve
--workers N`` instead (an admin front and N proxy processes, each session on one of them); its
CPU and RSS figures are the whole process tree's. Each session replays a 20-turn agent conversation whose
request bodies are encoded up front (the answers are fixed), then starts over on the same
session (a new chain), so the load generator spends its CPU on HTTP, not on JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import (
    ANSWER_TEXT,
    cpu_seconds,
    create_polar_session,
    filler,
    percentile,
    start_bench_server,
)

TURNS = 20


def _bodies(append_words: int) -> list[bytes]:
    messages: list[dict[str, str]] = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": filler(append_words, 1)},
    ]
    bodies = []
    for k in range(TURNS):
        bodies.append(json.dumps({"model": "bench", "messages": messages, "max_tokens": 64}).encode())
        messages = messages + [
            {"role": "assistant", "content": ANSWER_TEXT},
            {"role": "user", "content": filler(append_words, 100 + k)},
        ]
    return bodies


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


class Load:
    """N session workers in this process; counts calls, errors, latencies and tokens."""

    def __init__(self, http: aiohttp.ClientSession, bodies: list[bytes]):
        self.http, self.bodies = http, bodies
        self.done = 0
        self.errors: list[str] = []
        self.latencies: list[float] = []
        self.record_tokens = 0  # prompt + sampled ids of every call (what the ledger stores)
        self.chain_tokens = 0  # distinct tokens of the trainable sequences
        self.measuring = False
        self.stop = False
        self.warm = 0  # sessions past their first (cold, fully rendered) call

    async def worker(self, base: str, key: str) -> None:
        url = f"{base}/chat/completions"
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        previous = 0
        k = 0
        while not self.stop:
            started = time.perf_counter()
            try:
                async with self.http.post(url, data=self.bodies[k], headers=headers) as resp:
                    raw = await resp.read()
                if resp.status != 200:
                    self.errors.append(f"HTTP {resp.status}: {raw[:200]!r}")
                    await asyncio.sleep(0.05)
                    continue
                usage = json.loads(raw)["usage"]
            except (TimeoutError, aiohttp.ClientError, KeyError, ValueError) as exc:
                self.errors.append(repr(exc))
                await asyncio.sleep(0.05)
                continue
            prompt, sampled = usage["prompt_tokens"], usage["completion_tokens"]
            self.record_tokens += prompt + sampled
            self.chain_tokens += (prompt - previous if k else prompt) + sampled
            previous = prompt + sampled
            if k == 0 and not self.measuring:
                self.warm += 1
            if self.measuring:
                self.done += 1
                self.latencies.append((time.perf_counter() - started) * 1e3)
            k = (k + 1) % len(self.bodies)


def _rss_mb(proc: Any) -> float:
    """Resident MB of the proxy and its worker processes."""
    import psutil

    total = 0
    for p in (proc, *proc.children(recursive=True)):
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


async def measure(
    workdir: Path,
    *,
    answer_ids: list[int],
    levels: list[int],
    seconds: float,
    warmup_s: float = 0.5,
    append_words: int = 30,
    workers: int = 1,
) -> dict[str, Any]:
    """calls/s, latency, proxy CPU% and RSS per level (measured after every session's first
    call plus ``warmup_s``); bytes per captured token at the end."""
    import psutil

    workdir.mkdir(parents=True, exist_ok=True)
    ledger = workdir / "ledger-concurrency"
    server = start_bench_server(
        [
            "proxy",
            "--answer-ids",
            ",".join(map(str, answer_ids)),
            "--data-dir",
            str(ledger),
            "--workers",
            str(workers),
        ],
        workdir / "polar-concurrency.log",
    )
    proc = psutil.Process(server.proc.pid)
    me = psutil.Process(os.getpid())
    bodies = _bodies(append_words)
    result: dict[str, Any] = {
        "levels": {},
        "seconds": seconds,
        "turns_per_conversation": TURNS,
        "workers": workers,
        "rss_mb_idle": _rss_mb(proc),
    }
    record_tokens = chain_tokens = 0
    try:
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=120)
        ) as http:
            for n in levels:
                load = Load(http, bodies)
                sessions = [
                    await create_polar_session(http, server.base_url, f"conc{n}-{i}") for i in range(n)
                ]
                tasks = [asyncio.create_task(load.worker(url, key)) for key, url in sessions]
                # every session's first call renders its whole prompt: measure only once all are past it
                deadline = time.monotonic() + 120
                while load.warm < n and time.monotonic() < deadline and not load.errors:
                    await asyncio.sleep(0.05)
                await asyncio.sleep(warmup_s)
                cpu0, me0, t0 = cpu_seconds(server.proc.pid), me.cpu_times(), time.perf_counter()
                load.measuring = True
                await asyncio.sleep(seconds)
                load.measuring = False
                elapsed = time.perf_counter() - t0
                cpu1, me1 = cpu_seconds(server.proc.pid), me.cpu_times()
                load.stop = True
                await asyncio.gather(*tasks)
                lat = load.latencies or [float("nan")]
                result["levels"][str(n)] = {
                    "calls_per_s": load.done / elapsed,
                    "calls": load.done,
                    "errors": len(load.errors),
                    "first_error": load.errors[0] if load.errors else None,
                    "latency_p50_ms": percentile(lat, 50),
                    "latency_p99_ms": percentile(lat, 99),
                    "proxy_cpu_percent": 100 * (cpu1 - cpu0) / elapsed,
                    "client_cpu_percent": 100 * ((me1.user + me1.system) - (me0.user + me0.system)) / elapsed,
                    "proxy_rss_mb": _rss_mb(proc),
                }
                record_tokens += load.record_tokens
                chain_tokens += load.chain_tokens
    finally:
        rss = _rss_mb(proc) if proc.is_running() else None
        server.stop()
    disk = _dir_bytes(ledger)
    result.update(
        {
            "record_tokens": record_tokens,
            "chain_tokens": chain_tokens,
            "ledger_bytes": disk,
            "disk_bytes_per_record_token": disk / record_tokens if record_tokens else None,
            "disk_bytes_per_chain_token": disk / chain_tokens if chain_tokens else None,
            "rss_mb_end": rss,
            "ram_bytes_per_record_token": (
                (rss - result["rss_mb_idle"]) * 2**20 / record_tokens if rss and record_tokens else None
            ),
            "ram_bytes_per_chain_token": (
                (rss - result["rss_mb_idle"]) * 2**20 / chain_tokens if rss and chain_tokens else None
            ),
            "errors_total": sum(v["errors"] for v in result["levels"].values()),
        }
    )
    return result
