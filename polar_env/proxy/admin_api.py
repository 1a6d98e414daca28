"""The admin API's and the model list's bodies, typed (``proxy/app.py`` serves them): a request
is validated into its model, so a bad field is a 400 that names it, and each answer is a model,
so its keys are declared once here and not in a dict literal at each route."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from polar_env.proxy.policy import FenceWindow
from polar_env.trajectory.models import TrajectoryMetadata
from polar_env.trajectory.records import EpisodeBudget, SessionInfo


class CreateSession(BaseModel):
    """``POST /admin/sessions``. Forced ``sampling`` was called ``policy`` before the rename; either
    name is read, both at once is a 400."""

    model_config = ConfigDict(extra="ignore")  # a newer client's fields do not break an older proxy

    session_id: str | None = None
    sampling: dict[str, Any] | None = Field(default=None, validation_alias=AliasChoices("sampling", "policy"))
    # becomes the trajectory's metadata: a key Polar writes must have its type there (else a 400)
    metadata: TrajectoryMetadata | None = None
    training: bool = False
    budget: EpisodeBudget | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_name_for_sampling(cls, body: Any) -> Any:
        if isinstance(body, dict) and "sampling" in body and "policy" in body:
            raise ValueError("give sampling only (policy is its old name)")
        return body


class CloseSession(BaseModel):
    """``POST /admin/sessions/{sid}/close``: how the episode ended."""

    status: Literal["completed", "timeout", "error"] = "completed"


class SessionUrls(BaseModel):
    openai: str  # base URL for OpenAI clients (``.../v1``)
    anthropic: str  # base URL for Anthropic (and Gemini) clients


class SessionCreated(BaseModel):
    """The answer to a create: the only time the session's key is shown."""

    session_id: str
    api_key: str
    urls: SessionUrls


class SessionView(SessionInfo):
    """A session as the admin API shows it: never its key's hash."""

    key_sha256: str = Field(exclude=True)

    @classmethod
    def of(cls, info: SessionInfo, **extra: Any) -> SessionView:
        return cls.model_validate({**info.model_dump(), **extra})


class SessionDetail(SessionView):
    """``GET /admin/sessions/{sid}``: the session and how many calls it recorded."""

    calls: int


class Resumed(BaseModel):
    """``POST /admin/resume``: the version now served and the window the fence was closed for."""

    version: int | None
    window: FenceWindow | None


class ModelEntry(BaseModel):
    """One served model, with the fields the OpenAI (``Model``) and the Anthropic (``ModelInfo``)
    SDKs require, so one list answers both."""

    id: str
    object: Literal["model"] = "model"
    created: int  # OpenAI: seconds since the epoch
    owned_by: str = "polar"
    type: Literal["model"] = "model"
    display_name: str
    created_at: datetime  # Anthropic: the same instant, RFC 3339
    lifecycle: Literal["active"] = "active"

    @classmethod
    def served_since(cls, model: str, started_at: float) -> ModelEntry:
        return cls(
            id=model,
            display_name=model,
            created=int(started_at),
            created_at=datetime.fromtimestamp(int(started_at), tz=UTC),
        )


class ModelList(BaseModel):
    """``GET /v1/models``."""

    object: Literal["list"] = "list"
    data: list[ModelEntry]


class Health(BaseModel):
    """``GET /health`` of one proxy."""

    status: Literal["ok"] = "ok"
    sessions: int
    backend: str
    model: str


class WorkerAnswer(BaseModel):
    """One worker's answer to a request the multi-worker front sent to each (``proxy/workers.py``)."""

    url: str
    status: int | str  # the HTTP status, or why the worker could not be reached
    answer: Any = None


class WorkersAnswer(BaseModel):
    """The front's answer to a request that went to every worker: theirs, in worker order."""

    workers: list[WorkerAnswer]


class WorkersHealth(WorkersAnswer):
    status: Literal["ok", "degraded"]
    sessions: int
