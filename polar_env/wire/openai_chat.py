"""OpenAI Chat Completions' outgoing shapes: the ``chat.completion`` body and its
``chat.completion.chunk`` stream events (``proxy/codecs/openai_chat.py`` fills them)."""

from __future__ import annotations

from typing import Any, Literal

from polar_env.wire.shape import UNSET, Shape, UnsetType


class FunctionCallOut(Shape):
    name: str
    arguments: str


class CustomCallOut(Shape):
    name: str
    input: str


class ToolCallOut(Shape):
    index: int | UnsetType = UNSET  # stream deltas only
    id: str
    type: Literal["function", "custom"]
    function: FunctionCallOut | UnsetType = UNSET
    custom: CustomCallOut | UnsetType = UNSET


class TokenLogprobOut(Shape):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[dict[str, Any]]


class ChoiceLogprobs(Shape):
    content: list[TokenLogprobOut]
    refusal: None = None


class AssistantMessageOut(Shape):
    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[ToolCallOut] | UnsetType = UNSET


class Choice(Shape):
    index: int = 0
    message: AssistantMessageOut
    logprobs: ChoiceLogprobs | None
    finish_reason: str


class Usage(Shape):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(Shape):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class Delta(Shape):
    role: Literal["assistant"] | UnsetType = UNSET
    content: str | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[ToolCallOut] | UnsetType = UNSET


class ChunkChoice(Shape):
    index: int = 0
    delta: Delta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(Shape):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | UnsetType = UNSET
