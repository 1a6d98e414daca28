"""Anthropic Messages (``POST /v1/messages``, ``/v1/messages/count_tokens``): Claude Code's wire API.

Content blocks map onto the canonical conversation: ``tool_result`` blocks of a user message become
``tool`` messages in order, ``thinking`` becomes the assistant's reasoning and its ``signature``
(which the proxy issues, containing the call id) is the ref the engine matches the turn by.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import Field

from polar_env.chat.messages import AssistantTurn, Conversation, Message, ToolCall, ToolSpec
from polar_env.proxy import volatile
from polar_env.proxy.codecs.common import (
    PART_JOIN,
    DecodedRequest,
    WireError,
    choose_tools,
    decode_items,
    dedupe,
    echoed_model,
    finish_of,
    flag_structured_output,
    flatten_parts,
    merge_split_turns,
    no_stream_head,
    require_object,
    sampling_of,
    sse_frame,
    stops_of,
    tool_input,
    user_turn,
    validate,
    validate_items,
)
from polar_env.proxy.seen import Seen
from polar_env.wire.anthropic_messages import (
    BlockDelta,
    ContentBlock,
    ContentBlockDelta,
    ContentBlockStart,
    ContentBlockStop,
    ErrorBody,
    InputJsonDelta,
    MessageDelta,
    MessageOut,
    MessageStart,
    MessageStop,
    Ping,
    SignatureDelta,
    StopDelta,
    StreamEvent,
    TextDelta,
    TextOut,
    ThinkingDelta,
    ThinkingOut,
    TokenCount,
    ToolUseOut,
    Usage,
    anthropic_error,
)
from polar_env.wire.ids import issued_ref
from polar_env.wire.loose import Loose

API = "messages"
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
# blocks that put nothing in the prompt (server-side tool traces); skipped with a flag
HARMLESS_BLOCKS = frozenset(
    {
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "container_upload",
        "search_result",
    }
)


class TextBlock(Loose):
    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(Loose):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any] | str = Field(default_factory=dict)


class ToolResultBlock(Loose):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None


class ThinkingBlock(Loose):
    type: Literal["thinking"]
    thinking: str = ""
    signature: str | None = None


BLOCK_MODELS: dict[str, type[Loose]] = {
    "text": TextBlock,
    "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock,
    "thinking": ThinkingBlock,
}


class AnthropicMessage(Loose):
    role: Literal["user", "assistant", "system"]  # "system" mid-conversation: a Claude Code beta
    content: str | list[dict[str, Any]]


class AnthropicTool(Loose):
    name: str
    type: str | None = None  # absent or "custom" for client tools; versioned server tools otherwise
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class MessagesRequest(Loose):
    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[AnthropicTool] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: float | None = None  # recorded, never sent (a narrowing knob, neutralised)
    stream: bool | None = False
    stop_sequences: list[str] | None = None
    tool_choice: dict[str, Any] | None = None  # {"type": "auto" | "any" | "tool" | "none", "name": ...}
    output_format: dict[str, Any] | None = None  # structured outputs: {"type": "json_schema", ...}


# -- decoding ----------------------------------------------------------------------------------
def decode(body: Any, seen: Seen | None = None) -> DecodedRequest:
    """``seen``: the session's last request; the leading messages equal to its raw ones are taken
    as it decoded them (validation and conversion run on the messages new since, and its last
    message again: an empty final assistant message is valid only last), and its stripped
    messages are reused (proxy/seen.py)."""
    body = require_object(body, API)
    req, k, known = validate_items(MessagesRequest, body, "messages", API, seen, redo_last=True)
    last = k + len(req.messages) - 1
    wire, flags = decode_items(
        body["messages"], req.messages, k, known, lambda i, m, raised: _wire_message(i, m, i == last, raised)
    )
    if seen is not None:
        seen.decoded = wire
    messages, refs = wire.messages, wire.refs
    if req.system:
        system = req.system if isinstance(req.system, str) else PART_JOIN.join(b.text for b in req.system)
        messages, refs = [Message(role="system", content=system), *messages], [None, *refs]
    messages, refs = merge_split_turns(messages, refs, seen)
    prefill = _prefill(req, messages, refs)
    tools = []
    for tool in req.tools or []:
        if tool.type not in (None, "custom"):
            flags.append(f"skipped_tool:{tool.type}")
            continue
        tools.append(ToolSpec.function(tool.name, tool.description, tool.input_schema))
    tools, choice = choose_tools(tools, *_tool_choice(req.tool_choice, flags), flags)
    flag_structured_output((req.output_format or {}).get("type"), flags)
    decoded = DecodedRequest(
        conversation=Conversation(messages=messages, tools=tools),
        stream=bool(req.stream),
        model=req.model.strip(),
        raw_model=req.model,
        requested_sampling=sampling_of(req.temperature, req.top_p, req.max_tokens, req.top_k),
        flags=dedupe(flags),
        assistant_refs=refs,
        stop=stops_of(req.stop_sequences),
        tool_choice=choice,
        prefill=prefill,
    )
    return volatile.apply(decoded, seen=seen)


def _prefill(req: MessagesRequest, messages: list[Message], refs: list[str | None]) -> str | None:
    """A final assistant message is a prefill the reply continues, not a turn to close: taken out
    of the conversation (the prompt ends inside that turn) and returned as text."""
    last = messages[-1] if messages else None
    if req.messages[-1].role != "assistant" or last is None or last.role != "assistant" or last.tool_calls:
        return None
    if last.content != last.content.rstrip():
        raise WireError(400, "final assistant content cannot end with trailing whitespace")
    messages.pop()
    refs.pop()
    return last.content


def _tool_choice(choice: dict[str, Any] | None, flags: list[str]) -> tuple[str, str | None]:
    choice = choice or {}
    if choice.get("disable_parallel_tool_use"):
        flags.append("unenforced:disable_parallel_tool_use")
    kind = choice.get("type", "auto")
    if kind in ("auto", "none"):
        return kind, None
    if kind == "any":
        return "required", None
    if kind == "tool" and isinstance(choice.get("name"), str):
        return "function", choice["name"]
    raise WireError(400, f"invalid messages request: tool_choice: unsupported type {kind!r}")


def decode_count_tokens(body: Any) -> DecodedRequest:
    """``/v1/messages/count_tokens`` takes a Messages body (``max_tokens`` and ``stream`` unused)."""
    return decode(body).model_copy(update={"stream": False})


def encode_count(tokens: int) -> TokenCount:
    """count_tokens' answer: the prompt's length in the served model's tokens."""
    return TokenCount(input_tokens=tokens)


