"""Run an aiohttp app on 127.0.0.1 for the duration of a test (backend test doubles)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web


@asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    """Yield the base URL of ``app`` listening on a free port; stop it afterwards."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def never_answering_completions() -> AsyncIterator[str]:
    """A vLLM-shaped ``/v1/completions`` that never answers (an overloaded server cannot be provoked
    on demand); yields its base URL."""

    async def never(request: web.Request) -> web.Response:
        await asyncio.sleep(3600)
        return web.Response(status=500)

    app = web.Application()
    app.router.add_post("/v1/completions", never)
    async with serve(app) as url:
        yield url
