"""Polar's agent server logic (NeMo Gym ``/run``), free of NeMo Gym so it can be tested alone.

One process holds one proxy, listening on a Unix socket (the sandboxes' only way out), whose
backend is the policy server NeMo Gym / NeMo-RL names in ``policy_base_url`` (several URLs spread
sessions over the servers). For each data row ``run`` checks the row (a malformed one is an
``InputError``: the server answers 4xx, nothing is made), then runs the episode through the stages
every Polar episode goes through (``polar_env.episodes.stages``: begin, prepare, run, finish),
at a :class:`ResourcesSite`: the resources server seeds the workspace (a bubblewrap tree or a
container of the task's image, with this process's proxy socket and harness install mounted),
grades it at ``/verify`` and removes it. The session's forced sampling is the row's
``responses_create_params`` sampling (``temperature``, ``top_p``, ``max_output_tokens``: what
NeMo-RL stamps, enforced over whatever the harness asks for). The answer is the NeMo-RL ``/run``
result, the run's outcome table applied (``polar_env.outcomes``: reward, mask), with the
failure's structured fields (``failures.EpisodeFailure``) and Gym's observability records.

Cancellation safety: each episode runs as its own task. A caller that goes away (client timeout,
disconnect: Gym cancels the handler) cancels the episode, which still settles — ``cancelled``,
masked, session closed, workspace removed — in the background; ``stop`` (server shutdown) cancels
what is in flight the same way and waits for every settle to finish.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from msgspec import structs
from pydantic import Field

from polar_env import metrics
from polar_env.agent_server.failures import COMPONENT, Component, EpisodeFailure, Stage
from polar_env.agent_server.observations import agent_observations, latency_summary, producer_trajectory
from polar_env.environment import EnvSettings
from polar_env.episodes import stages
from polar_env.episodes.admission import StageAdmission
from polar_env.episodes.episode import Episode, EpisodeResult
from polar_env.episodes.episode import Stage as EpisodeStage
from polar_env.episodes.settings import EpisodeSettings, GradingSettings, StageSettings
from polar_env.episodes.sites import patch_bytes
from polar_env.episodes.workspace import Workspace
from polar_env.grades import GradeResult
from polar_env.harness_adapters.registry import get_adapter
from polar_env.janitor import Janitor
from polar_env.outcomes import FailureKind
from polar_env.proxy.app import ProxyServer
from polar_env.proxy.settings import ProxySettings, admin_secret, build_proxy, proxy_model
from polar_env.resources_server.core import VerifyOutcome, attach_sandbox
from polar_env.sandbox.base import SandboxSpec
from polar_env.trajectory.accepted import Sample, accepted_work
from polar_env.trajectory.export import GroupPrompts, TrajectoryWriter, to_nemo_gym_result
from polar_env.trajectory.models import Trajectory
from polar_env.trajectory.records import CallRecord
from polar_env.wire.gym_resources import SeedSessionResponse, WorkspaceMounts
from polar_env.wire.nemo_gym import AgentRunResult, RunResult

log = logging.getLogger(__name__)
SHUTDOWN_GRACE_S = 120.0  # how long stop() waits for in-flight episodes to settle
ACCEPTED_WINDOW = 4096  # the last episodes /metrics' accepted-work figures are computed over


class PolarAgentConfig(ProxySettings, EpisodeSettings, StageSettings):
    """What an operator sets in the Gym config (``responses_api_agents.polar_agent``): the proxy's settings
    (``ProxySettings``: ``url`` is Gym's ``policy_base_url``, ``model_name`` its ``policy_model_name``,
    ``backend`` vllm or nemo-rl), every episode's (``EpisodeSettings``, the names `polar rollout` takes; a
    row's ``responses_create_params`` sampling overrides ``temperature``/``top_p``/``max_tokens``;
    ``sandbox``, ``grading_timeout`` and ``reward_key`` are the resources server's, which makes and grades
    the workspaces) and the agent's own."""

    # episodes seeding or running their harness at once (grading is outside it): of those, prepare_slots
    # seed and boot at once (None: run_slots, else no cap), and their model calls share run_slots (per-call
    # admission, proxy/run_slots.py: one in a tool leaves its slot to another's call; None: no cap)
    max_concurrent_episodes: int = 64
    runtime_dir: str | None = None  # proxy socket + ledger (default: a temp dir, removed at stop)
    trajectories_path: str | None = None  # append Polar's full trajectory (every chain) here
    # a policy version's step is this many /run calls (max_staleness counts versions; NeMo-RL: prompts per
    # step x generations per prompt)
    episodes_per_step: int = Field(default=1, ge=1)


