"""The failure kinds and the reward/mask table (docs/outcomes.md): every class of the table is
classified from the records an episode leaves, rewarded/masked as documented, overridable per run;
an episode with no tokens or a failure outside the policy is exported as a masked placeholder,
never dropped from nemo_results.jsonl and never trained on at reward 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from http_double import never_answering_completions
from repo_paths import REPO
from trajectory_helpers import call, session, three_turn, timed

from polar_env.outcomes import (
    DEFAULT_OUTCOMES,
    FailureKind,
    Outcome,
    OutcomeTable,
    classify_episode,
    explain_deadline,
    final_kind,
)
from polar_env.rollout.outputs import RolloutOutputs, finish_outputs, masked_lines
from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.checks import check_nemo_result, check_path

DOCS = REPO / "docs" / "outcomes.md"


def failed(index: int, kind: FailureKind, error: str):
    return call(index, [1, 2], [], error=error).model_copy(update={"failure_kind": kind})


# -- classification ------------------------------------------------------------------------------
def test_each_harness_ending_is_classified():
    ok = three_turn()
    assert classify_episode("completed", ok) is FailureKind.none
    assert classify_episode("error", ok) is FailureKind.harness_crashed
    assert classify_episode("error", []) is FailureKind.harness_start_failed
    assert (
        classify_episode("completed", []) is FailureKind.harness_start_failed
    )  # exit 0, never asked the model
    backend = [*ok, failed(3, FailureKind.backend_failure, "backend: HTTP 500")]
    assert classify_episode("completed", backend) is FailureKind.backend_failure
    assert (
        classify_episode("error", [failed(0, FailureKind.proxy_failure, "proxy: bug")])
        is FailureKind.proxy_failure
    )
    overflow = [*ok, failed(3, FailureKind.context_overflow, "context overflow: 9000 tokens")]
    assert classify_episode("error", overflow) is FailureKind.context_overflow
    cut = [*ok[:2], ok[2].model_copy(update={"finish_reason": "length"})]
    assert classify_episode("completed", cut) is FailureKind.budget_exhausted


def test_a_deadline_is_classified_by_cause():
    # three calls of 10 tokens each, 1 s of generation each (10 tok/s), the deadline at t=1100
    calls = [timed(c, at=1000.0 + 10 * i, total_s=1.0, generate_s=1.0) for i, c in enumerate(three_turn())]
    for c in calls:
        c.sampled_ids = list(range(10))
    # nothing in flight at the deadline: the harness (or a tool it ran) held the clock
    assert classify_episode("timeout", calls, deadline_at=1100.0) is FailureKind.deadline_harness
    # the last call was still generating when the harness was killed
    busy = [*calls[:2], timed(calls[2], at=1090.0, total_s=15.0, generate_s=15.0)]
    busy[2].sampled_ids = list(range(150))
    assert classify_episode("timeout", busy, deadline_at=1100.0) is FailureKind.deadline_sampling
    # ... but the backend served under 1 token a second: the backend's, not the policy's
    slow = [timed(c, at=c.created_at, total_s=60.0, generate_s=60.0) for c in busy]
    assert classify_episode("timeout", slow, deadline_at=1100.0) is FailureKind.deadline_backend
    # the first call never came back (cancelled when the proxy drained it): the backend's
    cancelled = call(0, [1, 2], [], error="cancelled: the call was cancelled before the backend answered")
    assert (
        classify_episode("timeout", [timed(cancelled, at=1000.0, total_s=130.0)], deadline_at=1100.0)
        is FailureKind.deadline_backend
    )
    # the floor is the run's to set
    assert (
        classify_episode("timeout", busy, deadline_at=1100.0, min_backend_tokens_per_s=50.0)
        is FailureKind.deadline_backend
    )
    # each verdict comes with its evidence, in words
    assert explain_deadline(FailureKind.deadline_backend, slow, 1100.0, 5.0).startswith(
        "deadline_backend: model call #2 was in flight at the deadline and the backend sampled 170 tokens "
        "in 180.0 s"
    )
    assert "no model call was in flight" in explain_deadline(FailureKind.deadline_harness, calls, 1100.0, 5.0)
    assert "had answered no call yet" in explain_deadline(
        FailureKind.deadline_backend, [timed(cancelled, at=1000.0, total_s=130.0)], 1100.0, 5.0
    )


def test_grading_decides_only_what_the_policy_did():
    assert final_kind(FailureKind.none, FailureKind.empty_patch, False) is FailureKind.empty_patch
    assert (
        final_kind(FailureKind.deadline_sampling, FailureKind.none, True) is FailureKind.none
    )  # resolved wins
    assert (
        final_kind(FailureKind.deadline_sampling, FailureKind.empty_patch, False)
        is FailureKind.deadline_sampling
    )
    assert (
        final_kind(FailureKind.harness_crashed, FailureKind.infrastructure, False)
        is FailureKind.infrastructure
    )
    assert final_kind(FailureKind.backend_failure, None, False) is FailureKind.backend_failure


# -- the table ------------------------------------------------------------------------------------
def test_default_table_masks_exactly_the_failures_outside_the_policy():
    table = OutcomeTable()
    assert table.apply(FailureKind.none, 1.0) == (1.0, False)
    assert table.apply(FailureKind.none, 0.0) == (0.0, False)
    for kind in FailureKind:
        reward, mask = table.apply(kind, 1.0)
        assert mask == kind.outside_policy, kind
        if kind is not FailureKind.none:
            assert reward == 0.0, kind


def test_what_the_agent_can_do_to_its_harness_is_graded_not_masked():
    """Killing its harness, sleeping past the deadline, breaking the grading sandbox's start: the agent
    can do each on purpose, so each is the policy's (graded, a wrong patch trained at 0)."""
    table = OutcomeTable()
    for kind in (FailureKind.harness_killed, FailureKind.deadline_harness, FailureKind.patch_broke_sandbox):
        assert not kind.outside_policy and table.apply(kind) == (0.0, False), kind
    assert final_kind(FailureKind.harness_killed, FailureKind.none, resolved=True) is FailureKind.none
    assert (
        final_kind(FailureKind.deadline_harness, FailureKind.none, resolved=False)
        is FailureKind.deadline_harness
    )
    assert classify_episode("error", three_turn(), killed_by="SIGKILL") is FailureKind.harness_killed


