"""The record of one model call, the unit the proxy appends to the ledger.

This is the contract between the proxy (writer) and the trajectory package (ledger, chain
builder, exporters). Session keys never appear here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from polar_env.backends.base import SamplingParams
from polar_env.chat.messages import AssistantTurn, Message, ToolSpec
from polar_env.outcomes import FailureKind

RECORD_SCHEMA_VERSION = 1


class CallRecord(BaseModel):
    schema_version: int = RECORD_SCHEMA_VERSION
    session_id: str
    call_index: int  # 0-based order of arrival within the session
    call_id: str  # id the proxy issued (response id, message id, completion id)
    api: Literal["chat", "responses", "messages", "gemini"]
    created_at: float
    messages: list[Message]  # canonical request messages after volatile stripping
    tools: list[ToolSpec] = Field(default_factory=list)
    prompt_ids: list[int] = Field(default_factory=list)
    sampled_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    output: AssistantTurn | None = None  # None when the backend failed
    finish_reason: str | None = None
    stop_sequence: str | None = None  # the requested stop string the reply was cut at (sampled ids end with it)
    # text written after the generation prompt, whose ids end prompt_ids: an Anthropic prefill, or the
    # start of a tool call that tool_choice required
    prefill: str = ""
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    requested_sampling: dict[str, Any] = Field(default_factory=dict)  # what the harness asked for
    overridden: list[str] = Field(default_factory=list)  # params the session policy overrode
    backend: str = ""
    model: str = ""
    timings: dict[str, float] = Field(default_factory=dict)  # render_ms, generate_ms, total_ms
    flags: list[str] = Field(default_factory=list)  # malformed_tool_call, stripped:<rule>, ...
    parent_call_index: int | None = None  # the call whose prompt+sampled ids this prompt extends
    reused_prefix_len: int = 0  # prompt ids taken verbatim from the parent (its prompt + sampled)
    break_reason: str | None = None  # why this call starts a new chain (None when it extends one)
    error: str | None = None  # why the call failed, if it did
    failure_kind: FailureKind | None = None  # backend_failure, proxy_failure, context_overflow, episode_budget


class EpisodeBudget(BaseModel):
    """Per-episode limits the proxy enforces whatever the harness's own step caps say (None: no limit):
    past one, each call is refused in its API's error shape and the episode ends ``episode_budget``."""

    max_calls: int | None = Field(default=None, ge=1)  # model calls let through (failed ones count too)
    max_sampled_tokens: int | None = Field(default=None, ge=1)  # tokens sampled over all calls


class SessionInfo(BaseModel):
    """What is persisted about a session; the key is stored only as a salted hash."""

    schema_version: int = RECORD_SCHEMA_VERSION
    session_id: str
    key_sha256: str
    created_at: float
    policy: dict[str, Any] = Field(default_factory=dict)  # forced sampling (temperature, top_p, max_tokens)
    metadata: dict[str, Any] = Field(default_factory=dict)  # task_id, group_id, harness, ...
    training: bool = False  # its samples are trained on: sampling must match the backend's logprobs
    logprobs_mode: Literal["raw", "processed", "unknown"] = "unknown"  # what the backend returned at start
    budget: EpisodeBudget = Field(default_factory=EpisodeBudget)
    closed_at: float | None = None
    status: Literal["open", "completed", "timeout", "error"] = "open"
