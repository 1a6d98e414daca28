"""How every episode runs, typed once: ``EpisodeSettings`` (the harness, its deadline, the sampling the
trainer dictates, the per-episode budget, the outcome table, where and how long it is graded).
``polar rollout``/``demo``/``train`` (``RolloutConfig``) and the Gym agent (``PolarAgentConfig``) inherit
these fields under these names, beside ``ProxySettings``, so one settings file fragment (``--settings
FILE``, or the Gym agent's YAML) sets any of them; each field is also a flag of the same name
(``--max-tokens`` sets ``max_tokens``). The stages (``polar_env.episodes.stages``) take the settings
themselves."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

from polar_env.outcomes import FailureKind, Outcome, OutcomeTable, parse_outcome
from polar_env.rewards.sandbox_exec import grading_timeout_s
from polar_env.trajectory.records import EpisodeBudget

# the names these settings had in the Gym servers' configs before they were declared once: refused by name
RENAMED = {
    "timeout_s": "timeout",
    "grading_timeout_s": "grading_timeout",
    "default_sampling": "temperature, top_p and max_tokens",
    "outcomes": "outcome (rows) and min_backend_tokens_per_s",
    "budget": "max_calls and max_sampled_tokens",
}


class GradingSettings(BaseModel):
    """Where an episode's workspace is made and how it is graded: in NeMo Gym the resources server's
    settings (``PolarResourcesConfig`` inherits these), in `polar rollout` part of ``EpisodeSettings``."""

    sandbox: str = "auto"  # auto | bubblewrap | docker | podman | apptainer (polar_env.episodes.workspace)
    # grading's own deadline (s), which outlives the harness's: POLAR_GRADING_TIMEOUT_S, else the default
    grading_timeout: float = Field(default_factory=grading_timeout_s)
    reward_key: str | None = None  # Harbor tasks: the reward.json key trained on (rewards/harbor_verifier.py)

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and (old := sorted(set(data) & set(RENAMED))):
            raise ValueError("; ".join(f"{name} is now {RENAMED[name]}" for name in old))
        return data


class TaskSettings(BaseModel):
    """Which tasks a job's episodes run: `polar rollout`'s ``--tasks``, the Gym resources server's
    ``tasks`` (the agent reads each row's ``task_id``)."""

    # bundled | terminal | verified | FILE.jsonl | a Harbor task folder | DATASET[:split] (tasks/loader.py)
    tasks: str = "bundled"


class StageSettings(BaseModel):
    """How many episodes are in each stage at once (docs/rollout.md, "Stages"; episodes/admission.py
    enters them), for `polar rollout` and the Gym agent alike."""

    run_slots: int | None = Field(default=None, ge=1)  # model calls at once (the inference concurrency)
    # workspaces opened and harnesses started (up to their first model call) at once: a dozen harnesses
    # starting together on a few cores each take several times as long; None: the run slots
    prepare_slots: int | None = Field(default=None, ge=1)
    # an episode starts only while the policy lag is within this many versions (None: no bound)
    max_staleness: int | None = Field(default=None, ge=0)


class EpisodeSettings(GradingSettings):
    """The settings of every episode of a job (the Gym agent's row sampling overrides the three sampling
    fields per episode)."""

    harness: str = "pi"  # a name in harness_adapters/registry.py
    timeout: float = 600.0  # the harness's wall-clock deadline per episode (s)
    temperature: float = 1.0  # the sampling the trainer dictates to every model call
    top_p: float = 1.0
    max_tokens: int = 1024  # per model call
    max_calls: int | None = Field(default=None, ge=1)  # per-episode budget at the proxy: model calls
    max_sampled_tokens: int | None = Field(default=None, ge=1)  # ... and tokens sampled over all calls
    # rows overriding the outcome table (docs/outcomes.md): KIND: mask | REWARD (a flag: KIND=mask|REWARD)
    outcome: dict[FailureKind, Outcome] = {}
    # a deadline hit while the backend sampled slower than this is masked, not the policy's
    min_backend_tokens_per_s: float = Field(default=OutcomeTable().min_backend_tokens_per_s, ge=0.0)
    mask_single_call: bool = False  # mask rollouts whose harness made one model call (OpenEnv RFC 006)

    @field_validator("outcome", mode="before")
    @classmethod
    def _outcome_rows(cls, value: Any) -> Any:
        """Rows as a mapping (``{harness_crashed: mask}``), ``KIND=VALUE`` strings or (kind, row) pairs."""
        if isinstance(value, dict):
            value = list(value.items())
        if not isinstance(value, list | tuple):
            return value
        items = value
        rows = {}
        for item in items:
            if isinstance(item, str):
                item = parse_outcome(item)
            kind, row = item
            if isinstance(row, str | int | float) and not isinstance(row, bool):
                row = parse_outcome(f"{FailureKind(kind).value}={row}")[1]
            rows[kind] = row
        return rows

    def episode_settings(self) -> EpisodeSettings:
        """These settings alone (a subclass's config, e.g. ``RolloutConfig``, reduced to them)."""
        return EpisodeSettings.model_validate(self.model_dump(include=set(EpisodeSettings.model_fields)))

    def sampling(self) -> dict[str, float | int]:
        """The sampling parameters the trainer dictates to every model call (the session forces them)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens}

    def budget(self) -> EpisodeBudget:
        return EpisodeBudget(max_calls=self.max_calls, max_sampled_tokens=self.max_sampled_tokens)

    def outcomes(self) -> OutcomeTable:
        return OutcomeTable(rows=self.outcome, min_backend_tokens_per_s=self.min_backend_tokens_per_s)
