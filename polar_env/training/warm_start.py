"""SFT warm start on Polar's token-exact rows (``polar export --format trl-sft``) on a CPU budget.

The rows are trained as they are: cross-entropy on the tokens the policy sampled (``assistant_masks``
1), never on the prompt, the tool results or the harness's template. On a GPU, or with time, TRL's
``SFTTrainer`` reads the same rows directly (docs/learning.md); here the embedded model's lower
layers stay frozen (``frozen_trunk``) so that a warm start fits in minutes on a shared 2-core CPU.
"""

from __future__ import annotations

from typing import Any

from polar_env.training.frozen_trunk import freeze_all_but_top, top_logprobs, trunk_hidden


def sft_warm_start(
    model: Any,
    rows: list[dict[str, Any]],
    *,
    epochs: int,
    learning_rate: float,
    top_layers: int,
    progress: Any = None,
) -> list[float]:
    """``epochs`` passes over ``rows`` (one optimizer step per row); returns each step's mean loss."""
    import torch

    first = freeze_all_but_top(model, top_layers)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=learning_rate, weight_decay=0.0)
    prepared = [
        (
            r["input_ids"],
            [p for p, m in enumerate(r["assistant_masks"]) if m and p > 0],
            trunk_hidden(model, r["input_ids"], first),
        )
        for r in rows
    ]
    losses: list[float] = []
    model.train()
    for _ in range(epochs):
        for ids, positions, hidden in prepared:
            optimizer.zero_grad()
            loss = -top_logprobs(model, hidden, ids, positions, first).mean()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if progress is not None:
                progress(len(losses), losses[-1])
    model.eval()
    return losses
