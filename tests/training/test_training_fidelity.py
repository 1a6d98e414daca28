"""TRL's own logprob code on Polar's tokens reproduces what the proxy recorded, for every harness.

One episode per harness (the real Codex, Claude Code and Pi CLIs in bubblewrap, through the proxy),
sampled by the model itself: the proxy's backend is the trainer's own module, sampling token by token
with a KV cache; the trainer then scores the captured main chain in one full forward pass
(``GRPOTrainer._get_per_token_logps_and_entropies``, the function its loss calls). Float32, so the
two must agree to 1e-4 on every sampled token, which is what makes the GRPO ratio 1 at step 0.
Each call's answer is cut at a few tokens: what this test pays for is the prefill of the harness's
first prompt, twice (sampler and trainer). Pi's is ~1.7k tokens; Codex's (~9.5k) and Claude Code's
(~12.8k) take minutes per forward pass on a 2-core CPU, more than CI's budget allows, so those two
run when ``POLAR_FIDELITY_ALL_HARNESSES=1`` is set (docs/training.md has their figures and the command).
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("trl")
pytestmark = [pytest.mark.slow, pytest.mark.needs("bwrap", "npm")]


@pytest.fixture(scope="module")
def live_model(embedded_dir):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(embedded_dir), dtype=torch.float32)


LONG_PROMPT = pytest.mark.skipif(
    os.environ.get("POLAR_FIDELITY_ALL_HARNESSES") != "1",
    reason="a 10k+ token prefill, twice, on CPU: set POLAR_FIDELITY_ALL_HARNESSES=1",
)


@pytest.mark.parametrize(
    "harness",
    [pytest.param("codex", marks=LONG_PROMPT), pytest.param("claude-code", marks=LONG_PROMPT), "pi"],
)
def test_trainer_forward_reproduces_recorded_logprobs(harness, live_model, embedded_dir, tmp_path):
    from trl import GRPOConfig

    from polar_env.rollout.config import RolloutConfig
    from polar_env.training.fidelity import recorded_vs_trainer
    from polar_env.training.grpo import PolarGRPOTrainer
    from polar_env.training.rollouts import PolarRollouts

    config = RolloutConfig(
        harness=harness,
        task_ids=["psf__requests-5414"],
        model_dir=embedded_dir,
        out=tmp_path / "rollouts",
        max_tokens=6,
        timeout=900,
    )
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        per_device_train_batch_size=2,
        num_generations=2,
        temperature=1.0,
        bf16=False,
        use_cpu=True,
        gradient_checkpointing=False,
        report_to="none",
    )
    with PolarRollouts(live_model, config) as rollouts:
        trainer = PolarGRPOTrainer(live_model, rollouts, args)
        rows = rollouts(list(rollouts.tasks), trainer)
    traj = rollouts.last_trajectories[0]
    assert traj.harness == harness and traj.backend == "trl-live", (traj.status, traj.error)
    chain = traj.chains[traj.main_chain]  # whatever the episode's status: the tokens are the sampler's
    assert chain.trainable_tokens >= 3, (traj.status, traj.error, traj.stats)
    result = recorded_vs_trainer(trainer, traj)
    print(
        f"{harness}: first prompt {len(rows['prompt_ids'][0])} tokens, {int(result['tokens'])} sampled, "
        f"max |Δ logprob| {result['max_abs_diff']:.2e}, ratio [{result['ratio_min']:.6f}, "
        f"{result['ratio_max']:.6f}]"
    )
    assert result["tokens"] == chain.trainable_tokens
    assert result["max_abs_diff"] < 1e-4