def test_docs_table_lists_every_kind_with_its_default():
    text = DOCS.read_text()
    for kind, row in DEFAULT_OUTCOMES.items():
        line = next((ln for ln in text.splitlines() if ln.startswith(f"| `{kind.value}`")), None)
        assert line is not None, f"{kind.value} is missing from docs/outcomes.md"
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert ("masked" if row.mask else "trained") in cells, (kind, cells)


def test_a_run_overrides_rows_from_the_cli_and_the_gym_config(tmp_path: Path):
    from polar_env.cli import build_parser
    from polar_env.cli.rollout import config_from_args
    from polar_env.rollout.plan import plan_from_config

    argv = [
        "rollout",
        "--task-ids",
        "pallets__flask-5014",
        "--outcome",
        "harness_crashed=mask",
        "--outcome",
        "deadline_harness=0",
        "--min-backend-tokens-per-s",
        "2",
    ]
    plan = plan_from_config(config_from_args(build_parser(argv).parse_args(argv)))
    table = plan.episode.outcomes()
    assert table.apply(FailureKind.harness_crashed) == (0.0, True)
    assert table.apply(FailureKind.deadline_harness) == (0.0, False)
    assert table.apply(FailureKind.backend_failure) == (0.0, True)  # rows not named keep their default
    assert table.min_backend_tokens_per_s == 2.0
    from polar_env.agent_server.core import PolarAgentConfig

    cfg = PolarAgentConfig.model_validate({"outcome": {"context_overflow": {"reward": 0.0, "mask": True}}})
    assert cfg.outcomes().rows[FailureKind.context_overflow] == Outcome(reward=0.0, mask=True)
    assert cfg.outcomes().rows[FailureKind.sandbox_failure].mask
    short = PolarAgentConfig.model_validate({"outcome": {"context_overflow": "mask", "deadline_harness": 0}})
    assert short.outcomes().rows == {**cfg.outcomes().rows, FailureKind.deadline_harness: Outcome(reward=0.0)}
    # a bad row is one clear CLI line, exit 2
    bad = subprocess.run(
        [sys.executable, "-m", "polar_env.cli", "rollout", "--outcome", "sandbox_failure=maybe"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "KIND=mask or KIND=REWARD" in bad.stderr, bad.stderr


# -- export: never dropped, never trained at 0 -------------------------------------------------------
def test_failed_episodes_stay_in_their_group_as_masked_placeholders(tmp_path: Path):
    """The quick demo's two ways to lose a sample: no tokens at all (it vanished from
    nemo_results.jsonl) and a failure outside the policy (it was trained on at reward 0)."""
    table = OutcomeTable()
    no_tokens = build_trajectory(
        session("a.s0"), [failed(0, FailureKind.backend_failure, "backend: refused")], status="error"
    )
    outside = build_trajectory(session("a.s1"), three_turn(), status="timeout")
    good = build_trajectory(session("a.s2"), three_turn(), status="completed")
    for traj, kind, graded in (
        (no_tokens, FailureKind.backend_failure, None),
        (outside, FailureKind.deadline_backend, None),
        (good, FailureKind.none, 1.0),
    ):
        traj.failure_kind = kind
        traj.reward, traj.masked = table.apply(kind, graded)
        traj.metadata.episode_key = traj.session_id
    out = tmp_path / "out"
    with RolloutOutputs(out) as outputs:
        for traj in (no_tokens, outside, good):
            outputs.add(traj)
    rows = [json.loads(line) for line in (out / "nemo_results.jsonl").read_text().splitlines()]
    assert [r["polar"]["session_id"] for r in rows] == ["a.s0", "a.s1", "a.s2"]  # none dropped
    assert [r["instance_config"]["mask_sample"] for r in rows] == [True, True, False]
    assert [r["failure_kind"] for r in rows] == ["polar:backend_failure", "polar:deadline_backend", None]
    assert all(check_nemo_result(r) == [] for r in rows)
    summary = finish_outputs(out, [no_tokens, outside, good])  # the rebuilt file keeps them too
    assert len((out / "nemo_results.jsonl").read_text().splitlines()) == 3
    assert summary["masked"] == 2 and summary["failure_kinds"]["deadline_backend"] == 1
    grpo = [json.loads(line) for line in (out / "grpo_batch.jsonl").read_text().splitlines()]
    assert {r["session_id"] for r in grpo} == {"a.s2"}  # masked samples train nothing


# -- end to end: a real harness against a backend slower than the deadline ---------------------------
needs_sandbox = pytest.mark.needs("bwrap", "npm")


@pytest.mark.slow
@needs_sandbox
async def test_timed_out_episodes_are_masked_not_dropped(tmp_path: Path, embedded_dir: Path):
    """Pi, sandboxed, through the proxy, against an OpenAI-compatible server that never answers (a
    stand-in for an overloaded vLLM: a real slow server cannot be provoked on demand). Both samples
    of the group hit the deadline with the model call in flight: both are exported, masked."""
    from polar_env.backends.registry import make_backend
    from polar_env.rollout.config import RolloutConfig
    from polar_env.rollout.plan import plan_from_config
    from polar_env.rollout.runner import proxy_factory, run_rollouts
    from polar_env.tasks.loader import load_tasks

    async with never_answering_completions() as url:
        config = RolloutConfig(
            harness="pi",
            task_ids=["pallets__flask-5014"],
            samples=2,
            concurrency=2,
            timeout=20,
            out=tmp_path / "out",
            model_dir=embedded_dir,
        )
        plan = plan_from_config(config)
        backend = make_backend("vllm", url=url, model="slow", timeout_s=3600)
        trajectories = await run_rollouts(
            plan, proxy_factory(config, backend=backend, tasks=load_tasks("bundled"))
        )
    assert len(trajectories) == 2
    assert {t.status for t in trajectories} == {"timeout"}
    assert {t.failure_kind for t in trajectories} == {FailureKind.deadline_backend}
    assert all(
        t.masked and t.grading is None for t in trajectories
    )  # not graded: it says nothing of the policy
    rows = [json.loads(line) for line in (tmp_path / "out" / "nemo_results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["instance_config"]["mask_sample"] for r in rows)
    assert all(check_nemo_result(r) == [] for r in rows)
    # the quick demo's first hour: the mask says why (the call in flight, the backend's rate, the flag to
    # raise), and `polar check` does not claim no rollout reached the model when each had a call generating
    for t in trajectories:
        assert "deadline_backend: model call #0 was in flight" in t.error and "--timeout" in t.error, t.error
    assert all(t.session_id in masked_lines(trajectories) for t in trajectories)
    for name in ("nemo_results.jsonl", "trajectories.jsonl"):
        (warning,) = [w for w in check_path(tmp_path / "out" / name).warnings if "unusable" in w]
        assert "2 made a model call that ended unanswered" in warning and "no rollout reached" not in warning
