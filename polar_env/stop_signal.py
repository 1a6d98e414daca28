"""Waiting for SIGINT/SIGTERM in the long-running servers (proxy, policy server, bench's backends).

One place so every server stops the same way: finish the current request, then clean up.
"""

from __future__ import annotations

import asyncio
import signal


async def wait_for_stop_signal() -> None:
    """Return once the process receives SIGINT or SIGTERM (the caller then shuts down cleanly)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
