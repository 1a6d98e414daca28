"""A rollout that never reached the model is exported with its group's first prompt (``GroupPrompts``),
so NeMo-RL keeps it in its task's group; the end-to-end run is tests/rollout/test_groups_export.py."""

from __future__ import annotations

from trajectory_helpers import session, three_turn

from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.checks import check_nemo_result, first_prompt_ids, nemo_rl_groups
from polar_env.trajectory.export import GroupPrompts, nemo_results, to_nemo_gym_result


def test_placeholder_takes_a_siblings_first_prompt_and_joins_its_group():
    reached = build_trajectory(session("s1"), three_turn(), reward=1.0)
    failed = build_trajectory(session("s2"), [], status="error", error="killed before its first call")
    alone = build_trajectory(session("s3", group_id="g2", task_id="t2"), [], status="error")
    assert failed.main_chain is None
    without = to_nemo_gym_result(failed, placeholder_token_id=7).row()
    assert first_prompt_ids(without) == [7] and without["polar"]["first_prompt"] == "none"

    results = [
        r.row() for r in nemo_results([failed, reached, alone])
    ]  # the sibling may come later in the file
    assert [r["polar"]["first_prompt"] for r in results] == ["sibling", "own", "none"]
    assert (
        first_prompt_ids(results[0]) == first_prompt_ids(results[1]) == reached.chains[0].first_prompt_ids()
    )
    assert results[0]["instance_config"]["mask_sample"] is True
    assert all(check_nemo_result(r) == [] for r in results)
    assert sorted(map(sorted, nemo_rl_groups([first_prompt_ids(r) for r in results]))) == [[0, 1], [2]]


def test_group_prompts_keeps_the_most_recent_groups():
    prompts = GroupPrompts(max_groups=1)
    first = build_trajectory(session("a", group_id="g1"), three_turn())
    second = build_trajectory(session("b", group_id="g2"), three_turn())
    prompts.note(first)
    prompts.note(second)
    assert prompts.get(second) == second.chains[0].first_prompt_ids()
    assert prompts.get(first) is None  # evicted: a long-lived agent server sees every task once per step
