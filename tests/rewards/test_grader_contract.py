"""The grader contract (rewards/grader.py): one function picks the grader, and `Grader.grade` adds the
same integrity layers to every grader: a grader exception is a result, tampering scores 0, and an
outcome outside the policy stays masked only where the task's control fails the same grading.

The masking rule is one code path for all three graders; here each grader's own procedure (`run`) is
replaced by a double that ends outside the policy on cue, and its control by one that passes or
fails (an infrastructure fault and a passing control cannot be provoked together on cue in three
graders); the real provocations (a tree past PATH_MAX, a broken verifier output) are in
tests/rewards/test_rewards_grading.py and tests/rewards/test_harbor_channel.py.
"""

from __future__ import annotations

import pytest

from polar_env.grades import GradeResult, GradingMode, ModeResult
from polar_env.outcomes import DEFAULT_OUTCOMES, FailureKind
from polar_env.rewards import grader as contract
from polar_env.rewards.grader import (
    BubblewrapGrader,
    HarborGrader,
    ImageGrader,
    NoGrader,
    RunDeadline,
    Submission,
    grade_submission,
    grade_task,
    grader_for,
)
from polar_env.tasks.harbor import load_task_dir
from polar_env.tasks.loader import TERMINAL_DIR, load_bundled

DEADLINE = RunDeadline(timeout_s=60)


@pytest.fixture(scope="module")
def swe_task():
    return next(t for t in load_bundled() if t.instance_id == "pallets__flask-5014")


@pytest.fixture(scope="module")
def harbor_task():
    return load_task_dir(TERMINAL_DIR / "fix-median-bug")


def test_one_function_picks_the_grader(swe_task, harbor_task):
    assert type(grader_for(swe_task, "bubblewrap", DEADLINE)) is BubblewrapGrader
    assert type(grader_for(swe_task, "podman", DEADLINE)) is ImageGrader
    assert (
        type(grader_for(swe_task.model_copy(update={"base_archive": None}), "apptainer", DEADLINE))
        is ImageGrader
    )
    assert type(grader_for(harbor_task, "podman", DEADLINE)) is HarborGrader
    with pytest.raises(NoGrader, match="in a container"):
        grader_for(harbor_task, "bubblewrap", DEADLINE)
    with pytest.raises(NoGrader, match="without a base archive"):
        grader_for(swe_task.model_copy(update={"base_archive": None}), "bubblewrap", DEADLINE)


async def test_a_task_without_a_grader_is_an_infrastructure_grade(harbor_task):
    result = await grade_submission(harbor_task, Submission(patch="x"), kind="bubblewrap", deadline=DEADLINE)
    assert result.failure_kind == FailureKind.infrastructure and "in a container" in result.error


def _outcome(task, kind: FailureKind, **fields) -> GradeResult:
    return GradeResult(instance_id=task.instance_id, failure_kind=kind, error=f"{kind} on cue", **fields)


@pytest.mark.parametrize("cls", [BubblewrapGrader, ImageGrader, HarborGrader])
@pytest.mark.parametrize("outcome", [FailureKind.infrastructure, FailureKind.no_reward, "raises"])
@pytest.mark.parametrize("control_passes", [True, False])
async def test_the_same_masking_rule_holds_in_every_grader(
    cls, outcome, control_passes, swe_task, harbor_task, monkeypatch
):
    """Outside the policy (or a grader exception) + a control that passes = the submission's 0, trained
    (``broke_grading``); + a control that fails too = masked, its kind kept."""
    task = harbor_task if cls is HarborGrader else swe_task
    g = cls(task, "podman", DEADLINE)

    async def run(work: Submission) -> GradeResult:
        if work == g.control_submission():
            return _outcome(task, FailureKind.none if control_passes else FailureKind.infrastructure)
        if outcome == "raises":
            raise OSError(36, "File name too long")
        return _outcome(task, outcome, modes={GradingMode.strict: ModeResult(failure_kind=outcome)})

    monkeypatch.setattr(g, "run", run)

    async def control() -> GradeResult:  # not kept on disk: each case its own verdict
        return await run(g.control_submission())

    monkeypatch.setattr(g, "control", control)
    result = await g.grade(Submission(patch="diff --git a/x b/x\n"))
    reward, masked = DEFAULT_OUTCOMES[result.failure_kind].reward, DEFAULT_OUTCOMES[result.failure_kind].mask
    if control_passes:
        assert result.failure_kind == FailureKind.broke_grading and not masked and reward == 0.0, result
        assert "passes" in result.control and result.reward == 0.0 and not result.resolved
        assert all(m.failure_kind == FailureKind.broke_grading for m in result.modes.values())
    else:
        kept = FailureKind.infrastructure if outcome == "raises" else outcome
        assert result.failure_kind == kept and masked, result
        assert "fails too" in result.control


