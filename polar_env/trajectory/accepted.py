"""The accepted-work figure: how much trainable work a run produced per hour, per run slot and per
GPU-hour, with the fractions that were dropped (masked, or left in a group too thin to train) and
stale (sampled by an older policy than the newest the run saw).

Raw tokens per second reward a configuration for work the trainer throws away; Polar upstream's
profiling ranks configurations by accepted trainable work per allocated GPU-hour instead, so does
this. An episode is *accepted* when it is not masked and its GRPO group keeps at least two
unmasked samples (a group of one, ``--samples 1``, is accepted as it is: nothing groups it); its
trainable tokens are its loss-mask-1 tokens (every chain). The hours are the union of the
episodes' own spans (session opened to finished), so a resumed run's pause between two attempts
does not count. The run slots are what the driver stamped on each trajectory (``run_slots``; under
Ray each node's, summed over nodes); GPUs are the run's ``--gpus`` (``gpus``), unknown otherwise.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from polar_env.trajectory.export import group_key
from polar_env.trajectory.models import Trajectory


@dataclass(frozen=True)
class Sample:
    """What the figure needs of one finished episode (a long-lived server keeps these, not trajectories)."""

    group: str
    masked: bool
    trainable_tokens: int
    start: float
    end: float
    run_slots: int | None
    node: str
    gpus: int | None
    policy_versions: tuple[int, ...]

    @classmethod
    def of(cls, t: Trajectory) -> Sample:
        meta = t.metadata
        return cls(
            group_key(t),
            t.masked,
            t.stats.trainable_tokens,
            t.created_at,
            t.created_at + (meta.duration_s or 0.0),
            meta.run_slots,
            meta.ray_node_id or "",
            meta.gpus,
            tuple(t.stats.policy_versions),
        )


def _hours(spans: list[tuple[float, float]]) -> float:
    covered = end_at = 0.0
    for start, end in sorted(spans):
        start = max(start, end_at)
        if end > start:
            covered += end - start
            end_at = end
    return covered / 3600


def _rate(amount: float, hours: float, per: float | None = 1.0) -> float | None:
    return amount / hours / per if hours > 0 and per else None


def accepted_work(episodes: Iterable[Trajectory | Sample]) -> dict[str, Any]:
    """The figure over finished episodes (summary.json ``accepted_work``; module docstring)."""
    samples = [e if isinstance(e, Sample) else Sample.of(e) for e in episodes]
    usable: dict[str, int] = defaultdict(int)
    size: dict[str, int] = defaultdict(int)
    for s in samples:
        usable[s.group] += not s.masked
        size[s.group] += 1
    accepted = [s for s in samples if not s.masked and (usable[s.group] >= 2 or size[s.group] == 1)]
    tokens = sum(s.trainable_tokens for s in accepted)
    hours = _hours([(s.start, s.end) for s in samples])
    slots_per_node: dict[str, int] = {}
    for s in samples:
        if s.run_slots is not None:
            slots_per_node[s.node] = max(s.run_slots, slots_per_node.get(s.node, 0))
    run_slots = sum(slots_per_node.values()) or None
    gpus = max((s.gpus for s in samples if s.gpus is not None), default=None)
    versions = [s.policy_versions for s in samples if s.policy_versions]
    newest = max((v[-1] for v in versions), default=0)
    n = len(samples)
    return {
        "episodes": n,
        "accepted_episodes": len(accepted),
        "accepted_trainable_tokens": tokens,
        "hours": round(hours, 6),
        "accepted_episodes_per_hour": _rate(len(accepted), hours),
        "accepted_tokens_per_hour": _rate(tokens, hours),
        "run_slots": run_slots,
        "accepted_tokens_per_run_slot_hour": _rate(tokens, hours, run_slots),
        "gpus": gpus,
        "accepted_tokens_per_gpu_hour": _rate(tokens, hours, gpus),
        "drop_fraction": (n - len(accepted)) / n if n else None,
        "masked_fraction": sum(s.masked for s in samples) / n if n else None,
        "stale_fraction": sum(v[0] < newest for v in versions) / len(versions) if versions else None,
    }
