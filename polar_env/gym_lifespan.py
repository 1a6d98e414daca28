"""Hooking a Polar server's own start and stop into a NeMo Gym server's FastAPI lifespan.

Gym builds each server's app itself (``setup_webserver``) and stops it with SIGINT; the hooks run
after the app's own startup and before its own shutdown, on the serving event loop. Only the
app's router is touched, so this module needs no FastAPI import of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

Hook = Callable[[], Awaitable[None]]


def add_lifespan_hooks(app: Any, *, start: Hook | None = None, stop: Hook | None = None) -> None:
    outer = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(application: Any) -> AsyncIterator[Any]:
        async with outer(application) as state:
            if start is not None:
                await start()
            try:
                yield state
            finally:
                if stop is not None:
                    await stop()

    app.router.lifespan_context = lifespan
