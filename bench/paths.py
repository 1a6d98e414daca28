"""The three ways a request reaches the backend: direct, through Polar, through LiteLLM.

Each path is started against the same backend server; ``conversation`` opens what one
conversation needs (Polar: a session and its key) and returns the URL and headers to post to.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import (
    REPO,
    ServerProc,
    create_polar_session,
    free_port,
    spawn_bench_server,
    start_bench_server,
    wait_bench_server,
    wait_http,
)

LITELLM_KEY = "sk-polar-bench-0123456789abcdef0123456789abcdef"


@dataclass
class Path_:
    name: str
    base_url: str
    headers: dict[str, str] = field(default_factory=dict)
    polar: bool = False
    _n: int = 0

    async def conversation(self, http: aiohttp.ClientSession) -> tuple[str, dict[str, str]]:
        if not self.polar:
            return f"{self.base_url}/v1/chat/completions", self.headers
        self._n += 1
        sid = f"bench-{os.getpid()}-{time.monotonic_ns()}-{self._n}"
        key, url = await create_polar_session(http, self.base_url, sid)
        return f"{url}/chat/completions", {"Authorization": f"Bearer {key}"}


# LiteLLM's proxy pins its own web stack and SDK versions, so it lives in a venv of its own
# (scripts/setup_litellm.sh), not in Polar's
LITELLM_VENV = REPO / ".venv-litellm"


def litellm_executable() -> Path | None:
    """``litellm`` beside this Python (``pip install -e '.[bench]'``), else in ``.venv-litellm``."""
    for exe in (Path(sys.executable).parent / "litellm", LITELLM_VENV / "bin" / "litellm"):
        if exe.exists():
            return exe
    return None


def start_litellm(backend_url: str, workdir: Path) -> tuple[subprocess.Popen, int, Path]:
    """LiteLLM's own proxy server (``litellm --config``), pass-through to ``backend_url``."""
    exe = litellm_executable()
    if exe is None:
        raise FileNotFoundError(
            "litellm is not installed: bash scripts/setup_litellm.sh (or "
            "POLAR_SETUP_LITELLM=1 bash scripts/setup.sh) makes .venv-litellm"
        )
    config = workdir / "litellm.yaml"
    config.write_text(
        json.dumps(
            {
                "model_list": [
                    {
                        "model_name": "bench",
                        "litellm_params": {
                            "model": "openai/bench",
                            "api_base": f"{backend_url}/v1",
                            "api_key": "none",
                        },
                    }
                ],
                "litellm_settings": {"telemetry": False},
            }
        )
    )
    port = free_port()
    log = workdir / "litellm.log"
    env = {
        **os.environ,
        "LITELLM_MASTER_KEY": LITELLM_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
    }
    proc = subprocess.Popen(
        [str(exe), "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"],
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    return proc, port, log


@dataclass
class PathSet:
    """The servers behind a set of paths; ``close`` stops every process it started."""

    paths: list[Path_]
    procs: list[ServerProc]
    litellm: subprocess.Popen | None = None
    litellm_error: str | None = None

    def close(self) -> None:
        for proc in self.procs:
            proc.stop()
        if self.litellm is not None and self.litellm.poll() is None:
            self.litellm.terminate()
            try:
                self.litellm.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.litellm.kill()


async def open_paths(workdir: Path, backend_args: list[str], *, with_litellm: bool, tag: str) -> PathSet:
    """Start the backend, then Polar's proxy (``vllm`` backend kind) and optionally LiteLLM against
    it, those two at the same time (both take seconds to import)."""
    workdir.mkdir(parents=True, exist_ok=True)
    backend = start_bench_server(["backend", *backend_args], workdir / f"backend-{tag}.log")
    out = PathSet([Path_("direct", backend.base_url)], [backend])
    try:
        polar_log = workdir / f"polar-{tag}.log"
        polar = spawn_bench_server(
            ["proxy", "--backend-url", backend.base_url, "--data-dir", str(workdir / f"ledger-{tag}")],
            polar_log,
        )
        out.procs.append(ServerProc(polar, 0, polar_log))  # stopped by close() even if it never starts
        litellm = None
        if with_litellm:
            try:
                out.litellm, port, log = start_litellm(backend.base_url, workdir)
                litellm = (port, log)
            except FileNotFoundError as exc:
                out.litellm_error = str(exc)
        out.procs[-1] = wait_bench_server(polar, polar_log)
        out.paths.append(Path_("polar", out.procs[-1].base_url, polar=True))
        if litellm is not None:
            port, log = litellm
            try:
                await wait_http(f"http://127.0.0.1:{port}/health/liveliness", 180, out.litellm)
                out.paths.append(
                    Path_("litellm", f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {LITELLM_KEY}"})
                )
            except TimeoutError:
                out.litellm_error = f"LiteLLM proxy did not start: {log.read_text()[-1500:]}"
    except BaseException:
        out.close()
        raise
    return out


async def post_chat(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], body: bytes
) -> tuple[float, dict[str, Any]]:
    """One timed call; raises on any non-200 answer (a benchmark must not time errors)."""
    started = time.perf_counter()
    async with http.post(url, data=body, headers={**headers, "Content-Type": "application/json"}) as resp:
        raw = await resp.read()
    elapsed = (time.perf_counter() - started) * 1e3
    if resp.status != 200:
        raise RuntimeError(f"{url}: HTTP {resp.status}: {raw[:500]!r}")
    return elapsed, json.loads(raw)


class Conversation:
    """One conversation through ``path``, a call at a time: call 0 on ``history``, then each call
    appends the answer and ``append(i)`` (what an agent loop does). The body is encoded before the
    clock starts, the same way for every path."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        path: Path_,
        history: list[dict[str, str]],
        append: Any,
        *,
        max_tokens: int = 64,
    ):
        self.http, self.path, self.append, self.max_tokens = http, path, append, max_tokens
        self.messages = list(history)
        self.calls = 0
        self._target: tuple[str, dict[str, str]] | None = None

    async def call(self) -> float:
        """The next call; its latency in ms."""
        if self._target is None:
            self._target = await self.path.conversation(self.http)
        url, headers = self._target
        body = json.dumps(
            {"model": "bench", "messages": self.messages, "max_tokens": self.max_tokens, "temperature": 0.0}
        ).encode()
        elapsed, reply = await post_chat(self.http, url, headers, body)
        content = reply["choices"][0]["message"].get("content") or ""
        self.messages = self.messages + [{"role": "assistant", "content": content}, self.append(self.calls)]
        self.calls += 1
        return elapsed


async def run_conversation(
    http: aiohttp.ClientSession,
    path: Path_,
    history: list[dict[str, str]],
    n_calls: int,
    append: Any,
    *,
    max_tokens: int = 64,
    after_first: Any = None,
    after_each: Any = None,
) -> list[float]:
    """Call 0 on ``history`` then ``n_calls`` more (a :class:`Conversation`).

    Returns the latency of every call in ms (index 0 is the cold call). ``after_first()`` runs after
    call 0, ``after_each()`` after every call.
    """
    conversation = Conversation(http, path, history, append, max_tokens=max_tokens)
    latencies = []
    for i in range(n_calls + 1):
        latencies.append(await conversation.call())
        if i == 0 and after_first is not None:
            after_first()
        if after_each is not None:
            after_each()
        await asyncio.sleep(0)
    return latencies