class InputError(ValueError):
    """A malformed ``/run`` row: the server answers 4xx with this message, never a 500."""


class ResourcesClient(Protocol):
    """How the agent reaches the resources server (HTTP in NeMo Gym, direct calls in tests).

    ``seed`` raises ``UnknownTask`` when the resources server does not know the task."""

    async def seed(
        self, episode_id: str, task_id: str, *, mounts: WorkspaceMounts | None = None
    ) -> SeedSessionResponse: ...

    async def verify(self, episode_id: str, task_id: str, *, result: RunResult) -> VerifyOutcome: ...

    async def close(self, episode_id: str) -> None: ...


# a row's responses_create_params key: the setting it overrides
ROW_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "max_output_tokens": "max_tokens"}


def row_settings(params: dict[str, Any] | None, settings: EpisodeSettings) -> EpisodeSettings:
    """The episode's settings: the row's ``responses_create_params`` sampling (what NeMo-RL stamps) over
    the configured ones."""
    params = params or {}
    given = {field: params[key] for key, field in ROW_SAMPLING.items() if params.get(key) is not None}
    return settings.model_copy(update=given)


def row_task_id(row: dict[str, Any]) -> str:
    """The task a row names: ``task_id`` (Polar's rows), or ``instance_id`` (SWE-bench rows)."""
    for key in ("task_id", "instance_id"):
        if isinstance(row.get(key), str) and row[key]:
            return row[key]
    meta = row.get("metadata") or {}
    if isinstance(meta.get("task_id"), str) and meta["task_id"]:
        return meta["task_id"]
    raise InputError("the row names no task (expected a non-empty 'task_id' field)")


_SAMPLING_RANGES = {
    "temperature": (0.0, math.inf, "a number >= 0"),
    "top_p": (1e-9, 1.0, "a number in (0, 1]"),
    "max_output_tokens": (1, math.inf, "an integer >= 1"),
}


def row_sampling(row: dict[str, Any]) -> dict[str, Any]:
    """The row's ``responses_create_params``, its sampling checked (out of range is an ``InputError``)."""
    params = row.get("responses_create_params")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InputError("responses_create_params must be an object")
    for key, (low, high, what) in _SAMPLING_RANGES.items():
        value = params.get(key)
        if value is None:
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if (
            not number
            or not (low <= value <= high)
            or (key == "max_output_tokens" and not isinstance(value, int))
        ):
            raise InputError(f"responses_create_params.{key} must be {what}, got {value!r}")
    return dict(params)


@dataclass
class SeededWorkspace(Workspace):
    """A workspace the resources server made and removes: ``close`` asks it to (once)."""

    release: Callable[[], Awaitable[None]] | None = None

    async def close(self) -> None:
        release, self.release = self.release, None
        if release is not None:
            await release()


class ResourcesSite:
    """The Gym agent's :class:`~polar_env.episodes.episode.Site`: the resources server seeds the
    workspace (attached here to run the harness in), extracts and grades the patch at ``/verify``
    from its own side, and removes the workspace at ``/close_session``."""

    def __init__(self, resources: ResourcesClient, params: dict[str, Any], placeholder_token_id: int):
        self.resources, self.params, self.placeholder = resources, params, placeholder_token_id

    async def open(self, ep: Episode, spec: SandboxSpec) -> Workspace:
        episode_id = ep.session.session_id
        mounts = WorkspaceMounts(
            proxy_socket_dir=str(spec.proxy_socket_dir), harness_dir=str(spec.harness_dir)
        )
        try:
            seeded = await self.resources.seed(episode_id, ep.task.instance_id, mounts=mounts)
            sandbox = attach_sandbox(seeded, spec)
        except BaseException:  # also when the seed reply was lost: the server may have made the workspace
            await self._release(episode_id)
            raise
        return SeededWorkspace(sandbox, seeded.ref(), release=partial(self._release, episode_id))

    async def collect(self, ep: Episode) -> str:
        return ""  # the resources server reads the patch from its own side of the workspace, at /verify

    async def grade(self, ep: Episode, trajectory: Trajectory, grading: Any) -> GradeResult:
        draft = to_nemo_gym_result(
            trajectory,
            responses_create_params=self.params,
            placeholder_token_id=self.placeholder,
            arrays=True,
        )
        outcome = await self.resources.verify(ep.session.session_id, ep.task.instance_id, result=draft)
        ep.patch = outcome.patch
        return outcome.as_grade(ep.task.instance_id)

    async def _release(self, episode_id: str) -> None:
        try:  # close is idempotent at the resources server
            await self.resources.close(episode_id)
        except Exception:  # noqa: BLE001 - a leaked workspace must not lose the sample
            log.exception("polar agent: close of episode %s failed", episode_id)


