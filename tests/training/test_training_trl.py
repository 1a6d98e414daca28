"""Two GRPO steps of TRL's own trainer on real Pi episodes through the proxy, sampled by the live model.

The trainer's model object is the proxy's backend (``PolarRollouts``). A scripted policy picks the
text so that each group has one rollout that resolves the task (the gold patch, through Pi's bash
tool: reward 1.0 from the SWE-bench grading) and one that does nothing (reward 0.0); the trainer's
live model scores every token, over the whole context. The test asserts what the issue asks of the
smoke run: finite loss, the ratio π_θ/π_sampler at step 0 within 1 ± 1e-4 (TRL's own logprob code on
Polar's tokens), weights changed after the steps, and — read from the gradients of TRL's loss with
respect to the backbone's hidden states, not from the masks — zero gradient at every position whose
next token the model did not sample (prompt, Pi's tool output, template glue), non-zero at the rest.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("trl")
pytestmark = [pytest.mark.slow, pytest.mark.needs("bwrap", "npm")]

TASK = "psf__requests-5414"


def gold_or_nothing(tasks):
    """Even samples of a task replay its gold patch, odd ones answer at once (episode ids end
    ``.s<k>.a<n>``)."""
    from polar_env.harness_adapters.policies import answer_policy, gold_policy

    gold, answer = gold_policy(tasks), answer_policy(tasks)

    def policy(session_id, call_number, prompt_text):
        sample = int(session_id.rsplit(".s", 1)[1].split(".")[0])
        return (gold if sample % 2 == 0 else answer)(session_id, call_number, prompt_text)

    return policy


def test_two_grpo_steps_through_pi(embedded_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig

    from polar_env.rollout.config import RolloutConfig
    from polar_env.tasks.loader import load_tasks
    from polar_env.training.fidelity import position_gradients
    from polar_env.training.grpo import PolarGRPOTrainer
    from polar_env.training.rollouts import PolarRollouts

    model = AutoModelForCausalLM.from_pretrained(str(embedded_dir), dtype=torch.float32)
    config = RolloutConfig(
        harness="pi",
        task_ids=[TASK],
        model_dir=embedded_dir,
        out=tmp_path / "rollouts",
        score_window=32768,
        timeout=300,
        concurrency=2,
    )
    rollouts = PolarRollouts(model, config, policy=gold_or_nothing(load_tasks("bundled")))
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        per_device_train_batch_size=2,
        num_generations=2,
        max_steps=2,
        learning_rate=1e-4,
        beta=0.0,
        temperature=1.0,
        bf16=False,
        use_cpu=True,
        gradient_checkpointing=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
    )
    trainer = PolarGRPOTrainer(model, rollouts, args)
    assert rollouts.model.module is model  # the proxy samples with the trainer's own module
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    try:
        with position_gradients(trainer) as grads:
            trainer.train()
    finally:
        rollouts.close()

    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), trainer.state.log_history
    rewards = sorted(t.reward for t in rollouts.last_trajectories)
    assert rewards == [0.0, 1.0], [
        (t.session_id, t.status, t.failure_kind, t.reward) for t in rollouts.last_trajectories
    ]

    step0 = trainer.polar_fidelity[0]
    print(
        f"step 0: {int(step0['tokens'])} sampled tokens, max |Δ logprob| "
        f"{step0['logprob_abs_diff_max']:.2e}, ratio [{step0['ratio_min']:.6f}, {step0['ratio_max']:.6f}]"
    )
    assert step0["tokens"] > 50
    assert step0["logprob_abs_diff_max"] < 1e-4
    assert 1 - 1e-4 <= step0["ratio_min"] <= step0["ratio_max"] <= 1 + 1e-4

    changed = max(float((p.detach() - before[name]).abs().max()) for name, p in model.named_parameters())
    assert changed > 0.0

    assert len(grads) == 2  # one backward pass per step
    for g in grads:
        assert g.nonsampled_max() == 0.0  # prompt, tool output, template glue: no gradient at all
        assert g.sampled_min() > 0.0  # every sampled token of a row with an advantage: some gradient
        assert g.masked_completion_positions() > 0  # Pi's tool output sat inside the completion


def test_half_precision_is_refused(embedded_dir, tmp_path):
    """TRL's GRPOConfig defaults to bf16 autocast, whose logprobs are ~0.17 off the recorded float32 ones."""
    import torch
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig

    from polar_env.rollout.config import RolloutConfig
    from polar_env.training.grpo import PolarGRPOTrainer
    from polar_env.training.rollouts import PolarRollouts

    model = AutoModelForCausalLM.from_pretrained(str(embedded_dir), dtype=torch.float32)
    config = RolloutConfig(harness="pi", task_ids=[TASK], model_dir=embedded_dir, out=tmp_path / "rollouts")
    with PolarRollouts(model, config) as rollouts:
        for half in ({}, {"bf16": False, "fp16": True}):  # {}: TRL's own default, bf16
            args = GRPOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, report_to="none", **half)
            with pytest.raises(ValueError, match=r"bf16=False, fp16=False"):
                PolarGRPOTrainer(model, rollouts, args)
