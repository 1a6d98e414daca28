"""NeMo Gym resources server for Polar: per-episode sandbox workspaces and SWE-bench grading.

Endpoints (the agent server ``polar_agent`` calls them in this order for every rollout):
- ``/seed_session``: open the task's workspace on this host (a bubblewrap tree or a container of its image);
- ``/verify``: take the agent's patch from the workspace and grade it (or grade a given patch);
- ``/close_session``: remove the workspace;
- ``/aggregate_metrics``: resolved rate plus trajectory statistics.
Bad requests are 4xx with the reason (an unknown task 404, a closed or rebound episode 409, a
verify with neither episode nor patch 422); at shutdown every workspace is removed. The logic lives
in ``polar_env.resources_server.core``; this file only binds it to Gym.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseSeedSessionRequest,
    BaseSeedSessionResponse,
    BaseVerifyRequest,
    BaseVerifyResponse,
    ResourcesCloseSessionResponse,
    SimpleResourcesServer,
)
from nemo_gym.verifier_fixture import VerifierFixture
from pydantic import PrivateAttr

from polar_env.gym_lifespan import add_lifespan_hooks
from polar_env.resources_server.core import (
    EpisodeConflict,
    PolarResources,
    PolarResourcesConfig,
    UnknownTask,
    aggregate,
)
from polar_env.wire.gym_resources import (
    CloseSessionRequest,
    CloseSessionResponse,
    SeedSessionRequest,
    SeedSessionResponse,
    VerifyRequest,
    VerifyResponse,
)


class PolarResourcesServerConfig(PolarResourcesConfig, BaseResourcesServerConfig):
    """Gym's server settings plus Polar's own (``PolarResourcesConfig``, declared once)."""


# the bodies as polar_env.wire.gym_resources declares them, on Gym's base models (Gym's fields and checks
# come first: the typed `responses_create_params` and `response`, the `failure_kind` check)
class PolarSeedSessionRequest(BaseSeedSessionRequest, SeedSessionRequest):
    pass


class PolarSeedSessionResponse(BaseSeedSessionResponse, SeedSessionResponse):
    pass


class PolarCloseSessionResponse(ResourcesCloseSessionResponse, CloseSessionResponse):
    pass  # the request is Polar's own: Gym's typed close also needs an EpisodeId


class PolarVerifyRequest(BaseVerifyRequest, VerifyRequest):
    pass


class PolarVerifyResponse(BaseVerifyResponse, VerifyResponse):
    pass


class PolarVerifier:
    """The verify logic; subclasses provide ``polar`` (the PolarResources holding the episodes)."""

    async def verify(self, body: PolarVerifyRequest) -> PolarVerifyResponse:
        if body.episode_id is not None:
            outcome = await self.polar.verify(body.episode_id)
        elif body.patch is not None:
            try:
                task = self.polar.task(body.task_id)
            except UnknownTask as exc:
                raise HTTPException(status_code=404, detail=str(exc)) from None
            outcome = await self.polar.grade_patch(task, body.patch)
        else:
            raise HTTPException(status_code=422, detail="verify needs episode_id (a seeded episode) or patch")
        return PolarVerifyResponse(
            **body.model_dump(include={"responses_create_params", "response", "task_id"}),
            **outcome.model_dump(exclude={"patch"}),
        )


class StandalonePolarVerifier(PolarVerifier):
    """A verifier without a server around it (what VERIFIER_FIXTURE exercises)."""

    def __init__(self, config: PolarResourcesConfig | None = None):
        self.polar = PolarResources(config or PolarResourcesConfig())


class PolarResourcesServer(PolarVerifier, SimpleResourcesServer):
    ray_enabled = False
    config: PolarResourcesServerConfig
    _polar: PolarResources | None = PrivateAttr(default=None)

    @property
    def polar(self) -> PolarResources:  # built on first use: loading a large task set takes time
        if self._polar is None:
            self._polar = PolarResources(self.config)
        return self._polar

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        add_lifespan_hooks(app, stop=self._close_all)  # no workspace outlives the server
        return app

    async def _close_all(self) -> None:
        if self._polar is not None:
            # said before the slower scratch removal: ng_run kills a server that takes over a second
            closed = await self._polar.close_episodes()
            print(f"polar resources: closed {closed} open episode(s) at shutdown", flush=True)
            await self._polar.aclose()

    async def seed_session(self, body: PolarSeedSessionRequest) -> PolarSeedSessionResponse:
        try:
            seeded = await self.polar.seed(body.episode_id, body.task_id, mounts=body.mounts)
        except UnknownTask as exc:
            raise HTTPException(status_code=404, detail=str(exc)) from None
        except EpisodeConflict as exc:
            raise HTTPException(status_code=409, detail=str(exc)) from None
        return PolarSeedSessionResponse(**seeded.model_dump())

    async def close_resources_session(self, body: CloseSessionRequest) -> PolarCloseSessionResponse:
        await self.polar.close(body.resources_session_id)
        return PolarCloseSessionResponse(resources_session_id=body.resources_session_id)

    def compute_metrics(self, tasks: list[list[dict[str, Any]]]) -> dict[str, Any]:
        """Merged into Gym's agent_metrics: resolved rate (masked samples excluded) and trajectory stats."""
        return {f"polar/{k}": v for k, v in aggregate([r for task in tasks for r in task]).items()}


VERIFIER_FIXTURE = VerifierFixture(
    server_factory=StandalonePolarVerifier,
    request_model=PolarVerifyRequest,
    cases_path=Path(__file__).parent / "tests" / "verifier_cases.jsonl",
)


if __name__ == "__main__":
    PolarResourcesServer.run_webserver()