# the episode's stages by NeMo Gym's FailureStage names
GYM_STAGE: dict[EpisodeStage, Stage] = {"prepare": "seed", "run": "agent", "finish": "verification"}


class PolarAgent:
    def __init__(self, config: PolarAgentConfig):
        self.config = config
        self.episode_settings = config.episode_settings()  # each episode's, its row's sampling over them
        self.proxy: ProxyServer | None = None
        self.runtime_dir: Path | None = None
        self.adapter = get_adapter(config.harness)
        # the stages' limits, as the rollout's driver enters them too (episodes/admission.py): grading is
        # the resources server's (its max_concurrent_grades)
        self.admission = StageAdmission(
            live=config.max_concurrent_episodes,
            prepare=config.prepare_slots or config.run_slots or config.max_concurrent_episodes,
            run=config.run_slots,
            max_staleness=config.max_staleness,
            per_step=config.episodes_per_step,
        )
        self._writer: TrajectoryWriter | None = None
        # each task's first prompt as its rollouts reached the model (one per task: docs/harnesses.md), for
        # the placeholder of a rollout that fails before its first call, so it stays in its NeMo-RL group
        self._first_prompts = GroupPrompts(max_groups=4096)
        self._janitor: Janitor | None = None
        self._playing: set[asyncio.Task] = set()  # episodes before settling: stop() cancels these
        self._settling: set[asyncio.Task] = set()  # settles: stop() waits for these, never cancels
        self._stopping = False
        self.admin_secret = ""  # what the /polar/* routes require (start() decides it)
        self.admin_secret_file: Path | None = None  # where a generated one was written
        self._finished: collections.deque[Sample] = collections.deque(
            maxlen=ACCEPTED_WINDOW
        )  # /metrics' figures

    async def start(self) -> None:
        """Build the proxy over the policy server and install the harness (once per process)."""
        c = self.config
        if set_here := sorted(set(GradingSettings.model_fields) & c.model_fields_set):
            log.warning(
                "polar agent: %s apply where the workspaces are made and graded, in NeMo Gym the resources "
                "server (resources_servers.polar): this agent does not use them",
                ", ".join(set_here),
            )
        if not c.url:
            raise ValueError(
                "url is empty: set it to the policy server (Gym's policy_base_url; NeMo-RL sets it)"
            )
        model = await asyncio.to_thread(proxy_model, c)
        self.runtime_dir = (
            Path(c.runtime_dir) if c.runtime_dir else Path(tempfile.mkdtemp(prefix="polar-agent-"))
        )
        if not c.runtime_dir:  # ours: removed at stop, or by the janitor if the process is killed first
            self._janitor = Janitor(self.runtime_dir)
        self.runtime_dir.mkdir(parents=True, exist_ok=True)
        if not (
            c.admin_secret or EnvSettings.read().admin_secret
        ):  # generated into this file, its path printed
            self.admin_secret_file = self.runtime_dir / "admin_secret"
        self.admin_secret = admin_secret(c, self.runtime_dir / "admin_secret")
        self.proxy = build_proxy(
            c, data_dir=self.runtime_dir / "ledger", admin_secret=self.admin_secret, model=model
        )
        self.admission.bind(self.proxy)
        metrics.publish_figures("run", lambda: accepted_work(self._finished))
        sock_dir = self.runtime_dir / "sock"
        sock_dir.mkdir(exist_ok=True)
        sock_dir.chmod(0o755)  # the sandbox uid traverses it to reach the socket
        await self.proxy.start(unix_socket=sock_dir / "proxy.sock", port=None)
        if c.trajectories_path:
            self._writer = TrajectoryWriter(Path(c.trajectories_path))
        await asyncio.to_thread(self.adapter.install)
        log.info(
            "polar agent: harness %s, proxy on %s, policy %s (%s)",
            self.adapter.name,
            self.proxy.unix_socket,
            c.url,
            c.backend,
        )

    async def stop(self) -> None:
        """Shutdown: episodes in flight are cancelled (masked ``cancelled``) and settle — session closed,
        workspace removed — before the proxy goes; then the agent's temp dir is removed."""
        self._stopping = True
        for task in list(self._playing):
            task.cancel()
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        while pending := self._playing | self._settling:  # a cancelled episode starts its settle
            if time.monotonic() >= deadline:
                log.error(
                    "polar agent: %d episode(s) did not settle within %.0fs", len(pending), SHUTDOWN_GRACE_S
                )
                break
            await asyncio.wait(pending, timeout=deadline - time.monotonic())
        if self.proxy is not None:
            await self.proxy.stop()
            self.proxy.registry.ledger.close()
            self.proxy = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._janitor is not None:
            await asyncio.to_thread(self._janitor.release)
            self._janitor = None

    @property
    def open_sessions(self) -> int:
        return sum(1 for s in self.proxy.registry.all() if s.info.closed_at is None) if self.proxy else 0

    async def run(
        self, row: dict[str, Any], resources: ResourcesClient, *, rollout_id: str | None = None
    ) -> AgentRunResult:
        """One rollout of the row's task; returns a result NeMo-RL accepts, or raises ``InputError``.

        Its token ids are read-only numpy views (``to_nemo_gym_result(arrays=True)``): serialise its
        ``row()`` with ``polar_env.fastjson.dumps``, as the Gym server does."""
        if self.proxy is None or self._stopping:
            raise RuntimeError("the agent is not running (start() not awaited, or stopping)")
        task_id = row_task_id(row)
        params = row_sampling(row)
        episode = asyncio.ensure_future(self._episode(row, task_id, params, resources, rollout_id))
        self._playing.add(episode)
        episode.add_done_callback(self._playing.discard)
        try:
            return await asyncio.shield(episode)
        except asyncio.CancelledError:
            episode.cancel()  # the caller is gone: the episode settles (masked) in the background
            raise

    async def _episode(
        self,
        row: dict[str, Any],
        task_id: str,
        params: dict[str, Any],
        resources: ResourcesClient,
        rollout_id: str | None,
    ) -> AgentRunResult:
        proxy = self.proxy
        assert proxy is not None
        cancelled: tuple[Component, str] | None = None
        async with self.admission.episode() as entry:  # a live slot, then the staleness bound
            ep = stages.begin(
                proxy,
                _TaskView(task_id, row),
                episode_id=f"{_slug(task_id)}-{uuid.uuid4().hex[:12]}",
                settings=row_settings(params, self.episode_settings),
                site=ResourcesSite(resources, params, min(proxy.engine.eos_ids)),
                prompt=_row_prompt(params),
                queued_at=entry.queued_at,
                metadata=entry.metadata,
            )
            try:
                async with entry.preparing():
                    with metrics.stage("prepare"):
                        await stages.prepare(ep)
                        await stages.booted(ep)
                with metrics.stage("run"):
                    await stages.run(ep)
            except asyncio.CancelledError:
                asyncio.current_task().uncancel()  # type: ignore[union-attr]
                stage = GYM_STAGE[ep.stage]
                cancelled = (
                    ("agent_server", f"the agent server shut down during the {stage} stage")
                    if self._stopping
                    else ("client", f"the /run caller went away during the {stage} stage")
                )
        # the live slot is the run stage's only: grading (settle) happens outside it, so a slow grade never
        # holds back the next episode's model calls. Settling is not interrupted by a second cancel
        # (shutdown after a disconnect)
        settle = asyncio.ensure_future(
            self._settle(ep, params, rollout_id or ep.session.session_id, cancelled)
        )
        self._settling.add(settle)
        settle.add_done_callback(self._settling.discard)
        return await asyncio.shield(settle)

    async def _settle(
        self,
        ep: Episode,
        params: dict[str, Any],
        rollout_id: str,
        cancelled: tuple[Component, str] | None,
    ) -> AgentRunResult:
        """The harness stopped if the episode was cancelled, then its finish stage (drain, classify,
        grade at the resources server unless the kind is outside the policy, close the workspace),
        and the NeMo-RL result."""
        if cancelled is not None:
            await stages.halt(ep, cancelled=cancelled[1])
        with metrics.stage("finish"):
            result = await stages.finish(ep)
        failure = self._failure(ep, result, cancelled[0] if cancelled else "client")
        return self._result(ep, result, failure, params, rollout_id)

    def _failure(self, ep: Episode, result: EpisodeResult, cancelled_by: Component) -> EpisodeFailure | None:
        """The structured record of what ended the episode: where it failed before the harness could end,
        what the grade said, or what the ledger shows (a failed call, the deadline, the harness's end)."""
        kind, started = result.failure_kind, ep.session.started
        if kind is FailureKind.none:
            return None
        at_s = {mark: round(at - started, 3) for mark, at in ep.marks.items()}
        if ep.failure is kind and ep.failed_in is not None:
            component: Component = (
                cancelled_by
                if kind is FailureKind.cancelled
                else "request"
                if kind is FailureKind.input_error
                else "resources_server"
                if ep.failed_in == "prepare"
                else "sandbox"
            )
            failure = EpisodeFailure(
                kind=kind,
                stage=GYM_STAGE[ep.failed_in],
                component=component,
                cause=(ep.error or kind.value)[:2000],
                at_s=at_s.get("failed"),
            )
        elif ep.graded_error is not None:
            failure = EpisodeFailure(
                kind=kind,
                stage="verification",
                component="grader",
                cause=ep.graded_error[:2000],
                at_s=at_s.get("done"),
            )
        elif kind is not ep.classified:  # the grade decided it
            cause = (result.grade.error if result.grade is not None else "") or kind.value
            failure = EpisodeFailure(
                kind=kind,
                stage="verification",
                component=COMPONENT.get(kind, "policy"),
                cause=cause[:2000],
                at_s=at_s.get("done"),
            )
        else:
            failure = self._classified(ep, kind, result.calls, at_s.get("ended"))
        _note_in_flight(failure, ep.marks.get("ended"), result.calls)
        return failure

    def _classified(
        self, ep: Episode, kind: FailureKind, calls: list[CallRecord], at_s: float | None
    ) -> EpisodeFailure:
        """The record of a kind the ledger decided (a failed call, the deadline, the harness's end)."""
        run = ep.run
        failed = [c for c in calls if c.failure_kind is not None]
        if kind in (FailureKind.backend_failure, FailureKind.proxy_failure) and failed:
            where = "at the policy server" if kind is FailureKind.backend_failure else "inside Polar's proxy"
            return EpisodeFailure(
                kind=kind,
                stage="agent",
                component=COMPONENT[kind],
                at_s=at_s,
                cause=f"{len(failed)} model call(s) failed {where}, the last: {failed[-1].error}"[:2000],
                in_flight_call=failed[-1].call_index,
            )
        cause = _CAUSES.get(kind, kind.value).format(timeout=f"{self.config.timeout:g}")
        if run is not None and kind is FailureKind.harness_killed:
            cause = f"harness killed by {run.signal}"
        elif (
            run is not None
            and run.error
            and kind in (FailureKind.harness_crashed, FailureKind.harness_start_failed)
        ):
            cause = f"{cause}: {run.error}"
        return EpisodeFailure(
            kind=kind,
            stage="agent",
            component=COMPONENT.get(kind, "policy"),
            cause=cause[:2000],
            at_s=at_s,
            exit_code=run.exit_code if run else None,
            signal=run.signal if run else None,
        )

    def _result(
        self,
        ep: Episode,
        result: EpisodeResult,
        failure: EpisodeFailure | None,
        params: dict[str, Any],
        rollout_id: str,
    ) -> AgentRunResult:
        proxy = self.proxy
        assert proxy is not None
        traj = result.trajectory
        traj.reward, traj.error = traj.reward or 0.0, failure.cause if failure else None
        resolved = result.grade is not None and result.grade.resolved
        # arrays: the result is only serialised (fastjson), and its per-call prompts are views, not copies
        self._first_prompts.note(traj)
        out = to_nemo_gym_result(
            traj,
            responses_create_params=params,
            placeholder_token_id=min(proxy.engine.eos_ids),
            group_prompt=self._first_prompts.get(traj),
            arrays=True,
        )
        mask = out.instance_config.mask_sample
        meta = traj.metadata
        meta.mask_sample = mask
        meta.failure = failure.model_dump() if failure else None
        meta.patch_bytes = patch_bytes(result.patch or ep.patch)
        if self.config.run_slots:
            meta.run_slots = self.config.run_slots
        if self._writer is not None:
            self._writer.write(traj)
        self._finished.append(Sample.of(traj))
        session_id = ep.session.session_id
        proxy.registry.discard(session_id)  # the trajectory carries it on: the proxy keeps only open sessions
        latency = latency_summary(traj)
        run = ep.run
        invocation_status = (
            "completed"
            if run is not None and run.status == "completed" and failure is None
            else "incomplete"
            if failure is not None and failure.kind in _INCOMPLETE
            else "failed"
        )
        timings = result.timings  # the rollout's own schema: docs/nemo.md maps the top-level keys onto it
        out.polar.timings, out.polar.model_call_latency_ms = timings.model_dump(), latency
        return AgentRunResult(
            **structs.asdict(out),
            mask_sample=mask,
            resolved=resolved,
            task_id=ep.task.instance_id,
            failure_reason=failure.cause if failure else None,
            failure=failure.model_dump() if failure else None,
            harness_exit_code=run.exit_code if run is not None else None,
            # numeric top-level keys: Gym and NeMo-RL average each into a metric
            duration_s=timings.total_s,
            seed_s=timings.prepare_s,
            harness_s=timings.harness_s,
            grading_s=timings.grade_s,
            model_call_p50_ms=latency.get("p50", 0.0),
            model_call_p95_ms=latency.get("p95", 0.0),
            ng_agent_observations=agent_observations(
                traj,
                out.response.output,
                invocation_id=session_id,
                status=invocation_status,
                duration_ms=timings.harness_s * 1e3,
                error_type=failure.kind.value if failure else None,
            ),
            ng_trajectory=producer_trajectory(
                traj,
                task_id=ep.task.instance_id,
                rollout_id=rollout_id,
                invocation_id=session_id,
                resolved=None if mask else resolved,
            ),
        )


