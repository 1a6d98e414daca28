"""Polar as a real NeMo Gym environment under the faults a training cluster sees: `gym env start`
(ng_run), `gym eval run` (ng_collect_rollouts) and `gym env test` (ng_test), all from the real
nemo-gym 0.7.0 in .venv-gym (scripts/setup_nemo_gym.sh). The clean collection path is
tests/nemo_gym/test_nemo_gym_docs.py (docs/nemo.md's commands, run as written).

One `ng_run` serves every case here. The policy is Polar's stand-in policy server (vLLM's
/v1/completions wire, the deterministic `gold` policy over the real SmolLM2). To hold a model call
in flight the test pauses the policy server with SIGSTOP — a stalled inference server, the real
thing — and sees the call waiting in the server's receive queue. Cases: concurrent seeds of one
episode; a `/run` whose client goes away mid-episode; a harness killed with a call in flight; the
collection client stopped with SIGINT. After each, nothing of the episode remains (workspace,
sandbox process, proxy session) and its rollout is masked by the documented outcome table; after
shutdown no temp dir remains either. Every server's temp state goes to the test's own TMPDIR.

Machine workaround: nemo-gym 0.7.0 wants Python >= 3.13.14 and this machine has 3.13.0, where uv
cannot build the server venvs, so every server venv is a link to .venv-gym (prebuilt with
--ignore-requires-python) and Gym is told to reuse it (skip_venv_if_present).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from gym_helpers import (
    free_port,
    harness_pids,
    interruptible,
    requests_waiting,
    sandbox_processes,
    stop,
    wait_for,
    wait_until,
)
from repo_paths import REPO
from scrape_helpers import scrape, value

from polar_env.trajectory.checks import check_nemo_result

GYM_VENV = REPO / ".venv-gym"
EXTRA_ROOT = REPO / "nemo_gym_env"
SERVER_DIRS = (
    "resources_servers/polar",
    "responses_api_agents/polar_agent",
    "environment_servers/legacy_agent",
)
EXAMPLES = EXTRA_ROOT / "resources_servers" / "polar" / "data" / "example.jsonl"
ROWS = [json.loads(line) for line in EXAMPLES.read_text().splitlines()]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (GYM_VENV / "bin" / "ng_run").exists(),
        reason="needs the NeMo Gym venv: run scripts/setup_nemo_gym.sh",
    ),
    pytest.mark.needs("bwrap", "npm"),
]


class Gym:
    """The running environment: where its servers listen and where their state lives."""

    def __init__(
        self, work: Path, env: dict[str, str], common: list[str], policy: subprocess.Popen, policy_port: int
    ):
        self.work, self.env, self.common, self.policy, self.policy_port = (
            work,
            env,
            common,
            policy,
            policy_port,
        )
        self.tmp = work / "tmp"
        self.trajectories = work / "trajectories.jsonl"
        self.urls: dict[str, str] = {}

    def discover(self, head_port: int) -> None:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{head_port}/global_config_dict_yaml", timeout=30) as r:
            config = yaml.safe_load(yaml.safe_load(r.read().decode()))
        for name in ("polar_pi_agent", "polar_resources_server"):
            block = next(iter(next(iter(config[name].values())).values()))
            self.urls[name] = f"http://{block['host']}:{block['port']}"

    def open_sessions(self) -> list[str]:
        return [p.name for p in self.tmp.glob("polar-agent-*/ledger/sessions/*")]

    def workspaces(self) -> list[str]:
        return [p.name for p in self.tmp.glob("polar-resources-*/polar-ws-*")]

    def settled(self) -> bool:
        return not self.open_sessions() and not self.workspaces() and not sandbox_processes(self.tmp)

    def recorded(self) -> list[dict]:
        text = self.trajectories.read_text() if self.trajectories.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def pause_policy(self) -> None:
        self.policy.send_signal(signal.SIGSTOP)

    def resume_policy(self) -> None:
        self.policy.send_signal(signal.SIGCONT)


@pytest.fixture(scope="module")
def gym(tmp_path_factory, embedded_dir):
    """The policy server plus `ng_run` on configs/polar_pi.yaml, torn down with SIGINT and checked clean."""
    work = tmp_path_factory.mktemp("nemo-gym")
    venvs = work / "venvs"
    for d in SERVER_DIRS:
        (venvs / d).mkdir(parents=True)
        (venvs / d / ".venv").symlink_to(GYM_VENV)
    (work / "tmp").mkdir()
    policy_port, head_port = free_port(), free_port()
    policy_log = work / "policy.log"
    policy = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "polar_env.cli",
            "policy-server",
            "--backend",
            "scripted",
            "--policy",
            "gold",
            "--port",
            str(policy_port),
            "--model-dir",
            str(embedded_dir),
        ],
        stdout=policy_log.open("w"),
        stderr=subprocess.STDOUT,
        cwd=REPO,
        start_new_session=True,
        preexec_fn=interruptible,
    )
    env = {
        **os.environ,
        "PATH": f"{GYM_VENV / 'bin'}:{os.environ['PATH']}",
        "NEMO_GYM_EXTRA_ROOTS": str(EXTRA_ROOT),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "TMPDIR": str(work / "tmp"),
        "RAY_TMPDIR": "/tmp",
    }  # Ray's AF_UNIX socket paths under a pytest tmp dir would be too long
    env.pop("VIRTUAL_ENV", None)
    common = ["+head_server.host=127.0.0.1", f"+head_server.port={head_port}"]
    g = Gym(work, env, common, policy, policy_port)
    agent = "+polar_pi_agent.responses_api_agents.polar_agent"
    run_log = work / "ng_run.log"
    run = None
    try:
        wait_for(policy_log, "policy server ready", policy, 120)
        run = subprocess.Popen(
            [
                str(GYM_VENV / "bin" / "ng_run"),
                f"+config_paths=[{REPO / 'configs' / 'polar_pi.yaml'}]",
                f"+policy_base_url=http://127.0.0.1:{policy_port}/v1",
                "+policy_api_key=none",
                "+policy_model_name=polar-policy",
                f"+polar_model_dir={embedded_dir}",
                f"{agent}.trajectories_path={g.trajectories}",
                f"{agent}.timeout=600",
                "+skip_venv_if_present=true",
                f"+uv_venv_dir={venvs}",
                *common,
            ],
            stdout=run_log.open("w"),
            stderr=subprocess.STDOUT,
            cwd=work,
            env=env,
            start_new_session=True,
            preexec_fn=interruptible,
        )
        wait_for(run_log, "All 3 / 3 servers ready", run, 300)
        g.discover(head_port)
        yield g
    finally:
        g.resume_policy()
        if run is not None:
            stop(run)
        stop(policy, signal.SIGTERM, 30)
    # shutdown: every server settled its episodes and removed its temp state
    log = run_log.read_text(errors="replace")
    assert "polar agent stopped: every episode settled, temp state removed" in log, log[-4000:]
    assert not [p.name for p in (work / "tmp").iterdir() if p.name.startswith("polar-")]
    assert sandbox_processes(work / "tmp") == []


def _post(url: str, body: dict, timeout_s: float = 900) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _row(i: int = 0) -> dict:
    return {
        **ROWS[i],
        "responses_create_params": {**ROWS[i]["responses_create_params"], "max_output_tokens": 2048},
    }


def test_concurrent_seeds_of_one_episode_make_one_workspace(gym):
    url = gym.urls["polar_resources_server"]
    body = {"episode_id": "twin-1", "task_id": ROWS[0]["task_id"]}
    replies: list[tuple[int, dict]] = []
    threads = [
        threading.Thread(target=lambda: replies.append(_post(f"{url}/seed_session", body))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [status for status, _ in replies] == [200, 200], replies
    assert replies[0][1]["sandbox_root"] == replies[1][1]["sandbox_root"]
    assert len(gym.workspaces()) == 1
    assert _post(f"{url}/close_session", {"resources_session_id": "twin-1"})[0] == 200
    assert gym.settled()
    # bad requests: a 4xx with the reason, never a 500
    status, reply = _post(f"{url}/seed_session", {"episode_id": "x", "task_id": "nobody__nothing-1"})
    assert status == 404 and "unknown task_id" in reply["detail"]
    status, reply = _post(gym.urls["polar_pi_agent"] + "/run", {**_row(), "task_id": ""})
    assert status == 422 and "task_id" in reply["detail"]
    status, reply = _post(
        gym.urls["polar_pi_agent"] + "/run",
        {**_row(), "responses_create_params": {**_row()["responses_create_params"], "temperature": -1}},
    )
    assert status == 422 and "temperature" in reply["detail"]


def test_masked_rollouts_survive_gyms_aggregation(gym):
    """Gym leaves masked rollouts out of every quality metric (compute_metrics never sees them);
    the agent's aggregation still counts them."""
    rollouts = [
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0, "mask_sample": False},
        {
            "_ng_task_index": 0,
            "_ng_rollout_index": 1,
            "reward": 0.0,
            "mask_sample": True,
            "failure_kind": "polar:harness_killed",
        },
        {"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 0.0, "mask_sample": False},
    ]
    status, metrics = _post(gym.urls["polar_pi_agent"] + "/aggregate_metrics", {"verify_responses": rollouts})
    assert status == 200, metrics
    agent = metrics["agent_metrics"]
    assert agent["mean/reward"] == 0.5  # over the two unmasked rollouts
    assert (
        agent["polar/masked_fraction"] == pytest.approx(1 / 3) and agent["polar/masked/harness_killed"] == 1
    )
    assert metrics["key_metrics"]["polar/num_masked"] == 1


