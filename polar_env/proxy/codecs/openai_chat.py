"""OpenAI Chat Completions (``POST /v1/chat/completions``): Pi's default wire API.

Decodes the request into the canonical conversation and encodes an :class:`AssistantTurn` as a
``chat.completion`` body or as ``chat.completion.chunk`` SSE frames ending in ``data: [DONE]``.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from polar_env.chat.messages import AssistantTurn, Conversation, Message, ToolCall, ToolSpec
from polar_env.proxy import volatile
from polar_env.proxy.codecs.common import (
    SSE_COMMENT_KEEPALIVE,
    DecodedRequest,
    OpenAIRequestFields,
    WireError,
    choose_tools,
    custom_tool_description,
    decode_items,
    dedupe,
    echoed_model,
    finish_of,
    flag_structured_output,
    flatten_parts,
    merge_split_turns,
    no_stream_head,
    openai_tool_choice,
    refuse_n,
    require_object,
    sampling_of,
    sse_frame,
    stops_of,
    validate_items,
)
from polar_env.proxy.seen import Seen
from polar_env.wire.loose import Loose
from polar_env.wire.openai_chat import (
    AssistantMessageOut,
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChoiceLogprobs,
    ChunkChoice,
    CustomCallOut,
    Delta,
    FunctionCallOut,
    TokenLogprobOut,
    ToolCallOut,
    Usage,
)
from polar_env.wire.openai_errors import ErrorBody, openai_error, openai_overflow
from polar_env.wire.shape import UNSET, UnsetType

API = "chat completions"


class ContentPart(Loose):
    type: str = "text"
    text: str | None = None


class FunctionCall(Loose):
    name: str
    arguments: str | dict[str, Any] = "{}"


class CustomCall(Loose):
    name: str
    input: str = ""


class ChatToolCall(Loose):
    id: str
    type: Literal["function", "custom"] = "function"
    function: FunctionCall | None = None
    custom: CustomCall | None = None


class ChatMessage(Loose):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class FunctionDef(Loose):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class CustomDef(Loose):
    name: str
    description: str | None = None
    format: dict[str, Any] | None = None


class ChatTool(Loose):
    type: str = "function"
    function: FunctionDef | None = None
    custom: CustomDef | None = None


class StreamOptions(Loose):
    include_usage: bool = False


class ChatRequest(OpenAIRequestFields):
    messages: list[ChatMessage] = Field(min_length=1)
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    tools: list[ChatTool] | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    logprobs: bool | None = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's extension; ``enable_thinking`` is read


def decode(body: Any, seen: Seen | None = None) -> DecodedRequest:
    """``seen``: the session's last request; the leading messages equal to its raw ones are taken
    as it decoded them, so validation and conversion run on the messages new since."""
    body = require_object(body, API)
    req, k, known = validate_items(ChatRequest, body, "messages", API, seen)
    refuse_n(req.n)
    wire, flags = decode_items(
        body["messages"], req.messages, k, known, lambda i, m, raised: [(_message(m, i, raised), None)]
    )
    if seen is not None:
        seen.decoded = wire
    messages, refs = merge_split_turns(wire.messages, wire.refs, seen)
    tools = [t for t in (_tool(t, flags) for t in req.tools or []) if t is not None]
    tools, choice = choose_tools(tools, *openai_tool_choice(req.tool_choice, flags), flags)
    if req.parallel_tool_calls is False:
        flags.append("unenforced:parallel_tool_calls=false")
    flag_structured_output((req.response_format or {}).get("type"), flags)
    if req.top_logprobs:
        flags.append("unenforced:top_logprobs")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    decoded = DecodedRequest(
        conversation=Conversation(messages=messages, tools=tools),
        stream=bool(req.stream),
        model=req.model.strip(),
        raw_model=req.model,
        requested_sampling=sampling_of(req.temperature, req.top_p, max_tokens, req.top_k),
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        flags=dedupe(flags),
        assistant_refs=refs,
        stop=stops_of(req.stop, limit=4),
        tool_choice=choice,
        logprobs=bool(req.logprobs),
        enable_thinking=_enable_thinking(req.chat_template_kwargs),
    )
    return volatile.apply(decoded, seen=seen)


def _enable_thinking(kwargs: dict[str, Any] | None) -> bool | None:
    value = (kwargs or {}).get("enable_thinking")
    if value is not None and not isinstance(value, bool):
        raise WireError(400, "chat_template_kwargs.enable_thinking must be true or false")
    return value


def _message(m: ChatMessage, index: int, flags: list[str]) -> Message:
    text = flatten_parts(m.content, flags)
    if m.role in ("system", "developer"):
        return Message(role="system", content=text)
    if m.role == "user":
        return Message(role="user", content=text)
    if m.role in ("tool", "function"):
        if m.role == "tool" and not m.tool_call_id:
            raise WireError(400, f"messages.{index}: a tool message needs tool_call_id")
        return Message(role="tool", content=text, tool_call_id=m.tool_call_id, name=m.name)
    calls = [_call(c, index) for c in m.tool_calls or []]
    reasoning = m.reasoning_content if m.reasoning_content is not None else m.reasoning
    return Message(role="assistant", content=text, reasoning=reasoning, tool_calls=calls)


def _call(c: ChatToolCall, index: int) -> ToolCall:
    if c.type == "custom":
        if c.custom is None:
            raise WireError(400, f"messages.{index}.tool_calls: custom call {c.id} has no 'custom' object")
        return ToolCall(id=c.id, name=c.custom.name, arguments=c.custom.input, kind="custom")
    if c.function is None:
        raise WireError(400, f"messages.{index}.tool_calls: call {c.id} has no 'function' object")
    args = c.function.arguments
    return ToolCall(
        id=c.id,
        name=c.function.name,
        arguments=args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
    )


def _tool(t: ChatTool, flags: list[str]) -> ToolSpec | None:
    if t.type == "function" and t.function is not None:
        return ToolSpec.function(t.function.name, t.function.description, t.function.parameters)
    if t.type == "custom" and t.custom is not None:
        return ToolSpec(
            name=t.custom.name,
            kind="custom",
            description=custom_tool_description(t.custom.description or "", t.custom.format),
        )
    flags.append(f"skipped_tool:{t.type}")
    return None


# -- encoding ----------------------------------------------------------------------------------
def _wire_call(tc: ToolCall, index: int | UnsetType = UNSET) -> ToolCallOut:
    if tc.kind == "custom":
        return ToolCallOut(
            index=index, id=tc.id, type="custom", custom=CustomCallOut(name=tc.name, input=tc.arguments)
        )
    return ToolCallOut(
        index=index, id=tc.id, type="function", function=FunctionCallOut(name=tc.name, arguments=tc.arguments)
    )


def _usage(turn: AssistantTurn) -> Usage:
    return Usage(
        prompt_tokens=turn.prompt_tokens,
        completion_tokens=turn.completion_tokens,
        total_tokens=turn.prompt_tokens + turn.completion_tokens,
    )


def _logprobs(turn: AssistantTurn) -> ChoiceLogprobs | None:
    if turn.logprobs is None:
        return None
    return ChoiceLogprobs(
        content=[
            TokenLogprobOut(token=t.token, logprob=t.logprob, bytes=t.bytes, top_logprobs=t.top_logprobs)
            for t in turn.logprobs
        ]
    )


def encode_response(turn: AssistantTurn, req: DecodedRequest) -> ChatCompletion:
    message = AssistantMessageOut(
        content=turn.content if turn.content or not turn.tool_calls else None,
        reasoning_content=UNSET if turn.reasoning is None else turn.reasoning,
        tool_calls=[_wire_call(tc) for tc in turn.tool_calls] if turn.tool_calls else UNSET,
    )
    return ChatCompletion(
        id=f"chatcmpl-{turn.call_id}",
        created=turn.created_at,
        model=echoed_model(turn, req),
        choices=[Choice(message=message, logprobs=_logprobs(turn), finish_reason=finish_of(turn))],
        usage=_usage(turn),
    )


def encode_stream(turn: AssistantTurn, req: DecodedRequest) -> list[bytes]:
    head = {"id": f"chatcmpl-{turn.call_id}", "created": turn.created_at, "model": echoed_model(turn, req)}

    def chunk(delta: Delta, finish: str | None = None, logprobs: ChoiceLogprobs | None = None) -> bytes:
        return sse_frame(
            ChatCompletionChunk(
                **head, choices=[ChunkChoice(delta=delta, logprobs=logprobs, finish_reason=finish)]
            )
        )

    frames = [chunk(Delta(role="assistant", content=""))]
    if turn.reasoning:
        frames.append(chunk(Delta(reasoning_content=turn.reasoning)))
    if turn.content or turn.logprobs is not None:
        frames.append(chunk(Delta(content=turn.content), logprobs=_logprobs(turn)))
    frames += [chunk(Delta(tool_calls=[_wire_call(tc, i)])) for i, tc in enumerate(turn.tool_calls)]
    frames.append(chunk(Delta(), finish_of(turn)))
    if req.include_usage:
        frames.append(sse_frame(ChatCompletionChunk(**head, choices=[], usage=_usage(turn))))
    frames.append(sse_frame("[DONE]"))
    return frames


KEEPALIVE = SSE_COMMENT_KEEPALIVE
encode_stream_head = no_stream_head


def encode_stream_error(body: ErrorBody) -> bytes:
    """A failure after the stream started: the error body as a chunk, then the end of the stream."""
    return sse_frame(body) + sse_frame("[DONE]")


def encode_error(status: int, message: str) -> ErrorBody:
    return openai_error(status, message)


def encode_overflow(prompt_tokens: int, window: int | None) -> ErrorBody:
    """Chat Completions' wording, numbers included (as vLLM's OpenAI server words it too)."""
    return openai_overflow(
        f"This model's maximum context length is {window or prompt_tokens - 1} tokens. However, your "
        f"messages resulted in {prompt_tokens} tokens. Please reduce the length of the messages.",
        "messages",
    )
