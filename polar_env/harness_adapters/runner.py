"""Run one harness episode inside a sandbox, pointed at the proxy, and classify how it ended.

Inside the sandbox the forwarder binds 127.0.0.1:PORT first and then starts the harness as its
child, so the harness never races the listener (docs/architecture.md, "An episode"). The deadline
kills the whole sandbox process tree; a non-zero exit is an ``error`` carrying its stderr tail, and
a harness killed by a signal (the forwarder names it, or the sandbox itself died of one) says
which. Output is kept as bounded tails only, so a flooding harness cannot exhaust memory.
"""

from __future__ import annotations

import os
import re
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from polar_env.harness_adapters.base import HarnessAdapter, HarnessContext, HarnessSummary
from polar_env.sandbox.base import Deadline, Sandbox
from polar_env.sandbox.bubblewrap import FORWARDER_INSIDE
from polar_env.sandbox.forwarder import KILLED, ORIGIN_ENV, READY

SANDBOX_PYTHON = "/usr/bin/python3"


@dataclass
class HarnessRun:
    status: Literal["completed", "timeout", "error"]
    exit_code: int | None
    stdout_tail: str
    stderr_tail: str
    summary: HarnessSummary
    duration_s: float
    error: str | None = None
    ended_at: float = field(default_factory=time.time)  # when it ended (for a timeout: when it was killed)
    signal: str | None = None  # e.g. "SIGKILL" when the harness (or its sandbox) was killed


def episode_command(
    adapter: HarnessAdapter, ctx: HarnessContext, prompt: str, *, socket_inside: str
) -> list[str]:
    """forwarder (listen, then exec) + the harness's headless command line."""
    return [
        SANDBOX_PYTHON,
        FORWARDER_INSIDE,
        "--socket",
        socket_inside,
        "--port",
        str(ctx.port),
        "--",
        *adapter.command(ctx, prompt),
    ]


async def write_config(adapter: HarnessAdapter, sandbox: Sandbox, ctx: HarnessContext) -> None:
    with tempfile.TemporaryDirectory(prefix="polar-cfg-") as tmp:
        for i, (inside, content) in enumerate(adapter.config_files(ctx).items()):
            host = Path(tmp) / str(i)
            host.write_text(content)
            await sandbox.copy_in(host, inside)


async def run_episode_in_sandbox(
    adapter: HarnessAdapter,
    sandbox: Sandbox,
    *,
    proxy_socket_dir: Path | None,
    session_id: str,
    session_key: str,
    model_name: str,
    prompt: str,
    timeout_s: float,
    max_output_bytes: int = 4 << 20,
    origin_key: str | None = None,
    paused_s: Callable[[], float] | None = None,
) -> HarnessRun:
    """One rollout: write the adapter's config, run forwarder+harness to its end or the deadline
    (``origin_key``: the proxy's, so the forwarder tags each call with who made it; ``paused_s``:
    seconds the deadline's clock stood still so far, the wait for a run slot)."""
    spec = sandbox.spec
    if (
        proxy_socket_dir is not None
        and spec.proxy_socket_dir is not None
        and Path(proxy_socket_dir).resolve() != Path(spec.proxy_socket_dir).resolve()
    ):
        raise ValueError("proxy_socket_dir differs from the sandbox's bound socket dir")
    if spec.proxy_socket_dir is None:
        raise ValueError("the sandbox has no proxy socket dir bound; the harness could reach nothing")
    ctx = HarnessContext(
        session_id=session_id,
        session_key=session_key,
        model_name=model_name,
        port=spec.proxy_port,
        home=spec.home,
        workdir=spec.workdir,
        as_root=os.geteuid() == 0 and spec.uid == 0,
    )
    await write_config(adapter, sandbox, ctx)
    cmd = episode_command(adapter, ctx, prompt, socket_inside=spec.socket_path_inside)
    env = {**adapter.env(ctx), **({ORIGIN_ENV: origin_key} if origin_key else {})}
    deadline = Deadline(timeout_s, paused_s) if paused_s is not None else timeout_s
    res = await sandbox.run(cmd, env=env, timeout_s=deadline, stdin=None, max_output_bytes=max_output_bytes)
    summary = adapter.summarize(res.stdout_tail)
    if res.timed_out:
        status, error = "timeout", f"killed at the {timeout_s:g}s deadline"
    elif (sig := killed_by(res.exit_code, res.stderr_tail)) is not None:
        status, error = "error", f"harness killed by {sig} (not at the deadline)"
    elif res.exit_code != 0:
        status, error = "error", f"exit {res.exit_code}: {_stderr_text(res.stderr_tail)[-2000:]}"
    elif summary.error is not None and not summary.finished:
        # Pi exits 0 after its retries give up; its final event carries the failure.
        status, error = "error", f"harness reported: {summary.error}"
    else:
        status, error = "completed", None
    return HarnessRun(
        status=status,
        exit_code=res.exit_code,
        stdout_tail=res.stdout_tail,
        stderr_tail=res.stderr_tail,
        summary=summary,
        duration_s=res.duration_s,
        error=error,
        signal=None if res.timed_out else killed_by(res.exit_code, res.stderr_tail),
    )


def killed_by(exit_code: int | None, stderr_tail: str) -> str | None:
    """The signal that ended the harness: named by the forwarder, or the sandbox process's own death."""
    if exit_code is not None and exit_code < 0:
        return signal.Signals(-exit_code).name
    found = re.findall(rf"^{KILLED} (SIG[A-Z0-9]+)$", stderr_tail, re.MULTILINE)
    return found[-1] if found else None


def _stderr_text(tail: str) -> str:
    """The harness's own stderr, without the forwarder's bookkeeping line."""
    return "\n".join(line for line in tail.splitlines() if not line.startswith(READY))
