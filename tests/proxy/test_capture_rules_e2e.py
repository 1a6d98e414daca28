"""The capture rules and the admin API on real episodes: Pi in bubblewrap, through the proxy, graded.

- ``polar rollout --admin HOST:PORT``: the docs' curl commands (docs/training.md) set the version, pause
  the fence while an episode is between its calls and resume it with the next version; the episode's calls
  carry both and ``polar check`` shows the spread. A request without the secret is refused.
- One group of two rollouts of one task run in process: one answers at once (a single model call: flagged,
  and masked because the run asks ``mask_single_call``), the other's second turn comes back without
  logprobs (kept as context, mask 0, counted). The turns come from scripted policies scored by the real
  SmolLM2, as in tests/rollout/test_rollout.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gym_helpers import free_port

from polar_env.backends.base import Generation
from polar_env.backends.scripted import ScriptedBackend
from polar_env.harness_adapters.policies import final_answer, shell_call
from polar_env.rollout.config import RolloutConfig
from polar_env.rollout.plan import plan_from_config
from polar_env.rollout.runner import prepare, proxy_factory, run_rollouts
from polar_env.trajectory.checks import check_path
from polar_env.trajectory.export import read_trajectories

TASK = "psf__requests-5414"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

pytestmark = [pytest.mark.slow, pytest.mark.needs("bwrap", "npm")]


def _curl(*args: str, env: dict[str, str]) -> dict:
    """The docs' command, run by the shell as a user would type it."""
    out = subprocess.run(["bash", "-c", " ".join(args)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_rollout_admin_pause_bump_and_resume_by_curl(tmp_path: Path):
    port, secret = free_port(), "s3cret-for-the-test"
    env = {**ENV, "POLAR_ADMIN_SECRET": secret, "PROXY": f"http://127.0.0.1:{port}", "S": secret}
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "polar_env.cli",
            "rollout",
            "--harness",
            "pi",
            "--task-ids",
            TASK,
            "--samples",
            "1",
            "--policy",
            "gold-steps",
            "--score-window",
            "32",
            "--timeout",
            "300",
            "--max-tokens",
            "2000",
            "--out",
            str(out),
            "--admin",
            f"127.0.0.1:{port}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    try:
        while not any("admin API on" in line for line in lines):
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "".join(lines)
            lines.append(line)
        shown = next(line for line in lines if "admin API on" in line)
        assert (
            f"http://127.0.0.1:{port}/admin" in shown
            and "$POLAR_ADMIN_SECRET" in shown
            and secret not in shown
        )
        # docs/training.md, as written
        assert (
            _curl(
                f'curl -s -X POST http://127.0.0.1:{port}/admin/policy -H "Authorization: Bearer '
                '$POLAR_ADMIN_SECRET"',
                """-d '{"version": 7}'""",
                env=env,
            )["version"]
            == 7
        )
        refused = subprocess.run(
            [
                "curl",
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "-X",
                "POST",
                f"http://127.0.0.1:{port}/admin/pause",
            ],
            capture_output=True,
            text=True,
        )
        assert refused.stdout == "401"
        calls = out / "ledger" / "sessions"
        deadline = time.monotonic() + 240
        while not any(p.read_text().strip() for p in calls.glob("*/calls.jsonl")):  # the episode's first call
            assert time.monotonic() < deadline and proc.poll() is None, "no model call recorded"
            time.sleep(0.05)
        report = _curl(
            'curl -s -X POST $PROXY/admin/pause -H "Authorization: Bearer $S"',
            """-d '{"timeout_s": 300, "in_flight": "finish"}'""",
            env=env,
        )
        assert report["drained"] is True
        time.sleep(3)  # the harness runs its tool and asks again: that call waits at the fence
        # (five calls, so the pause lands between two of them however fast this machine runs the tools)
        resumed = _curl(
            'curl -s -X POST $PROXY/admin/resume -H "Authorization: Bearer $S"',
            """-d '{"version": 8}'""",
            env=env,
        )
        assert resumed["version"] == 8 and resumed["window"]["version_before"] == 7
        rest, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, "".join(lines) + rest
    (traj,) = read_trajectories(out / "trajectories.jsonl")
    versions = [c.policy_version for c in traj.calls]
    assert len(versions) == 5 and versions == sorted(versions) and set(versions) == {7, 8}, versions
    assert {c.version_source for c in traj.calls} == {"trainer"}
    assert resumed["window"]["held_calls"] == 1
    notes = " | ".join(check_path(out / "nemo_results.jsonl").notes)
    assert "policy versions 7..8 over 1 episode(s): spread within an episode max 1, 1 span an update" in notes


class DropsLogprobs(ScriptedBackend):
    """Test double: no real server sends sampled ids without their logprobs on demand, so the second
    call of sample 1 comes back without them (what a misaligned server reply becomes, backends/remote.py)."""

    async def generate(self, prompt_ids, sampling, *, session_id=None) -> Generation:
        number = self.answers.calls[session_id]
        gen = await super().generate(prompt_ids, sampling, session_id=session_id)
        return (
            gen.model_copy(update={"logprobs": []}) if ".s1." in (session_id or "") and number == 1 else gen
        )


def one_call_or_two(session_id: str | None, call_number: int, prompt_text: str) -> str:
    """Sample 0 answers at once (one model call); sample 1 runs one tool first."""
    if ".s0." in (session_id or "") or "<tool_response>" in prompt_text:
        return final_answer(prompt_text)
    return shell_call(prompt_text, "ls /testbed")


def test_single_call_rollouts_are_flagged_and_masked_and_unaligned_turns_are_context(
    tmp_path: Path, local_backend
):
    config = RolloutConfig(
        harness="pi",
        task_ids=[TASK],
        samples=2,
        concurrency=2,
        timeout=300,
        max_tokens=200,
        out=tmp_path / "run",
        mask_single_call=True,
    )
    plan = plan_from_config(config)
    prepare(plan)
    backend = DropsLogprobs(local_backend, one_call_or_two, context_window=32)
    import asyncio

    trajectories = sorted(
        asyncio.run(run_rollouts(plan, proxy_factory(config, backend=backend))), key=lambda t: t.session_id
    )
    single, tooled = trajectories
    assert single.stats.single_call and single.stats.calls == 1 and single.masked
    assert single.metadata.masked_because == "single_call" and single.failure_kind.value == "empty_patch"
    assert not tooled.stats.single_call and not tooled.masked and tooled.stats.calls == 2
    assert tooled.stats.context_only_turns == 1 and "logprobs_unaligned" in tooled.calls[1].flags
    chain = tooled.chains[tooled.main_chain]
    (span,) = [s for s in chain.spans if s.kind == "unscored"]
    assert span.call_index == 1 and not any(chain.loss_mask[span.start : span.end])
    assert any(chain.loss_mask)  # the first turn still trains
    report = check_path(config.out / "nemo_results.jsonl")
    assert any("1 rollout(s) made a single model call" in w and "all masked" in w for w in report.warnings)
    assert any("1 turn(s) in 1 episode(s) had no aligned logprobs" in n for n in report.notes)
    summary = json.loads((config.out / "summary.json").read_text())
    assert (
        summary["single_call_rollouts"] == 1 and summary["context_only_turns"] == 1 and summary["masked"] == 1
    )
    assert summary["logprobs_mode"] == ["raw"]  # the start-up probe: scripted answers are scored raw