_INCOMPLETE = frozenset(
    {
        FailureKind.cancelled,
        FailureKind.deadline_sampling,
        FailureKind.deadline_backend,
        FailureKind.deadline_harness,
    }
)
_CAUSES = {
    FailureKind.harness_crashed: "the harness failed after its first model call",
    FailureKind.harness_start_failed: "the harness ended before its first model call",
    FailureKind.deadline_sampling: "the {timeout}s deadline hit while the policy was still sampling",
    FailureKind.deadline_backend: "the {timeout}s deadline hit while the policy server served too slowly",
    FailureKind.deadline_harness: "the {timeout}s deadline hit while the harness held the clock",
    FailureKind.context_overflow: "the conversation outgrew the model's context",
    FailureKind.budget_exhausted: "the last answer was cut by the per-call token budget",
}


def _note_in_flight(failure: EpisodeFailure, ended: float | None, calls: list[CallRecord]) -> None:
    """Name the model call the harness was waiting on when it was killed, cancelled or out of time."""
    if (
        ended is None
        or failure.in_flight_call is not None
        or (failure.kind is not FailureKind.harness_killed and failure.kind not in _INCOMPLETE)
    ):
        return
    for call in calls:
        done = call.created_at + call.timings.get("total_ms", math.inf) / 1e3
        if call.created_at <= ended < done:
            failure.in_flight_call = call.call_index
            failure.cause += f" with model call #{call.call_index} in flight"
            return
    failure.cause += " between model calls"


class _TaskView:
    """Just enough of a Task for ``episode_prompt`` when the row carries the problem statement."""

    def __init__(self, task_id: str, row: dict[str, Any]):
        self.instance_id = task_id
        self.problem_statement = str(row.get("problem_statement") or "")
        self.harbor = None  # a Harbor task's row carries its instruction as the prompt (``input``)
        self.workdir = str(row.get("workdir") or "/testbed")


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


def _slug(text: str) -> str:
    """ASCII letters, digits, '-' and '_' only, starting with a letter or digit (a session id)."""
    slug = "".join(c if (c.isascii() and c.isalnum()) or c in "-_" else "-" for c in text)[:48]
    return slug if slug[:1].isalnum() else "t" + slug[:47]
