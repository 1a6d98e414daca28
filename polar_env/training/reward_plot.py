"""The mean reward per step of a training run as a PNG (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_rewards(metrics: list[dict[str, Any]], path: Path, *, title: str) -> Path:
    """One point per rollout round: ``step``, ``mean_reward`` and the ``phase`` that labels it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in metrics]
    rewards = [m["mean_reward"] for m in metrics]
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    ax.plot(steps, rewards, marker="o")
    for m in metrics:
        ax.annotate(
            f"{m['phase']}\n{m['mean_reward']:.2f}",
            (m["step"], m["mean_reward"]),
            textcoords="offset points",
            xytext=(0, 8),
            ha="center",
            fontsize=8,
        )
    ax.set_xticks(steps)
    ax.set_ylim(-0.05, 1.25)
    ax.set_xlabel("rollout round (0: the untrained model)")
    ax.set_ylabel("mean reward (model-sampled)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
