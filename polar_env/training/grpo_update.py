"""One GRPO policy update from Polar's GRPO rows (``polar_env.trajectory.export.grpo_rows``).

The clipped surrogate of GRPO on the sampled tokens only (loss mask 1), with the logprobs the
backend recorded as the old policy's: on one machine the proxy sampled with this very module, so
the ratio starts at 1. The loss is normalised by the batch's trainable tokens. Only the top layers
move (``frozen_trunk``), as in the warm start.
"""

from __future__ import annotations

from typing import Any

from polar_env.training.frozen_trunk import freeze_all_but_top, top_logprobs, trunk_hidden


def grpo_update(model: Any, optimizer: Any, rows: list[dict[str, Any]], *, top_layers: int,
                temperature: float = 1.0, clip: float = 0.2) -> dict[str, float]:
    """One optimizer step over ``rows``; rows with advantage 0 (a uniform group) carry no gradient.
    ``temperature`` is the one the rollouts sampled at (their logprobs are of that distribution)."""
    rows = [r for r in rows if r["advantage"] != 0.0 and any(r["loss_mask"])]
    stats = {"rows": float(len(rows)), "loss": 0.0, "ratio_max_dev": 0.0, "tokens": 0.0}
    if not rows:
        return stats
    import torch

    first = freeze_all_but_top(model, top_layers)
    total = sum(sum(r["loss_mask"]) for r in rows)
    optimizer.zero_grad()
    for row in rows:
        ids = row["input_ids"]
        positions = [p for p, m in enumerate(row["loss_mask"]) if m and p > 0]
        model.train()
        logprobs = top_logprobs(model, trunk_hidden(model, ids, first), ids, positions, first,
                                temperature=temperature)
        ratio = torch.exp(logprobs - torch.tensor([row["logprobs"][p] for p in positions]))
        advantage = float(row["advantage"])
        surrogate = torch.minimum(ratio * advantage, ratio.clamp(1 - clip, 1 + clip) * advantage)
        loss = -surrogate.sum() / total
        loss.backward()
        stats["loss"] += loss.item()
        stats["ratio_max_dev"] = max(stats["ratio_max_dev"], float((ratio.detach() - 1).abs().max()))
        stats["tokens"] += len(positions)
    optimizer.step()
    model.eval()
    return stats
