"""A rollout with several chains counts once in its group's baseline, in TRL's own advantage code.

One task, three rollouts (rewards 1, 0, 0); the rewarded one was compacted, so it has two chains (built
by the real chain builder from ledger records, as tests/training/test_train_paths.py does). Polar's GRPO batch
gives it two rows, both with the advantage of one sample in a group of three; TRL's ``GRPOTrainer``
(``_generate_and_score_completions``: its rollout_func, reward function and group normalisation) gets
one row per rollout from ``trl_row`` and computes the same baseline, 1/3. Counting the compacted rollout
once per chain would make it 1/2. NeMo-RL gets one ``/run`` result per rollout by contract (its own
``calculate_baseline_and_std_per_prompt`` was run on such results by hand: docs/nemo.md).
"""

from __future__ import annotations

import math

import pytest
from test_train_paths import compacted
from trajectory_helpers import call, session

from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.export import grpo_rows

pytest.importorskip("trl")


def plain(sid: str, reward: float):
    return build_trajectory(session(sid), [call(0, [1, 2, 3], [10, 11], session_id=sid)], reward=reward)


def test_a_compacted_rollout_counts_once_in_trls_baseline(embedded_dir, tmp_path):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from polar_env.training.grpo import polar_reward
    from polar_env.training.rollouts import trl_row

    group = [compacted("a", 1.0), plain("b", 0.0), plain("c", 0.0)]
    for t in group:
        t.group_id = "task"
    assert len(group[0].chains) == 2
    rows = grpo_rows(group, train_paths="all")
    assert [r["session_id"] for r in rows] == ["a", "a", "b", "c"]  # every chain a row ...
    mean, std = 1 / 3, math.sqrt(((1 - 1 / 3) ** 2 + 2 * (1 / 3) ** 2) / 3)
    assert (
        rows[0]["advantage"] == rows[1]["advantage"] == pytest.approx((1 - mean) / (std + 1e-6))
    )  # ... one sample

    tokenizer = AutoTokenizer.from_pretrained(embedded_dir)
    model = AutoModelForCausalLM.from_pretrained(embedded_dir, dtype=torch.float32)
    eos = tokenizer.eos_token_id

    def rollout_func(prompts, trainer):
        out = [trl_row(t, eos) for t in group]
        return {
            **{k: [r[k] for r in out] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask")},
            "polar_reward": [t.reward for t in group],
        }

    args = GRPOConfig(
        output_dir=str(tmp_path),
        num_generations=3,
        per_device_train_batch_size=3,
        max_steps=1,
        beta=0.0,
        bf16=False,
        use_cpu=True,
        report_to="none",
        logging_steps=1,
        temperature=1.0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[polar_reward],
        args=args,
        rollout_func=rollout_func,
        processing_class=tokenizer,
        train_dataset=Dataset.from_list([{"prompt": "fix it"}] * 3),
    )
    scored = trainer._generate_and_score_completions([{"prompt": "fix it"} for _ in group])
    advantages = scored["advantages"].tolist()
    assert len(advantages) == 3  # one row per rollout, the compacted one included once
    trl_std = math.sqrt(((1 - mean) ** 2 + 2 * mean**2) / 2)  # TRL: the sample std
    assert advantages == pytest.approx([(r - mean) / (trl_std + 1e-4) for r in (1.0, 0.0, 0.0)], rel=1e-5)
    assert sum(advantages) == pytest.approx(
        0.0, abs=1e-5
    )  # the baseline is the mean over 3 rollouts, not 4 rows
