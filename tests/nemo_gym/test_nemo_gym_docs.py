"""docs/nemo.md's CPU path, run exactly as written: the block marked ``polar:cpu-run``.

The setup block before it is what CI's scripts/test.sh already ran. The block is saved to a file
and run by bash as a user runs a pasted block from a script (not an interactive shell: nothing
added, job control only as the block itself turns it on), in a scratch copy of the clone: every
top-level entry is a symlink to the repository, so the files the commands write (logs, results,
.gym-venvs) land in the copy. TMPDIR points into the copy too, so whatever the servers leave behind
would be found. Then: the rollouts pass ``polar check`` and resolve, every log line the page
promises appears, Gym's rollout health observed its checks, the metrics say what the page says,
and nothing is left running: no process of the block's session (Ray's included), no sandbox.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from gym_helpers import interruptible, sandbox_processes
from repo_paths import REPO

from polar_env.trajectory.checks import check_path

DOC = REPO / "docs" / "nemo.md"
PORTS = (8011, 11000)
SERVER_DIRS = (
    "resources_servers/polar",
    "responses_api_agents/polar_agent",
    "environment_servers/legacy_agent",
)  # the policy server's and Gym's head server's, as the page writes them

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (REPO / ".venv-gym" / "bin" / "gym").exists(),
        reason="needs the NeMo Gym venv: run scripts/setup_nemo_gym.sh",
    ),
    pytest.mark.needs("bwrap", "npm"),
]


def documented_block(marker: str = "polar:cpu-run") -> str:
    text = DOC.read_text()
    found = re.search(rf"<!-- {re.escape(marker)}.*?-->\s*```bash\n(.*?)```", text, re.S)
    assert found, f"docs/nemo.md has no ```bash block marked {marker}"
    return found.group(1)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_the_documented_cpu_commands_collect_checked_rollouts(tmp_path: Path):
    busy = [p for p in PORTS if not _port_free(p)]
    assert not busy, f"ports {busy} are in use on 127.0.0.1; docs/nemo.md's commands need them"
    clone = tmp_path / "clone"
    clone.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in (".git", "results", "outputs", "gym.log", "policy.log"):
            (clone / entry.name).symlink_to(entry)
    if not (REPO / ".gym-venvs").exists():  # a worktree whose setup predates them: the links setup makes
        for server in SERVER_DIRS:
            (clone / ".gym-venvs" / server).mkdir(parents=True)
            (clone / ".gym-venvs" / server / ".venv").symlink_to(REPO / ".venv-gym")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    # Ray's own sockets stay under /tmp: AF_UNIX paths under a pytest tmp dir would be too long
    env.update(TMPDIR=str(tmp), RAY_TMPDIR="/tmp", RAY_USAGE_STATS_ENABLED="0")
    script = tmp_path / "cpu-run.sh"
    script.write_text(documented_block())
    output = tmp_path / "out.log"
    with output.open("w") as sink:
        proc = subprocess.Popen(
            ["bash", str(script)],
            cwd=clone,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            preexec_fn=interruptible,
        )
        _wait_or_fail(proc, clone / "gym.log", output)
    assert proc.returncode == 0, _tail(output)
    out = output.read_text(errors="replace")
    gym_log = (clone / "gym.log").read_text(errors="replace")
    context = f"{out[-4000:]}\n--- gym.log\n{gym_log[-4000:]}"

    rollouts = clone / "results" / "pi_rollouts.jsonl"
    assert rollouts.exists(), context
    results = [json.loads(line) for line in rollouts.read_text().splitlines() if line.strip()]
    assert len(results) == 4, context  # +limit=2 +num_repeats=2
    report = check_path(rollouts)  # what `polar check` prints; its exit status is the block's business
    assert report.kind == "nemo" and report.ok, report.render()
    for r in results:
        assert r["reward"] == 1.0 and r["resolved"] is True and r["mask_sample"] is False, (
            r["task_id"],
            r["failure"],
        )
        calls = [it for it in r["response"]["output"] if it["type"] == "function_call"]
        assert calls and calls[0]["name"] == "bash" and "git apply" in calls[0]["arguments"]
        usage = r["response"]["usage"]
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > 0
        assert r["seed_s"] > 0 and r["harness_s"] > 0 and r["grading_s"] > 0
    assert re.search(r"pi_rollouts\.jsonl: nemo file, 4 item\(s\)\n(?:  note: .*\n)*  OK\n", out), (
        context
    )  # polar check

    # Gym's own report: its health checks observed Polar's rollouts
    assert "Rollout health: 4 checked, 4 healthy, 0 unhealthy, 0 unobserved" in out, context
    metrics = json.loads((clone / "results" / "pi_rollouts_aggregate_metrics.json").read_text())[0][
        "agent_metrics"
    ]
    assert metrics["mean/reward"] == 1.0 and metrics["polar/resolved_rate"] == 1.0
    assert metrics["polar/masked_fraction"] == 0.0 and metrics["polar/num_rollouts"] == 4

    # every line the page promises
    assert "polar agent ready: harness pi, proxy on" in gym_log, context
    assert "polar agent stopped: every episode settled, temp state removed" in gym_log, context
    assert re.search(r"polar resources: closed \d+ open episode\(s\) at shutdown", gym_log), context
    assert "policy server ready on http://127.0.0.1:8011" in (clone / "policy.log").read_text()

    # nothing left behind: no process of the block (Ray's workers have process groups of their own, not
    # sessions), no sandbox, no temp dir, every server stopped
    assert _session_left(proc.pid) == []
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("polar-")], list(tmp.iterdir())
    assert sandbox_processes(tmp) == []
    assert all(_port_free(p) for p in PORTS)


def _session_left(sid: int, grace_s: float = 30.0) -> list[str]:
    """The processes still in session ``sid`` after ``grace_s`` (those winding down get that long)."""
    deadline = time.time() + grace_s
    while True:
        left = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[3]) == sid:  # after the command: state, ppid, pgrp, session
                left.append(f"{pid}: {cmd[:160]}")
        if not left or time.time() > deadline:
            return left
        time.sleep(1)


def _wait_or_fail(proc: subprocess.Popen, gym_log: Path, output: Path, timeout_s: float = 1500) -> None:
    """Wait for the block; if Gym dies on the way (the block's wait loop would then never end), stop it."""
    deadline = time.time() + timeout_s
    while proc.poll() is None:
        died = gym_log.exists() and "finished unexpectedly" in gym_log.read_text(errors="replace")
        if died or time.time() > deadline:
            os.killpg(proc.pid, signal.SIGINT)
            time.sleep(10)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(
                f"the documented commands {'failed' if died else 'did not finish'}:\n"
                f"{_tail(output)}\n--- gym.log\n{_tail(gym_log)}"
            )
        time.sleep(5)


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-4000:] if path.exists() else f"({path.name} missing)"
