"""Polar's agent server under NeMo Gym's test conventions (run by `gym env test`).

What can be checked without a policy server: the config Gym builds from YAML, the rows it accepts,
the wiring of ``/run``'s inputs, and that the observability records validate against Gym's own
models. The full rollout (harness, proxy, sandbox, grading) is covered by the repository's
tests/nemo_gym/test_nemo_gym_e2e.py through `gym env start` + `gym eval run`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from fastapi.testclient import TestClient
from nemo_gym.rollout_observability import AgentObservationBundle, TrajectoryRecord
from nemo_gym.server_utils import ServerClient
from responses_api_agents.polar_agent.app import (
    GymResources,
    PolarAgentServer,
    PolarAgentServerConfig,
    PolarRunRequest,
)

from polar_env.agent_server.core import PolarAgentConfig, row_settings, row_task_id
from polar_env.agent_server.observations import agent_observations, plain_items, producer_trajectory
from polar_env.chat.messages import AssistantTurn, Message, ToolCall
from polar_env.episodes.settings import EpisodeSettings
from polar_env.proxy.settings import ProxySettings
from polar_env.trajectory.export import to_nemo_gym_result
from polar_env.trajectory.models import CallSummary, Trajectory, TrajectoryStats
from polar_env.wire.gym_resources import VerifyResponse

EXAMPLES = Path(__file__).resolve().parents[3] / "resources_servers" / "polar" / "data" / "example.jsonl"


def _config(**kw) -> PolarAgentServerConfig:
    return PolarAgentServerConfig(
        host="127.0.0.1",
        port=0,
        entrypoint="app.py",
        name="polar_agent",
        resources_server={"type": "resources_servers", "name": "polar_resources_server"},
        **kw,
    )


def test_config_maps_onto_polar_agent_config() -> None:
    config = _config(
        harness="codex",
        url=["http://a:1/v1", "http://b:2/v1"],
        backend="nemo-rl",
        temperature=0.7,
        top_p=0.9,
        max_tokens=512,
    )
    assert isinstance(config, PolarAgentConfig)  # the Gym config is Polar's config, declared once
    assert config.harness == "codex" and config.backend == "nemo-rl"
    assert config.url == ["http://a:1", "http://b:2"]
    assert config.sampling() == {"temperature": 0.7, "top_p": 0.9, "max_tokens": 512}


def test_config_takes_the_settings_polar_rollout_and_proxy_serve_take() -> None:
    """A fragment of Polar's settings (tests/cli/test_settings.py: `polar rollout --settings`,
    `polar proxy serve --settings`) is the Gym agent's config under the same keys, and the same proxy
    settings come out."""
    fragment = {
        "backend": "vllm",
        "url": "http://a:1/v1",
        "model_name": "policy",
        "model_dir": "/models/policy",
        "tool_format": "qwen3_coder",
        "max_context": 4096,
        "agent_calls": "refuse",
    }
    assert _config(**fragment).proxy_settings() == ProxySettings.model_validate(fragment) != ProxySettings()


def test_example_rows_parse_as_run_requests() -> None:
    rows = [json.loads(line) for line in EXAMPLES.read_text().splitlines()]
    assert len(rows) == 5
    for row in rows:
        request = PolarRunRequest.model_validate(
            {
                **row,
                "responses_create_params": {
                    **row["responses_create_params"],
                    "temperature": 0.6,
                    "top_p": 0.95,
                    "max_output_tokens": 300,
                },
            }
        )
        dumped = request.model_dump(mode="json", exclude_unset=True)
        assert row_task_id(dumped) == row["task_id"]
        settings = row_settings(dumped["responses_create_params"], EpisodeSettings(max_tokens=8192))
        assert settings.sampling() == {
            "temperature": 0.6,
            "top_p": 0.95,
            "max_tokens": 300,
        }


def test_responses_endpoint_points_at_run() -> None:
    client = ServerClient.model_construct(head_server_config=None, global_config_dict={})
    server = PolarAgentServer(config=_config(backend="vllm", url="http://127.0.0.1:9"), server_client=client)
    with TestClient(server.setup_webserver(), raise_server_exceptions=False) as http:
        answer = http.post("/v1/responses", json={"input": "hi"})
    assert answer.status_code == 501 and "/run" in answer.text


def test_verify_payload_drops_token_ids_only() -> None:
    output = [
        {
            "type": "message",
            "content": [],
            "prompt_token_ids": [1],
            "generation_token_ids": [2],
            "generation_log_probs": [-0.1],
        }
    ]
    assert plain_items(output) == [{"type": "message", "content": []}]


def _trajectory() -> Trajectory:
    """Two proxied calls (a bash tool call, then a final answer) and a failed third, as the proxy records
    them."""
    call = AssistantTurn(
        call_id="c1",
        tool_calls=[ToolCall(id="t1", name="bash", arguments='{"command": "ls"}')],
        finish_reason="tool_calls",
    )
    done = AssistantTurn(call_id="c2", content="done")
    calls = [
        CallSummary(
            call_index=0,
            call_id="c1",
            api="chat",
            created_at=100.0,
            chain=0,
            parent_call_index=None,
            messages_offset=0,
            new_messages=[Message(role="user", content="fix it")],
            output=call,
            finish_reason="tool_calls",
            prompt_tokens=50,
            sampled_tokens=12,
            timings={"total_ms": 800.0},
        ),
        CallSummary(
            call_index=1,
            call_id="c2",
            api="chat",
            created_at=102.0,
            chain=0,
            parent_call_index=0,
            messages_offset=2,
            new_messages=[Message(role="tool", content="a.py", tool_call_id="t1")],
            output=done,
            finish_reason="stop",
            prompt_tokens=70,
            sampled_tokens=3,
            timings={"total_ms": 200.0},
        ),
        CallSummary(
            call_index=2,
            call_id="c3",
            api="chat",
            created_at=103.0,
            chain=None,
            parent_call_index=None,
            messages_offset=0,
            new_messages=[],
            output=None,
            finish_reason=None,
            prompt_tokens=0,
            sampled_tokens=0,
            error="backend: 503",
            timings={"total_ms": 5.0},
        ),
    ]
    stats = TrajectoryStats(
        calls=3,
        failed_calls=1,
        chains=0,
        sampled_tokens=15,
        trainable_tokens=0,
        trainable_fraction=0.0,
        main_chain_tokens=0,
        masked_tokens=0,
        unscored_tokens=0,
    )
    return Trajectory(
        session_id="ep-1",
        task_id="t",
        model="m",
        created_at=100.0,
        status="completed",
        calls=calls,
        stats=stats,
    )


def test_observability_records_validate_against_gyms_models() -> None:
    traj = _trajectory()
    result = to_nemo_gym_result(traj, placeholder_token_id=0).row()
    usage = result["response"]["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] == 50 + 12 + 70 + 3
    bundle = AgentObservationBundle.model_validate(
        agent_observations(
            traj,
            result["response"]["output"],
            invocation_id="ep-1",
            status="failed",
            duration_ms=3000.0,
            error_type="harness_killed",
        )
    )
    invocation, tool = bundle.records
    assert invocation.status == "failed" and [r.model_call_id for r in invocation.model_calls] == [
        "c1",
        "c2",
        "c3",
    ]
    assert tool.tool_call_id == "t1" and tool.tool_name == "bash"
    record = TrajectoryRecord.model_validate(
        producer_trajectory(traj, task_id="t", rollout_id="0-0", invocation_id="ep-1", resolved=True)
    )
    assert [t.turn_no for t in record.turns] == [1, 2] and record.turns[-1].resolved is True
    assert record.turns[1].step_count == 1  # one tool call before the second turn
    failed = record.model_calls[2]
    assert (
        failed.response_metadata.response_status == "failed"
        and failed.response_metadata.error_category == "backend"
    )
    assert record.model_calls[0].duration_ms == 800.0 and record.model_calls[0].token_stats.total_tokens == 62


class _HttpClient:
    """Gym's ServerClient's one method GymResources calls, over a real aiohttp session."""

    def __init__(self, http: aiohttp.ClientSession, base: str):
        self.http, self.base = http, base

    async def post(self, server_name: str, url_path: str, json: dict[str, Any]) -> aiohttp.ClientResponse:
        return await self.http.post(self.base + url_path, json=json)


def test_resources_bodies_are_the_shared_models_and_a_malformed_answer_names_its_fault() -> None:
    """GymResources sends polar_env.wire.gym_resources' models and parses the answers with them. The
    resources server is an aiohttp stand-in here, over real HTTP: the real one never answers malformed
    (its own answers are the e2e tests': tests/test_nemo_gym_e2e.py)."""
    answers: dict[str, dict[str, Any]] = {}
    seen: dict[str, Any] = {}

    async def answer(request: web.Request) -> web.Response:
        seen[request.path] = await request.json()
        return web.json_response(answers[request.path])

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/{path:.*}", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as http:
                server: Any = SimpleNamespace(server_client=_HttpClient(http, f"http://127.0.0.1:{port}"))
                resources = GymResources(server, "polar_resources_server")
                answers["/seed_session"] = {
                    "episode_id": "ep",
                    "task_id": "t",
                    "sandbox_root": "/r",
                    "uid": 7,
                    "gid": 7,
                }
                seeded = await resources.seed("ep", "t")
                assert seeded.ref().root == "/r" and seeded.ref().kind == "bubblewrap"
                assert seen["/seed_session"] == {"episode_id": "ep", "task_id": "t"}  # no mounts: none sent

                draft = to_nemo_gym_result(_trajectory(), placeholder_token_id=0)
                verdict = VerifyResponse(
                    reward=1.0,
                    resolved=True,
                    patch_bytes=9,
                    responses_create_params={},
                    response={},
                    task_id="t",
                )
                answers["/verify"] = verdict.model_dump()
                outcome = await resources.verify("ep", "t", result=draft)
                assert (outcome.reward, outcome.resolved, outcome.patch_bytes, outcome.patch) == (
                    1.0,
                    True,
                    9,
                    "",
                )
                assert seen["/verify"]["episode_id"] == "ep" and "patch" not in seen["/verify"]
                assert seen["/verify"]["response"]["id"] == draft.response.id

                answers["/verify"] = {**verdict.model_dump(), "reward": "lots"}
                with pytest.raises(ValueError, match=r"/verify answer is malformed(.|\n)*reward"):
                    await resources.verify("ep", "t", result=draft)
                answers["/seed_session"] = {"episode_id": "ep", "task_id": "t"}
                with pytest.raises(ValueError, match=r"/seed_session answer is malformed(.|\n)*sandbox_root"):
                    await resources.seed("ep", "t")

                answers["/close_session"] = {"resources_session_id": "ep"}
                await resources.close("ep")
                assert seen["/close_session"] == {"resources_session_id": "ep"}
        finally:
            await runner.cleanup()

    asyncio.run(main())
