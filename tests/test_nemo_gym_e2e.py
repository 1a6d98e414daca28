"""Polar as a real NeMo Gym environment: `gym env start` (ng_run), `gym eval run` (ng_collect_rollouts)
and `gym env test` (ng_test), all from the real nemo-gym 0.7.0 in .venv-gym (scripts/setup_nemo_gym.sh).

The policy is Polar's stand-in policy server (vLLM's /v1/completions wire) with the deterministic
`gold` policy: the real SmolLM2 scores a bash tool call that applies the task's fix, so Pi really
runs a tool in its sandbox, the proxy records real token ids and logprobs, and grading really
runs the task's tests. Every result must pass the NeMo-RL contract check with a graded reward,
and each task's group must share its first prompt token for token.

Machine workaround: nemo-gym 0.7.0 wants Python >= 3.13.14 and this machine has 3.13.0, where
uv cannot build the server venvs, so every server venv is a link to .venv-gym (prebuilt with
--ignore-requires-python) and Gym is told to reuse it (skip_venv_if_present).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polar_env.trajectory.checks import check_group, check_nemo_result, check_path

REPO = Path(__file__).resolve().parents[1]
GYM_VENV = REPO / ".venv-gym"
EXTRA_ROOT = REPO / "nemo_gym_env"
SERVER_DIRS = ("resources_servers/polar", "responses_api_agents/polar_agent", "environment_servers/legacy_agent")
REPEATS = 2

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (GYM_VENV / "bin" / "ng_run").exists(),
                       reason="needs the NeMo Gym venv: run scripts/setup_nemo_gym.sh"),
    pytest.mark.skipif(shutil.which("bwrap") is None or shutil.which("npm") is None, reason="needs bubblewrap and npm"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(path: Path, needle: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if needle in text:
            return
        if proc.poll() is not None:
            pytest.fail(f"process exited {proc.returncode} before {needle!r}:\n{text[-6000:]}")
        time.sleep(1)
    pytest.fail(f"no {needle!r} within {timeout_s}s:\n{path.read_text(errors='replace')[-6000:]}")


def _stop(proc: subprocess.Popen, sig: int = signal.SIGINT, timeout_s: float = 60) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def gym(tmp_path_factory, embedded_dir):
    """The policy server plus `ng_run` on configs/polar_pi.yaml; yields (env, common Gym overrides, workdir)."""
    work = tmp_path_factory.mktemp("nemo-gym")
    venvs = work / "venvs"
    for d in SERVER_DIRS:
        (venvs / d).mkdir(parents=True)
        (venvs / d / ".venv").symlink_to(GYM_VENV)
    policy_port, head_port = _free_port(), _free_port()
    policy_log = work / "policy.log"
    policy = subprocess.Popen([sys.executable, "-m", "polar_env.agent_server.policy_server", "--backend", "scripted",
                               "--policy", "gold", "--port", str(policy_port), "--model-dir", str(embedded_dir)],
                              stdout=policy_log.open("w"), stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    env = {**os.environ, "PATH": f"{GYM_VENV / 'bin'}:{os.environ['PATH']}", "NEMO_GYM_EXTRA_ROOTS": str(EXTRA_ROOT),
           "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("VIRTUAL_ENV", None)
    common = ["+head_server.host=127.0.0.1", f"+head_server.port={head_port}"]
    run_log = work / "ng_run.log"
    run = None
    try:
        _wait_for(policy_log, "policy server ready", policy, 120)
        run = subprocess.Popen(
            [str(GYM_VENV / "bin" / "ng_run"), f"+config_paths=[{REPO / 'configs' / 'polar_pi.yaml'}]",
             f"+policy_base_url=http://127.0.0.1:{policy_port}/v1", "+policy_api_key=none",
             "+policy_model_name=polar-policy", f"+polar_tokenizer={embedded_dir}",
             "+skip_venv_if_present=true", f"+uv_venv_dir={venvs}", *common],
            stdout=run_log.open("w"), stderr=subprocess.STDOUT, cwd=work, env=env, start_new_session=True)
        _wait_for(run_log, "All 3 / 3 servers ready", run, 300)
        yield env, common, work
    finally:
        if run is not None:
            _stop(run)
        _stop(policy, signal.SIGTERM, 30)


def test_rollout_collection_through_ng_run(gym):
    env, common, work = gym
    out = work / "rollouts.jsonl"
    proc = subprocess.run(
        [str(GYM_VENV / "bin" / "ng_collect_rollouts"), "+agent_name=polar_pi_agent",
         f"+input_jsonl_fpath={EXTRA_ROOT / 'resources_servers/polar/data/example.jsonl'}",
         f"+output_jsonl_fpath={out}", "+limit=null", f"+num_repeats={REPEATS}", "+num_samples_in_parallel=3",
         *common],
        cwd=work, env=env, capture_output=True, text=True, timeout=480)
    assert proc.returncode == 0, (proc.stdout[-4000:], proc.stderr[-4000:],
                                  (work / "ng_run.log").read_text(errors="replace")[-4000:])
    results = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    assert len(results) == 5 * REPEATS
    for r in results:
        assert check_nemo_result(r) == [], (r["task_id"], check_nemo_result(r))
        # the reward comes from grading: the gold fix resolves the task, none is masked
        assert r["reward"] == 1.0 and r["resolved"] is True and r["mask_sample"] is False, \
            (r["task_id"], r.get("failure_kind"), r.get("failure_reason"), r["polar"])
        assert r["polar"]["harness"] == "pi" and r["polar"]["status"] == "completed"
        calls = [it for it in r["response"]["output"] if it["type"] == "function_call"]
        assert calls and calls[0]["name"] == "bash" and "git apply" in calls[0]["arguments"]
        assert r["num_calls"] >= 2 and r["trainable_fraction"] == 1.0
    assert {r["task_id"] for r in results} == {json.loads(line)["task_id"] for line in
                                               (EXTRA_ROOT / "resources_servers/polar/data/example.jsonl")
                                               .read_text().splitlines()}
    groups: dict[str, list[dict]] = {}
    for r in results:
        groups.setdefault(r["polar"]["group_id"], []).append(r)
    assert sorted(len(g) for g in groups.values()) == [REPEATS] * 5
    for group_id, members in groups.items():
        assert check_group(members, label=group_id) == []
    report = check_path(out)  # the file as a whole: contract per line, groups by task
    assert report.kind == "nemo" and report.ok, report.render()
    metrics = json.loads((work / "rollouts_aggregate_metrics.json").read_text())
    assert metrics and metrics[0]["agent_metrics"]["mean/reward"] == 1.0


@pytest.mark.parametrize("entrypoint, validate", [("resources_servers/polar", True),
                                                 ("responses_api_agents/polar_agent", False)])
def test_gym_env_test_on_polar_servers(gym, entrypoint, validate):
    env, _, work = gym
    proc = subprocess.run(
        [str(GYM_VENV / "bin" / "ng_test"), f"+entrypoint={entrypoint}", f"+should_validate_data={str(validate).lower()}",
         "+skip_venv_if_present=true", f"+uv_venv_dir={work / 'venvs'}"],
        cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout[-6000:], proc.stderr[-3000:])
    assert " passed" in proc.stdout and " failed" not in proc.stdout
    if validate:
        assert "has been successfully validated" in proc.stdout
