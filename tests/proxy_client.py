"""Test-side helpers: run a real ProxyServer on 127.0.0.1 and talk to it like each harness does."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from polar_env.backends.base import Backend
from polar_env.chat.template import ChatRenderer
from polar_env.proxy.app import ProxyServer
from polar_env.proxy.engine import EngineConfig

ADMIN = "test-admin-secret"
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@asynccontextmanager
async def running_proxy(renderer: ChatRenderer, backend: Backend, data_dir: Path, **kw: Any):
    proxy = ProxyServer.create(
        renderer=renderer,
        backend=backend,
        data_dir=data_dir,
        admin_secret=ADMIN,
        config=kw.pop("config", EngineConfig(max_context=2048, default_max_tokens=64)),
        owns_backend=False,
        **kw,
    )  # session-scoped model fixtures outlive a proxy
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
