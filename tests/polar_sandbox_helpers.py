"""Shared by the sandbox/harness tests: a real aiohttp server on a Unix socket, like the proxy's."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class UnixHTTPServer:
    """Records every request; ``handler`` decides the reply."""

    def __init__(self, sock_dir: Path, handler: Handler, name: str = "proxy.sock"):
        self.sock_dir = sock_dir
        self.path = sock_dir / name
        self.handler = handler
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._runner: web.AppRunner | None = None

    async def _record(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path_qs, dict(request.headers)))
        return await self.handler(request)

    async def __aenter__(self) -> UnixHTTPServer:
        self.sock_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.sock_dir, 0o755)
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._record)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.UnixSite(self._runner, str(self.path), backlog=1024, shutdown_timeout=0.5).start()
        os.chmod(self.path, 0o777)  # the sandbox uid connects to it
        return self

    async def __aexit__(self, *exc) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


async def reply_json(status: int, body: str) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=status, text=body, content_type="application/json")
    return handler


async def hang(request: web.Request) -> web.Response:
    await request.read()
    await asyncio.sleep(3600)
    return web.Response(status=500)


def processes_matching(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker`` (to prove a tree was killed)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline:
                pids.append(int(entry))
    return pids
