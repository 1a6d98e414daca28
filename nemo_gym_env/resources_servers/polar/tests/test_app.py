"""Polar's resources server under NeMo Gym's own test conventions (run by `gym env test`).

Real parts: bundled SWE-bench tasks, bubblewrap workspaces, real grading (the task's tests run).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from nemo_gym.server_utils import ServerClient
from nemo_gym.verifier_fixture import exercise_verifier_fixture
from resources_servers.polar.app import (
    VERIFIER_FIXTURE,
    PolarResourcesServer,
    PolarResourcesServerConfig,
)

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
TASK = "psf__requests-5414"
RESPONSE = {
    "id": "r",
    "created_at": 0,
    "model": "m",
    "object": "response",
    "output": [],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
}
PARAMS = {"input": [{"role": "user", "content": "fix it"}]}


def _server(tmp_path: Path) -> PolarResourcesServer:
    config = PolarResourcesServerConfig(
        host="127.0.0.1", port=0, entrypoint="app.py", name="polar", scratch_root=str(tmp_path)
    )
    client = ServerClient.model_construct(head_server_config=None, global_config_dict={})
    return PolarResourcesServer(config=config, server_client=client)


def test_verifier_fixture() -> None:
    asyncio.run(
        exercise_verifier_fixture(
            VERIFIER_FIXTURE, reward_range=(0.0, 1.0), higher_is_better=True, determinism="unknown"
        )
    )


def test_seed_edit_verify_close_over_http(tmp_path: Path) -> None:
    server = _server(tmp_path)
    gold = server.polar.task(TASK).patch
    with TestClient(server.setup_webserver(), raise_server_exceptions=False) as http:
        seeded = http.post("/seed_session", json={"episode_id": "ep-1", "task_id": TASK})
        assert seeded.status_code == 200, seeded.text
        root = Path(seeded.json()["sandbox_root"])
        assert (root / "testbed").is_dir() and str(root).startswith(str(tmp_path))
        again = http.post("/seed_session", json={"episode_id": "ep-1", "task_id": TASK}).json()
        assert again["sandbox_root"] == str(root)  # a retried seed gets the same workspace

        # the "agent" edits the workspace the way a harness would: apply the fix in place
        subprocess.run(["patch", "-p1", "-d", str(root / "testbed")], input=gold.encode(), check=True)

        verified = http.post(
            "/verify",
            json={
                "responses_create_params": PARAMS,
                "response": RESPONSE,
                "task_id": TASK,
                "episode_id": "ep-1",
            },
        )
        assert verified.status_code == 200, verified.text
        body = verified.json()
        assert body["reward"] == 1.0 and body["resolved"] and not body["mask_sample"], body
        assert body["patch_bytes"] > 0 and body["grading"]["fail_to_pass"]

        closed = http.post("/close_session", json={"resources_session_id": "ep-1"})
        assert closed.status_code == 200 and not root.exists()
        assert http.post("/seed_session", json={"episode_id": "ep-1", "task_id": TASK}).status_code >= 400
        lost = http.post(
            "/verify",
            json={
                "responses_create_params": PARAMS,
                "response": RESPONSE,
                "task_id": TASK,
                "episode_id": "ep-1",
            },
        ).json()
        assert lost["reward"] == 0.0 and lost["mask_sample"] and lost["failure_kind"] == "polar:lost_session"


def test_untouched_workspace_scores_zero_unmasked(tmp_path: Path) -> None:
    server = _server(tmp_path)
    with TestClient(server.setup_webserver(), raise_server_exceptions=False) as http:
        assert http.post("/seed_session", json={"episode_id": "ep-2", "task_id": TASK}).status_code == 200
        body = http.post(
            "/verify",
            json={
                "responses_create_params": PARAMS,
                "response": RESPONSE,
                "task_id": TASK,
                "episode_id": "ep-2",
            },
        ).json()
        assert (
            body["reward"] == 0.0 and not body["mask_sample"] and body["failure_kind"] == "polar:empty_patch"
        )
        http.post("/close_session", json={"resources_session_id": "ep-2"})


def test_aggregate_metrics_reports_resolved_rate(tmp_path: Path) -> None:
    server = _server(tmp_path)
    rows = [
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0, "num_turns": 2},
        {"_ng_task_index": 0, "_ng_rollout_index": 1, "reward": 0.0, "num_turns": 4},
        {"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 0.0, "mask_sample": True, "num_turns": 1},
    ]
    with TestClient(server.setup_webserver(), raise_server_exceptions=False) as http:
        metrics = http.post("/aggregate_metrics", json={"verify_responses": rows}).json()
    agent = metrics["agent_metrics"]
    # Gym takes masked samples out of the quality metrics before Polar's are computed
    assert agent["polar/resolved_rate"] == 0.5 and agent["polar/num_samples"] == 2
    assert agent["polar/mean_num_turns"] == 3.0


def test_bad_requests_get_4xx_and_shutdown_removes_workspaces(tmp_path: Path) -> None:
    server = _server(tmp_path)
    with TestClient(server.setup_webserver(), raise_server_exceptions=False) as http:
        unknown = http.post("/seed_session", json={"episode_id": "ep-x", "task_id": "nobody__nothing-1"})
        assert (
            unknown.status_code == 404 and "unknown task_id 'nobody__nothing-1'" in unknown.json()["detail"]
        )
        neither = http.post(
            "/verify", json={"responses_create_params": PARAMS, "response": RESPONSE, "task_id": TASK}
        )
        assert neither.status_code == 422 and "episode_id" in neither.json()["detail"]
        bogus = http.post(
            "/verify",
            json={
                "responses_create_params": PARAMS,
                "response": RESPONSE,
                "task_id": "nobody__nothing-1",
                "patch": "",
            },
        )
        assert bogus.status_code == 404, bogus.text
        assert http.post("/seed_session", json={"episode_id": "ep-3", "task_id": TASK}).status_code == 200
        rebound = http.post("/seed_session", json={"episode_id": "ep-3", "task_id": "pallets__flask-5014"})
        assert rebound.status_code == 409 and "bound to task" in rebound.json()["detail"]
        assert list(tmp_path.glob("polar-resources-*/polar-ws-*"))
    assert not any(tmp_path.iterdir())  # the server's shutdown closed the episode nobody closed
