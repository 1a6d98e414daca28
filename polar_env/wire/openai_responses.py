"""OpenAI Responses API's outgoing shapes: the output items, the ``response`` object and the stream
events (``proxy/codecs/openai_responses.py`` fills them). The items are also what a NeMo Gym result records
of a turn (``wire/responses.py:output_items`` builds them for both); the request side's items are
the pydantic models in ``wire/responses.py``."""

from __future__ import annotations

from typing import Any, Literal

from polar_env.wire.shape import UNSET, Shape, UnsetType

ItemStatus = Literal["in_progress", "completed", "incomplete"]


# -- output items --------------------------------------------------------------------------------
class SummaryText(Shape):
    type: Literal["summary_text"] = "summary_text"
    text: str


class ReasoningOut(Shape):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[SummaryText]
    encrypted_content: str  # the call's ref (polar:v1:ID): how the next request names this turn


class LogprobOut(Shape):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[dict[str, Any]]


class OutputText(Shape):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[LogprobOut] | UnsetType = UNSET  # only when the request included them


class MessageOut(Shape):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]
    status: ItemStatus


class FunctionCallOut(Shape):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    namespace: str | UnsetType = UNSET  # Codex's namespaced tools: the call goes back as (namespace, name)
    arguments: str
    status: ItemStatus


class CustomToolCallOut(Shape):
    type: Literal["custom_tool_call"] = "custom_tool_call"
    id: str
    call_id: str
    name: str
    input: str
    status: ItemStatus


OutputItem = ReasoningOut | MessageOut | FunctionCallOut | CustomToolCallOut


class InputMessage(Shape):
    """A user, system or developer message as a Responses ``input`` item (an export's history)."""

    type: Literal["message"] = "message"
    role: str
    content: str


class FunctionCallOutput(Shape):
    """A tool result as a Responses ``input`` item (an export's history)."""

    type: Literal["function_call_output"] = "function_call_output"
    call_id: str
    output: str


# -- the response object ------------------------------------------------------------------------
class InputTokensDetails(Shape, frozen=True):
    cached_tokens: int = 0


class OutputTokensDetails(Shape, frozen=True):
    reasoning_tokens: int = 0


class Usage(Shape):
    input_tokens: int
    input_tokens_details: InputTokensDetails = InputTokensDetails()
    output_tokens: int
    output_tokens_details: OutputTokensDetails = OutputTokensDetails()
    total_tokens: int


class IncompleteDetails(Shape):
    reason: Literal["max_output_tokens"] = "max_output_tokens"


class Response(Shape):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    error: None = None
    incomplete_details: IncompleteDetails | None = None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool = True
    tool_choice: str = "auto"
    tools: list[Any] = []
    usage: Usage | None = None  # None until the response is done


# -- stream events ------------------------------------------------------------------------------
class StreamEvent(Shape):
    """What every numbered event starts with; ``type`` is also the SSE event name, and the codec
    sets ``sequence_number`` as it sends the event. Each event narrows ``type`` to its names."""

    type: Any
    sequence_number: int = 0


class ResponseEvent(StreamEvent):
    type: Literal["response.created", "response.in_progress", "response.completed"]
    response: Response


class OutputItemEvent(StreamEvent):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int
    item: OutputItem


class ItemEvent(StreamEvent):
    """An event about the text of one output item."""

    item_id: str
    output_index: int


class SummaryPartEvent(ItemEvent):
    type: Literal["response.reasoning_summary_part.added", "response.reasoning_summary_part.done"]
    summary_index: int
    part: SummaryText


class SummaryTextDelta(ItemEvent):
    type: Literal["response.reasoning_summary_text.delta"] = "response.reasoning_summary_text.delta"
    summary_index: int
    delta: str


class SummaryTextDone(ItemEvent):
    type: Literal["response.reasoning_summary_text.done"] = "response.reasoning_summary_text.done"
    summary_index: int
    text: str


class ContentPartEvent(ItemEvent):
    type: Literal["response.content_part.added", "response.content_part.done"]
    content_index: int
    part: OutputText


class OutputTextDelta(ItemEvent):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    content_index: int
    delta: str
    logprobs: list[LogprobOut]


class OutputTextDone(ItemEvent):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    content_index: int
    text: str
    logprobs: list[LogprobOut]


class FunctionCallArgumentsDelta(ItemEvent):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    delta: str


class FunctionCallArgumentsDone(ItemEvent):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    name: str
    arguments: str


class CustomToolCallInputDelta(ItemEvent):
    type: Literal["response.custom_tool_call_input.delta"] = "response.custom_tool_call_input.delta"
    delta: str


class CustomToolCallInputDone(ItemEvent):
    type: Literal["response.custom_tool_call_input.done"] = "response.custom_tool_call_input.done"
    input: str


class Keepalive(Shape):
    """OpenAI's heartbeat on long requests; Codex's idle timer counts it, openai-python hands it
    on as an event of type ``keepalive`` (tests/wire/test_wire_sdk_shapes.py)."""

    type: Literal["keepalive"] = "keepalive"


class ErrorEvent(Shape):
    """A failure after the stream opened: OpenAI's ``ResponseErrorEvent`` (``code`` carries the
    error's kind when it has no code of its own)."""

    type: Literal["error"] = "error"
    message: str
    param: str | None
    code: str | None
    sequence_number: int = 0
