"""What a rollout leaves in ``--out``: trajectories and NeMo results as episodes end, then the GRPO
batch and the summary over everything finished."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from polar_env.episodes.timings import TIMING_KEYS
from polar_env.trajectory.accepted import accepted_work
from polar_env.trajectory.exploits import run_summary as exploit_summary
from polar_env.trajectory.export import (
    GroupPrompts,
    TrajectoryWriter,
    group_key,
    grpo_rows,
    jsonl_line,
    nemo_results,
    thin_groups,
    to_nemo_gym_result,
    write_jsonl,
)
from polar_env.trajectory.models import Trajectory


def _drop_partial_line(path: Path) -> None:
    """A kill during a write leaves an unterminated last line; the next append would glue onto it."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as handle:
            handle.truncate(data.rfind(b"\n") + 1)


class RolloutOutputs:
    """``--out`` as episodes end: a line in trajectories.jsonl and nemo_results.jsonl per episode,
    flushed at once, so an interrupt loses only the episodes still running."""

    def __init__(self, out: Path):
        out.mkdir(parents=True, exist_ok=True)
        for name in ("trajectories.jsonl", "nemo_results.jsonl"):
            _drop_partial_line(out / name)
        self._trajectories = TrajectoryWriter(out / "trajectories.jsonl")
        self._nemo = open(out / "nemo_results.jsonl", "ab")  # noqa: SIM115 - appended as episodes end
        self._prompts = GroupPrompts()

    def add(self, trajectory: Trajectory) -> None:
        self._trajectories.write(trajectory)
        self._prompts.note(trajectory)
        # masked ones too: never dropped (a placeholder whose siblings end later gets their prompt in
        # finish_outputs)
        self._nemo.write(
            jsonl_line(
                to_nemo_gym_result(trajectory, group_prompt=self._prompts.get(trajectory), arrays=True).row()
            )
        )
        self._nemo.flush()

    def close(self) -> None:
        self._trajectories.close()
        self._nemo.close()

    def __enter__(self) -> RolloutOutputs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def finish_outputs(out: Path, trajectories: list[Trajectory], train_paths: str = "all") -> dict[str, Any]:
    """NeMo results (rebuilt, so an interrupt between two appends leaves no gap), GRPO batch (the
    chains ``train_paths`` selects) and summary over every finished episode in ``out``."""
    write_jsonl(out / "nemo_results.jsonl", (result.row() for result in nemo_results(trajectories)))
    graded = [t for t in trajectories if t.reward is not None]
    write_jsonl(out / "grpo_batch.jsonl", grpo_rows(graded, train_paths=train_paths))
    summary = summarize(trajectories)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def summarize(trajectories: list[Trajectory]) -> dict[str, Any]:
    n = len(trajectories)
    resolved = sum(bool(t.grading and t.grading.resolved) for t in trajectories)
    return {
        "episodes": n,
        "status": {s: sum(t.status == s for t in trajectories) for s in ("completed", "timeout", "error")},
        "resolved": resolved,
        "resolved_rate": resolved / n if n else 0.0,
        "masked": sum(t.masked for t in trajectories),
        # groups no rollout of which reached the model: their placeholders have no first prompt to share
        "unusable_groups": sorted(
            set(map(group_key, trajectories))
            - {group_key(t) for t in trajectories if t.main_chain is not None}
        ),
        "failure_kinds": dict(sorted(Counter(t.failure_kind.value for t in trajectories).items())),
        "calls": sum(t.stats.calls for t in trajectories),
        "sampled_tokens": sum(t.stats.sampled_tokens for t in trajectories),
        # GRPO groups left with fewer than 2 unmasked samples: they train nothing (no advantage)
        "thin_groups": thin_groups(trajectories),
        "trainable_tokens": sum(t.stats.trainable_tokens for t in trajectories),
        "chains": sum(t.stats.chains for t in trajectories),
        "models": sorted({t.model for t in trajectories if t.model}),
        "backends": sorted({t.backend for t in trajectories if t.backend}),
        # which logprobs the backend returned, per the proxy's start-up probe (backends/logprobs_mode.py): the
        # trainer's ratio needs "processed" unless sampling is at temperature 1, top-p 1
        "logprobs_mode": sorted(
            {str(t.metadata["logprobs_mode"]) for t in trajectories if t.metadata.get("logprobs_mode")}
        ),
        # the capture rules (OpenEnv RFC 006): single-call rollouts, context-only turns, unversioned calls
        "single_call_rollouts": sum(t.stats.single_call for t in trajectories),
        "context_only_turns": sum(t.stats.context_only_turns for t in trajectories),
        "unversioned_calls": sum(t.stats.unversioned_calls for t in trajectories),
        "policy_versions": sorted({v for t in trajectories for v in t.stats.policy_versions}),
        # grading's tampering signals (docs/rewards.md): episodes per flag
        "grading_flags": dict(
            sorted(Counter(f for t in trajectories for f in (t.grading.flags if t.grading else [])).items())
        ),
        # what the tool calls tried (history mining, fetching upstream, ...): an instrument
        # (trajectory/exploits.py)
        "exploit_attempts": exploit_summary(trajectories),
        # where an episode's time went, on average (episodes/timings.py TIMING_KEYS)
        "timings_mean_s": mean_timings(trajectories),
        # accepted trainable work per hour, run slot and GPU-hour; dropped and stale fractions
        # (trajectory/accepted.py)
        "accepted_work": accepted_work(trajectories),
    }


def mean_timings(trajectories: list[Trajectory]) -> dict[str, float]:
    """The mean of each stage timing over the episodes that have them."""
    timed = [t.metadata["timings"] for t in trajectories if isinstance(t.metadata.get("timings"), dict)]
    return (
        {key: round(sum(t.get(key, 0.0) for t in timed) / len(timed), 3) for key in TIMING_KEYS}
        if timed
        else {}
    )


def time_split(trajectories: list[Trajectory]) -> str:
    """One line: the mean seconds per stage of an episode."""
    mean = mean_timings(trajectories)
    return (
        "time per episode (mean s): " + "  ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in mean.items())
        if mean
        else "time per episode: no timings recorded"
    )


def masked_lines(trajectories: list[Trajectory]) -> str:
    """A line per masked episode (no loss, kept in its group): its kind and why; empty when none is."""
    masked = [t for t in trajectories if t.masked]
    if not masked:
        return ""
    lines = [
        f"masked (kept in their GRPO group, no loss; docs/outcomes.md): {len(masked)} of {len(trajectories)}"
    ]
    lines += [f"  {t.session_id}: {t.failure_kind.value}: {t.error or 'no cause recorded'}" for t in masked]
    return "\n".join(lines)


def summary_table(trajectories: list[Trajectory]) -> str:
    rows = [("episode", "status", "turns", "sampled", "trainable", "chains", "reward", "time s")]
    for t in trajectories:
        rows.append(
            (
                t.session_id,
                t.status,
                str(t.stats.calls),
                str(t.stats.sampled_tokens),
                str(t.stats.trainable_tokens),
                str(t.stats.chains),
                "-" if t.reward is None else f"{t.reward:.1f}",
                f"{t.metadata.get('duration_s', 0.0):.0f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
