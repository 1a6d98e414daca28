"""Polar's agent server under NeMo Gym's test conventions (run by `gym env test`).

What can be checked without a policy server: the config Gym builds from YAML, the rows it accepts,
and the wiring of ``/run``'s inputs. The full rollout (harness, proxy, sandbox, grading) is
covered by the repository's tests/test_nemo_gym_e2e.py through `gym env start` + `gym eval run`.
"""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient
from nemo_gym.server_utils import ServerClient
from responses_api_agents.polar_agent.app import (
    PolarAgentServer,
    PolarAgentServerConfig,
    PolarRunRequest,
    _plain,
)

from polar_env.agent_server.core import PolarAgentConfig, base_urls, row_task_id, session_policy

EXAMPLES = Path(__file__).resolve().parents[3] / "resources_servers" / "polar" / "data" / "example.jsonl"


def _config(**kw) -> PolarAgentServerConfig:
    return PolarAgentServerConfig(host="127.0.0.1", port=0, entrypoint="app.py", name="polar_agent",
                                  resources_server={"type": "resources_servers", "name": "polar_resources_server"},
                                  **kw)


def test_config_maps_onto_polar_agent_config() -> None:
    config = _config(harness="codex", policy_base_url=["http://a:1/v1", "http://b:2/v1"], backend="nemo-rl",
                     default_sampling={"temperature": 0.7, "top_p": 0.9, "max_tokens": 512})
    assert isinstance(config, PolarAgentConfig)  # the Gym config is Polar's config, declared once
    assert config.harness == "codex" and config.backend == "nemo-rl"
    assert base_urls(config.policy_base_url) == ["http://a:1", "http://b:2"]
    assert config.default_sampling["top_p"] == 0.9


def test_example_rows_parse_as_run_requests() -> None:
    rows = [json.loads(line) for line in EXAMPLES.read_text().splitlines()]
    assert len(rows) == 5
    for row in rows:
        request = PolarRunRequest.model_validate({**row, "responses_create_params": {
            **row["responses_create_params"], "temperature": 0.6, "top_p": 0.95, "max_output_tokens": 300}})
        dumped = request.model_dump(mode="json", exclude_unset=True)
        assert row_task_id(dumped) == row["task_id"]
        assert session_policy(dumped["responses_create_params"], {"max_tokens": 8192}) == {
            "temperature": 0.6, "top_p": 0.95, "max_tokens": 300}


def test_responses_endpoint_points_at_run() -> None:
    client = ServerClient.model_construct(head_server_config=None, global_config_dict={})
    server = PolarAgentServer(config=_config(policy_base_url="http://127.0.0.1:9"), server_client=client)
    with TestClient(server.setup_webserver(), raise_server_exceptions=False) as http:
        answer = http.post("/v1/responses", json={"input": "hi"})
    assert answer.status_code == 501 and "/run" in answer.text


def test_verify_payload_drops_token_ids_only() -> None:
    response = {"id": "r", "output": [{"type": "message", "content": [], "prompt_token_ids": [1],
                                       "generation_token_ids": [2], "generation_log_probs": [-0.1]}]}
    assert _plain(response) == {"id": "r", "output": [{"type": "message", "content": []}]}
