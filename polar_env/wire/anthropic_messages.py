"""Anthropic Messages' outgoing shapes: the ``message`` body, the stream events Claude Code rebuilds
it from, the error body and count_tokens' answer (``proxy/codecs/anthropic_messages.py`` fills them).

Content blocks, block deltas and stream events are tagged by their ``type`` (written first), so each
union below is one msgspec can also decode, and a stream event's tag is its SSE event name.
"""

from __future__ import annotations

from typing import Any, Literal

from polar_env.wire.shape import Shape

# Claude Code retries 429 and 5xx; it reads overloaded_error and api_error as transient
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


class Typed(Shape, tag_field="type"):
    """A shape whose ``type`` key is its tag (each subclass names it with ``tag=``)."""


class ThinkingOut(Typed, tag="thinking"):
    thinking: str
    signature: str  # the proxy's ref for the turn, sent back with the block on the next request


class TextOut(Typed, tag="text"):
    text: str


class ToolUseOut(Typed, tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


ContentBlock = ThinkingOut | TextOut | ToolUseOut


class Usage(Shape):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0  # no prompt caching (cache_control) is offered
    cache_read_input_tokens: int = 0


class MessageOut(Shape):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentBlock]
    stop_reason: str | None  # null until the stream's message_delta tells it
    stop_sequence: str | None
    usage: Usage


class ThinkingDelta(Typed, tag="thinking_delta"):
    thinking: str


class SignatureDelta(Typed, tag="signature_delta"):
    signature: str


class TextDelta(Typed, tag="text_delta"):
    text: str


class InputJsonDelta(Typed, tag="input_json_delta"):
    partial_json: str


BlockDelta = ThinkingDelta | SignatureDelta | TextDelta | InputJsonDelta


class MessageStart(Typed, tag="message_start"):
    message: MessageOut


class Ping(Typed, tag="ping"):
    pass


class ContentBlockStart(Typed, tag="content_block_start"):
    index: int
    content_block: ContentBlock


class ContentBlockDelta(Typed, tag="content_block_delta"):
    index: int
    delta: BlockDelta


class ContentBlockStop(Typed, tag="content_block_stop"):
    index: int


class StopDelta(Shape):
    stop_reason: str
    stop_sequence: str | None


class MessageDelta(Typed, tag="message_delta"):
    delta: StopDelta
    usage: Usage


class MessageStop(Typed, tag="message_stop"):
    pass


class ErrorDetail(Shape):
    type: str
    message: str


class ErrorBody(Typed, tag="error"):
    error: ErrorDetail


StreamEvent = (
    MessageStart
    | Ping
    | ContentBlockStart
    | ContentBlockDelta
    | ContentBlockStop
    | MessageDelta
    | MessageStop
    | ErrorBody
)


class TokenCount(Shape):
    input_tokens: int


def anthropic_error(status: int, message: str) -> ErrorBody:
    """The error body for an HTTP status, typed as Anthropic types it (unlisted: by 4xx or 5xx)."""
    kind = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return ErrorBody(error=ErrorDetail(type=kind, message=message))
