"""One episode end to end: task tree -> sandbox -> harness through the proxy -> patch -> grade -> trajectory.

This is the unit `polar demo`, `polar rollout` and the NeMo Gym agent server all run. Whatever
happens (harness crash, timeout, backend failure), the episode returns a trajectory with its
status and whatever the proxy captured.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polar_env.harness_adapters.registry import get_adapter
from polar_env.harness_adapters.runner import HarnessRun, run_episode_in_sandbox
from polar_env.proxy.app import ProxyServer
from polar_env.rewards.grading import GradeResult, grade
from polar_env.sandbox.base import SandboxSpec
from polar_env.sandbox.bubblewrap import BubblewrapSandbox
from polar_env.tasks.models import Task
from polar_env.tasks.tree import materialize
from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.models import Trajectory

PROMPT = """You are working in the repository at /testbed. Resolve the following issue by editing the \
source code (not the tests). When you are done, stop.

<issue>
{problem}
</issue>"""


@dataclass
class EpisodeConfig:
    harness: str = "pi"
    timeout_s: float = 600.0  # the harness's wall-clock deadline
    grading_timeout_s: float = 900.0  # grading's own budget, which outlives the rollout's
    policy: dict[str, Any] = field(default_factory=dict)  # sampling the trainer dictates
    model_name: str | None = None  # what the harness asks for (default: the backend's model)
    grade: bool = True
    scratch_root: Path | None = None


@dataclass
class EpisodeResult:
    trajectory: Trajectory
    grade: GradeResult | None
    harness: HarnessRun | None
    patch: str


def episode_prompt(task: Task) -> str:
    """The first user message; identical for every rollout of a task (GRPO groups depend on it)."""
    return PROMPT.format(problem=task.problem_statement.strip())


async def run_episode(proxy: ProxyServer, task: Task, *, episode_id: str, group_id: str | None = None,
                      config: EpisodeConfig | None = None, metadata: dict[str, Any] | None = None
                      ) -> EpisodeResult:
    """Run one rollout of ``task``; ``proxy`` must listen on a Unix socket (the sandbox's only way out)."""
    config = config or EpisodeConfig()
    if proxy.unix_socket is None:
        raise ValueError("the proxy must listen on a Unix socket for sandboxed episodes")
    adapter = get_adapter(config.harness)
    await asyncio.to_thread(adapter.install)
    started = time.time()
    session_id, key = proxy.create_session(episode_id, policy=config.policy, metadata={
        "task_id": task.instance_id, "group_id": group_id or task.instance_id, "harness": adapter.name,
        "harness_version": adapter.version, **(metadata or {})})
    scratch = Path(tempfile.mkdtemp(prefix=f"polar-{episode_id}-", dir=config.scratch_root))
    sandbox = None
    run: HarnessRun | None = None
    patch, result, status, error = "", None, "error", None
    try:
        tree = await asyncio.to_thread(materialize, task, scratch / "tree")
        spec = SandboxSpec(proxy_socket_dir=proxy.unix_socket.parent, proxy_socket_name=proxy.unix_socket.name,
                           harness_dir=adapter.install_dir(), scratch_root=scratch)
        sandbox = await asyncio.to_thread(BubblewrapSandbox.create, tree, spec=spec)
        run = await run_episode_in_sandbox(
            adapter, sandbox, proxy_socket_dir=spec.proxy_socket_dir, session_id=session_id, session_key=key,
            model_name=config.model_name or proxy.engine.backend.model, prompt=episode_prompt(task),
            timeout_s=config.timeout_s)
        status, error = run.status, run.error
        patch = (await sandbox.diff()).decode("utf-8", errors="surrogateescape")
    except Exception as exc:  # noqa: BLE001 - an infrastructure failure still yields a trajectory
        status, error = "error", f"infrastructure: {type(exc).__name__}: {exc}"
    finally:
        if sandbox is not None:
            await sandbox.destroy()
        shutil.rmtree(scratch, ignore_errors=True)
    await proxy.drain(session_id)  # a harness killed mid-call leaves that call to finish recording
    calls = proxy.registry.ledger.calls(session_id)
    if status == "completed" and any(c.error and c.error.startswith("backend:") for c in calls):
        status = "error"
        error = error or "infrastructure: a model call failed at the backend"
    info = proxy.registry.close(session_id, status)
    if config.grade and (error is None or not error.startswith("infrastructure")):
        result = await asyncio.to_thread(grade, task, patch, timeout_s=config.grading_timeout_s)
    trajectory = build_trajectory(
        info, calls, status=status, error=error,
        reward=result.reward if result else None,
        grading=result.model_dump(mode="json") if result else None)
    trajectory.metadata.update({"duration_s": time.time() - started, "patch_bytes": len(patch.encode(
        "utf-8", errors="surrogateescape"))})
    return EpisodeResult(trajectory=trajectory, grade=result, harness=run, patch=patch)
