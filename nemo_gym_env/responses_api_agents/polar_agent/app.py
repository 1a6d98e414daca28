"""NeMo Gym agent server for Polar: ``/run`` drives an unmodified coding harness through Polar's proxy.

Per process: one Polar proxy on a Unix socket, backed by the policy server Gym names in
``policy_base_url`` (NeMo-RL's vLLM HTTP servers in training, any vLLM in evaluation). Per row:
seed the episode at the ``polar`` resources server, run the harness in the sandbox, verify, close,
and answer with the NeMo-RL result (token ids of the main chain, reward, ``mask_sample`` on
infrastructure failures). The logic lives in ``polar_env.agent_server.core``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi.responses import JSONResponse
from nemo_gym.base_resources_server import BaseRunRequest
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, SimpleResponsesAPIAgent
from nemo_gym.config_types import ResourcesServerRef
from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import raise_for_status
from pydantic import ConfigDict, PrivateAttr

from polar_env.agent_server.core import PolarAgent, PolarAgentConfig
from polar_env.episodes.workspace import WorkspaceMounts
from polar_env.resources_server.core import SeededEpisode, VerifyOutcome, aggregate


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

    async def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        resp = await self.server.server_client.post(server_name=self.name, url_path=path, json=payload)
        await raise_for_status(resp)
        return await resp.json()

    async def seed(self, episode_id: str, task_id: str, *, mounts: WorkspaceMounts | None = None) -> SeededEpisode:
        body: dict[str, Any] = {"episode_id": episode_id, "task_id": task_id}
        if mounts is not None:
            body["mounts"] = mounts.model_dump()
        return SeededEpisode.model_validate(await self._post("/seed_session", body))

    async def verify(self, episode_id: str, task_id: str, *, result: dict[str, Any]) -> VerifyOutcome:
        body = {"responses_create_params": result["responses_create_params"], "response": _plain(result["response"]),
                "task_id": task_id, "episode_id": episode_id}
        out = await self._post("/verify", body)
        return VerifyOutcome(reward=out["reward"], resolved=out.get("resolved", False),
                             mask_sample=out.get("mask_sample", False), failure_kind=out.get("failure_kind"),
                             failure_reason=out.get("failure_reason"), grading=out.get("grading") or {})

    async def close(self, episode_id: str) -> None:
        await self._post("/close_session", {"resources_session_id": episode_id})


def _plain(response: dict[str, Any]) -> dict[str, Any]:
    """The response without token ids (verify grades the workspace; it needs no tokens)."""
    drop = {"prompt_token_ids", "generation_token_ids", "generation_log_probs"}
    return {**response, "output": [{k: v for k, v in item.items() if k not in drop}
                                   for item in response.get("output", [])]}


class PolarAgentServer(SimpleResponsesAPIAgent):
    ray_enabled = False
    config: PolarAgentServerConfig
    _agent: PolarAgent | None = PrivateAttr(default=None)
    _lock: asyncio.Lock = PrivateAttr(default_factory=asyncio.Lock)

    async def _ready(self) -> PolarAgent:
        async with self._lock:  # the proxy binds to the serving event loop, so start it on first use
            if self._agent is None:
                agent = PolarAgent(self.config)
                await agent.start()
                self._agent = agent
        return self._agent

    def compute_metrics(self, tasks: list[list[dict[str, Any]]]) -> dict[str, Any]:
        """Merged into Gym's agent_metrics (what `gym eval run` reports): resolved rate and trajectory stats."""
        return {f"polar/{k}": v for k, v in aggregate([r for task in tasks for r in task]).items()}

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming) -> JSONResponse:
        return JSONResponse({"error": {"message": "polar_agent runs whole episodes: POST /run"}}, status_code=501)

    async def run(self, body: PolarRunRequest) -> JSONResponse:
        agent = await self._ready()
        row = body.model_dump(mode="json", exclude_unset=True)
        result = await agent.run(row, GymResources(self, self.config.resources_server.name))
        return JSONResponse(result)


if __name__ == "__main__":
    PolarAgentServer.run_webserver()
