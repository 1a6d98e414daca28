"""Test-side helpers: run a real ProxyServer on 127.0.0.1 (in process, or ``polar proxy serve`` in a
subprocess) and talk to it like each harness does."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from polar_env.backends.base import Backend
from polar_env.chat.template import ChatRenderer
from polar_env.proxy.app import ProxyServer
from polar_env.proxy.engine import EngineConfig
from polar_env.proxy.settings import ProxySettings, build_proxy

ADMIN = "test-admin-secret"
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def make_proxy(
    renderer: ChatRenderer,
    backend: Backend,
    data_dir: Path,
    *,
    admin_secret: str = ADMIN,
    default_max_tokens: int = EngineConfig.default_max_tokens,
    owns_backend: bool = True,
    **settings: Any,
) -> ProxyServer:
    """A proxy over ``backend`` assembled as every command assembles one (``build_proxy``);
    ``settings`` are ``ProxySettings`` fields (max_context, keepalive_s, backend_retries, ...)."""
    return build_proxy(
        ProxySettings(**settings),
        data_dir=data_dir,
        admin_secret=admin_secret,
        model=(renderer, backend),
        default_max_tokens=default_max_tokens,
        owns_backend=owns_backend,
    )


@asynccontextmanager
async def running_proxy(
    renderer: ChatRenderer,
    backend: Backend,
    data_dir: Path,
    *,
    max_context: int | None = 2048,
    default_max_tokens: int = 64,
    **settings: Any,
):
    """``make_proxy`` listening on 127.0.0.1; the backend is left open (session-scoped model fixtures
    outlive a proxy)."""
    proxy = make_proxy(
        renderer,
        backend,
        data_dir,
        max_context=max_context,
        default_max_tokens=default_max_tokens,
        owns_backend=False,
        **settings,
    )
    await proxy.start("127.0.0.1", 0)
    try:
        yield proxy
    finally:
        await proxy.stop()


def parse_sse(raw: bytes) -> list[tuple[str | None, Any]]:
    """SSE frames as (event name, decoded data); ``[DONE]`` stays a string. Keep-alives a slow answer
    is preceded by are skipped as the SDKs skip them: comment lines (no data) and Responses'
    ``keepalive`` events."""
    events = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip())
        if not data or name == "keepalive":
            continue
        text = "\n".join(data)
        events.append((name, text if text == "[DONE]" else json.loads(text)))
    return events


async def post(
    http: aiohttp.ClientSession, url: str, body: Any, key: str | None, header: str = "bearer"
) -> tuple[int, Any]:
    headers = {}
    if key is not None:
        headers = {"Authorization": f"Bearer {key}"} if header == "bearer" else {"x-api-key": key}
    async with http.post(url, json=body, headers=headers) as resp:
        raw = await resp.read()
        if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
            return resp.status, parse_sse(raw)
        return resp.status, json.loads(raw) if raw else None


async def ledger_calls(http: aiohttp.ClientSession, proxy: ProxyServer, sid: str) -> list[dict]:
    async with http.get(
        f"{proxy.base_url}/admin/sessions/{sid}/calls", headers={"Authorization": f"Bearer {ADMIN}"}
    ) as resp:
        assert resp.status == 200
        return sorted(await resp.json(), key=lambda r: r["call_index"])


def serve_proxy(data_dir: Path, *extra: str, secret: str) -> subprocess.Popen:
    """The real ``polar proxy serve`` (instant backend: the proxy's own load) on a free port over
    ``data_dir``, its admin secret ``secret``; stdout and stderr in ``stdout``."""
    return subprocess.Popen(
        [sys.executable, "-m", "polar_env.cli", "proxy", "serve", "--backend", "instant"]
        + ["--port", "0", "--data-dir", str(data_dir), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "POLAR_ADMIN_SECRET": secret},
    )


async def started_proxy(
    data_dir: Path, *extra: str, secret: str, timeout_s: float = 240
) -> tuple[subprocess.Popen, str]:
    """``serve_proxy`` and the line it prints once it listens (its URLs)."""
    proc = serve_proxy(data_dir, *extra, secret=secret)
    assert proc.stdout is not None
    return proc, await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout_s)
