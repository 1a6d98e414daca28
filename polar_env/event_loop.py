"""Run a server's main coroutine on uvloop where it is installed (the asyncio loop otherwise).

uvloop's libuv loop spends less CPU per socket event than asyncio's selector loop, which is most
of what a proxy with an instant backend does; nothing in Polar depends on which loop runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
