"""`polar rollout` at the acceptance's size: 2 bundled tasks x 2 samples at concurrency 2 give 4 graded
trajectories in 2 GRPO groups with identical first prompts; a run interrupted with Ctrl-C resumes on the
same --out without redoing finished episodes; the same job runs spread over a two-node Ray cluster
started on this machine.

The slow tests run the real command: Pi in bubblewrap, through the proxy, graded. The turns come from
the ``noop`` scripted policy (one ``ls`` tool call, then a final answer) scored by the real SmolLM2,
which keeps episodes short enough to run 12 of them in CI.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest
from trajectory_helpers import session, three_turn

from polar_env.cli import main as polar_main
from polar_env.grades import GradeResult
from polar_env.rollout.outputs import RolloutOutputs, summarize
from polar_env.rollout.plan import RolloutPlan, finished_keys, pending_episodes
from polar_env.rollout.progress import Progress
from polar_env.rollout.ray import node_ledger
from polar_env.tasks.loader import load_tasks
from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.checks import check_group, first_prompt_ids
from polar_env.trajectory.export import read_trajectories
from polar_env.trajectory.models import Trajectory

TASKS = ["pallets__flask-5014", "psf__requests-5414"]
KEYS = {f"{t}.s{k}" for t in TASKS for k in range(2)}
ARGS = [
    "--harness",
    "pi",
    "--task-ids",
    *TASKS,
    "--samples",
    "2",
    "--concurrency",
    "2",
    "--policy",
    "noop",
    "--score-window",
    "32",
    "--timeout",
    "120",
    "--max-tokens",
    "200",
]
# One torch thread per process: several scoring processes share 2 cores, where OpenMP threads spinning
# against each other made scoring ten times slower. Ray: no token auth, whatever ~/.ray holds.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}

needs_sandbox = pytest.mark.needs("bwrap", "npm")


def polar(*argv: str) -> list[str]:
    return [sys.executable, "-m", "polar_env.cli", *argv]


def trajectory(session_id: str, key: str, *, status: str = "completed", resolved: bool = False) -> Trajectory:
    traj = build_trajectory(
        session(session_id),
        three_turn(),
        status=status,
        reward=float(resolved),
        grading=GradeResult(instance_id=session_id, resolved=resolved),
    )
    traj.metadata.episode_key = key
    return traj


# -- fast ----------------------------------------------------------------------------------------
def test_outputs_survive_a_write_cut_off_by_a_kill(tmp_path: Path):
    out = tmp_path / "out"
    with RolloutOutputs(out) as outputs:
        outputs.add(trajectory("a.s0.a0", "a.s0"))
    with open(out / "trajectories.jsonl", "ab") as handle:  # what a SIGKILL mid-write leaves
        handle.write(trajectory("a.s1.a0", "a.s1").model_dump_json().encode()[:200])
    assert finished_keys(out) == {"a.s0"}

    with RolloutOutputs(out) as outputs:  # a rerun: the torn line goes, the next append starts clean
        outputs.add(trajectory("a.s1.a1", "a.s1"))
    assert [t.session_id for t in read_trajectories(out / "trajectories.jsonl")] == ["a.s0.a0", "a.s1.a1"]
    assert len((out / "nemo_results.jsonl").read_text().splitlines()) == 2


def test_pending_episodes_skip_finished_keys(tmp_path: Path):
    tasks = [t for t in load_tasks("bundled") if t.instance_id in TASKS]
    plan = RolloutPlan(tasks=tasks, samples=2, out=tmp_path)
    with RolloutOutputs(tmp_path) as outputs:
        outputs.add(trajectory(f"{TASKS[0]}.s1.a0", f"{TASKS[0]}.s1"))
    left = [(t.instance_id, k) for t, k in pending_episodes(plan)]
    assert left == [(TASKS[0], 0), (TASKS[1], 0), (TASKS[1], 1)]


def test_progress_counts_failed_and_resolved():
    progress = Progress(total=3, done=0)
    progress.update(trajectory("x", "x.s0", resolved=True))
    progress.update(trajectory("y", "y.s0", status="timeout"))
    progress.close()
    assert (progress.bar.n, progress.resolved, progress.failed) == (2, 1, 1)
    assert progress.tokens == 2 * 9  # three_turn samples 3 + 2 + 4 tokens


def test_summary_counts_grading_flags():
    flagged = [trajectory(f"t{n}", f"t{n}.s0") for n in range(3)]
    flagged[0].grading.flags = ["reset:test", "runner-output"]
    flagged[1].grading.flags = ["reset:test"]
    assert summarize(flagged)["grading_flags"] == {"reset:test": 2, "runner-output": 1}


def test_node_ledger_falls_back_to_temp_when_out_is_not_writable(tmp_path: Path):
    assert node_ledger(tmp_path / "out", "abcdef0123456789") == tmp_path / "out/ledger/nodes/abcdef012345"
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    path = node_ledger(blocked / "out", "abcdef0123456789")
    assert path.is_dir() and path.is_relative_to(tempfile.gettempdir()) and not blocked.is_dir()
    shutil.rmtree(path)


# -- slow: the real command -----------------------------------------------------------------------
def tree_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def assert_acceptance(out: Path) -> list[Trajectory]:
    """4 finished, graded episodes in 2 groups with identical first prompts, passing polar check."""
    trajectories = list(read_trajectories(out / "trajectories.jsonl"))
    assert sorted(t.metadata.episode_key for t in trajectories) == sorted(KEYS)
    for t in trajectories:
        assert t.status == "completed", (t.session_id, t.error)
        assert t.stats.calls == 2 and t.stats.chains == 1 and t.stats.trainable_tokens > 0
        assert t.reward == 0.0 and t.grading and t.grading.resolved is False  # ls fixes nothing
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        groups[t.group_id].append(t)
    assert sorted(groups) == sorted(TASKS) and all(len(g) == 2 for g in groups.values())
    for group_id, group in groups.items():
        assert check_group(group, label=group_id) == []
    assert first_prompt_ids(groups[TASKS[0]][0]) != first_prompt_ids(groups[TASKS[1]][0])
    for name in ("trajectories.jsonl", "nemo_results.jsonl", "grpo_batch.jsonl"):
        assert polar_main(["check", str(out / name)]) == 0, name
    assert len((out / "nemo_results.jsonl").read_text().splitlines()) == 4
    return trajectories


@pytest.mark.slow
@needs_sandbox
def test_rollout_resumes_after_ctrl_c_without_redoing_finished_episodes(tmp_path: Path):
    out = tmp_path / "out"
    command = polar("rollout", *ARGS, "--out", str(out))
    # SIGINT as a terminal's Ctrl-C finds it: a launcher that ran the suite in the background (nohup
    # ... &) leaves it ignored, which the child inherits, and Python then never raises KeyboardInterrupt
    proc = subprocess.Popen(
        command,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 300
        while not finished_keys(out):
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "no episode finished in 300 s"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        printed = proc.communicate(timeout=180)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "run the same command again" in printed, printed[-3000:]
    first = list(read_trajectories(out / "trajectories.jsonl"))
    assert 1 <= len(first) < 4
    first_bytes = (out / "trajectories.jsonl").read_bytes()
    sessions = out / "ledger" / "sessions"
    before = {p.name for p in sessions.iterdir()}
    digests = {t.session_id: tree_digest(sessions / t.session_id) for t in first}

    rerun = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=400)
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-3000:]
    trajectories = assert_acceptance(out)
    # finished episodes were not redone: their lines, session ids and ledgers are as they were
    assert (out / "trajectories.jsonl").read_bytes().startswith(first_bytes)
    assert {t.session_id for t in first} <= {t.session_id for t in trajectories}
    assert {sid: tree_digest(sessions / sid) for sid in digests} == digests
    # the rerun ran exactly the unfinished episodes, each as a fresh attempt beside any cut-off one
    new = {p.name for p in sessions.iterdir()} - before
    assert len(new) == 4 - len(first)
    assert {sid.rsplit(".", 1)[0] for sid in new} == KEYS - {t.metadata.episode_key for t in first}
    cut_off = before - set(digests)
    assert all(sid not in {t.session_id for t in trajectories} for sid in cut_off)


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def start_ray_node(args: list[str], log: Path) -> subprocess.Popen:
    """``ray start --block``: this test's own process, so ending it ends only this node (never ``ray stop``,
    which would stop every Ray node on the machine)."""
    p = (*free_ports(6),)
    ports = [
        f"--node-manager-port={p[0]}",
        f"--object-manager-port={p[1]}",
        f"--dashboard-agent-listen-port={p[2]}",
        f"--dashboard-agent-grpc-port={p[3]}",
        f"--runtime-env-agent-port={p[4]}",
        f"--metrics-export-port={p[5]}",
    ]
    ray = Path(sys.executable).parent / "ray"
    proc = subprocess.Popen(
        [
            str(ray),
            "start",
            *args,
            *ports,
            "--num-cpus=1",
            "--object-store-memory=100000000",
            "--disable-usage-stats",
            "--block",
        ],
        env=ENV,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # a group: the node's processes
    deadline = time.monotonic() + 120
    while "block forever" not in log.read_text():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.5)
    return proc


@pytest.fixture
def ray_cluster(tmp_path: Path):
    """A head and a worker node started on this machine; yields (address, [head, worker] processes)."""
    pytest.importorskip("ray")
    temp = Path(tempfile.mkdtemp(prefix="polar-ray-", dir="/tmp"))  # Ray's socket paths must stay short
    (gcs,) = free_ports(1)
    nodes: list[subprocess.Popen] = []
    try:
        nodes.append(
            start_ray_node(
                ["--head", f"--port={gcs}", "--include-dashboard=false", f"--temp-dir={temp}"],
                tmp_path / "head.log",
            )
        )
        nodes.append(start_ray_node([f"--address=127.0.0.1:{gcs}"], tmp_path / "worker.log"))
        yield f"127.0.0.1:{gcs}", nodes
    finally:
        for node in reversed(nodes):
            node.terminate()
        for node in nodes:
            try:
                node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                node.kill()
        shutil.rmtree(temp, ignore_errors=True)


def worker_node_id(address: str) -> str:
    """The Ray node id of the cluster's one node that is not the head (asked in a process of its own)."""
    script = (
        f"import ray; ray.init(address={address!r}, logging_level='ERROR', log_to_driver=False); "
        "print(*[n['NodeID'] for n in ray.nodes() if n['Alive'] and "
        "'node:__internal_head__' not in n['Resources']]); ray.shutdown()"
    )
    run = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=120)
    ids = run.stdout.split()
    assert run.returncode == 0 and len(ids) == 1, run.stdout + run.stderr[-2000:]
    return ids[0]


