"""Polar's NeMo Gym server logic without nemo-gym: the agent core, the resources core, the policy server.

Real parts throughout: the SmolLM2 tokenizer and model (scoring the scripted policy's text), real
HTTP between the vllm backend and the policy server, bubblewrap workspaces, real grading, and the
real Pi CLI for the full episode. The only stand-in is ``DirectResources`` (the resources server's
logic called in process instead of over Gym's HTTP), and a failing resources client for the
infrastructure-failure path, which cannot be provoked otherwise.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from polar_sandbox_helpers import processes_matching
from reliability_helpers import wait_gone

from polar_env.agent_server.core import (
    InputError,
    PolarAgent,
    PolarAgentConfig,
    _row_prompt,
    row_sampling,
    row_settings,
    row_task_id,
)
from polar_env.backends.base import SamplingParams
from polar_env.backends.vllm import VllmBackend
from polar_env.cli.policy_server import PolicyServer, gold_policy
from polar_env.episodes import episode_prompt
from polar_env.episodes.settings import EpisodeSettings
from polar_env.episodes.timings import TIMING_KEYS
from polar_env.harness_adapters.policies import DONE as FINAL
from polar_env.proxy.settings import base_urls
from polar_env.resources_server import core as resources_core
from polar_env.resources_server.core import (
    EpisodeConflict,
    PolarResources,
    PolarResourcesConfig,
    UnknownTask,
    VerifyOutcome,
    aggregate,
    attach_sandbox,
    masked_metrics,
)
from polar_env.sandbox.base import SandboxSpec
from polar_env.tasks.loader import load_tasks
from polar_env.trajectory.checks import check_nemo_result
from polar_env.wire.gym_resources import SeedSessionResponse, WorkspaceMounts
from polar_env.wire.nemo_gym import RunResult

needs_bwrap = pytest.mark.needs("bwrap")
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


def test_row_settings_take_the_trainers_sampling_over_the_config():
    config = EpisodeSettings(temperature=1.0, top_p=1.0, max_tokens=8192)
    assert row_settings({"temperature": 0.6, "max_output_tokens": 300}, config).sampling() == {
        "temperature": 0.6,
        "top_p": 1.0,
        "max_tokens": 300,
    }
    assert row_settings(None, config) == config
    assert row_settings({"top_p": None}, config) == config


def test_row_task_id_and_prompt():
    assert row_task_id({"task_id": "a"}) == "a"
    assert row_task_id({"instance_id": "b"}) == "b"
    with pytest.raises(ValueError, match="task_id"):
        row_task_id({"responses_create_params": {}})
    assert (
        _row_prompt({"input": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}) == "u"
    )
    assert _row_prompt({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x"}]}]}) == "x"
    assert _row_prompt({"input": "plain"}) == "plain" and _row_prompt({}) is None


def test_aggregate_resolved_rate_excludes_masked_samples():
    rollouts = [
        {"reward": 1.0, "num_turns": 3},
        {"reward": 0.0, "num_turns": 5},
        {
            "reward": 0.0,
            "instance_config": {"mask_sample": True},
            "num_turns": 1,
            "failure_kind": "polar:harness_killed",
        },
    ]
    out = aggregate(rollouts)
    assert out["resolved_rate"] == 0.5 and out["mean_num_turns"] == 3.0 and out["num_samples"] == 3
    assert aggregate([]) == {"num_samples": 0}
    # Gym gives compute_metrics only unmasked rollouts; the masked ones are counted over all of them
    assert masked_metrics(rollouts) == {
        "num_rollouts": 3,
        "num_masked": 1,
        "masked_fraction": pytest.approx(1 / 3),
        "masked/harness_killed": 1,
    }


def test_row_checks_give_input_errors_not_crashes():
    assert row_sampling({"responses_create_params": {"temperature": 0.0, "top_p": 1, "max_output_tokens": 5}})
    for bad, field in (
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_output_tokens": 2.5}, "max_output_tokens"),
        ({"temperature": "hot"}, "temperature"),
    ):
        with pytest.raises(InputError, match=field):
            row_sampling({"responses_create_params": bad})
    with pytest.raises(InputError, match="task_id"):
        row_task_id({"task_id": ""})


def test_a_harness_killed_by_a_signal_is_named_not_an_exit_code(tmp_path: Path):
    """The sandbox's forwarder runs the harness as its child: a SIGKILLed harness must read as that."""
    import subprocess
    import sys

    from polar_env.harness_adapters.runner import killed_by
    from polar_env.sandbox.forwarder import __file__ as forwarder

    proc = subprocess.run(
        [
            sys.executable,
            forwarder,
            "--socket",
            str(tmp_path / "none.sock"),
            "--port",
            "0",
            "--",
            "sh",
            "-c",
            "kill -KILL $$",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 128 + 9 and killed_by(proc.returncode, proc.stderr) == "SIGKILL", proc.stderr
    assert killed_by(-15, "") == "SIGTERM"  # the sandbox process itself died of a signal
    assert killed_by(1, "POLAR_FORWARDER_READY 127.0.0.1:18080\n") is None  # an ordinary failure


def test_the_janitor_removes_a_killed_servers_temp_state(tmp_path: Path):
    """Gym SIGKILLs a server that is not gone a second after SIGINT: its temp dir must go anyway, and
    as host root the mounts beneath it (a sandbox's tmpfs with a view inside, the proxy's socket
    tmpfs: they were left mounted, the removal stopping at each mount point)."""
    import os
    import subprocess
    import sys
    import time

    from polar_env.sandbox.views import mount_tmpfs, socket_dir, unmount

    state = tmp_path / "polar-agent-x"
    (state / "ledger").mkdir(parents=True)
    if os.geteuid() == 0:
        (state / "sandbox").mkdir()
        mount_tmpfs(state / "sandbox", 1 << 20, "polar-sandbox")
        (state / "sandbox" / "views").mkdir()
        mount_tmpfs(state / "sandbox" / "views", 1 << 20, "polar-sandbox")
        assert socket_dir(state / "sock")
    code = (
        "import os, signal, sys; from pathlib import Path; from polar_env.janitor import Janitor; "
        "j = Janitor(Path(sys.argv[1])); print('ready', flush=True); os.kill(os.getpid(), signal.SIGKILL)"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, str(state)], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == -9 and "ready" in proc.stdout
        deadline = time.time() + 30
        while state.exists() and time.time() < deadline:
            time.sleep(0.1)
        assert not state.exists()
        assert str(state) not in Path("/proc/self/mountinfo").read_text()
    finally:  # what a failing janitor left
        for point in (state / "sandbox", state / "sock"):
            if os.path.ismount(point):
                unmount(point)


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
        assert len(gen.logprobs) == len(gen.token_ids) and all(
            math.isfinite(x) and x <= 0 for x in gen.logprobs
        )
        assert gen.prompt_ids == ids and gen.finish_reason == "stop"

        after = renderer.tokenizer.encode(
            prompt + "<tool_response>ok</tool_response>", add_special_tokens=False
        )
        done = await backend.generate(after, SamplingParams(max_tokens=64))
        assert renderer.tokenizer.decode(done.token_ids, skip_special_tokens=True).strip() == FINAL

        short = await backend.generate(ids, SamplingParams(max_tokens=5))
        assert len(short.token_ids) == 5 and short.finish_reason == "length"

        import aiohttp

        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"http://127.0.0.1:{server.port}/v1/completions", json={"prompt": "text"}
            ) as r:
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
    with pytest.raises(UnknownTask, match="unknown task_id"):
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


async def _until(condition) -> None:
    async with asyncio.timeout(60):  # a state that never comes fails the test instead of hanging it
        while not condition():
            await asyncio.sleep(0.005)


@needs_bwrap
async def test_concurrent_seeds_of_one_episode_make_one_workspace(tmp_path: Path, tasks, monkeypatch):
    resources = PolarResources(PolarResourcesConfig(scratch_root=str(tmp_path)), tasks=list(tasks.values()))
    try:
        first, second = await asyncio.gather(resources.seed("ep", TASK_ID), resources.seed("ep", TASK_ID))
        assert first == second and len(list(tmp_path.glob("polar-resources-*/polar-ws-*"))) == 1
        assert Path(first.sandbox_root).parent.name.startswith(
            "polar-ws-"
        )  # every trace under the workspace dir

        # The seeds below are held at the workspace's opening until the test lets them go, so a cancel or a
        # close lands mid-seed for certain (a warm base opens in well under the 50 ms a sleep used to give).
        gate, real_open = asyncio.Event(), resources_core.open_workspace

        async def held_open(*args, **kwargs):
            await gate.wait()
            return await real_open(*args, **kwargs)

        monkeypatch.setattr(resources_core, "open_workspace", held_open)

        # a caller cancelled mid-seed (client gone) leaves the seed to finish; close removes what it made
        caller = asyncio.ensure_future(resources.seed("ep2", TASK_ID))
        await _until(lambda: "ep2" in resources._seeding)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        gate.set()
        await _until(
            lambda: "ep2" in resources.episodes and "ep2" not in resources._seeding
        )  # its done callback ran
        assert resources.open_episodes == 2
        await resources.close("ep2")
        assert resources.open_episodes == 1 and len(list(tmp_path.glob("polar-resources-*/polar-ws-*"))) == 1

        # a close that arrives while the seed is still running: the seed is refused, nothing stays
        gate.clear()
        racing = asyncio.ensure_future(resources.seed("ep3", TASK_ID))
        await _until(lambda: "ep3" in resources._seeding)
        closing = asyncio.ensure_future(resources.close("ep3"))
        await _until(lambda: "ep3" in resources.closed)
        gate.set()
        assert await closing is False  # the seed removed what it made itself
        with pytest.raises(EpisodeConflict, match="closed"):
            await racing
        with pytest.raises(UnknownTask, match="unknown task_id"):
            await resources.seed("ep4", "nobody__nothing-1")
    finally:  # a failed check must not leave workspaces mounted
        await resources.aclose()
    assert resources.open_episodes == 0 and not any(tmp_path.iterdir())


# -- the agent core ------------------------------------------------------------------------------
class DirectResources:
    """The resources core called in process (Gym calls it over HTTP; tests/nemo_gym/test_nemo_gym_e2e.py does
    that)."""

    def __init__(self, core: PolarResources):
        self.core = core
        self.closed: list[str] = []

    async def seed(
        self, episode_id: str, task_id: str, *, mounts: WorkspaceMounts | None = None
    ) -> SeedSessionResponse:
        return await self.core.seed(episode_id, task_id, mounts=mounts)

    async def verify(self, episode_id: str, task_id: str, *, result: RunResult) -> VerifyOutcome:
        assert result.responses_create_params["input"]
        return await self.core.verify(episode_id)

    async def close(self, episode_id: str) -> None:
        self.closed.append(episode_id)
        await self.core.close(episode_id)


class SeedFails(DirectResources):
    """Stand-in for a resources server that cannot create workspaces (disk full, host down)."""

    async def seed(
        self, episode_id: str, task_id: str, *, mounts: WorkspaceMounts | None = None
    ) -> SeedSessionResponse:
        raise OSError("no space left on device")


@pytest.fixture
async def policy_url(local_backend):
    from polar_env.backends.scripted import ScriptedBackend

    server = PolicyServer(
        ScriptedBackend(local_backend, gold_policy(), context_window=256), model_name="polar-policy"
    )
    await server.start()
    yield f"http://127.0.0.1:{server.port}/v1"
    await server.stop()


def _row(task) -> dict[str, Any]:
    return {
        "task_id": task.instance_id,
        "responses_create_params": {
            "input": [{"role": "user", "content": episode_prompt(task)}],
            "temperature": 1.0,
            "top_p": 1.0,
            "max_output_tokens": 2048,
        },
    }


@needs_bwrap
@pytest.mark.skipif(shutil.which("npm") is None, reason="needs npm for the Pi harness")
async def test_failures_before_the_harness_are_masked_with_their_cause(
    tmp_path: Path, policy_url, embedded_dir, tasks
):
    agent = PolarAgent(
        PolarAgentConfig(
            harness="pi", backend="vllm", url=policy_url, model_name="polar-policy", model_dir=embedded_dir
        )
    )
    await agent.start()
    runtime_dir = agent.runtime_dir
    assert runtime_dir is not None and runtime_dir.name.startswith("polar-agent-")
    core = PolarResources(PolarResourcesConfig(scratch_root=str(tmp_path)), tasks=list(tasks.values()))
    try:
        broken = (await agent.run(_row(tasks[TASK_ID]), SeedFails(core))).row()
        unknown = (
            await agent.run({**_row(tasks[TASK_ID]), "task_id": "nobody__nothing-1"}, DirectResources(core))
        ).row()
        with pytest.raises(InputError, match="temperature"):
            await agent.run(
                {**_row(tasks[TASK_ID]), "responses_create_params": {"temperature": -1}},
                DirectResources(core),
            )
        assert agent.open_sessions == 0 and not list((runtime_dir / "ledger" / "sessions").iterdir())
    finally:
        await agent.stop()
    assert not runtime_dir.exists()  # the agent's temp state goes with it
    for result in (broken, unknown):
        assert result["reward"] == 0.0 and result["mask_sample"] is True
        timings = result["polar"]["timings"]  # the rollout's schema, its top-level keys read from it
        assert tuple(timings) == TIMING_KEYS and timings["prepare_s"] > 0
        assert (result["seed_s"], result["duration_s"]) == (timings["prepare_s"], timings["total_s"])
        assert result["instance_config"]["mask_sample"] is True
        assert check_nemo_result(result) == []  # a masked placeholder NeMo-RL still accepts
    assert broken["failure_kind"] == "polar:sandbox_failure" and "no space left" in broken["polar"]["error"]
    assert broken["failure"]["stage"] == "seed" and broken["failure"]["component"] == "resources_server"
    # an unknown task is the request's fault, and says so
    assert (
        unknown["failure_kind"] == "polar:input_error"
        and "unknown task_id 'nobody__nothing-1'" in unknown["failure_reason"]
        and unknown["failure"]["component"] == "request"
    )
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
@needs_bwrap
@pytest.mark.skipif(shutil.which("npm") is None, reason="needs npm for the Pi harness")
@pytest.mark.parametrize(
    "harness, tool", [("pi", "bash"), ("codex", "exec_command"), ("claude-code", "Bash")]
)
async def test_agent_runs_a_harness_through_the_proxy_and_grades(
    harness, tool, tmp_path: Path, policy_url, embedded_dir, tasks
):
    traj_file = tmp_path / "trajectories.jsonl"
    agent = PolarAgent(
        PolarAgentConfig(
            harness=harness,
            backend="vllm",
            url=policy_url,
            model_name="polar-policy",
            model_dir=embedded_dir,
            runtime_dir=str(tmp_path / "rt"),
            trajectories_path=str(traj_file),
            timeout=300,
        )
    )
    await agent.start()
    core = PolarResources(PolarResourcesConfig(scratch_root=str(tmp_path / "ws")), tasks=list(tasks.values()))
    resources = DirectResources(core)
    try:
        result = (await agent.run(_row(tasks[TASK_ID]), resources)).row()
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
    # one timings schema: the trajectory's metadata and the /run result carry the same, seed to close
    timings = result["polar"]["timings"]
    assert saved[0]["metadata"]["timings"] == timings and tuple(timings) == TIMING_KEYS
    assert result["grading_s"] == timings["grade_s"] > 0 and timings["close_s"] > 0 and timings["model_s"] > 0


@pytest.mark.slow
@needs_bwrap
@pytest.mark.skipif(shutil.which("npm") is None, reason="needs npm for the Pi harness")
async def test_run_slots_hold_the_policy_server_at_its_concurrency_per_call(
    tmp_path: Path, policy_url, embedded_dir, tasks
):
    """Two Pi episodes live at once, one run slot: the policy server never has two calls at once,
    calls wait at the proxy for the slot (not in the harness's deadline), and both still resolve.
    The backend and the slots are wrapped only to count: the real ones answer."""
    agent = PolarAgent(
        PolarAgentConfig(
            harness="pi",
            backend="vllm",
            url=policy_url,
            model_name="polar-policy",
            model_dir=embedded_dir,
            runtime_dir=str(tmp_path / "rt"),
            timeout=300,
            max_concurrent_episodes=2,
            run_slots=1,
        )
    )
    await agent.start()
    engine = agent.proxy.engine
    assert engine.run_slots is not None and engine.run_slots.n == 1
    generate, enter = engine.backend.generate, engine.run_slots.enter
    inflight, most, waits = [0], [0], []

    async def counted(*args, **kwargs):
        inflight[0] += 1
        most[0] = max(most[0], inflight[0])
        try:
            return await generate(*args, **kwargs)
        finally:
            inflight[0] -= 1

    async def timed(session_id: str, *, harness: bool = True) -> float:
        waits.append(await enter(session_id, harness=harness))
        return waits[-1]

    engine.backend.generate, engine.run_slots.enter = counted, timed
    core = PolarResources(PolarResourcesConfig(scratch_root=str(tmp_path / "ws")), tasks=list(tasks.values()))
    try:
        results = await asyncio.gather(
            *(agent.run(_row(tasks[TASK_ID]), DirectResources(core)) for _ in range(2))
        )
    finally:
        await agent.stop()
    rows = [r.row() for r in results]
    assert all(r["reward"] == 1.0 and not r["mask_sample"] for r in rows), [r["polar"] for r in rows]
    assert most[0] == 1 and len(waits) >= 4 and max(waits) > 0  # one call at a time, and some waited for it
    assert not core.episodes


class HeldResources(DirectResources):
    """The resources core in process, with ``/seed_session`` or ``/verify`` held at a gate (so the test
    can cancel the caller in that stage), or ``/verify`` failing as a grader bug would (a crash cannot
    be made to happen on cue)."""

    def __init__(self, core: PolarResources, hold: str | None = None, crash: bool = False):
        super().__init__(core)
        self.hold, self.crash = hold, crash
        self.reached, self.gate = asyncio.Event(), asyncio.Event()

    async def _held(self, stage: str) -> None:
        if self.hold == stage:
            self.reached.set()
            await self.gate.wait()

    async def seed(
        self, episode_id: str, task_id: str, *, mounts: WorkspaceMounts | None = None
    ) -> SeedSessionResponse:
        await self._held("seed")
        return await super().seed(episode_id, task_id, mounts=mounts)

    async def verify(self, episode_id: str, task_id: str, *, result: RunResult) -> VerifyOutcome:
        await self._held("verification")
        if self.crash:
            raise RuntimeError("grader bug: index out of range")
        return await super().verify(episode_id, task_id, result=result)


@pytest.mark.slow
@needs_bwrap
@pytest.mark.skipif(shutil.which("npm") is None, reason="needs npm for the Pi harness")
@pytest.mark.parametrize(
    "fault", ["cancel-seed", "cancel-agent", "stop-agent", "cancel-verification", "grader-crash"]
)
async def test_a_fault_in_each_stage_settles_and_leaves_nothing_behind(
    fault: str, tmp_path: Path, policy_url, embedded_dir, tasks
):
    """The Gym agent's episode through the lifecycle's stages, with a fault in each: the /run caller
    gone while the workspace is seeded, while the harness waits on a model call (held in the policy
    server's backend, which the wrapper only delays) and while the resources server grades; the agent
    server shut down mid-run; a grader that raises. Each ends as a recorded trajectory with its cause
    and stage (a grade in flight finishes: settling is never interrupted), and leaves no open
    session, workspace or sandbox process."""
    kind_of_fault, stage = fault.split("-", 1)
    traj_file, scratch = tmp_path / "trajectories.jsonl", tmp_path / "ws"
    agent = PolarAgent(
        PolarAgentConfig(
            harness="pi",
            backend="vllm",
            url=policy_url,
            model_name="polar-policy",
            model_dir=embedded_dir,
            runtime_dir=str(tmp_path / "rt"),
            timeout=300,
            trajectories_path=str(traj_file),
            run_slots=1,
        )
    )
    await agent.start()
    core = PolarResources(PolarResourcesConfig(scratch_root=str(scratch)), tasks=list(tasks.values()))
    resources = HeldResources(
        core, hold=stage if stage in ("seed", "verification") else None, crash=kind_of_fault == "grader"
    )
    generate, call_held, release_call = agent.proxy.engine.backend.generate, asyncio.Event(), asyncio.Event()

    async def held_call(*args, **kwargs):
        if stage == "agent":
            call_held.set()
            await release_call.wait()
        return await generate(*args, **kwargs)

    agent.proxy.engine.backend.generate = held_call
    stopped = False
    try:
        caller = asyncio.ensure_future(agent.run(_row(tasks[TASK_ID]), resources))
        if kind_of_fault == "grader":
            row = (await caller).row()
        else:
            async with asyncio.timeout(120):
                await (call_held if stage == "agent" else resources.reached).wait()
            if stage == "agent":
                await asyncio.sleep(
                    0.5
                )  # the episode sees its harness's first call (booted) and starts its run stage
            if kind_of_fault == "stop":
                stopping = asyncio.ensure_future(agent.stop())
                stopped = True
            else:
                caller.cancel()
            release_call.set()
            resources.gate.set()
            if kind_of_fault == "stop":
                await stopping
                row = (await caller).row()  # the episode settles, masked, before the server goes
            else:
                with pytest.raises(asyncio.CancelledError):
                    await caller
                await _until(lambda: not agent._settling and not agent._playing)
    finally:
        release_call.set()
        resources.gate.set()
        if not stopped:
            await agent.stop()
    recorded = [json.loads(line) for line in traj_file.read_text().splitlines()]
    assert len(recorded) == 1
    traj = recorded[0]
    failure = traj["metadata"]["failure"]
    if stage == "verification" and kind_of_fault == "cancel":  # the grade in flight finished: a real result
        assert failure is None and traj["reward"] == 1.0 and traj["metadata"]["mask_sample"] is False
    else:
        expected = {
            "cancel-seed": ("cancelled", "seed", "client"),
            "cancel-agent": ("cancelled", "agent", "client"),
            "stop-agent": ("cancelled", "agent", "agent_server"),
            "grader-crash": ("infrastructure", "verification", "grader"),
        }[fault]
        assert (failure["kind"], failure["stage"], failure["component"]) == expected, failure
        assert traj["metadata"]["mask_sample"] is True and traj["reward"] == 0.0
        if fault == "cancel-agent":
            assert failure["in_flight_call"] == 0 and "model call #0 in flight" in failure["cause"]
        if kind_of_fault == "grader":
            assert "grader bug: index out of range" in failure["cause"] and row["mask_sample"] is True
    if kind_of_fault == "stop":
        assert row["failure"]["component"] == "agent_server" and row["mask_sample"] is True
    assert traj["calls"] or stage == "seed"  # what the proxy captured is kept
    assert resources.closed and not core.episodes and not core._seeding
    assert not list(scratch.glob("polar-resources-*/polar-ws-*"))
    await core.aclose()  # its janitor (a process naming the scratch dir) goes too
    assert await wait_gone(processes_matching, str(scratch)) == []  # no sandbox process binds a workspace
    assert not (tmp_path / "rt" / "ledger" / "sessions").exists() or not list(
        (tmp_path / "rt" / "ledger" / "sessions").iterdir()
    )