@pytest.mark.parametrize("cls", [BubblewrapGrader, ImageGrader, HarborGrader])
async def test_tampering_scores_zero_in_every_grader(cls, swe_task, harbor_task, monkeypatch):
    """A resolving grade that carries a tampering flag (a channel's finding, the diff's) pays nothing;
    a note does not."""
    task = harbor_task if cls is HarborGrader else swe_task
    g = cls(task, "podman", DEADLINE, mode=GradingMode.harbor if cls is HarborGrader else GradingMode.strict)

    async def run(work: Submission) -> GradeResult:
        return GradeResult(
            instance_id=task.instance_id, mode=g.mode, resolved=True, reward=1.0, flags=[work.patch]
        )

    monkeypatch.setattr(g, "run", run)
    assert (await g.grade(Submission(patch="note:output-truncated"))).reward == 1.0
    zero = await g.grade(Submission(patch="reward-writer"))
    assert zero.reward == 0.0 and not zero.resolved and "tampering" in zero.error


def test_the_control_of_the_control_is_itself(swe_task):
    """Grading the solution never waits on a control: it is the control."""
    g = BubblewrapGrader(swe_task, "bubblewrap", DEADLINE)
    assert g.control_submission() == Submission(patch=swe_task.patch)
    assert contract.Submission() == HarborGrader(swe_task, "podman", DEADLINE).control_submission()


def test_rollout_warns_about_or_refuses_tasks_an_audit_found_controllable(
    swe_task, tmp_path, monkeypatch, caplog
):
    """What `polar tasks audit` stored for a task on this node decides: a warning, or with
    --refuse-controllable a refusal naming the task."""
    from polar_env.rewards import audit
    from polar_env.rewards.audit import CheckResult, TaskAudit
    from polar_env.rollout.config import RolloutConfig
    from polar_env.rollout.plan import plan_from_config
    from polar_env.tasks.loader import TaskLoadError

    monkeypatch.setenv("POLAR_GOLD_CACHE", str(tmp_path))
    config = RolloutConfig(tasks="bundled", task_ids=[swe_task.instance_id], out=tmp_path / "out")
    assert plan_from_config(config).tasks  # never audited: nothing said
    audit.save(swe_task, TaskAudit.of(swe_task.instance_id, {"early-exit": CheckResult(verdict="controls")}))
    assert audit.load(swe_task).verdict == "controllable"
    assert plan_from_config(config).tasks and "can control" in caplog.text
    with pytest.raises(TaskLoadError, match=f"{swe_task.instance_id}: CONTROLLABLE"):
        plan_from_config(config.model_copy(update={"refuse_controllable": True}))


@pytest.mark.slow
@pytest.mark.needs("bwrap")
def test_a_tree_past_path_max_is_the_agents_zero_in_the_bubblewrap_grader(swe_task):
    """A real provocation: a new file whose path (4,056 bytes) fits git but not the grader's host-side
    copy of the tree (ENAMETOOLONG). It used to be a masked `infrastructure`; the solution passes the
    same grading (the control), so it is the agent's 0, trained."""
    path = "/".join(f"{i:0250d}" for i in range(16)) + "/" + "x" * 40
    patch = (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n"
        "+x\n"
    )
    result = grade_task(swe_task, patch, kind="bubblewrap")
    assert result.failure_kind == FailureKind.broke_grading and result.reward == 0.0, result
    assert not DEFAULT_OUTCOMES[result.failure_kind].mask and "passes this grading" in result.control