def _start_run_and_hold_a_call(gym) -> None:
    """With the policy server paused, wait until the episode's first model call waits on it."""
    wait_until(
        lambda: requests_waiting(gym.policy_port) > 0, 300, "a model call waiting on the paused policy"
    )


def test_a_run_cancelled_mid_episode_settles_masked(gym):
    """The client goes away (a timeout, a dropped connection): the episode still closes everything."""
    before = len(gym.recorded())
    host, port = gym.urls["polar_pi_agent"].removeprefix("http://").split(":")
    body = json.dumps(_row(1)).encode()
    gym.pause_policy()
    try:
        with socket.create_connection((host, int(port))) as client:
            client.sendall(
                b"POST /run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            _start_run_and_hold_a_call(gym)
            assert gym.open_sessions() and gym.workspaces()
        # the client is gone
    finally:
        gym.resume_policy()
    wait_until(gym.settled, 120, "the cancelled episode to settle")
    wait_until(lambda: len(gym.recorded()) > before, 60, "the cancelled episode's trajectory")
    traj = gym.recorded()[-1]
    failure = traj["metadata"]["failure"]
    assert failure["kind"] == "cancelled" and failure["component"] == "client" and failure["stage"] == "agent"
    assert failure["in_flight_call"] == 0 and "model call #0 in flight" in failure["cause"]
    assert traj["metadata"]["mask_sample"] is True and traj["reward"] == 0.0


def test_a_harness_killed_with_a_call_in_flight_is_graded_as_a_kill(gym):
    """A kill the supervisor cannot tell from the agent's own (it can kill its harness): graded, not
    masked."""
    answer: list[tuple[int, dict]] = []
    gym.pause_policy()
    try:
        worker = threading.Thread(
            target=lambda: answer.append(_post(gym.urls["polar_pi_agent"] + "/run", _row(2)))
        )
        worker.start()
        _start_run_and_hold_a_call(gym)
        victims = harness_pids(gym.tmp)
        assert len(victims) == 1, victims
        os.kill(victims[0], signal.SIGKILL)
    finally:
        gym.resume_policy()
    worker.join(600)
    status, result = answer[0]
    assert status == 200, result
    assert check_nemo_result(result) == []
    assert (
        result["mask_sample"] is False
        and result["reward"] == 0.0
        and result["failure_kind"] == "polar:harness_killed"
    )
    failure = result["failure"]
    assert (
        failure["component"] == "harness"
        and failure["signal"] == "SIGKILL"
        and failure["in_flight_call"] == 0
    )
    assert failure["cause"] == "harness killed by SIGKILL with model call #0 in flight", failure
    assert "POLAR_FORWARDER_READY" not in result["polar"]["error"]
    wait_until(gym.settled, 60, "the killed episode to settle")


def test_the_agent_is_scraped_twice_during_a_run(gym):
    """Prometheus scrapes the Gym agent (docs/rollout.md "Watching a run"): once while an episode is
    in its run stage, once after it finished; parsed by prometheus_client's own parser, the counters
    moved and the histograms filled between the two."""
    url = gym.urls["polar_pi_agent"] + "/metrics"
    before = scrape(url)
    answer: list[tuple[int, dict]] = []
    worker = threading.Thread(
        target=lambda: answer.append(_post(gym.urls["polar_pi_agent"] + "/run", _row(0)))
    )
    worker.start()
    during = before
    while worker.is_alive() and value(during, "polar_episodes_in_stage", stage="run") < 1:
        time.sleep(0.1)
        during = scrape(url)
    worker.join(600)
    after = scrape(url)
    assert answer[0][0] == 200 and answer[0][1]["reward"] == 1.0, answer
    assert value(during, "polar_episodes_in_stage", stage="run") == 1, "no scrape caught the episode running"
    assert ("polar_backend_calls_in_flight", ()) in during
    assert ("polar_inference_busy_fraction", ()) in during and value(
        during, "polar_inference_busy_fraction"
    ) <= 1.0
    assert 0.0 < value(after, "polar_inference_busy_fraction") <= 1.0
    for name in (
        "polar_generation_tokens_total",
        "polar_prompt_tokens_total",
        "polar_model_call_duration_seconds_count",
    ):
        assert value(after, name, api="chat") > value(during, name, api="chat"), name
    assert value(after, "polar_model_call_duration_seconds_bucket", api="chat", le="+Inf") > 0
    for name in ("polar_grading_duration_seconds_count", "polar_sandbox_start_duration_seconds_count"):
        assert value(after, name) == value(before, name) + 1, name
    assert (
        value(after, "polar_episodes_total", failure_kind="none", masked="false")
        == value(before, "polar_episodes_total", failure_kind="none", masked="false") + 1
    )
    assert value(after, "polar_run_accepted_episodes") >= 1
    wait_until(gym.settled, 60, "the scraped episode to settle")


def test_sigint_of_the_collection_client_leaves_nothing_behind(gym):
    before = len(gym.recorded())
    rows = gym.work / "two.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS[3:5]))
    gym.pause_policy()
    try:
        client = subprocess.Popen(
            [
                str(GYM_VENV / "bin" / "ng_collect_rollouts"),
                "+agent_name=polar_pi_agent",
                f"+input_jsonl_fpath={rows}",
                f"+output_jsonl_fpath={gym.work / 'interrupted.jsonl'}",
                "+limit=null",
                "+num_repeats=1",
                "+num_samples_in_parallel=2",
                *gym.common,
            ],
            cwd=gym.work,
            env=gym.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=interruptible,
        )
        wait_until(
            lambda: requests_waiting(gym.policy_port) >= 2, 300, "both episodes' first calls in flight"
        )
        stop(client, signal.SIGINT, 120)
    finally:
        gym.resume_policy()
    wait_until(gym.settled, 180, "the interrupted episodes to settle")
    wait_until(lambda: len(gym.recorded()) >= before + 2, 60, "the interrupted episodes' trajectories")
    for traj in gym.recorded()[before:]:
        assert traj["metadata"]["failure"]["kind"] == "cancelled" and traj["metadata"]["mask_sample"] is True


def _get(url: str, headers: dict[str, str] | None = None) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_agents_polar_routes_require_the_admin_secret(gym):
    """The trainer's weight-sync routes (pause, resume, the version) answer only with the secret; a
    generated one is in the agent's runtime dir, as its start-up line says."""
    url = gym.urls["polar_pi_agent"]
    (secret_file,) = gym.tmp.glob("polar-agent-*/admin_secret")
    assert "/polar/* admin secret in" in (gym.work / "ng_run.log").read_text(errors="replace")
    secret = secret_file.read_text()
    assert _get(f"{url}/polar/policy") == 401
    assert _get(f"{url}/polar/policy", {"Authorization": "Bearer wrong"}) == 401
    assert _post(f"{url}/polar/pause", {"timeout_s": 5})[0] == 401
    assert (
        _post(f"{url}/polar/resume", {})[0] == 401 and _post(f"{url}/polar/policy", {"version": 3})[0] == 401
    )
    assert _get(f"{url}/polar/policy", {"Authorization": f"Bearer {secret}"}) == 200


def test_the_policy_servers_version_moving_mid_episode_shows_in_polar_check(gym, tmp_path):
    """A trainer swaps weights on the policy server (vLLM's /update_weight_version) while an episode runs;
    nobody tells the agent: each call records the server's label, and ``polar check`` shows the spread."""
    policy = f"http://127.0.0.1:{gym.policy_port}"
    assert _post(f"{policy}/update_weight_version", {"new_version": "1"})[0] == 200
    answer: list[tuple[int, dict]] = []
    try:
        worker = threading.Thread(
            target=lambda: answer.append(_post(gym.urls["polar_pi_agent"] + "/run", _row(3)))
        )
        worker.start()
        wait_until(
            lambda: any(
                p.read_text().strip() for p in gym.tmp.glob("polar-agent-*/ledger/sessions/*/calls.jsonl")
            ),
            300,
            "the episode's first model call",
        )
        assert (
            _post(f"{policy}/update_weight_version", {"new_version": "2"})[0] == 200
        )  # the gold policy's tool runs
        worker.join(600)
    finally:
        _post(f"{policy}/update_weight_version", {"new_version": "default"})
    status, result = answer[0]
    assert status == 200, result
    assert result["polar"]["policy_versions"] == [1, 2] and result["policy_version_spread"] == 1
    assert result["unversioned_calls"] == 0
    (tmp_path / "run.jsonl").write_text(json.dumps(result) + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "polar_env.cli", "check", str(tmp_path / "run.jsonl")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (
        "policy versions 1..2 over 1 episode(s): spread within an episode max 1, 1 span an update"
        in proc.stdout
    ), proc.stdout + proc.stderr
    wait_until(gym.settled, 60, "the episode to settle")


@pytest.mark.parametrize(
    "entrypoint, validate", [("resources_servers/polar", True), ("responses_api_agents/polar_agent", False)]
)
def test_gym_env_test_on_polar_servers(gym, entrypoint, validate):
    proc = subprocess.run(
        [
            str(GYM_VENV / "bin" / "ng_test"),
            f"+entrypoint={entrypoint}",
            f"+should_validate_data={str(validate).lower()}",
            "+skip_venv_if_present=true",
            f"+uv_venv_dir={gym.work / 'venvs'}",
        ],
        cwd=gym.work,
        env=gym.env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout[-6000:], proc.stderr[-3000:])
    assert " passed" in proc.stdout and " failed" not in proc.stdout
    if validate:
        assert "has been successfully validated" in proc.stdout