def _block(message_index: int, block_index: int, raw: Any, flags: list[str]) -> Loose | str | None:
    """A validated block, placeholder text for media, or None for a harmless block."""
    if not isinstance(raw, dict):
        raise WireError(
            400, f"invalid messages request: messages.{message_index}.content.{block_index} must be an object"
        )
    kind = raw.get("type")
    where = f"messages.{message_index}.content.{block_index}"
    if not isinstance(kind, str):
        raise WireError(400, f"invalid messages request: {where}.type must be a string")
    if kind in BLOCK_MODELS:
        return validate(BLOCK_MODELS[kind], raw, API, where)
    if kind in ("image", "document"):
        return flatten_parts([raw], flags)
    if kind == "redacted_thinking" or kind in HARMLESS_BLOCKS:
        flags.append(f"skipped_block:{kind}")
        return None
    raise WireError(400, f"invalid messages request: {where}: unsupported content block type {kind!r}")


def _wire_message(
    index: int, m: AnthropicMessage, last: bool, flags: list[str]
) -> list[tuple[Message, str | None]]:
    """The canonical messages (with refs) of the request's ``index``-th message (``last``: the final one)."""
    blocks = [{"type": "text", "text": m.content}] if isinstance(m.content, str) else m.content
    if not blocks and not (m.role == "assistant" and last):
        raise WireError(
            400,
            f"messages.{index}: all messages must have non-empty content except for "
            "the optional final assistant message",
        )
    if m.role == "assistant":
        return [_assistant(index, blocks, flags)]
    if m.role == "system":
        texts = [
            validate(TextBlock, raw, API, f"messages.{index}.content.{j}").text
            for j, raw in enumerate(blocks)
        ]
        return [(Message(role="system", content=PART_JOIN.join(texts)), None)]
    return [(message, None) for message in _user(index, blocks, flags)]


def _user(index: int, blocks: list[Any], flags: list[str]) -> list[Message]:
    return user_turn(_user_items(index, blocks, flags))


def _user_items(index: int, blocks: list[Any], flags: list[str]) -> Iterator[str | Message]:
    for j, raw in enumerate(blocks):
        block = _block(index, j, raw, flags)
        if isinstance(block, ToolResultBlock):
            yield Message(
                role="tool", content=flatten_parts(block.content, flags), tool_call_id=block.tool_use_id
            )
        elif isinstance(block, TextBlock):
            yield block.text
        elif isinstance(block, str):
            yield block
        elif block is not None:
            raise WireError(
                400,
                f"invalid messages request: messages.{index}.content.{j}: "
                f"{raw['type']} blocks belong in assistant messages",
            )


def _assistant(index: int, blocks: list[Any], flags: list[str]) -> tuple[Message, str | None]:
    texts: list[str] = []
    thoughts: list[str] | None = None
    calls: list[ToolCall] = []
    ref = None
    for j, raw in enumerate(blocks):
        block = _block(index, j, raw, flags)
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, str):
            texts.append(block)
        elif isinstance(block, ThinkingBlock):
            thoughts = (thoughts or []) + [block.thinking]
            ref = ref or block.signature
        elif isinstance(block, ToolUseBlock):
            args = (
                block.input if isinstance(block.input, str) else json.dumps(block.input, ensure_ascii=False)
            )
            calls.append(ToolCall(id=block.id, name=block.name, arguments=args))
        elif isinstance(block, ToolResultBlock):
            raise WireError(
                400,
                f"invalid messages request: messages.{index}.content.{j}: "
                "tool_result blocks belong in user messages",
            )
    reasoning = None if thoughts is None else PART_JOIN.join(thoughts)
    return Message(
        role="assistant", content=PART_JOIN.join(texts), reasoning=reasoning, tool_calls=calls
    ), ref


