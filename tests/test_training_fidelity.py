"""TRL's own logprob code on Polar's tokens reproduces what the proxy recorded, for every harness.

One episode per harness (the real Codex, Claude Code and Pi CLIs in bubblewrap, through the proxy),
sampled by the model itself: the proxy's backend is the trainer's own module, sampling token by token
with a KV cache; the trainer then scores the captured main chain in one full forward pass
(``GRPOTrainer._get_per_token_logps_and_entropies``, the function its loss calls). Float32, so the
two must agree to 1e-4 on every sampled token, which is what makes the GRPO ratio 1 at step 0.
Each call's answer is cut at a few tokens: the harnesses' first prompts are 1.5k-13k tokens, and
the prefill of those on a CPU is what this test pays for.
"""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("trl")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("bwrap") is None or shutil.which("npm") is None,
                                 reason="needs bubblewrap and npm")]


@pytest.fixture(scope="module")
def live_model(embedded_dir):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(embedded_dir), dtype=torch.float32)


@pytest.mark.parametrize("harness", ["codex", "claude-code", "pi"])
def test_trainer_forward_reproduces_recorded_logprobs(harness, live_model, embedded_dir, tmp_path):
    from trl import GRPOConfig

    from polar_env.rollout.config import RolloutConfig
    from polar_env.training.fidelity import recorded_vs_trainer
    from polar_env.training.grpo import PolarGRPOTrainer
    from polar_env.training.rollouts import PolarRollouts

    config = RolloutConfig(harness=harness, task_ids=["psf__requests-5414"], model_dir=embedded_dir,
                           out=tmp_path / "rollouts", max_tokens=6, timeout=900)
    args = GRPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=1, num_generations=1,
                      temperature=1.0, bf16=False, use_cpu=True, gradient_checkpointing=False, report_to="none")
    with PolarRollouts(live_model, config) as rollouts:
        trainer = PolarGRPOTrainer(live_model, rollouts, args)
        rows = rollouts(list(rollouts.tasks), trainer)
    traj = rollouts.last_trajectories[0]
    assert traj.harness == harness and traj.backend == "trl-live", (traj.status, traj.error)
    assert sum(rows["env_mask"][0]) >= 3, (traj.status, traj.error, traj.stats)
    result = recorded_vs_trainer(trainer, traj)
    print(f"{harness}: first prompt {len(rows['prompt_ids'][0])} tokens, {int(result['tokens'])} sampled, "
          f"max |Δ logprob| {result['max_abs_diff']:.2e}, ratio [{result['ratio_min']:.6f}, {result['ratio_max']:.6f}]")
    assert result["tokens"] == sum(rows["env_mask"][0])
    assert result["max_abs_diff"] < 1e-4
