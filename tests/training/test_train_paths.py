"""Which chains train (``--train-paths``) and failed samples masked one at a time, on our exports.

Hand-built ledger records: an episode whose history was compacted (two chains, the second started
by "history rewritten"), in a group of four where one sibling failed outside the policy (masked).
The real Claude Code compaction is in tests/harness_adapters/test_harness_context.py."""

from __future__ import annotations

import math
import sys
import types

import pytest
from trajectory_helpers import call, session

from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.export import grpo_rows, thin_groups, to_nemo_gym_result
from polar_env.trajectory.paths import one_chain, train_chains
from polar_env.trajectory.sft import sft_rows

COMPACTED = "history rewritten (compaction or edited history)"


def compacted(sid: str, reward: float, *, masked: bool = False):
    calls = [
        call(0, [1, 2, 3], [10, 11], tool="shell", session_id=sid),
        call(1, [1, 2, 3, 10, 11, 4], [12, 13], parent=0, session_id=sid),
        call(2, [7, 8], [20, 21, 22], reason=COMPACTED, session_id=sid),  # the summary's chain
        call(3, [7, 8, 20, 21, 22, 9], [23], parent=2, session_id=sid),
    ]
    traj = build_trajectory(session(sid), calls, reward=reward)
    traj.masked = masked
    return traj


def test_all_trains_both_chains_main_and_final_one():
    traj = compacted("s1", 1.0)
    assert [ch.start_reason for ch in traj.chains] == ["start", COMPACTED]
    assert [r["chain"] for r in grpo_rows([traj], train_paths="all")] == [0, 1]
    assert [r["chain"] for r in grpo_rows([traj], train_paths="main")] == [0]
    assert [r["chain"] for r in grpo_rows([traj], train_paths="final")] == [1]
    assert [r["chain"] for r in sft_rows([traj], "trl-sft", only_resolved=False, train_paths="all")] == [0, 1]
    assert [r["chain"] for r in sft_rows([traj], "nemo-rl-sft", only_resolved=False, train_paths="main")] == [
        0
    ]
    chain, side = one_chain(traj, "all")  # one sequence per rollout (TRL): the main one, the rest counted
    assert chain.index == 0 and side == traj.chains[1].trainable_tokens == 4


def test_a_function_chooses(monkeypatch):
    module = types.ModuleType("my_paths")
    module.shortest = lambda t: [min(t.chains, key=lambda ch: len(ch.input_ids)).index]
    monkeypatch.setitem(sys.modules, "my_paths", module)
    assert [ch.index for ch in train_chains(compacted("s1", 1.0), "my_paths:shortest")] == [1]
    for bad in ("everything", "my_paths:nope", "no_such_module_here:f", ":f"):
        with pytest.raises(ValueError, match="train-paths"):
            grpo_rows([compacted("s1", 1.0)], train_paths=bad)


def test_one_masked_sample_leaves_its_siblings_finite_advantages():
    group = [compacted("a", 1.0), compacted("b", 0.0), compacted("c", 1.0), compacted("d", 0.0, masked=True)]
    rows = grpo_rows(group, train_paths="main")
    assert sorted(r["session_id"] for r in rows) == ["a", "b", "c"]  # the masked one alone gives no row
    assert all(math.isfinite(r["advantage"]) and r["advantage"] != 0 for r in rows)
    results = [to_nemo_gym_result(t) for t in group]
    assert [r.instance_config.mask_sample for r in results] == [False, False, False, True]
    assert thin_groups(group) == {}
    pair = [compacted("e", 1.0), compacted("f", 0.0, masked=True)]
    for t in pair:
        t.group_id = "g2"
    assert thin_groups(group + pair) == {"g2": 1}  # reported: one usable sample has no advantage to give
