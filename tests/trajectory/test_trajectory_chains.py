"""Chain rules on hand-built records: joining is token-exact, every break starts a new chain."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from trajectory_helpers import call, session, three_turn

from polar_env.trajectory.chains import build_trajectory, main_chain_index
from polar_env.trajectory.checks import check_nemo_result, check_trajectory
from polar_env.trajectory.export import to_nemo_gym_result


def test_three_turn_session_is_one_chain_with_mask_exactly_on_sampled():
    calls = three_turn()
    traj = build_trajectory(session(), calls, reward=1.0)
    assert len(traj.chains) == 1
    chain = traj.chains[0]
    assert chain.call_indices == [0, 1, 2]
    assert chain.input_ids == calls[2].prompt_ids + calls[2].sampled_ids
    sampled_positions = set()
    for c in calls:
        start = len(c.prompt_ids)
        sampled_positions |= set(range(start, start + len(c.sampled_ids)))
        assert chain.input_ids[start : start + len(c.sampled_ids)] == c.sampled_ids
        assert chain.logprobs[start : start + len(c.sampled_ids)] == c.logprobs
    assert {i for i, m in enumerate(chain.loss_mask) if m} == sampled_positions
    assert all(lp == 0.0 for lp, m in zip(chain.logprobs, chain.loss_mask, strict=True) if not m)
    assert [s.kind for s in chain.spans] == [
        "prompt",
        "sampled",
        "interstitial",
        "sampled",
        "interstitial",
        "sampled",
    ]
    assert traj.stats.sampled_tokens == traj.stats.trainable_tokens == 9
    assert traj.stats.trainable_fraction == 1.0
    assert traj.stats.breaks == []
    assert traj.main_chain == 0 and traj.status == "completed"
    assert (traj.task_id, traj.group_id, traj.harness, traj.model) == ("t1", "g1", "codex", "smol")
    # each later call keeps only what it added: the tool result after the parent's answer
    assert [m.role for m in traj.calls[1].new_messages] == ["tool"]
    assert traj.calls[1].messages_offset == 2


def test_compaction_and_side_call_make_three_chains_with_named_breaks():
    c = three_turn()[:2]
    side = call(2, [50, 51], [52, 53], reason="side call")  # e.g. title generation
    compacted = call(3, [1, 2, 60, 61], [62, 63, 64], reason="compaction")  # history rewritten
    after = call(4, [1, 2, 60, 61, 62, 63, 64, 65], [66], parent=3)
    traj = build_trajectory(session(), c + [side, compacted, after])
    assert [ch.call_indices for ch in traj.chains] == [[0, 1], [2], [3, 4]]
    assert [(b.call_index, b.reason) for b in traj.stats.breaks] == [(2, "side call"), (3, "compaction")]
    assert traj.stats.chains == 3
    # no splice: the compacted chain starts from its own prompt, all masked
    ch = traj.chains[2]
    assert ch.input_ids[:4] == [1, 2, 60, 61] and ch.loss_mask[:4] == [0, 0, 0, 0]
    assert sum(ch.loss_mask) == 4
    assert traj.stats.trainable_tokens == traj.stats.sampled_tokens == 5 + 2 + 4
    # main chain: most trainable tokens (5 vs 2 vs 4)
    assert traj.main_chain == 0
    assert traj.stats.main_chain_tokens == 5


def test_second_child_of_a_parent_is_a_branch():
    c0, c1 = three_turn()[:2]
    retry = c1.model_copy(
        update={"call_index": 2, "call_id": "c2", "sampled_ids": [20, 21, 22], "logprobs": [-1.0, -1.0, -1.0]}
    )
    cont = call(3, retry.prompt_ids + retry.sampled_ids + [9], [30], parent=2)
    traj = build_trajectory(session(), [c0, c1, retry, cont])
    assert [ch.call_indices for ch in traj.chains] == [[0, 1], [2, 3]]
    assert traj.chains[1].start_reason == "branch"
    # the branch re-uses call 0's sampled tokens only as (masked) prompt: never trained twice
    assert traj.stats.trainable_tokens == 3 + 2 + 3 + 1
    assert main_chain_index(traj.chains) == 0  # 5 vs 4 trainable tokens


def test_false_parent_claim_is_not_token_exact():
    c0, c1 = three_turn()[:2]
    lying = c1.model_copy(update={"prompt_ids": [1, 2, 3, 4, 10, 99, 12, 5, 6]})  # one token differs
    traj = build_trajectory(session(), [c0, lying])
    assert len(traj.chains) == 2
    assert traj.chains[1].start_reason == "not token-exact"
    assert traj.chains[1].loss_mask[:9] == [0] * 9


def test_failed_calls_are_kept_but_add_no_tokens():
    c0, c1, c2 = three_turn()
    failed = call(1, c1.prompt_ids, [], parent=0, error="backend: HTTP 500")
    retried = c1.model_copy(update={"call_index": 2, "call_id": "c2"})
    last = c2.model_copy(update={"call_index": 3, "call_id": "c3", "parent_call_index": 2})
    traj = build_trajectory(session(), [c0, failed, retried, last], status="error", error="harness exit 1")
    assert len(traj.chains) == 1 and traj.chains[0].call_indices == [0, 2, 3]
    assert traj.stats.failed_calls == 1 and traj.stats.calls == 4
    assert traj.calls[1].chain is None and traj.calls[1].error == "backend: HTTP 500"
    assert traj.status == "error" and traj.error == "harness exit 1"


def test_unusable_logprobs_are_masked_not_guessed():
    c0, c1, c2 = three_turn()
    c1 = c1.model_copy(update={"logprobs": [float("nan"), -0.5]})
    traj = build_trajectory(session(), [c0, c1, c2])
    ch = traj.chains[0]
    span = next(s for s in ch.spans if s.call_index == 1 and s.kind != "interstitial")
    assert span.kind == "unscored"
    assert ch.loss_mask[span.start : span.end] == [0, 0]
    assert all(math.isfinite(x) for x in ch.logprobs)
    assert traj.stats.unscored_tokens == 2
    assert traj.stats.trainable_tokens == traj.stats.sampled_tokens - 2


@st.composite
def sessions(draw):
    """Random call trees: each call extends an earlier one (token-exactly or not), starts fresh, or fails."""
    calls = []
    for i in range(draw(st.integers(1, 12))):
        ok = [c for c in calls if c.error is None]
        sampled = draw(st.lists(st.integers(0, 50), min_size=1, max_size=4))
        choice = draw(st.sampled_from(["extend", "extend", "fresh", "fail", "lie"]))
        if choice in ("extend", "lie") and ok:
            p = draw(st.sampled_from(ok))
            prompt = p.prompt_ids + p.sampled_ids + draw(st.lists(st.integers(0, 50), max_size=3))
            if choice == "lie":
                prompt = [x + 1 for x in prompt]
            calls.append(call(i, prompt, sampled, parent=p.call_index))
        elif choice == "fail":
            calls.append(call(i, [1, 2], [], error="backend: boom"))
        else:
            calls.append(
                call(
                    i, draw(st.lists(st.integers(0, 50), min_size=1, max_size=5)), sampled, reason="side call"
                )
            )
    return calls


@settings(max_examples=150, deadline=None)
@given(sessions())
def test_chain_invariants_hold_for_any_session(calls):
    traj = build_trajectory(session(), calls, reward=1.0)
    assert check_trajectory(traj) == []
    members = [i for ch in traj.chains for i in ch.call_indices]
    assert sorted(members) == [c.call_index for c in calls if c.error is None]  # each exactly once
    for ch in traj.chains:
        for i in ch.call_indices:
            c = calls[i]
            span = next(s for s in ch.spans if s.call_index == i and s.kind == "sampled")
            assert ch.input_ids[span.start : span.end] == c.sampled_ids
            if i != ch.call_indices[0]:  # a joined call's whole prompt is the chain before its span
                assert ch.input_ids[: span.start] == c.prompt_ids
    assert traj.stats.trainable_tokens == traj.stats.sampled_tokens
    if traj.main_chain is not None:
        assert check_nemo_result(to_nemo_gym_result(traj, responses_create_params={"input": []}).row()) == []
