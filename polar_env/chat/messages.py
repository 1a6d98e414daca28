"""The canonical conversation every wire API decodes into.

Chat Completions, Responses and Anthropic Messages all reduce to these few types, so the token
path (rendering, prefix matching, ledger) is written once. Equality of canonical messages is what
decides whether a new request extends an earlier call, so these models carry no volatile fields.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Literal

from pydantic import BaseModel, Field

Role = Literal["system", "user", "assistant", "tool"]


class ToolCall(BaseModel):
    """A tool call as the model made it; ``arguments`` is JSON text (raw text for custom tools)."""

    id: str
    name: str
    arguments: str = "{}"
    kind: Literal["function", "custom"] = "function"


class Message(BaseModel):
    role: Role
    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None  # role == "tool": the call this result answers
    name: str | None = None  # role == "tool": the tool's name, when the API gives it

    def fingerprint(self) -> str:
        """Stable hash of the message, used for message-level prefix matching."""
        return _digest(self.model_dump(mode="json"))


class ToolSpec(BaseModel):
    """A tool offered to the model; ``kind='custom'`` is a free-text tool (Codex's apply_patch)."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    kind: Literal["function", "custom"] = "function"

    @classmethod
    def function(cls, name: str, description: str | None, parameters: dict[str, Any] | None) -> ToolSpec:
        """A function tool as the APIs declare one: no schema means one that takes no arguments."""
        if parameters is None:
            return cls(name=name, description=description or "")
        return cls(name=name, description=description or "", parameters=parameters)


class Conversation(BaseModel):
    """What one harness request asks for, reduced to what reaches the model's prompt."""

    messages: list[Message]
    tools: list[ToolSpec] = Field(default_factory=list)

    def tools_fingerprint(self) -> str:
        return _digest([t.model_dump(mode="json") for t in self.tools])


class TokenLogprob(BaseModel):
    """One sampled token's recorded logprob, in the OpenAI APIs' shape (no alternatives)."""

    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[dict[str, Any]] = Field(default_factory=list)


class AssistantTurn(BaseModel):
    """The parsed answer of one model call, which each wire API encodes in its own shape."""

    call_id: str
    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    finish_reason: Literal["stop", "length", "tool_calls"] = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    malformed_tool_call: bool = False
    model: str = ""
    stop_sequence: str | None = None  # the stop string the reply was cut at
    prefill: str = ""  # Anthropic prefill: ``content`` starts with it, the answer carries only the rest
    # only when the harness asked for logprobs; the record keeps them once, as ``CallRecord.logprobs``
    logprobs: list[TokenLogprob] | None = Field(default=None, exclude=True)
    # when the call was made (seconds): the answer's ``created``; the record keeps it as ``created_at``
    created_at: int = Field(default_factory=lambda: int(time.time()), exclude=True)

    def as_message(self) -> Message:
        return Message(
            role="assistant", content=self.content, reasoning=self.reasoning, tool_calls=self.tool_calls
        )


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]
