"""NeMo Gym agent server for Polar: ``/run`` drives an unmodified coding harness through Polar's proxy.

Per process: one Polar proxy on a Unix socket, backed by the policy server Gym names in
``policy_base_url`` (NeMo-RL's vLLM HTTP servers in training, any vLLM in evaluation). Per row:
seed the episode at the ``polar`` resources server, run the harness in the sandbox, verify, close,
and answer with the NeMo-RL result (token ids of the main chain, reward, ``mask_sample`` by the
outcome table, the failure's structured fields, ``ng_agent_observations`` and ``ng_trajectory``).
A malformed row is a 422 with the reason. The agent starts with the server (on its event loop)
and stops with it: episodes in flight settle (masked ``shutdown``) and its temp dir is removed.
The logic lives in ``polar_env.agent_server.core``.
"""

from __future__ import annotations

import hmac
import json
from typing import Any, TypeVar

from aiohttp import ClientResponseError
from fastapi import Body, Depends, FastAPI, Header, HTTPException, Response
from fastapi.responses import JSONResponse
from nemo_gym.base_resources_server import BaseRunRequest
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, SimpleResponsesAPIAgent
from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest, ResourcesServerRef
from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.rollout_correlation import maybe_rollout_id_from_run_body
from nemo_gym.server_utils import raise_for_status
from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError

from polar_env import fastjson, metrics
from polar_env.agent_server.core import InputError, PolarAgent, PolarAgentConfig
from polar_env.agent_server.observations import plain_items
from polar_env.gym_lifespan import add_lifespan_hooks
from polar_env.proxy.policy import PauseRequest, PolicyFence, PolicyState, PolicyVersion, ResumeRequest
from polar_env.resources_server.core import UnknownTask, VerifyOutcome, aggregate, masked_metrics
from polar_env.wire.gym_resources import (
    CloseSessionRequest,
    CloseSessionResponse,
    SeedSessionRequest,
    SeedSessionResponse,
    VerifyRequest,
    VerifyResponse,
    WorkspaceMounts,
)
from polar_env.wire.nemo_gym import RunResult

Answer = TypeVar("Answer", bound=BaseModel)


class PolarAgentServerConfig(PolarAgentConfig, BaseResponsesAPIAgentConfig):
    """Gym's server settings plus Polar's own (``PolarAgentConfig``, declared once)."""

    resources_server: ResourcesServerRef


class PolarRunRequest(BaseRunRequest):
    """A data row: ``responses_create_params`` (prompt + the trainer's sampling) and ``task_id``."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    task_id: str


class GymResources:
    """The resources server over Gym's HTTP client (same host: the workspace is a local directory)."""

    def __init__(self, server: SimpleResponsesAPIAgent, name: str):
        self.server, self.name = server, name

    async def _post(self, path: str, body: BaseModel, answer: type[Answer]) -> Answer:
        """POST the typed body (its None fields left out); the answer parsed as ``answer`` (a
        malformed one raises, naming the fault)."""
        payload = body.model_dump(mode="json", exclude_none=True)
        resp = await self.server.server_client.post(server_name=self.name, url_path=path, json=payload)
        await raise_for_status(resp)
        try:
            return answer.model_validate(await resp.json())
        except ValidationError as exc:
            raise ValueError(f"the resources server's {path} answer is malformed: {exc}") from None

    async def seed(
        self, episode_id: str, task_id: str, *, mounts: WorkspaceMounts | None = None
    ) -> SeedSessionResponse:
        body = SeedSessionRequest(episode_id=episode_id, task_id=task_id, mounts=mounts)
        try:
            return await self._post("/seed_session", body, SeedSessionResponse)
        except ClientResponseError as exc:
            if exc.status == 404:  # the resources server does not have the task: an input error, not ours
                raise UnknownTask(_detail(exc)) from None
            raise

    async def verify(self, episode_id: str, task_id: str, *, result: RunResult) -> VerifyOutcome:
        body = VerifyRequest(
            responses_create_params=result.responses_create_params,
            response={**result.response.row(), "output": plain_items(result.response.output)},
            task_id=task_id,
            episode_id=episode_id,
        )
        answer = await self._post("/verify", body, VerifyResponse)
        return VerifyOutcome.model_validate(answer, from_attributes=True)

    async def close(self, episode_id: str) -> None:
        body = CloseSessionRequest(resources_session_id=episode_id)
        await self._post("/close_session", body, CloseSessionResponse)


def _detail(exc: ClientResponseError) -> str:
    """FastAPI's ``{"detail": ...}`` from an error answer, else its raw text."""
    raw = getattr(exc, "response_content", b"") or b""
    try:
        return str(json.loads(raw)["detail"])
    except (ValueError, KeyError, TypeError):
        return raw.decode("utf-8", errors="replace") or str(exc)


