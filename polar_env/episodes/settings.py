"""What one episode runs with: the harness, its deadline, the trainer's sampling, grading, the outcome
table and the proxy's per-episode budget."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polar_env.outcomes import OutcomeTable
from polar_env.rewards.sandbox_exec import grading_timeout_s
from polar_env.trajectory.records import EpisodeBudget


@dataclass
class EpisodeConfig:
    harness: str = "pi"
    timeout_s: float = 600.0  # the harness's wall-clock deadline
    grading_timeout_s: float = field(
        default_factory=grading_timeout_s
    )  # grading's own budget, outlives the rollout's
    sampling: dict[str, Any] = field(default_factory=dict)  # sampling the trainer dictates
    model_name: str | None = None  # what the harness asks for (default: the backend's model)
    grade: bool = True
    scratch_root: Path | None = None
    sandbox: str = "auto"  # auto | bubblewrap | docker | podman | apptainer (episodes.workspace)
    outcomes: OutcomeTable = field(default_factory=OutcomeTable)  # reward/mask per failure kind
    budget: EpisodeBudget = field(default_factory=EpisodeBudget)  # per-episode limits the proxy enforces
    reward_key: str | None = (
        None  # a Harbor task's reward.json key that is the reward (rewards/harbor_verifier.py)
    )
    mask_single_call: bool = False  # mask a rollout whose harness made one model call (OpenEnv RFC 006)
