"""One episode's lifecycle: session -> workspace -> harness -> drain -> close -> patch -> grade -> trajectory.

``run_episode`` is the whole of it in one process (``polar rollout``, ``polar demo``). The NeMo Gym
servers split it across two processes (the resources server owns the workspace, patch and grade;
the agent server the session and harness) and call the same pieces: :func:`open_session`,
:func:`run_harness`, :func:`close_session`, :func:`extract_patch`. Whatever happens (harness crash,
timeout, backend failure), an episode ends in a trajectory with its status, whatever the proxy
captured, and its failure kind and reward/mask from the run's outcome table (polar_env.outcomes).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from polar_env.episodes.workspace import Workspace, open_workspace
from polar_env.harness_adapters.base import HarnessAdapter
from polar_env.harness_adapters.registry import NOISE_EXCLUDES, get_adapter
from polar_env.harness_adapters.runner import HarnessRun, run_episode_in_sandbox
from polar_env.outcomes import FailureKind, OutcomeTable, classify_episode, final_kind
from polar_env.proxy.app import ORIGIN_TAGGED, ProxyServer
from polar_env.rewards.grading import GradeResult, grading_timeout_s
from polar_env.rewards.image_grading import grade_task
from polar_env.sandbox.base import Sandbox, SandboxSpec
from polar_env.tasks.models import Task
from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.models import Trajectory
from polar_env.trajectory.records import EpisodeBudget

PROMPT = """You are working in the repository at /testbed. Resolve the following issue by editing the \
source code (not the tests). When you are done, stop.

<issue>
{problem}
</issue>"""


@dataclass
class EpisodeConfig:
    harness: str = "pi"
    timeout_s: float = 600.0  # the harness's wall-clock deadline
    grading_timeout_s: float = field(default_factory=grading_timeout_s)  # grading's own budget, outlives the rollout's
    sampling: dict[str, Any] = field(default_factory=dict)  # sampling the trainer dictates
    model_name: str | None = None  # what the harness asks for (default: the backend's model)
    grade: bool = True
    scratch_root: Path | None = None
    sandbox: str = "auto"  # auto | bubblewrap | docker | podman | apptainer (episodes.workspace)
    outcomes: OutcomeTable = field(default_factory=OutcomeTable)  # reward/mask per failure kind
    budget: EpisodeBudget = field(default_factory=EpisodeBudget)  # per-episode limits the proxy enforces
    reward_key: str | None = None  # a Harbor task's reward.json key that is the reward (rewards/harbor_verifier.py)


@dataclass
class EpisodeResult:
    trajectory: Trajectory
    grade: GradeResult | None
    harness: HarnessRun | None
    patch: str
    failure_kind: FailureKind = FailureKind.none


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
    status: str
    error: str | None
    failure_kind: FailureKind  # before grading (polar_env.outcomes.final_kind adds the grade's)


def episode_prompt(task: Task) -> str:
    """The first user message; identical for every rollout of a task (GRPO groups depend on it).
    A Harbor task's is its instruction.md as written."""
    if task.harbor is not None:
        return task.problem_statement
    return PROMPT.format(problem=task.problem_statement.strip())


def open_session(proxy: ProxyServer, adapter: HarnessAdapter, episode_id: str, *, task_id: str,
                 group_id: str | None = None, sampling: dict[str, Any] | None = None,
                 metadata: dict[str, Any] | None = None, budget: EpisodeBudget | None = None) -> EpisodeSession:
    """A proxy session for the episode; ``proxy`` must listen on a Unix socket (the sandbox's only way out)."""
    if proxy.unix_socket is None:
        raise ValueError("the proxy must listen on a Unix socket for sandboxed episodes")
    session_id, key = proxy.create_session(episode_id, sampling=sampling or {}, training=True, budget=budget, metadata={
        "task_id": task_id, "group_id": group_id or task_id, "harness": adapter.name,
        "harness_version": adapter.version, ORIGIN_TAGGED: True, **(metadata or {})})
    return EpisodeSession(proxy, adapter, session_id, key, time.time())


def harness_spec(session: EpisodeSession, base: SandboxSpec | None = None) -> SandboxSpec:
    """``base`` with the mounts the harness needs: the proxy's socket dir and the harness install."""
    sock = session.proxy.unix_socket
    assert sock is not None
    return replace(base or SandboxSpec(), proxy_socket_dir=sock.parent, proxy_socket_name=sock.name,
                   harness_dir=session.adapter.install_dir())


async def run_harness(session: EpisodeSession, sandbox: Sandbox, prompt: str, *, model_name: str | None,
                      timeout_s: float) -> HarnessRun:
    return await run_episode_in_sandbox(
        session.adapter, sandbox, proxy_socket_dir=sandbox.spec.proxy_socket_dir, session_id=session.session_id,
        session_key=session.key, model_name=model_name or session.proxy.engine.backend.model, prompt=prompt,
        timeout_s=timeout_s, origin_key=session.proxy.origin_key)  # the forwarder tags each call's origin


