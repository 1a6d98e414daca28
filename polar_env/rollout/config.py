"""The settings of one rollout job, typed once: the CLI fills them, Ray ships them to every node."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from polar_env.episodes.settings import EpisodeSettings, StageSettings, TaskSettings
from polar_env.proxy.settings import ProxySettings


def host_port(value: str) -> str:
    """``HOST:PORT`` as given, or a ValueError that says what is expected."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT (e.g. 127.0.0.1:8787), got {value!r}")
    return value


class RolloutConfig(ProxySettings, EpisodeSettings, StageSettings, TaskSettings):
    """What `polar rollout` / `polar demo` were asked to do (one field per flag, same names; the proxy's
    own settings are ``ProxySettings``', every episode's ``EpisodeSettings``')."""

    model_config = ConfigDict(frozen=True)

    task_ids: list[str] | None = None
    limit: int | None = None
    policy: str = "model"  # who picks each answer: the backend's model, or a scripted policy (gold, noop)
    score_window: int = 1024  # scripted policies: prompt tokens the model scores each answer with
    samples: int = Field(default=1, ge=1)  # GRPO group size
    concurrency: int = Field(default=1, ge=1)  # run slots, by their old name (--run-slots wins)
    grade_slots: int | None = Field(default=None, ge=1)  # episodes graded at once
    lookahead: int | None = Field(default=None, ge=1)  # live harnesses beyond the run slots
    collapsed: bool = False  # one slot over every stage of an episode (the driver before stages)
    out: Path = Path("runs/rollout")
    refuse_controllable: bool = False  # refuse tasks `polar tasks audit` found controllable (else a warning)
    ray: str | None = None  # a Ray cluster address ('auto': the one on this machine)
    train_paths: str = "all"  # which chains become training rows: all | main | final | module:function
    # HOST:PORT where the proxy also listens on TCP, for its admin API (the weight-sync fence, the version)
    admin: str | None = None
    # watching the run (docs/rollout.md "Watching a run"): where /metrics is served, where per-round figures
    # go
    metrics_port: str | None = None  # PORT or HOST:PORT
    report_to: list[Literal["tensorboard", "wandb"]] = []
    gpus: int | None = Field(default=None, ge=1)  # the backend's GPUs: the accepted work per GPU-hour

    @field_validator("admin")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        return None if value is None else host_port(value)

    @field_validator("train_paths")
    @classmethod
    def _known_paths(cls, value: str) -> str:
        from polar_env.trajectory.paths import selector

        selector(value)  # a bad value fails here, before any episode runs
        return value