def ready_nodes(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("ray: node ")]


@pytest.mark.slow
@needs_sandbox
def test_rollout_runs_on_a_two_node_local_ray_cluster(ray_cluster, tmp_path: Path):
    address, _ = ray_cluster
    out = tmp_path / "out"
    run = subprocess.run(
        polar("rollout", *ARGS, "--out", str(out), "--ray", address),
        env=ENV,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert len(ready_nodes(run.stderr)) == 2, run.stderr[-3000:]
    trajectories = assert_acceptance(out)
    used = {t.metadata.ray_node_id for t in trajectories}
    assert len(used) == 2, "episodes ran on both nodes"
    for node_id in used:  # each node's own proxy wrote its own ledger
        ledger = out / "ledger" / "nodes" / node_id[:12] / "sessions"
        assert {t.session_id for t in trajectories if t.metadata.ray_node_id == node_id} == {
            p.name for p in ledger.iterdir()
        }


@pytest.mark.slow
@needs_sandbox
def test_ray_episodes_of_a_lost_node_move_to_the_others(ray_cluster, tmp_path: Path):
    """The worker node dies (SIGKILL, like a lost machine) while its episode runs: the driver hands the
    episode to the head node and the job still completes."""
    address, (_, worker) = ray_cluster
    out = tmp_path / "out"
    args = [*ARGS[: ARGS.index("--task-ids") + 1], TASKS[0], *ARGS[ARGS.index("--samples") :]]
    args[args.index("--concurrency") + 1] = "1"  # one episode per node
    # the gold in five calls, then graded on its node: an episode that lasts long enough to be cut short
    args[args.index("--policy") + 1] = "gold-steps"
    proc = subprocess.Popen(
        polar("rollout", *args, "--out", str(out), "--ray", address),
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        # killed the moment its episode has a session: a warm episode is over ~1.5 s later, and waiting for
        # the head's episode too let the worker's finish first
        sessions = out / "ledger" / "nodes" / worker_node_id(address)[:12] / "sessions"
        while not (sessions.is_dir() and any(sessions.iterdir())):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no episode started on the worker node"
            time.sleep(0.02)
        os.killpg(worker.pid, signal.SIGKILL)  # the node and every process it started, at once
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (stdout + stderr)[-3000:]
    assert "moving its episodes" in stderr, stderr[-3000:]
    trajectories = list(read_trajectories(out / "trajectories.jsonl"))
    assert sorted(t.metadata.episode_key for t in trajectories) == [f"{TASKS[0]}.s0", f"{TASKS[0]}.s1"]
    assert all(t.status == "completed" for t in trajectories)
    assert len({t.metadata.ray_node_id for t in trajectories}) == 1, "all finished on the surviving node"
    assert check_group(trajectories) == []
