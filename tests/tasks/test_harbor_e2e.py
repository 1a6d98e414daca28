"""Harbor tasks end to end in podman: the verifier contract against a hostile agent, a verifier that
writes no reward (masked, its own kind), and `polar rollout` gold and no-op episodes on the terminal
tasks for two harnesses, checked by `polar check`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import repo_paths
from own_containers import own_containers

from polar_env.episodes.workspace import engine_available, open_workspace
from polar_env.rewards.harbor_verifier import verify
from polar_env.sandbox.base import SandboxSpec
from polar_env.tasks.harbor import load_task_dir
from polar_env.tasks.loader import TERMINAL_DIR
from polar_env.tasks.runtime import check_image

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not engine_available("podman"), reason="needs podman (scripts/setup_podman.sh)"),
]
ENGINE = "podman"
FIXTURES = repo_paths.FIXTURES / "harbor"
NO_REWARD = FIXTURES / "no-reward"


def _polar(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "polar_env.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_agent_cannot_read_tests_or_solution_nor_plant_a_reward():
    """In the episode the agent's uid finds neither tests/ nor solution/ anywhere; a reward it plants
    (in a /logs the image left writable, and from a process it leaves running) does not survive, nor
    does one a process left by test.sh writes later, nor one from a process test.sh left disguised as
    the container's keep-alive (`sleep infinity`), nor a program, a python module or a user-site .pth it
    plants where the image's PATH, PYTHONPATH and its HOME lead (test.sh runs `mkdir` and `python3`): the
    task's test.sh writes none, so the verifier reports no_reward, not a planted 1. test.sh ran as the
    agent's uid (the task names no verifier user), not root. The real keep-alive (its pid recorded at
    the start) survives."""
    task = load_task_dir(NO_REWARD)
    check_image(task, ENGINE)
    ws = await open_workspace(task, SandboxSpec(), sandbox=ENGINE)
    try:
        box = ws.sandbox
        assert box.keepalive_pid is not None  # the --init's child, the container's `sleep infinity`
        look = await box.run(
            [
                "sh",
                "-c",
                "ls /tests /solution 2>&1; find / -xdev \\( -name test.sh -o -name "
                "solve.sh \\) 2>/dev/null; id -u",
            ],
            timeout_s=120,
        )
        assert "No such file or directory" in look.stdout_tail  # /solution; /tests is the host's, unreadable
        assert "cannot open directory '/tests': Permission denied" in look.stdout_tail
        assert "test.sh" not in look.stdout_tail.replace("/tests", "") and "solve.sh" not in look.stdout_tail
        assert look.stdout_tail.split()[-1] == "1000"
        plant = await box.run(
            [
                "sh",
                "-c",
                "echo 1 > /logs/verifier/reward.txt; echo '{\"reward\": 1}' > "
                "/logs/verifier/reward.json; (nohup sh -c 'while :; do echo 1 > "
                "/logs/verifier/reward.txt; done' >/dev/null 2>&1 &)",
            ],
            timeout_s=60,
        )
        # the image left /logs writable, but /logs/verifier is a host directory no uid of the container may
        # write
        assert "/logs/verifier/reward.txt: Permission denied" in plant.stderr_tail, plant
        writer = "os.system('echo 1 > /logs/verifier/reward.txt 2>/dev/null')"  # the dir refuses it now
        plant = await box.run(
            [
                "sh",
                "-c",
                "mkdir -p /app/bin /app/lib && printf '#!/bin/sh\\necho 1 > "
                '/logs/verifier/reward.txt; exec /bin/mkdir "$@"\\n\' > /app/bin/mkdir && '
                f'chmod +x /app/bin/mkdir && echo "import os; {writer}" > /app/lib/json.py && '
                "site=$(python3 -m site --user-site) && /bin/mkdir -p $site && "
                f'echo "import os; {writer}" > $site/polar.pth && '
                "sh -c 'command -v mkdir' && python3 -c 'import json; print(json.__file__)'",
            ],
            timeout_s=60,
        )
        # the agent's own commands find what it planted (the image's PATH, PYTHONPATH, its HOME)
        assert plant.stdout_tail.split()[:2] == ["/app/bin/mkdir", "/app/lib/json.py"], plant
        result = await verify(task, box)  # type: ignore[arg-type]
        assert result.failure_kind == "no_reward" and result.reward == 0.0 and not result.resolved, result
        assert "wrote neither" in result.error
        # the process test.sh left to write a reward 3 s later was killed before the reward was read
        left = await box.run(
            [
                "sh",
                "-c",
                "sleep 5; ls -A /logs/verifier; cat /tmp/verifier/uid; stat -c %U /tests/test.sh; "
                "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done | grep -c '^sleep "
                f"infinity'; tr '\\0' ' ' < /proc/{box.keepalive_pid}/cmdline",
            ],
            timeout_s=60,
        )
        # nothing planted survived or ran; test.sh ran as the agent's uid; the tests are the host root's (no
        # uid of the container's: `nobody`); one `sleep infinity` is left: the keep-alive
        assert left.stdout_tail.split() == ["1000", "nobody", "1", "sleep", "infinity"], left.stdout_tail
    finally:
        await ws.close()


async def test_the_agent_and_its_verifier_run_as_the_tasks_agent_user():
    """`[agent] user = "tester"` (uid 1234 in the task's image): the agent's commands run as it, it
    owns the workdir, and test.sh (no `[verifier] user`) runs as it too, so the task's reward is 1."""
    task = load_task_dir(FIXTURES / "agent-user")
    ws = await open_workspace(task, SandboxSpec(), sandbox=ENGINE)
    try:
        done = await ws.sandbox.run(
            ["sh", "-c", "id -u; stat -c %u .; echo done > /app/done.txt"], timeout_s=60
        )
        assert done.stdout_tail.split() == ["1234", "1234"], done
        assert ws.ref.uid == 1234  # what another process attaching to the workspace runs as
        result = await verify(task, ws.sandbox)  # type: ignore[arg-type]
        assert result.reward == 1.0 and result.failure_kind == "none", result
    finally:
        await ws.close()


def _containers() -> set[str]:
    return own_containers(ENGINE)


async def test_a_separate_verifier_runs_in_a_fresh_container_with_only_the_artifacts():
    """`environment_mode = "separate"`: test.sh runs in a fresh container of the environment image
    that holds only the artifact task.toml lists (/app/out, less its *.tmp files, links dropped), not
    the rest of the agent's container, with what its `[[verifier.collect]]` hooks wrote there first (one as
    the agent, one as root: Harbor's `user`); it is
    removed afterwards. An artifact the agent did not leave
    is skipped: its verifier says 0, not an error."""
    task = load_task_dir(FIXTURES / "separate-verifier")
    assert task.harbor.config.verifier.separate
    ws = await open_workspace(task, SandboxSpec(), sandbox=ENGINE)
    try:
        before = _containers()
        result = await verify(task, ws.sandbox)  # type: ignore[arg-type]
        assert result.reward == 0.0 and result.failure_kind == "none", result  # no /app/out to carry over
        made = await ws.sandbox.run(
            [
                "sh",
                "-c",
                "mkdir -p /app/out && echo done > /app/out/result.txt && "
                "echo x > /app/elsewhere.txt && echo t > /app/out/skip.tmp && "
                "ln -s /etc/passwd /app/out/link && echo made",
            ],
            timeout_s=60,
        )
        assert "made" in made.stdout_tail
        result = await verify(task, ws.sandbox)  # type: ignore[arg-type]
        assert result.reward == 1.0 and result.failure_kind == "none", result
        assert _containers() == before  # the verifier's containers are gone, the agent's is still there
        left = await ws.sandbox.run(["ls", "/app"], timeout_s=60)
        assert "elsewhere.txt" in left.stdout_tail, left
        assert list(ws.sandbox.host_dir("/logs/verifier").iterdir()) == []  # the verifier wrote elsewhere
    finally:
        await ws.close()


async def test_a_compose_main_service_is_built_and_run_with_its_environment():
    """environment/docker-compose.yaml with only `main`: its build context and dockerfile are built,
    and the container runs with its environment and working_dir (test.sh checks all of it: reward 1)."""
    task = load_task_dir(FIXTURES / "compose-main")
    ws = await open_workspace(task, SandboxSpec(), sandbox=ENGINE)
    try:
        assert task.image.startswith("localhost/polar-harbor/compose-main:"), task.image
        done = await ws.sandbox.run(["sh", "-c", "echo done > /srv/done.txt && pwd"], timeout_s=60)
        assert done.stdout_tail.split() == ["/srv"], done
        result = await verify(task, ws.sandbox)  # type: ignore[arg-type]
        assert result.reward == 1.0 and result.failure_kind == "none", result
    finally:
        await ws.close()


def test_rollout_with_a_verifier_that_writes_no_reward_is_masked(tmp_path: Path):
    out = tmp_path / "out"
    proc = _polar(
        "rollout",
        "--tasks",
        str(NO_REWARD),
        "--sandbox",
        ENGINE,
        "--policy",
        "answer",
        "--harness",
        "pi",
        "--out",
        str(out),
        "--score-window",
        "256",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (traj,) = _rows(out / "trajectories.jsonl")
    assert traj["failure_kind"] == "no_reward" and traj["masked"] is True, traj.get("grading")
    assert traj["grading"]["mode"] == "harbor"


@pytest.mark.parametrize(
    ("harness", "gold_task", "noop_task"),
    [("pi", "fix-median-bug", "csv-region-totals"), ("codex", "csv-region-totals", "fix-median-bug")],
)
def test_gold_and_noop_rollouts_on_terminal_tasks(
    harness: str, gold_task: str, noop_task: str, tmp_path: Path
):
    """`polar rollout --tasks <harbor dir>`: solve.sh through the harness's shell tool earns 1.0, the
    no-op policy does not; `polar check` accepts both outputs (one episode each: the closing note has
    all six tasks, gold and no-op)."""
    for policy, tid in (("gold", gold_task), ("noop", noop_task)):
        out = tmp_path / policy
        proc = _polar(
            "rollout",
            "--tasks",
            str(TERMINAL_DIR),
            "--task-ids",
            tid,
            "--sandbox",
            ENGINE,
            "--policy",
            policy,
            "--harness",
            harness,
            "--out",
            str(out),
            "--score-window",
            "256",
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        (traj,) = _rows(out / "trajectories.jsonl")
        assert traj["task_id"] == tid and traj["metadata"]["workspace"] == ENGINE
        assert traj["grading"]["mode"] == "harbor"
        if policy == "gold":
            assert traj["reward"] == 1.0 and traj["failure_kind"] == "none", traj["grading"]
        else:
            assert traj["reward"] != 1.0 and not traj["masked"], traj["grading"]
        if tid == "csv-region-totals":  # its multi-key reward.json is kept whole on the trajectory
            assert set(traj["grading"]["rewards"]) == {"reward", "regions_correct"}
        check = _polar("check", str(out / "nemo_results.jsonl"), timeout=300)
        assert check.returncode == 0 and "OK" in check.stdout, check.stdout + check.stderr


def test_polar_eval_grades_a_prediction_for_a_harbor_task(tmp_path: Path):
    """`polar eval` of patches: applied in a fresh container of the task's image, then its verifier."""
    task = load_task_dir(TERMINAL_DIR / "fix-median-bug")
    base = (task.harbor.environment_dir / "app" / "stats.py").read_text()
    fixed = base.replace(
        "    return ordered[len(ordered) // 2]\n",
        "    n = len(ordered)\n    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n "
        "// 2]) / 2\n",
    )
    fixed = fixed.replace(
        "    return max(counts, key=counts.get)\n",
        "    top = max(counts.values())\n    return min(v for v, c in counts.items() if c == top)\n",
    )
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "stats.py").write_text(base)
    (tmp_path / "b" / "stats.py").write_text(fixed)
    diff = subprocess.run(
        ["git", "diff", "--no-index", "a/stats.py", "b/stats.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    ).stdout
    patch = diff.replace("a/a/stats.py", "a/stats.py").replace("b/b/stats.py", "b/stats.py")
    preds = tmp_path / "preds.jsonl"
    preds.write_text(
        "".join(
            json.dumps({"instance_id": iid, "model_patch": p, "model_name_or_path": "t"}) + "\n"
            for iid, p in (("fix-median-bug", patch), ("top-ips-from-log", ""))
        )
    )
    proc = _polar(
        "eval",
        "--tasks",
        "terminal",
        "--predictions",
        str(preds),
        "--sandbox",
        ENGINE,
        "--out",
        str(tmp_path / "report.json"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["resolved_ids"] == ["fix-median-bug"] and report["unresolved_ids"] == ["top-ips-from-log"]
    assert report["error_instances"] == 0
