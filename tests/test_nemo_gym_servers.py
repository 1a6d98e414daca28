"""Polar's NeMo Gym server logic without nemo-gym: the agent core, the resources core, the policy server.

Real parts throughout: the SmolLM2 tokenizer and model (scoring the scripted policy's text), real
HTTP between the vllm backend and the policy server, bubblewrap workspaces, real grading, and the
real Pi CLI for the full episode. The only stand-in is ``DirectResources`` (the resources server's
logic called in process instead of over Gym's HTTP), and a failing resources client for the
infrastructure-failure path, which cannot be provoked otherwise.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from polar_env.agent_server.core import (
    PolarAgent,
    PolarAgentConfig,
    _row_prompt,
    base_urls,
    row_task_id,
    session_policy,
)
from polar_env.agent_server.policy_server import PolicyServer, gold_policy
from polar_env.backends.base import SamplingParams
from polar_env.backends.policies import DONE as FINAL
from polar_env.backends.vllm import VllmBackend
from polar_env.episodes import episode_prompt
from polar_env.episodes.workspace import WorkspaceMounts
from polar_env.resources_server.core import (
    PolarResources,
    PolarResourcesConfig,
    SeededEpisode,
    VerifyOutcome,
    aggregate,
    attach_sandbox,
)
from polar_env.sandbox.base import SandboxSpec
from polar_env.tasks.loader import load_tasks
from polar_env.trajectory.checks import check_nemo_result

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
TASK_ID = "psf__requests-5414"


@pytest.fixture(scope="module")
def tasks():
    return {t.instance_id: t for t in load_tasks("bundled")}


# -- pure helpers ------------------------------------------------------------------------------
def test_base_urls_accepts_what_gym_and_nemo_rl_pass():
    assert base_urls("http://h:1/v1") == ["http://h:1"]
    assert base_urls(["http://a:1/v1/", "http://b:2"]) == ["http://a:1", "http://b:2"]
    assert base_urls("http://a:1/v1, http://b:2/v1") == ["http://a:1", "http://b:2"]
    assert base_urls("") == []


def test_session_policy_takes_the_trainers_sampling_over_defaults():
    default = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 8192}
    assert session_policy({"temperature": 0.6, "max_output_tokens": 300}, default) == {
        "temperature": 0.6, "top_p": 1.0, "max_tokens": 300}
    assert session_policy(None, default) == default
    assert session_policy({"top_p": None}, default) == default


def test_row_task_id_and_prompt():
    assert row_task_id({"task_id": "a"}) == "a"
    assert row_task_id({"instance_id": "b"}) == "b"
    with pytest.raises(ValueError, match="task_id"):
        row_task_id({"responses_create_params": {}})
    assert _row_prompt({"input": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}) == "u"
    assert _row_prompt({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x"}]}]}) == "x"
    assert _row_prompt({"input": "plain"}) == "plain" and _row_prompt({}) is None


def test_aggregate_resolved_rate_excludes_masked_samples():
    out = aggregate([{"reward": 1.0, "num_turns": 3}, {"reward": 0.0, "num_turns": 5},
                     {"reward": 0.0, "instance_config": {"mask_sample": True}, "num_turns": 1}])
    assert out["resolved_rate"] == 0.5 and out["masked_fraction"] == pytest.approx(1 / 3)
    assert out["mean_num_turns"] == 3.0 and out["num_samples"] == 3
    assert aggregate([]) == {"num_samples": 0}


# -- the stand-in policy server over real HTTP -------------------------------------------------
async def test_policy_server_speaks_the_vllm_wire(local_backend, renderer, tasks):
    from polar_env.backends.scripted import ScriptedBackend

    server = PolicyServer(ScriptedBackend(local_backend, gold_policy(), context_window=128), model_name="p")
    await server.start()
    backend = VllmBackend([f"http://127.0.0.1:{server.port}"], model="p")
    try:
        task = tasks[TASK_ID]
        prompt = f'tools: {{"name": "bash"}}\n{episode_prompt(task)}'
        ids = renderer.tokenizer.encode(prompt, add_special_tokens=False)
        gen = await backend.generate(ids, SamplingParams(max_tokens=2048))
        text = renderer.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        assert text.startswith("<tool_call>") and "git apply" in text and task.patch.splitlines()[0] in text
        assert len(gen.logprobs) == len(gen.token_ids) and all(math.isfinite(x) and x <= 0 for x in gen.logprobs)
        assert gen.prompt_ids == ids and gen.finish_reason == "stop"

        after = renderer.tokenizer.encode(prompt + "<tool_response>ok</tool_response>", add_special_tokens=False)
        done = await backend.generate(after, SamplingParams(max_tokens=64))
        assert renderer.tokenizer.decode(done.token_ids, skip_special_tokens=True).strip() == FINAL

        short = await backend.generate(ids, SamplingParams(max_tokens=5))
        assert len(short.token_ids) == 5 and short.finish_reason == "length"

        import aiohttp

        async with aiohttp.ClientSession() as http:
            async with http.post(f"http://127.0.0.1:{server.port}/v1/completions", json={"prompt": "text"}) as r:
                assert r.status == 400 and "token ids" in (await r.json())["error"]["message"]
    finally:
        await backend.aclose()
        await server.stop()


# -- resources core: workspace owned by one side, used by the other -----------------------------
@pytest.mark.slow
@needs_bwrap
async def test_seed_attach_verify_close(tmp_path: Path, tasks):
    resources = PolarResources(PolarResourcesConfig(scratch_root=str(tmp_path)), tasks=list(tasks.values()))
    seeded = await resources.seed("ep", TASK_ID)
    assert await resources.seed("ep", TASK_ID) == seeded  # idempotent
    with pytest.raises(ValueError, match="bound to task"):
        await resources.seed("ep", "pallets__flask-5014")
    with pytest.raises(KeyError, match="unknown task_id"):
        await resources.seed("other", "nobody__nothing-1")

    # the agent side attaches and edits through the sandbox, as a harness would
    sandbox = attach_sandbox(seeded, SandboxSpec())
    run = await sandbox.run(["patch", "-p1"], stdin=tasks[TASK_ID].patch.encode(), timeout_s=60)
    assert run.exit_code == 0, run.stderr_tail

    outcome = await resources.verify("ep")
    assert outcome.reward == 1.0 and outcome.resolved and not outcome.mask_sample
    assert outcome.patch.startswith("diff --git") and outcome.grading["fail_to_pass"]

    assert await resources.close("ep") and not Path(seeded.sandbox_root).exists()
    assert not await resources.close("ep")
    lost = await resources.verify("ep")
    assert lost.mask_sample and lost.reward == 0.0 and lost.failure_kind == "polar:lost_session"
    with pytest.raises(ValueError, match="already closed"):
        await resources.seed("ep", TASK_ID)


# -- the agent core ------------------------------------------------------------------------------
class DirectResources:
    """The resources core called in process (Gym calls it over HTTP; tests/test_nemo_gym_e2e.py does that)."""

    def __init__(self, core: PolarResources):
        self.core = core
        self.closed: list[str] = []

    async def seed(self, episode_id: str, task_id: str, *, mounts: WorkspaceMounts | None = None) -> SeededEpisode:
        return await self.core.seed(episode_id, task_id, mounts=mounts)

    async def verify(self, episode_id: str, task_id: str, *, result: dict[str, Any]) -> VerifyOutcome:
        assert result["responses_create_params"]["input"]
        return await self.core.verify(episode_id)

    async def close(self, episode_id: str) -> None:
        self.closed.append(episode_id)
        await self.core.close(episode_id)


class SeedFails(DirectResources):
    """Stand-in for a resources server that cannot create workspaces (disk full, host down)."""

    async def seed(self, episode_id: str, task_id: str, *, mounts: WorkspaceMounts | None = None) -> SeededEpisode:
        raise OSError("no space left on device")


@pytest.fixture
async def policy_url(local_backend):
    from polar_env.backends.scripted import ScriptedBackend

    server = PolicyServer(ScriptedBackend(local_backend, gold_policy(), context_window=256), model_name="polar-policy")
    await server.start()
    yield f"http://127.0.0.1:{server.port}/v1"
    await server.stop()


def _row(task) -> dict[str, Any]:
    return {"task_id": task.instance_id, "responses_create_params": {
        "input": [{"role": "user", "content": episode_prompt(task)}], "temperature": 1.0, "top_p": 1.0,
        "max_output_tokens": 2048}}


@needs_bwrap
@pytest.mark.skipif(shutil.which("npm") is None, reason="needs npm for the Pi harness")
async def test_infrastructure_failure_gives_a_masked_valid_result(tmp_path: Path, policy_url, embedded_dir, tasks):
    agent = PolarAgent(PolarAgentConfig(harness="pi", policy_base_url=policy_url, policy_model_name="polar-policy",
                                        tokenizer=str(embedded_dir), runtime_dir=str(tmp_path / "rt")))
    await agent.start()
    try:
        core = PolarResources(PolarResourcesConfig(scratch_root=str(tmp_path)), tasks=list(tasks.values()))
        result = await agent.run(_row(tasks[TASK_ID]), SeedFails(core))
        no_task = await agent.run({"responses_create_params": _row(tasks[TASK_ID])["responses_create_params"]},
                                  DirectResources(core))
    finally:
        await agent.stop()
    assert result["reward"] == 0.0 and result["mask_sample"] is True
    assert result["instance_config"]["mask_sample"] is True
    assert result["failure_kind"] == "polar:sandbox_failure" and "no space left" in result["polar"]["error"]
    assert check_nemo_result(result) == []  # a masked placeholder NeMo-RL still accepts
    assert no_task["failure_kind"] == "polar:input_error" and no_task["mask_sample"] is True
    assert check_nemo_result(no_task) == []


@pytest.mark.slow
@needs_bwrap
@pytest.mark.skipif(shutil.which("npm") is None, reason="needs npm for the Pi harness")
@pytest.mark.parametrize("harness, tool", [("pi", "bash"), ("codex", "exec_command"), ("claude-code", "Bash")])
async def test_agent_runs_a_harness_through_the_proxy_and_grades(harness, tool, tmp_path: Path, policy_url,
                                                                 embedded_dir, tasks):
    traj_file = tmp_path / "trajectories.jsonl"
    agent = PolarAgent(PolarAgentConfig(harness=harness, policy_base_url=policy_url, policy_model_name="polar-policy",
                                        tokenizer=str(embedded_dir), runtime_dir=str(tmp_path / "rt"),
                                        trajectories_path=str(traj_file), timeout_s=300))
    await agent.start()
    core = PolarResources(PolarResourcesConfig(scratch_root=str(tmp_path / "ws")), tasks=list(tasks.values()))
    resources = DirectResources(core)
    try:
        result = await agent.run(_row(tasks[TASK_ID]), resources)
    finally:
        await agent.stop()
    assert check_nemo_result(result) == [], check_nemo_result(result)
    assert result["reward"] == 1.0 and result["resolved"] and not result["mask_sample"], result["polar"]
    assert result["polar"]["status"] == "completed" and result["harness_exit_code"] == 0
    assert result["responses_create_params"]["max_output_tokens"] == 2048
    calls = [it for it in result["response"]["output"] if it["type"] == "function_call"]
    assert calls[0]["name"] == tool and "git apply" in calls[0]["arguments"]
    assert resources.closed and not core.episodes  # the workspace was released
    saved = [json.loads(line) for line in traj_file.read_text().splitlines()]
    assert len(saved) == 1 and saved[0]["reward"] == 1.0 and saved[0]["grading"]["resolved"] is True
