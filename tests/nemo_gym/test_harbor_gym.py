"""A Harbor task through the real NeMo Gym: `gym env start` (ng_run) with Polar's resources server on
the terminal tasks in podman, then `gym eval run` (rollout collection): the gold policy (solve.sh through
Pi's shell tool) earns 1.0, graded by the task's own verifier in the container the agent left, and the
rollout passes `polar check`. Same server venv workaround as tests/nemo_gym/test_nemo_gym_e2e.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from gym_helpers import free_port, interruptible, stop, wait_for
from repo_paths import REPO

from polar_env.episodes import episode_prompt
from polar_env.episodes.workspace import engine_available
from polar_env.tasks.loader import load_tasks
from polar_env.trajectory.checks import check_path

GYM_VENV = REPO / ".venv-gym"
SERVER_DIRS = (
    "resources_servers/polar",
    "responses_api_agents/polar_agent",
    "environment_servers/legacy_agent",
)
TASK_ID = "fix-median-bug"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (GYM_VENV / "bin" / "ng_run").exists(), reason="needs the NeMo Gym venv (setup_nemo_gym.sh)"
    ),
    pytest.mark.skipif(not engine_available("podman"), reason="needs podman (scripts/setup_podman.sh)"),
    pytest.mark.skipif(shutil.which("npm") is None, reason="needs npm (the Pi harness)"),
]


def test_gym_collects_a_gold_rollout_of_a_harbor_task(tmp_path: Path, embedded_dir: Path):
    venvs = tmp_path / "venvs"
    for d in SERVER_DIRS:
        (venvs / d).mkdir(parents=True)
        (venvs / d / ".venv").symlink_to(GYM_VENV)
    (tmp_path / "tmp").mkdir()
    (task,) = [t for t in load_tasks("terminal") if t.instance_id == TASK_ID]
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        json.dumps(
            {
                "responses_create_params": {
                    "input": [{"role": "user", "content": episode_prompt(task)}],
                    "max_output_tokens": 2048,
                },
                "task_id": TASK_ID,
                "task_source": "polar_pi_agent",
            }
        )
        + "\n"
    )
    policy_port, head_port = free_port(), free_port()
    env = {
        **os.environ,
        "PATH": f"{GYM_VENV / 'bin'}:{os.environ['PATH']}",
        "NEMO_GYM_EXTRA_ROOTS": str(REPO / "nemo_gym_env"),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "TMPDIR": str(tmp_path / "tmp"),
        "RAY_TMPDIR": "/tmp",
    }
    env.pop("VIRTUAL_ENV", None)
    head = ["+head_server.host=127.0.0.1", f"+head_server.port={head_port}"]
    policy_log, run_log = tmp_path / "policy.log", tmp_path / "ng_run.log"
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
            "--tasks",
            "terminal",
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
                "+polar_tasks=terminal",
                "+polar_sandbox=podman",
                "+skip_venv_if_present=true",
                f"+uv_venv_dir={venvs}",
                *head,
            ],
            stdout=run_log.open("w"),
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env=env,
            start_new_session=True,
            preexec_fn=interruptible,
        )
        wait_for(run_log, "servers ready", run, 300)
        out = tmp_path / "rollouts.jsonl"
        collect = subprocess.run(
            [
                str(GYM_VENV / "bin" / "gym"),
                "eval",
                "run",
                "--no-serve",
                "+agent_name=polar_pi_agent",
                f"+input_jsonl_fpath={rows}",
                f"+output_jsonl_fpath={out}",
                "+num_samples_in_parallel=1",
                *head,
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=1500,
        )
        assert collect.returncode == 0, collect.stdout[-3000:] + collect.stderr[-3000:]
    finally:
        if run is not None:
            stop(run)
        stop(policy)
    (result,) = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    assert result["task_id"] == TASK_ID and result["reward"] == 1.0 and result["resolved"] is True
    assert result["mask_sample"] is False
    calls = [item for item in result["response"]["output"] if item["type"] == "function_call"]
    assert calls and "POLAR_SOLVE_EOF" in calls[0]["arguments"]  # solve.sh, through Pi's bash tool
    report = check_path(out)
    assert report.kind == "nemo" and report.ok, report.render()
    assert "Rollout health: 1 checked, 1 healthy" in collect.stdout
