"""Polar's agent server logic (NeMo Gym ``/run``), free of NeMo Gym so it can be tested alone.

One process holds one proxy, listening on a Unix socket (the sandboxes' only way out), whose
backend is the policy server NeMo Gym / NeMo-RL names in ``policy_base_url`` (several URLs spread
sessions over the servers). For each data row ``run``:

1. opens a proxy session whose policy is the row's ``responses_create_params`` sampling
   (``temperature``, ``top_p``, ``max_output_tokens``: what NeMo-RL stamps, enforced over
   whatever the harness asks for);
2. asks the resources server to seed the episode's workspace (a bubblewrap tree or a container of the
   task's image, with this process's proxy socket and harness install mounted) and attaches to it;
3. runs the configured harness in the sandbox against the proxy until it ends or the deadline;
4. asks the resources server to verify (extract the patch, grade) and to close the episode;
5. rebuilds the trajectory from the proxy's ledger and returns the NeMo-RL ``/run`` result.

Every episode is classified into a ``FailureKind`` and rewarded/masked by the configured outcome
table (polar_env.outcomes): failures outside the policy (row, seed, sandbox, policy server, grading
environment) are masked placeholders, never dropped; whatever the agent did itself is graded as is.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from polar_env.episodes.lifecycle import (
    close_session,
    episode_prompt,
    harness_spec,
    open_session,
    patch_bytes,
    run_harness,
)
from polar_env.episodes.workspace import WorkspaceMounts
from polar_env.harness_adapters.registry import get_adapter
from polar_env.harness_adapters.runner import HarnessRun
from polar_env.outcomes import FailureKind, OutcomeTable, final_kind
from polar_env.proxy.app import ProxyServer
from polar_env.proxy.engine import EngineConfig
from polar_env.resources_server.core import SeededEpisode, VerifyOutcome, attach_sandbox
from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.export import TrajectoryWriter, to_nemo_gym_result

log = logging.getLogger(__name__)


class PolarAgentConfig(BaseModel):
    """What an operator sets in the Gym config (``responses_api_agents.polar_agent``)."""

    harness: str = "pi"  # codex | claude-code | pi (polar_env.harness_adapters)
    policy_base_url: str | list[str] = ""  # NeMo-RL passes a list (one per vLLM server), with or without /v1
    policy_model_name: str = ""  # the served model name; also what the harness asks for
    backend: str = "vllm"  # vllm (stock OpenAI server, /v1/completions) | nemo-rl (NeMo-RL's HTTP server)
    tokenizer: str = "embedded"  # HF model/tokenizer dir of the policy, or "embedded" (the CI SmolLM2)
    tool_format: str | None = None  # hermes | qwen3_coder (default: from the chat template)
    max_context: int | None = None  # the context window to enforce; None: the backend's own (max_model_len)
    timeout_s: float = 1800.0  # the harness's wall-clock deadline per episode
    max_concurrent_episodes: int = 64
    default_sampling: dict[str, float | int] = Field(
        default_factory=lambda: {"temperature": 1.0, "top_p": 1.0, "max_tokens": 8192})
    runtime_dir: str | None = None  # proxy socket + ledger (default: a fresh temp dir)
    trajectories_path: str | None = None  # append Polar's full trajectory (every chain) here
    backend_options: dict[str, Any] = Field(default_factory=dict)  # e.g. timeout_s, chat_template_kwargs
    outcomes: OutcomeTable = Field(default_factory=OutcomeTable)  # reward/mask per failure kind (docs/outcomes.md)


class ResourcesClient(Protocol):
    """How the agent reaches the resources server (HTTP in NeMo Gym, direct calls in tests)."""

    async def seed(self, episode_id: str, task_id: str, *, mounts: WorkspaceMounts | None = None
                   ) -> SeededEpisode: ...

    async def verify(self, episode_id: str, task_id: str, *, result: dict[str, Any]) -> VerifyOutcome: ...

    async def close(self, episode_id: str) -> None: ...


def base_urls(value: str | list[str]) -> list[str]:
    """Server roots from Gym's ``policy_base_url`` (one URL, a list, or comma-separated), ``/v1`` dropped
    because the backends add their own paths."""
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for url in (u.strip().rstrip("/") for u in items if u and u.strip()):
        out.append(url[:-3] if url.endswith("/v1") else url)
    return out


def session_policy(params: dict[str, Any] | None, default: dict[str, Any]) -> dict[str, Any]:
    """The proxy session's sampling: the row's ``responses_create_params`` over the configured default."""
    params = params or {}
    policy = dict(default)
    for src, dst in (("temperature", "temperature"), ("top_p", "top_p"), ("max_output_tokens", "max_tokens")):
        if params.get(src) is not None:
            policy[dst] = params[src]
    return policy


def row_task_id(row: dict[str, Any]) -> str:
    """The task a row names: ``task_id`` (Polar's rows), or ``instance_id`` (SWE-bench rows)."""
    for key in ("task_id", "instance_id"):
        if isinstance(row.get(key), str) and row[key]:
            return row[key]
    meta = row.get("metadata") or {}
    if isinstance(meta.get("task_id"), str):
        return meta["task_id"]
    raise ValueError("the row names no task (expected a 'task_id' field)")


class PolarAgent:
    def __init__(self, config: PolarAgentConfig):
        self.config = config
        self.proxy: ProxyServer | None = None
        self.runtime_dir: Path | None = None
        self.adapter = get_adapter(config.harness)
        self._episodes = asyncio.Semaphore(config.max_concurrent_episodes)
        self._writer: TrajectoryWriter | None = None

    async def start(self) -> None:
        """Build the proxy over the policy server and install the harness (once per process)."""
        from polar_env.backends.registry import make_backend
        from polar_env.chat.template import ChatRenderer

        c = self.config
        urls = base_urls(c.policy_base_url)
        if not urls:
            raise ValueError("policy_base_url is empty: set it to the policy server (NeMo-RL sets it itself)")
        model_dir = _tokenizer_dir(c.tokenizer)
        renderer = await asyncio.to_thread(ChatRenderer.from_pretrained, model_dir, tool_format=c.tool_format)
        backend = make_backend(c.backend, url=urls, model=c.policy_model_name, **c.backend_options)
        self.runtime_dir = Path(c.runtime_dir) if c.runtime_dir else Path(tempfile.mkdtemp(prefix="polar-agent-"))
        self.runtime_dir.mkdir(parents=True, exist_ok=True)
        self.proxy = ProxyServer.create(renderer=renderer, backend=backend, data_dir=self.runtime_dir / "ledger",
                                        admin_secret=secrets.token_urlsafe(32),
                                        config=EngineConfig(max_context=c.max_context))
        sock_dir = self.runtime_dir / "sock"
        sock_dir.mkdir(exist_ok=True)
        sock_dir.chmod(0o755)  # the sandbox uid traverses it to reach the socket
        await self.proxy.start(unix_socket=sock_dir / "proxy.sock", port=None)
        if c.trajectories_path:
            self._writer = TrajectoryWriter(Path(c.trajectories_path))
        await asyncio.to_thread(self.adapter.install)
        log.info("polar agent: harness %s, proxy on %s, policy %s (%s)", self.adapter.name, self.proxy.unix_socket,
                 urls, c.backend)

    async def stop(self) -> None:
        if self.proxy is not None:
            await self.proxy.stop()
            self.proxy = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    async def run(self, row: dict[str, Any], resources: ResourcesClient) -> dict[str, Any]:
        """One rollout of the row's task; always returns a result NeMo-RL accepts."""
        if self.proxy is None:
            raise RuntimeError("PolarAgent.start() was not awaited")
        async with self._episodes:
            return await self._run(row, resources)

    async def _run(self, row: dict[str, Any], resources: ResourcesClient) -> dict[str, Any]:
        proxy = self.proxy
        assert proxy is not None
        bad_row: ValueError | None = None
        try:
            task_id = row_task_id(row)
        except ValueError as exc:  # the data's fault, not the policy's: a masked placeholder, not a lost sample
            task_id, bad_row = "", exc
        params = dict(row.get("responses_create_params") or {})
        episode_id = f"{_slug(task_id)}-{uuid.uuid4().hex[:12]}"
        session = open_session(proxy, self.adapter, episode_id, task_id=task_id,
                               policy=session_policy(params, self.config.default_sampling))
        started = session.started
        run: HarnessRun | None = None
        status, error = "error", None
        seeded = False
        failure: FailureKind | None = None
        try:
            if bad_row is not None:
                raise bad_row
            spec = harness_spec(session)
            mounts = WorkspaceMounts(proxy_socket_dir=str(spec.proxy_socket_dir), harness_dir=str(spec.harness_dir))
            seed = await resources.seed(episode_id, task_id, mounts=mounts)
            seeded = True
            sandbox = attach_sandbox(seed, spec)
            prompt = _row_prompt(params) or episode_prompt(_TaskView(task_id, row))
            run = await run_harness(session, sandbox, prompt, model_name=self.config.policy_model_name or None,
                                    timeout_s=self.config.timeout_s)
            status, error = run.status, run.error
        except Exception as exc:  # noqa: BLE001 - a workspace failure still yields a result
            status, error = "error", f"{type(exc).__name__}: {exc}"
            failure = FailureKind.input_error if exc is bad_row else FailureKind.sandbox_failure
            log.exception("polar agent: episode %s failed before the harness finished", episode_id)
        table = self.config.outcomes
        closed = await close_session(session, status, error, failure=failure, harness=run, outcomes=table)
        status, error, kind = closed.status, closed.error, closed.failure_kind
        traj = build_trajectory(closed.info, closed.calls, status=status, error=error)
        placeholder = min(proxy.engine.eos_ids)
        draft = to_nemo_gym_result(traj, responses_create_params=params, placeholder_token_id=placeholder)
        outcome: VerifyOutcome
        try:
            if kind.outside_policy:  # grading would say nothing about the policy
                outcome = VerifyOutcome.failed(kind, error or kind.value)
            elif not seeded:
                raise RuntimeError(error or "the episode was never seeded")
            else:
                outcome = await resources.verify(episode_id, task_id, result=draft)
                kind = final_kind(kind, FailureKind.from_wire(outcome.failure_kind), outcome.resolved)
        except Exception as exc:  # noqa: BLE001 - grading that could not run is not the policy's
            kind = FailureKind.infrastructure
            outcome = VerifyOutcome.failed(kind, f"verify failed: {exc}")
        finally:
            try:  # also when the seed reply was lost: the server may have made the workspace (close is idempotent)
                await resources.close(episode_id)
            except Exception:  # noqa: BLE001 - a leaked workspace must not lose the sample
                log.exception("polar agent: close of episode %s failed", episode_id)
        reward, mask = table.apply(kind, outcome.reward)
        traj = traj.model_copy(update={"reward": reward or 0.0, "grading": outcome.grading or None,
                                       "failure_kind": kind, "masked": mask})
        traj.metadata.update({"duration_s": time.time() - started, "patch_bytes": patch_bytes(outcome.patch)})
        if self._writer is not None:
            self._writer.write(traj)
        result = to_nemo_gym_result(traj, responses_create_params=params, placeholder_token_id=placeholder)
        result.update({"mask_sample": result["instance_config"]["mask_sample"], "resolved": outcome.resolved,
                       "task_id": task_id, "failure_reason": outcome.failure_reason or error,
                       "harness_exit_code": run.exit_code if run is not None else None,
                       "duration_s": time.time() - started})
        return result


class _TaskView:
    """Just enough of a Task for ``episode_prompt`` when the row carries the problem statement."""

    def __init__(self, task_id: str, row: dict[str, Any]):
        self.instance_id = task_id
        self.problem_statement = str(row.get("problem_statement") or "")


def _row_prompt(params: dict[str, Any]) -> str | None:
    """The first user message of the row's ``input`` (the dataset's prompt), if it has one."""
    items = params.get("input")
    if isinstance(items, str):
        return items
    for item in items or []:
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return None


def _tokenizer_dir(spec: str) -> Path:
    if spec in ("", "embedded"):
        from polar_env.backends.embedded import embedded_model_dir

        return embedded_model_dir()
    return Path(spec)


def _slug(text: str) -> str:
    """ASCII letters, digits, '-' and '_' only, starting with a letter or digit (a session id)."""
    slug = "".join(c if (c.isascii() and c.isalnum()) or c in "-_" else "-" for c in text)[:48]
    return slug if slug[:1].isalnum() else "t" + slug[:47]
