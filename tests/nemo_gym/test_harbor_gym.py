"""Tasks in containers through the real NeMo Gym: `gym env start` (ng_run) with Polar's resources server
in podman, then `gym eval run` (rollout collection), the gold policy earning 1.0 and the rollout passing
`polar check`:

- a Harbor task (the terminal tasks): solve.sh through Pi's shell tool, graded by the task's own verifier
  in the container the agent left;
- a dataset's row (``polar_tasks=swe-gym:FILE.jsonl``, SWE-Gym's schema, on its local stand-in image:
  tests/dataset_standins.py): the gold patch through Pi's edit tool, graded in the image by SWE-Gym's
  procedure (its conda env activated), strict.

Same server venv workaround as tests/nemo_gym/test_nemo_gym_e2e.py."""

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


def swe_gym_rows(tmp_path: Path) -> str:
    """A file of one SWE-Gym row (the bundled requests task in SWE-Gym's schema), its stand-in image built
    under the name SWE-Gym's loader gives it; the task spec naming it."""
    from dataset_standins import standin_row

    from polar_env.tasks.loader import load_bundled

    (bundled,) = [t for t in load_bundled() if t.instance_id == "psf__requests-5414"]
    row = standin_row(bundled, "swe-gym")
    path = tmp_path / "swe-gym-rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return f"swe-gym:{path}"


@pytest.mark.parametrize("source", ["harbor", "swe-gym"])
def test_gym_collects_a_gold_rollout_of_a_task_in_a_container(
    source: str, tmp_path: Path, embedded_dir: Path
):
    venvs = tmp_path / "venvs"
    for d in SERVER_DIRS:
        (venvs / d).mkdir(parents=True)
        (venvs / d / ".venv").symlink_to(GYM_VENV)
    (tmp_path / "tmp").mkdir()
    tasks = "terminal" if source == "harbor" else swe_gym_rows(tmp_path)
    task_id = TASK_ID if source == "harbor" else "psf__requests-5414"
    (task,) = [t for t in load_tasks(tasks) if t.instance_id == task_id]
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        json.dumps(
            {
                "responses_create_params": {
                    "input": [{"role": "user", "content": episode_prompt(task)}],
                    "max_output_tokens": 2048,
                },
                "task_id": task_id,
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
            tasks,
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
                f"+polar_tasks='{tasks}'",
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
    assert result["task_id"] == task_id and result["reward"] == 1.0 and result["resolved"] is True
    assert result["mask_sample"] is False
    calls = [item for item in result["response"]["output"] if item["type"] == "function_call"]
    if source == "harbor":
        assert calls and "POLAR_SOLVE_EOF" in calls[0]["arguments"]  # solve.sh, through Pi's bash tool
    else:  # the gold patch through Pi's own tools, graded by SWE-Gym's procedure in its image
        assert any("models.py" in c["arguments"] for c in calls), calls  # the file the gold patch fixes
        assert result["polar"]["failure_kind"] == "none", result["polar"]
    report = check_path(out)
    assert report.kind == "nemo" and report.ok, report.render()
    assert "Rollout health: 1 checked, 1 healthy" in collect.stdout
