"""Harness faults in a real episode: crash, hang, output flood, endless retries, a backend that
breaks mid-episode. Each is bounded, ends with the right status and its partial trajectory, and
leaves no process, sandbox directory or cgroup behind (counted, not assumed).

The harness is a fake (a stdlib Python script, see reliability_helpers.FAKE_HARNESS) because a real
CLI cannot be made to crash or flood on cue; it still runs as a real process in the real bubblewrap
sandbox, through the real forwarder and proxy, driven by the real ``run_episode``.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
from polar_sandbox_helpers import processes_matching
from proxy_client import make_proxy
from reliability_helpers import FakeHarness, faulty_vllm, polar_cgroups, wait_gone

from polar_env.backends.registry import make_backend
from polar_env.episodes import EpisodeSettings, run_episode, stages
from polar_env.outcomes import FailureKind
from polar_env.sandbox.bubblewrap import BubblewrapSandbox
from polar_env.tasks.loader import load_tasks

pytestmark = [pytest.mark.slow, pytest.mark.needs("bwrap")]


@pytest.fixture(scope="module")
def task():
    return next(t for t in load_tasks("bundled") if t.instance_id == "pallets__flask-5014")


async def _episode(
    renderer,
    task,
    tmp_path: Path,
    monkeypatch,
    mode: str,
    *,
    backend_mode: str = "ok",
    timeout_s: float = 20,
    env: dict[str, str] | None = None,
):
    marker = f"polar-rel-{uuid.uuid4().hex[:10]}"
    harness = FakeHarness(mode, marker, tmp_path / "install", env)
    monkeypatch.setattr(stages, "get_adapter", lambda name: harness)
    sock_dir = Path(tempfile.mkdtemp(prefix="prx-"))  # short: Unix socket paths are limited to 108 bytes
    sock_dir.chmod(0o755)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    created: list[str] = []  # sandbox names, to find their cgroups (other test runs may share the host)
    real_create = BubblewrapSandbox.create

    def recording_create(tree, **kwargs):
        sandbox = real_create(tree, **kwargs)
        created.append(sandbox.root.name)
        return sandbox

    monkeypatch.setattr(BubblewrapSandbox, "create", recording_create)
    try:
        async with faulty_vllm(renderer) as double:
            double.mode = backend_mode
            backend = make_backend("vllm", url=double.url, model="policy", timeout_s=5)
            proxy = make_proxy(
                renderer,
                backend,
                tmp_path / "data",
                admin_secret="s",
                max_context=2048,
                default_max_tokens=16,
                backend_retries=0,
            )
            await proxy.start(unix_socket=sock_dir / "proxy.sock", port=0)
            try:
                result = await run_episode(
                    proxy,
                    task,
                    episode_id=f"ep-{mode}",
                    settings=EpisodeSettings(harness="fake", timeout=timeout_s),
                    scratch_root=scratch,
                    grade=False,
                )
                calls = proxy.registry.ledger.calls(f"ep-{mode}")
            finally:
                await proxy.stop()
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)
    # cleaned up: no process, no sandbox dir, no cgroup left
    assert await wait_gone(processes_matching, marker) == []
    assert list(scratch.iterdir()) == []
    assert len(created) == 1
    assert not {g for g in polar_cgroups() if g.split("/")[1] in created}
    return result, calls


async def test_harness_crash_mid_episode(renderer, task, tmp_path: Path, monkeypatch):
    result, calls = await _episode(renderer, task, tmp_path, monkeypatch, "crash")
    assert result.harness.status == "error" and result.harness.exit_code == 3
    traj = result.trajectory
    assert traj.status == "error" and "segfault in tool runner" in traj.error
    assert traj.stats.calls == 1 and len(calls) == 1 and traj.stats.trainable_tokens > 0
    assert (
        result.failure_kind is FailureKind.harness_crashed and not traj.masked
    )  # after its first call: policy's


async def test_harness_hang_is_killed_at_the_deadline(renderer, task, tmp_path: Path, monkeypatch):
    result, calls = await _episode(renderer, task, tmp_path, monkeypatch, "hang", timeout_s=4)
    assert result.harness.status == "timeout" and result.harness.exit_code is None
    assert 3.5 < result.harness.duration_s < 20
    assert result.trajectory.status == "timeout" and result.trajectory.stats.calls == 1
    # no model call in flight at the deadline: the harness (or a command of the agent's) held the clock;
    # the agent can do that on purpose, so it is trained at 0, not masked
    assert result.failure_kind is FailureKind.deadline_harness and not result.trajectory.masked


async def test_output_flood_is_bounded(renderer, task, tmp_path: Path, monkeypatch):
    result, _ = await _episode(renderer, task, tmp_path, monkeypatch, "flood", env={"FLOOD_MB": "48"})
    run = result.harness
    assert run.status == "completed", run.error
    assert len(run.stdout_tail) <= 4 << 20  # 48 MB written, only the tail kept
    assert run.summary.finished  # the tail still holds the harness's final event
    assert result.trajectory.status == "completed"


async def test_endless_retries_stop_at_the_second_identical_failure(
    renderer, task, tmp_path: Path, monkeypatch
):
    """A harness that retries a failing call forever: the proxy stops the session at the second
    identical failure (docs/proxy.md, no retry storms) and refuses the rest before the backend."""
    result, calls = await _episode(
        renderer, task, tmp_path, monkeypatch, "retry_forever", backend_mode="500", timeout_s=4
    )
    assert result.harness.status == "timeout"  # it keeps retrying the refusals until its deadline
    traj = result.trajectory
    assert traj.status == "error" and traj.error.startswith(
        "stopped: the harness sent the same failing request"
    )
    assert len(calls) == 2 and all(c.error and "HTTP 500" in c.error for c in calls)
    assert traj.stats.failed_calls == len(calls) and traj.stats.trainable_tokens == 0
    assert traj.failure_kind is FailureKind.backend_failure and traj.masked


async def test_backend_failure_mid_episode_ends_in_error_with_partial_trajectory(
    renderer, task, tmp_path: Path, monkeypatch
):
    """The harness shrugs off a 5xx and exits 0; the episode is still ``error``, its good turn kept."""
    result, calls = await _episode(
        renderer, task, tmp_path, monkeypatch, "give_up", backend_mode="ok_then_500"
    )
    assert result.harness.status == "completed" and result.harness.summary.turns == 2
    traj = result.trajectory
    assert traj.status == "error" and "backend" in traj.error
    assert [c.error is None for c in calls] == [True, False]
    assert traj.stats.calls == 2 and traj.stats.failed_calls == 1 and traj.stats.trainable_tokens > 0
    assert traj.failure_kind is FailureKind.backend_failure and traj.masked and traj.reward == 0.0