async def close_session(session: EpisodeSession, status: str, error: str | None, *,
                        failure: FailureKind | None = None, harness: HarnessRun | None = None,
                        outcomes: OutcomeTable | None = None) -> ClosedSession:
    """Drain in-flight calls (a harness killed mid-call leaves that call to finish recording),
    classify the episode (``failure``: what already failed before the harness could end, e.g. the
    workspace), close the session."""
    proxy = session.proxy
    await proxy.drain(session.session_id)
    calls = proxy.registry.ledger.calls(session.session_id)
    stopped = proxy.registry.get(session.session_id).stopped
    if stopped is not None:  # the proxy refused a retry loop; the harness ended on that refusal
        status, error = "error", f"stopped: {stopped}"
    floor = (outcomes or OutcomeTable()).min_backend_tokens_per_s
    kind = failure or classify_episode(status, calls, deadline_at=harness.ended_at if harness else None,
                                       min_backend_tokens_per_s=floor, killed_by=harness.signal if harness else None)
    if kind.outside_policy and status == "completed":
        status, error = "error", error or f"{kind.value}: the episode failed outside the policy"
    info = proxy.registry.close(session.session_id, status)
    return ClosedSession(info, calls, status, error, kind)


async def extract_patch(sandbox: Sandbox) -> str:
    """The agent's patch: the workspace's diff against its base snapshot, harness noise dropped."""
    return (await sandbox.diff(NOISE_EXCLUDES)).decode("utf-8", errors="surrogateescape")


def patch_bytes(patch: str) -> int:
    return len(patch.encode("utf-8", errors="surrogateescape"))


def agent_timeout(task: Task, default_s: float) -> float:
    """The harness's deadline: a Harbor task's ``[agent] timeout_sec`` where it sets one."""
    own = task.harbor.config.agent.timeout_sec if task.harbor is not None else None
    return own or default_s


async def grade_episode(task: Task, patch: str, workspace: Workspace | None, config: EpisodeConfig) -> GradeResult:
    """A Harbor task's own verifier in the agent's (still open) container; SWE-bench grading of the
    patch in a fresh tree or container otherwise."""
    if task.harbor is not None:
        from polar_env.rewards.harbor_verifier import verify
        from polar_env.sandbox.container import ContainerSandbox

        assert workspace is not None and isinstance(workspace.sandbox, ContainerSandbox)
        return await verify(task, workspace.sandbox, reward_key=config.reward_key)
    return await asyncio.to_thread(grade_task, task, patch, kind=workspace.ref.kind if workspace else "bubblewrap",
                                   timeout_s=config.grading_timeout_s)


async def run_episode(proxy: ProxyServer, task: Task, *, episode_id: str, group_id: str | None = None,
                      config: EpisodeConfig | None = None, metadata: dict[str, Any] | None = None
                      ) -> EpisodeResult:
    """Run one rollout of ``task`` in a workspace this process owns."""
    config = config or EpisodeConfig()
    adapter = get_adapter(config.harness)
    await asyncio.to_thread(adapter.install)
    session = open_session(proxy, adapter, episode_id, task_id=task.instance_id, group_id=group_id,
                           sampling=config.sampling, metadata=metadata, budget=config.budget)
    workspace: Workspace | None = None
    run: HarnessRun | None = None
    patch, result, status, error = "", None, "error", None
    failure: FailureKind | None = None
    try:
        spec = harness_spec(session, SandboxSpec(scratch_root=config.scratch_root))
        workspace = await open_workspace(task, spec, sandbox=config.sandbox)
        run = await run_harness(session, workspace.sandbox, episode_prompt(task), model_name=config.model_name,
                                timeout_s=agent_timeout(task, config.timeout_s))
        status, error = run.status, run.error
        patch = await extract_patch(workspace.sandbox)
    except Exception as exc:  # noqa: BLE001 - a workspace failure still yields a trajectory
        status, error, failure = "error", f"{type(exc).__name__}: {exc}", FailureKind.sandbox_failure
    finally:
        if workspace is not None and task.harbor is None:  # a Harbor task is verified in its workspace
            await workspace.close()
    try:
        closed = await close_session(session, status, error, failure=failure, harness=run, outcomes=config.outcomes)
        kind = closed.failure_kind
        if config.grade and not kind.outside_policy:  # grading would say nothing about the policy
            result = await grade_episode(task, patch, workspace, config)
            kind = final_kind(kind, result.failure_kind, result.resolved)
    finally:
        if workspace is not None and task.harbor is not None:
            await workspace.close()
    reward, masked = config.outcomes.apply(kind, result.reward if result else None)
    trajectory = build_trajectory(
        closed.info, closed.calls, status=closed.status, error=closed.error, reward=reward,
        grading=result.model_dump(mode="json") if result else None)
    trajectory.failure_kind, trajectory.masked = kind, masked
    trajectory.metadata.update({"duration_s": time.time() - session.started, "patch_bytes": patch_bytes(patch)})
    if workspace is not None:  # where it ran (and was graded): bubblewrap, or the engine and image
        trajectory.metadata["workspace"] = workspace.ref.kind
        if workspace.ref.clone:  # how its tree was cloned from the task's warm base (episodes/base_trees.py)
            trajectory.metadata["workspace_clone"] = workspace.ref.clone
        if workspace.ref.image:
            trajectory.metadata["image"] = workspace.ref.image
    return EpisodeResult(trajectory=trajectory, grade=result, harness=run, patch=patch, failure_kind=kind)