# -- encoding ----------------------------------------------------------------------------------
def content_blocks(turn: AssistantTurn) -> list[ContentBlock]:
    """The answer's blocks in Anthropic's order: thinking (signed with the turn's ref), text, tool calls."""
    blocks: list[ContentBlock] = []
    if turn.reasoning is not None:
        blocks.append(ThinkingOut(thinking=turn.reasoning, signature=issued_ref(turn.call_id)))
    text = turn.content.removeprefix(turn.prefill)  # a prefilled reply carries only its continuation
    if text or not turn.tool_calls:
        blocks.append(TextOut(text=text))
    blocks += [ToolUseOut(id=tc.id, name=tc.name, input=tool_input(tc)) for tc in turn.tool_calls]
    return blocks


def stop_reason(turn: AssistantTurn) -> str:
    """Anthropic's name for why the turn ended; a matched stop sequence is its own reason."""
    return "stop_sequence" if turn.stop_sequence is not None else STOP_REASONS[finish_of(turn)]


def _usage(turn: AssistantTurn, done: bool = True) -> Usage:
    """Not ``done`` (message_start, before any output is streamed) no output tokens are counted yet."""
    return Usage(input_tokens=turn.prompt_tokens, output_tokens=turn.completion_tokens if done else 0)


def _message(turn: AssistantTurn, req: DecodedRequest, content: list[ContentBlock], done: bool) -> MessageOut:
    """The message body; not ``done`` (message_start) it has no stop yet and no output counted."""
    return MessageOut(
        id=f"msg_{turn.call_id}",
        model=echoed_model(turn, req),
        content=content,
        stop_reason=stop_reason(turn) if done else None,
        stop_sequence=turn.stop_sequence if done else None,
        usage=_usage(turn, done),
    )


def encode_response(turn: AssistantTurn, req: DecodedRequest) -> MessageOut:
    """The non-streamed answer: the whole message at once."""
    return _message(turn, req, content_blocks(turn), done=True)


def _streamed(block: ContentBlock) -> tuple[ContentBlock, list[BlockDelta]]:
    """A block as the stream tells it: opened empty (content_block_start), then filled by deltas."""
    if isinstance(block, ThinkingOut):
        deltas: list[BlockDelta] = [ThinkingDelta(thinking=block.thinking)] if block.thinking else []
        return ThinkingOut(thinking="", signature=""), [*deltas, SignatureDelta(signature=block.signature)]
    if isinstance(block, TextOut):
        return TextOut(text=""), [TextDelta(text=block.text)] if block.text else []
    return (
        ToolUseOut(id=block.id, name=block.name, input={}),
        [InputJsonDelta(partial_json=json.dumps(block.input, ensure_ascii=False))],
    )


def _frame(event: StreamEvent) -> bytes:
    """An SSE frame named, as Anthropic names its events, by the event's ``type``."""
    return sse_frame(event, event=str(event.__struct_config__.tag))


def encode_stream(turn: AssistantTurn, req: DecodedRequest) -> list[bytes]:
    """The streamed answer in the event order Claude Code rebuilds the message from."""
    frames = [_frame(MessageStart(message=_message(turn, req, [], done=False))), _frame(Ping())]
    for index, block in enumerate(content_blocks(turn)):
        start, deltas = _streamed(block)
        frames.append(_frame(ContentBlockStart(index=index, content_block=start)))
        frames += [_frame(ContentBlockDelta(index=index, delta=delta)) for delta in deltas]
        frames.append(_frame(ContentBlockStop(index=index)))
    stop = StopDelta(stop_reason=stop_reason(turn), stop_sequence=turn.stop_sequence)
    frames.append(_frame(MessageDelta(delta=stop, usage=_usage(turn))))
    frames.append(_frame(MessageStop()))
    return frames


# Anthropic's own keep-alive event; sent while a slow generation runs so no client idle timeout trips
KEEPALIVE = _frame(Ping())
encode_stream_head = no_stream_head


def encode_stream_error(body: ErrorBody) -> bytes:
    """A failure after the stream started (the status line is sent): Anthropic's ``error`` event."""
    return _frame(body)


def encode_error(status: int, message: str) -> ErrorBody:
    """Anthropic's error body; Claude Code retries 429/5xx (``overloaded_error``, ``api_error``)."""
    return anthropic_error(status, message)


def encode_overflow(prompt_tokens: int, window: int | None) -> ErrorBody:
    """Anthropic's wording, which Claude Code parses (``N tokens > M maximum``) to compact reactively.

    ``M`` is the longest prompt that still leaves one token to generate."""
    limit = window - 1 if window else prompt_tokens - 1
    return encode_error(400, f"prompt is too long: {prompt_tokens} tokens > {limit} maximum")