class PolarAgentServer(SimpleResponsesAPIAgent):
    ray_enabled = False
    config: PolarAgentServerConfig
    _agent: PolarAgent | None = PrivateAttr(default=None)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        # the proxy binds to the serving event loop: start the agent there, and stop it with the server
        add_lifespan_hooks(app, start=self._start_agent, stop=self._stop_agent)
        # the trainer's weight sync (docs/training.md): the version every call records, and the fence;
        # only with the admin secret (the agent's config, $POLAR_ADMIN_SECRET, or the file printed at start)
        admin = [Depends(self._require_admin)]
        app.get("/polar/policy", dependencies=admin)(self.policy_state)
        app.post("/polar/policy", dependencies=admin)(self.set_policy)
        app.post("/polar/pause", dependencies=admin)(self.pause)
        app.post("/polar/resume", dependencies=admin)(self.resume)
        app.get("/metrics")(self.metrics)  # Prometheus scrapes the agent (polar_env/metrics.py)
        return app

    async def metrics(self) -> Response:
        return Response(metrics.exposition(), media_type=metrics.CONTENT_TYPE)

    async def _require_admin(self, authorization: str = Header(default="")) -> None:  # noqa: B008
        secret = self._agent.admin_secret if self._agent is not None else ""
        given = authorization[7:].strip() if authorization.lower().startswith("bearer ") else ""
        if not secret or not hmac.compare_digest(given.encode(), secret.encode()):
            raise HTTPException(
                status_code=401, detail="the /polar routes require the admin secret as Bearer token"
            )

    def _fence(self) -> PolicyFence:
        if self._agent is None:
            raise HTTPException(
                status_code=503, detail="the polar agent is not running (starting or stopping)"
            )
        return self._agent.proxy.engine.fence

    async def policy_state(self) -> PolicyState:
        return self._fence().state()

    async def set_policy(self, body: PolicyVersion) -> PolicyState:
        fence = self._fence()
        fence.set_version(body.version)
        return fence.state()

    async def pause(self, body: PauseRequest) -> JSONResponse:
        report = await self._fence().pause(body)
        return JSONResponse(report.model_dump(mode="json"), status_code=200 if report.drained else 504)

    async def resume(self, body: ResumeRequest) -> PolicyState:
        fence = self._fence()
        fence.resume(body.version)
        return fence.state()

    async def _start_agent(self) -> None:
        agent = PolarAgent(self.config)
        await agent.start()
        self._agent = agent
        where = (
            f"in {agent.admin_secret_file}"
            if agent.admin_secret_file is not None
            else "from the config or $POLAR_ADMIN_SECRET"
        )
        print(
            f"polar agent ready: harness {agent.adapter.name}, proxy on {agent.proxy.unix_socket}, "
            f"policy {self.config.url} ({self.config.backend}); /polar/* admin secret {where}",
            flush=True,
        )

    async def _stop_agent(self) -> None:
        if self._agent is not None:
            agent, self._agent = self._agent, None
            await agent.stop()
            print("polar agent stopped: every episode settled, temp state removed", flush=True)

    def compute_metrics(self, tasks: list[list[dict[str, Any]]]) -> dict[str, Any]:
        """Merged into Gym's agent_metrics (what `gym eval run` reports): resolved rate and trajectory stats
        over the unmasked rollouts (Gym passes only those)."""
        return {f"polar/{k}": v for k, v in aggregate([r for task in tasks for r in task]).items()}

    async def aggregate_metrics(self, body: AggregateMetricsRequest = Body()) -> AggregateMetrics:  # noqa: B008
        """Gym's aggregation, plus masked-rollout counts over every rollout (``compute_metrics`` never sees
        the masked ones, so they are counted here)."""
        metrics = await super().aggregate_metrics(body)
        masked = {f"polar/{k}": v for k, v in masked_metrics(body.verify_responses).items()}
        metrics.agent_metrics.update(masked)
        metrics.key_metrics.update({k: masked[k] for k in ("polar/masked_fraction", "polar/num_masked")})
        return metrics

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming) -> JSONResponse:
        return JSONResponse(
            {"error": {"message": "polar_agent runs whole episodes: POST /run"}}, status_code=501
        )

    async def run(self, body: PolarRunRequest) -> Response:
        if self._agent is None:
            raise HTTPException(
                status_code=503, detail="the polar agent is not running (starting or stopping)"
            )
        row = body.model_dump(mode="json", exclude_unset=True)
        try:
            rollout_id = maybe_rollout_id_from_run_body(row)
        except ValueError as exc:  # a malformed explicit _ng_rollout_id
            raise HTTPException(status_code=422, detail=str(exc)) from None
        try:
            result = await self._agent.run(
                row, GymResources(self, self.config.resources_server.name), rollout_id=rollout_id
            )
        except InputError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None
        # orjson: a 100k-token episode's result is ~60 MB of JSON (every call repeats its prompt, as NeMo-RL
        # requires), seconds for the stdlib codec; its token ids are numpy views the stdlib cannot write
        return Response(fastjson.dumps(result.row()), media_type="application/json")


if __name__ == "__main__":
    PolarAgentServer.run_webserver()
