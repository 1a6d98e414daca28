"""Proofs, with the trainer's own code, that TRL trains on exactly what the policy sampled.

- ``recorded_vs_trainer``: TRL's own logprob computation (``GRPOTrainer._get_per_token_logps_and_entropies``,
  the function its loss calls) on a trajectory's main chain, compared with the logprobs the proxy
  recorded on the sampled tokens. Equal within float error means the GRPO ratio starts at 1.
- ``position_gradients``: during training, the gradient of TRL's loss with respect to the backbone's
  last hidden state at every position (the input of the LM head there). A position whose next token
  was not sampled by the model (prompt, tool output, harness template) must get exactly zero; this is
  read from the gradients themselves, not from the masks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from polar_env.trajectory.models import Trajectory


def recorded_vs_trainer(trainer: Any, traj: Trajectory) -> dict[str, float]:
    """Max |trainer logprob - recorded logprob| over the main chain's sampled tokens (one forward pass).

    Every sampled token with a recorded logprob counts, whatever the outcome table decided about
    training on the episode (a timed-out episode's tokens are still the sampler's)."""
    if traj.main_chain is None:
        return {"tokens": 0.0, "max_abs_diff": 0.0, "ratio_min": 1.0, "ratio_max": 1.0}
    chain = traj.chains[traj.main_chain]
    start = len(chain.first_prompt_ids())
    device = trainer.accelerator.device
    ids = torch.tensor([chain.input_ids], device=device)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, torch.ones_like(ids), len(chain.input_ids) - start
        )
    mask = torch.tensor(chain.loss_mask[start:], device=device).bool()
    recorded = torch.tensor(chain.logprobs[start:], device=device, dtype=logps.dtype)
    delta = (logps[0] - recorded)[mask]
    return {
        "tokens": float(delta.numel()),
        "max_abs_diff": float(delta.abs().max()) if delta.numel() else 0.0,
        "ratio_min": float(delta.exp().min()) if delta.numel() else 1.0,
        "ratio_max": float(delta.exp().max()) if delta.numel() else 1.0,
    }


@dataclass
class PositionGradients:
    """One backward pass: per row, the gradient norm at each hidden position, and what each position
    predicts."""

    grad: torch.Tensor  # (B, P+C): |d loss / d h_j| for the hidden state at position j
    sampled: torch.Tensor  # (B, P+C) bool: position j predicts token j+1, which the model sampled
    completion: torch.Tensor  # (B, P+C) bool: position j predicts a token of the completion
    advantages: torch.Tensor  # (B,)

    def nonsampled_max(self) -> float:
        """Largest gradient at a position whose next token the model did not sample (must be 0.0)."""
        return float(self.grad[~self.sampled].max()) if (~self.sampled).any() else 0.0

    def sampled_min(self) -> float:
        """Smallest gradient at a sampled position of a row with a non-zero advantage (must be > 0)."""
        rows = self.advantages != 0
        picked = self.grad[rows][self.sampled[rows]]
        return float(picked.min()) if picked.numel() else 0.0

    def masked_completion_positions(self) -> int:
        """Completion positions that carry no gradient: tool output and template glue between turns."""
        return int((self.completion & ~self.sampled).sum())


@contextmanager
def position_gradients(trainer: Any) -> Iterator[list[PositionGradients]]:
    """Record a ``PositionGradients`` for every training backward pass run inside the block."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    records: list[PositionGradients] = []
    current: dict[str, Any] = {}
    compute_loss = trainer.compute_loss

    def compute_loss_seen(model_: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        current["inputs"] = inputs
        return compute_loss(model_, inputs, *args, **kwargs)

    def on_forward(module: Any, args: Any, output: Any) -> None:
        hidden = output.last_hidden_state
        if not hidden.requires_grad or "inputs" not in current:
            return
        inputs = current.pop("inputs")
        hidden.register_hook(lambda grad: records.append(_describe(grad, inputs)))

    handle = model.base_model.register_forward_hook(on_forward)
    trainer.compute_loss = compute_loss_seen
    try:
        yield records
    finally:
        handle.remove()
        del trainer.compute_loss


def _describe(grad: torch.Tensor, inputs: dict[str, Any]) -> PositionGradients:
    prompt_len = inputs["prompt_ids"].size(1)
    mask = inputs["completion_mask"] * inputs.get("tool_mask", 1)
    batch, total = grad.shape[:2]
    sampled = torch.zeros(batch, total, dtype=torch.bool, device=grad.device)
    completion = torch.zeros_like(sampled)
    sampled[:, prompt_len - 1 : total - 1] = mask.bool()  # position j predicts token j + 1
    completion[:, prompt_len - 1 : total - 1] = inputs["completion_mask"].bool()
    return PositionGradients(
        grad=grad.detach().norm(dim=-1),
        sampled=sampled,
        completion=completion,
        advantages=inputs["advantages"].detach().reshape(batch, -1)[:, 0],
    )
