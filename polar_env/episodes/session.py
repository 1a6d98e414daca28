"""An episode's proxy session: opened with the trainer's sampling and the episode's budget, the harness
run against it in the sandbox, then drained, classified and closed."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from polar_env.harness_adapters.base import HarnessAdapter
from polar_env.harness_adapters.runner import HarnessRun, run_episode_in_sandbox
from polar_env.outcomes import (
    DEADLINE_KINDS,
    FailureKind,
    HarnessStatus,
    OutcomeTable,
    classify_episode,
    explain_deadline,
)
from polar_env.proxy.app import ORIGIN_TAGGED, ProxyServer
from polar_env.sandbox.base import Sandbox, SandboxSpec
from polar_env.trajectory.records import EpisodeBudget


@dataclass
class EpisodeSession:
    """An open proxy session for one episode, and the harness that will use it."""

    proxy: ProxyServer
    adapter: HarnessAdapter
    session_id: str
    key: str
    started: float


@dataclass
class ClosedSession:
    info: Any  # the registry's SessionInfo
    calls: list[Any]
    status: HarnessStatus
    error: str | None
    failure_kind: FailureKind  # before grading (polar_env.outcomes.final_kind adds the grade's)


def open_session(
    proxy: ProxyServer,
    adapter: HarnessAdapter,
    episode_id: str,
    *,
    task_id: str,
    group_id: str | None = None,
    sampling: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    budget: EpisodeBudget | None = None,
) -> EpisodeSession:
    """A proxy session for the episode; ``proxy`` must listen on a Unix socket (the sandbox's only way
    out)."""
    if proxy.unix_socket is None:
        raise ValueError("the proxy must listen on a Unix socket for sandboxed episodes")
    session_id, key = proxy.create_session(
        episode_id,
        sampling=sampling or {},
        training=True,
        budget=budget,
        metadata={
            "task_id": task_id,
            "group_id": group_id or task_id,
            "harness": adapter.name,
            "harness_version": adapter.version,
            ORIGIN_TAGGED: True,
            **(metadata or {}),
        },
    )
    return EpisodeSession(proxy, adapter, session_id, key, time.time())


def harness_spec(session: EpisodeSession, base: SandboxSpec | None = None) -> SandboxSpec:
    """``base`` with the mounts the harness needs: the proxy's socket dir and the harness install."""
    sock = session.proxy.unix_socket
    assert sock is not None
    return replace(
        base or SandboxSpec(),
        proxy_socket_dir=sock.parent,
        proxy_socket_name=sock.name,
        harness_dir=session.adapter.install_dir(),
    )


async def run_harness(
    session: EpisodeSession, sandbox: Sandbox, prompt: str, *, model_name: str | None, timeout_s: float
) -> HarnessRun:
    """The harness to its end or its deadline (whose clock stops while the session waits for a run slot)."""
    slots = session.proxy.engine.run_slots
    return await run_episode_in_sandbox(
        session.adapter,
        sandbox,
        proxy_socket_dir=sandbox.spec.proxy_socket_dir,
        session_id=session.session_id,
        session_key=session.key,
        model_name=model_name or session.proxy.engine.backend.model,
        prompt=prompt,
        timeout_s=timeout_s,
        origin_key=session.proxy.origin_key,  # the forwarder tags each call's origin
        paused_s=partial(slots.waited_s, session.session_id) if slots is not None else None,
    )


async def close_session(
    session: EpisodeSession,
    status: HarnessStatus,
    error: str | None,
    *,
    failure: FailureKind | None = None,
    harness: HarnessRun | None = None,
    outcomes: OutcomeTable | None = None,
) -> ClosedSession:
    """Drain in-flight calls (a harness killed mid-call leaves that call to finish recording),
    classify the episode (``failure``: what already failed before the harness could end, e.g. the
    workspace), close the session."""
    proxy = session.proxy
    await proxy.drain(session.session_id)
    calls = proxy.registry.ledger.calls(session.session_id)
    open_session = proxy.registry.get(session.session_id)
    stopped = open_session.stopped if open_session is not None else None
    if stopped is not None:  # the proxy refused a retry loop; the harness ended on that refusal
        status, error = "error", f"stopped: {stopped}"
    floor = (outcomes or OutcomeTable()).min_backend_tokens_per_s
    kind = failure or classify_episode(
        status,
        calls,
        deadline_at=harness.ended_at if harness else None,
        min_backend_tokens_per_s=floor,
        killed_by=harness.signal if harness else None,
    )
    if kind in DEADLINE_KINDS and harness is not None:  # say which deadline kind it is, and why
        error = (
            f"{error}; {explain_deadline(kind, calls, harness.ended_at, floor)}"
            if error
            else explain_deadline(kind, calls, harness.ended_at, floor)
        )
    if kind.outside_policy and status == "completed":
        status, error = "error", error or f"{kind.value}: the episode failed outside the policy"
    info = proxy.registry.close(session.session_id, status)
    return ClosedSession(info, calls, status, error, kind)
