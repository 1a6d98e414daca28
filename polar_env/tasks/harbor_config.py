"""The typed model of a Harbor task's ``task.toml`` (harbor 0.25.0's ``harbor.models.task.config``).

Only the fields Polar acts on are typed; every other key is kept as it is (``extra="allow"``), so a
newer task still loads and an export writes it back unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Harbor's verifier paths: the reward test.sh writes, the tests copied in after the agent, and the fresh
# HOME Polar gives test.sh; in a Harbor task's containers each is a host directory
# (rewards/harbor_verifier.py)
VERIFIER_DIR = "/logs/verifier"
TESTS_DIR = "/tests"
VERIFIER_HOME = "/var/lib/polar-verifier-home"
VERIFIER_HOST_DIRS = (VERIFIER_DIR, TESTS_DIR, VERIFIER_HOME)


class _Section(BaseModel):
    model_config = ConfigDict(extra="allow")


class AgentSection(_Section):
    timeout_sec: float | None = None
    user: str | int | None = None


class EnvironmentSection(_Section):
    build_timeout_sec: float = 600.0
    docker_image: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    gpus: int | None = None
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    allow_internet: bool | None = None  # deprecated in harbor 0.25 for network_mode; both read
    network_mode: str | None = None  # "no-network" | "public" | "allowlist"

    @property
    def wants_internet(self) -> bool:
        """What the task asks for; Polar's episodes reach only the proxy either way (docs/tasks.md)."""
        if self.network_mode is not None:
            return self.network_mode != "no-network"
        return bool(self.allow_internet)


class VerifierSection(_Section):
    timeout_sec: float = 600.0
    env: dict[str, str] = Field(default_factory=dict)
    user: str | int | None = None  # None: the agent's uid here (Harbor: the image's default user)
    environment_mode: Literal["shared", "separate"] | None = None
    environment: EnvironmentSection | None = None  # [verifier.environment]: implies "separate"

    @model_validator(mode="after")
    def _shared_has_no_environment(self) -> VerifierSection:
        if self.environment_mode == "shared" and self.environment is not None:
            raise ValueError("environment_mode = 'shared' is incompatible with [verifier.environment]")
        return self

    @property
    def separate(self) -> bool:
        """Harbor's rule: an explicit ``environment_mode``, else separate exactly when
        ``[verifier.environment]`` is given."""
        if self.environment_mode is not None:
            return self.environment_mode == "separate"
        return self.environment is not None


class SolutionSection(_Section):
    env: dict[str, str] = Field(default_factory=dict)


class HarborConfig(BaseModel):
    """``task.toml``: the sections of harbor's ``TaskConfig`` Polar uses; unknown keys are kept."""

    model_config = ConfigDict(extra="allow")

    schema_version: str = "1.0"
    task: dict[str, Any] | None = None  # [task] package info (name = "org/name")
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: VerifierSection = Field(default_factory=VerifierSection)
    agent: AgentSection = Field(default_factory=AgentSection)
    environment: EnvironmentSection = Field(default_factory=EnvironmentSection)
    solution: SolutionSection = Field(default_factory=SolutionSection)
    steps: list[dict[str, Any]] | None = None
    # what a separate verifier gets of the agent's container: paths, or {source, destination, exclude}
    artifacts: list[str | dict[str, Any]] = Field(default_factory=list)


class HarborRef(BaseModel):
    """What a Polar task keeps of its folder: where it is and its parsed config."""

    path: str
    config: HarborConfig

    @property
    def root(self) -> Path:
        return Path(self.path)

    @property
    def tests_dir(self) -> Path:
        return self.root / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.root / "solution"

    @property
    def environment_dir(self) -> Path:
        return self.root / "environment"
