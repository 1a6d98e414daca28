"""OpenAI Responses API (``POST /v1/responses``): Codex's only wire API, and one of Pi's.

Codex resends the full history each turn (``store: false``) as typed items. The assistant side of
one turn arrives as several items (reasoning, message, function calls) which merge back into one
canonical assistant message. The proxy is stateless per request: ``previous_response_id`` is refused.
Streams end in ``response.completed`` even for truncated turns (with ``status: "incomplete"``):
Codex treats ``response.incomplete`` as a failure and retries the same call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from msgspec.structs import replace

from polar_env.chat.messages import AssistantTurn, Conversation, Message, ToolCall, ToolSpec
from polar_env.proxy import volatile
from polar_env.proxy.codecs.common import (
    PART_JOIN,
    DecodedRequest,
    OpenAIRequestFields,
    WireError,
    choose_tools,
    custom_tool_description,
    dedupe,
    echoed_model,
    finish_of,
    flag_structured_output,
    flatten_parts,
    merge_split_turns,
    openai_tool_choice,
    require_object,
    sampling_of,
    sse_frame,
    validate,
)
from polar_env.proxy.seen import Seen
from polar_env.wire.ids import call_id_from_ref
from polar_env.wire.loose import Loose
from polar_env.wire.openai_errors import ErrorBody, openai_error, openai_overflow
from polar_env.wire.openai_responses import (
    ContentPartEvent,
    CustomToolCallInputDelta,
    CustomToolCallInputDone,
    ErrorEvent,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    FunctionCallOut,
    IncompleteDetails,
    Keepalive,
    MessageOut,
    OutputItem,
    OutputItemEvent,
    OutputTextDelta,
    OutputTextDone,
    ReasoningOut,
    Response,
    ResponseEvent,
    StreamEvent,
    SummaryPartEvent,
    SummaryText,
    SummaryTextDelta,
    SummaryTextDone,
    Usage,
)
from polar_env.wire.responses import (
    ContentPart,
    CustomToolCallItem,
    FunctionCallItem,
    MessageItem,
    ReasoningItem,
    ToolRoute,
    output_items,
)
from polar_env.wire.shape import UNSET

API = "responses"
LOGPROBS_INCLUDE = "message.output_text.logprobs"
STATELESS = "this proxy is stateless; send the full input (store=false)"


class ToolOutputItem(Loose):
    type: Literal["function_call_output", "custom_tool_call_output"]
    call_id: str
    output: str | list[ContentPart]


ITEM_MODELS: dict[str, type[Loose]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "custom_tool_call": CustomToolCallItem,
    "function_call_output": ToolOutputItem,
    "custom_tool_call_output": ToolOutputItem,
    "reasoning": ReasoningItem,
}
# items that carry no prompt text the model needs (hosted tool traces); skipped with a flag
HARMLESS_ITEMS = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "image_generation_call",
        "tool_search_call",
        "tool_search_output",
        "code_interpreter_call",
        "mcp_list_tools",
    }
)


class ToolDef(Loose):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None  # type == "namespace"


class ResponsesRequest(OpenAIRequestFields):
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    tools: list[ToolDef] | None = None
    text: dict[str, Any] | None = None  # {"format": {"type": "text" | "json_schema" | "json_object"}, ...}
    include: list[str] | None = None


# -- decoding ----------------------------------------------------------------------------------
def decode(body: Any, seen: Seen | None = None) -> DecodedRequest:
    """``seen``: the session's last request, whose stripped messages are reused (proxy/seen.py)."""
    body = require_object(body, API)
    if body.get("previous_response_id"):
        raise WireError(400, f"previous_response_id is not supported: {STATELESS}")
    if body.get("conversation"):
        raise WireError(400, f"conversation is not supported: {STATELESS}")
    req = validate(ResponsesRequest, body, API)
    flags: list[str] = []
    tools, routes = _tools(req.tools or [], flags)
    tools, choice = choose_tools(
        tools, *openai_tool_choice(_flat_choice(req.tool_choice, routes), flags), flags
    )
    if req.parallel_tool_calls is False:
        flags.append("unenforced:parallel_tool_calls=false")
    fmt = (req.text or {}).get("format")
    flag_structured_output(fmt.get("type") if isinstance(fmt, dict) else None, flags)
    if req.top_logprobs:
        flags.append("unenforced:top_logprobs")
    builder = _Builder(flags)
    if req.instructions:
        builder.add(Message(role="system", content=req.instructions))
    if isinstance(req.input, str):
        builder.add(Message(role="user", content=req.input))
    else:
        if not req.input and not req.instructions:
            raise WireError(400, "invalid responses request: input is empty")
        for index, raw in enumerate(req.input):
            builder.item(index, raw)
    builder.close()
    messages, refs = merge_split_turns(builder.messages, builder.refs)
    decoded = DecodedRequest(
        conversation=Conversation(messages=messages, tools=tools),
        stream=bool(req.stream),
        model=req.model.strip(),
        raw_model=req.model,
        requested_sampling=sampling_of(req.temperature, req.top_p, req.max_output_tokens),
        flags=dedupe(flags),
        assistant_refs=refs,
        tool_routes=routes,
        tool_choice=choice,
        logprobs=LOGPROBS_INCLUDE in (req.include or []),
    )
    return volatile.apply(decoded, seen=seen)


def _flat_choice(
    choice: str | dict[str, Any] | None, routes: dict[str, ToolRoute]
) -> str | dict[str, Any] | None:
    """A forced tool named by its wire name (and namespace) refers to its canonical, flattened name."""
    if isinstance(choice, dict) and isinstance(choice.get("name"), str) and choice.get("namespace"):
        return {**choice, "name": flat_name(choice["namespace"], choice["name"])}
    return choice


def flat_name(namespace: str | None, name: str) -> str:
    """The canonical (model-visible) name of a namespaced tool; Codex calls it back as the pair."""
    if not namespace:
        return name
    return f"{namespace}{name}" if namespace.endswith("_") else f"{namespace}__{name}"


def _tools(defs: list[ToolDef], flags: list[str]) -> tuple[list[ToolSpec], dict[str, ToolRoute]]:
    specs: list[ToolSpec] = []
    routes: dict[str, ToolRoute] = {}
    for i, d in enumerate(defs):
        if d.type in ("function", "custom"):
            if not d.name:
                raise WireError(400, f"invalid responses request: tools.{i}: a {d.type} tool needs a name")
            specs.append(
                ToolSpec.function(d.name, d.description, d.parameters)
                if d.type == "function"
                else ToolSpec(
                    name=d.name,
                    kind="custom",
                    description=custom_tool_description(d.description or "", d.format),
                )
            )
        elif d.type == "namespace" and d.name:
            for member in _members(d, i):
                name = flat_name(d.name, member.name or "")
                specs.append(ToolSpec.function(name, member.description, member.parameters))
                routes[name] = ToolRoute(name=member.name or "", namespace=d.name)
        else:
            flags.append(f"skipped_tool:{d.type}")
    return specs, routes


def _members(d: ToolDef, index: int) -> list[ToolDef]:
    members = [validate(ToolDef, m, API, f"tools.{index}.tools") for m in d.tools or []]
    for m in members:
        if m.type != "function" or not m.name:
            raise WireError(
                400,
                f"invalid responses request: tools.{index}: namespace {d.name} member must be "
                f"a named function tool, got {m.type}",
            )
    return members


@dataclass
class _Group:
    """The assistant-side items of one turn, merged into one canonical message."""

    texts: list[str] = field(default_factory=list)
    reasoning: list[str] | None = None
    calls: list[ToolCall] = field(default_factory=list)
    refs: list[tuple[int, str]] = field(default_factory=list)  # (priority, ref)

    def call_id(self) -> str | None:
        return next((c for c in (call_id_from_ref(r) for _, r in self.refs) if c), None)

    def message(self) -> Message:
        return Message(
            role="assistant",
            content=PART_JOIN.join(self.texts),
            reasoning=None if self.reasoning is None else PART_JOIN.join(self.reasoning),
            tool_calls=self.calls,
        )


class _Builder:
    def __init__(self, flags: list[str]):
        self.flags = flags
        self.messages: list[Message] = []
        self.refs: list[str | None] = []
        self.group: _Group | None = None

    def add(self, message: Message, ref: str | None = None) -> None:
        self.close()
        self.messages.append(message)
        self.refs.append(ref)

    def close(self) -> None:
        if self.group is not None:
            group, self.group = self.group, None
            self.messages.append(group.message())
            self.refs.append(min(group.refs)[1] if group.refs else None)

    def _assistant(self, kind: str, ref: str | None) -> _Group:
        g = self.group
        if g is not None:
            other = call_id_from_ref(ref)
            if (
                (kind == "reasoning" and (g.texts or g.calls or g.reasoning is not None))
                or (kind == "message" and g.calls)
                or (other and g.call_id() and other != g.call_id())
            ):
                self.close()
        if self.group is None:
            self.group = _Group()
        return self.group

    def item(self, index: int, raw: dict[str, Any]) -> None:
        kind = raw.get("type", "message")
        if not isinstance(kind, str):
            raise WireError(400, f"invalid responses request: input.{index}.type must be a string")
        if kind == "item_reference":
            raise WireError(400, f"input.{index}: item_reference is not supported: {STATELESS}")
        model = ITEM_MODELS.get(kind)
        if model is None:
            if kind in HARMLESS_ITEMS:
                self.flags.append(f"skipped_item:{kind}")
                return
            raise WireError(400, f"invalid responses request: input.{index}: unsupported item type {kind!r}")
        item = validate(model, raw, API, f"input.{index}")
        if isinstance(item, MessageItem):
            text = flatten_parts(item.content, self.flags)
            if item.role == "assistant":
                g = self._assistant("message", item.id)
                g.texts.append(text)
                if item.id:
                    g.refs.append((1, item.id))
            else:
                self.add(Message(role="user" if item.role == "user" else "system", content=text))
        elif isinstance(item, ReasoningItem):
            g = self._assistant("reasoning", item.encrypted_content)
            parts = item.content or item.summary  # full reasoning text when given, else its summary
            g.reasoning = (g.reasoning or []) + (["\n\n".join(p.text for p in parts)] if parts else [])
            if item.encrypted_content:
                g.refs.append((0, item.encrypted_content))
        elif isinstance(item, FunctionCallItem | CustomToolCallItem):
            g = self._assistant("call", item.id)
            if isinstance(item, FunctionCallItem):
                g.calls.append(
                    ToolCall(
                        id=item.call_id, name=flat_name(item.namespace, item.name), arguments=item.arguments
                    )
                )
            else:
                g.calls.append(ToolCall(id=item.call_id, name=item.name, arguments=item.input, kind="custom"))
            if item.id:
                g.refs.append((2, item.id))
        elif isinstance(item, ToolOutputItem):
            self.add(
                Message(
                    role="tool", content=flatten_parts(item.output, self.flags), tool_call_id=item.call_id
                )
            )


# -- encoding ----------------------------------------------------------------------------------
def _output_items(turn: AssistantTurn, req: DecodedRequest) -> list[OutputItem]:
    """The turn's items as this request named its tools (kinds, Codex namespaces)."""
    return output_items(turn, req.conversation.tools, req.tool_routes)


def _usage(turn: AssistantTurn) -> Usage:
    return Usage(
        input_tokens=turn.prompt_tokens,
        output_tokens=turn.completion_tokens,
        total_tokens=turn.prompt_tokens + turn.completion_tokens,
    )


def _pending_response(call_id: str, model: str, created: int) -> Response:
    """The in-progress response object, sent before any item (its id and time are the call's)."""
    return Response(id=f"resp_{call_id}", created_at=created, model=model, status="in_progress", output=[])


def _response(turn: AssistantTurn, req: DecodedRequest, output: list[OutputItem]) -> Response:
    head = {"id": f"resp_{turn.call_id}", "created_at": turn.created_at, "model": echoed_model(turn, req)}
    if finish_of(turn) == "length":
        return Response(
            **head,
            status="incomplete",
            incomplete_details=IncompleteDetails(),
            output=output,
            usage=_usage(turn),
        )
    return Response(**head, status="completed", output=output, usage=_usage(turn))


def encode_response(turn: AssistantTurn, req: DecodedRequest) -> Response:
    return _response(turn, req, _output_items(turn, req))


def _pending(item: OutputItem) -> OutputItem:
    """How an item looks in ``response.output_item.added``: before any of its text."""
    if isinstance(item, ReasoningOut):
        return replace(item, summary=[])
    if isinstance(item, MessageOut):
        return replace(item, content=[], status="in_progress")
    if isinstance(item, FunctionCallOut):
        return replace(item, arguments="", status="in_progress")
    return replace(item, input="", status="in_progress")


def _item_events(item: OutputItem, index: int) -> list[StreamEvent]:
    """The events that stream one item's text, between its ``added`` and ``done``."""
    at = {"item_id": item.id, "output_index": index}
    if isinstance(item, ReasoningOut):
        return [
            event
            for s, part in enumerate(item.summary)
            for event in (
                SummaryPartEvent(
                    type="response.reasoning_summary_part.added",
                    **at,
                    summary_index=s,
                    part=SummaryText(text=""),
                ),
                SummaryTextDelta(**at, summary_index=s, delta=part.text),
                SummaryTextDone(**at, summary_index=s, text=part.text),
                SummaryPartEvent(
                    type="response.reasoning_summary_part.done", **at, summary_index=s, part=part
                ),
            )
        ]
    if isinstance(item, MessageOut):
        events: list[StreamEvent] = []
        for c, part in enumerate(item.content):
            logprobs = [] if part.logprobs is UNSET else part.logprobs
            events.append(
                ContentPartEvent(
                    type="response.content_part.added", **at, content_index=c, part=replace(part, text="")
                )
            )
            if part.text:
                events.append(OutputTextDelta(**at, content_index=c, delta=part.text, logprobs=logprobs))
            events += [
                OutputTextDone(**at, content_index=c, text=part.text, logprobs=logprobs),
                ContentPartEvent(type="response.content_part.done", **at, content_index=c, part=part),
            ]
        return events
    if isinstance(item, FunctionCallOut):
        return [
            FunctionCallArgumentsDelta(**at, delta=item.arguments),
            FunctionCallArgumentsDone(**at, name=item.name, arguments=item.arguments),
        ]
    return [CustomToolCallInputDelta(**at, delta=item.input), CustomToolCallInputDone(**at, input=item.input)]


def _head_events(call_id: str, model: str, created: int) -> list[StreamEvent]:
    pending = _pending_response(call_id, model, created)
    return [
        ResponseEvent(type="response.created", response=pending),
        ResponseEvent(type="response.in_progress", response=pending),
    ]


def encode_stream_head(req: DecodedRequest, call_id: str, model: str, created: int) -> list[bytes]:
    """``response.created`` and ``response.in_progress``, sent as a slow answer's stream opens: the
    API sends them first, and openai-python's stream helper refuses any event (a keep-alive
    included) before ``response.created``. They are the first frames of :func:`encode_stream`."""
    return _frames(_head_events(call_id, req.raw_model or model, created))


def _frames(events: list[StreamEvent]) -> list[bytes]:
    for number, event in enumerate(events):
        event.sequence_number = number
    return [sse_frame(event, event=event.type) for event in events]


def encode_stream(turn: AssistantTurn, req: DecodedRequest) -> list[bytes]:
    items = _output_items(turn, req)
    events = _head_events(turn.call_id, echoed_model(turn, req), turn.created_at)
    for index, item in enumerate(items):
        events.append(
            OutputItemEvent(type="response.output_item.added", output_index=index, item=_pending(item))
        )
        events += _item_events(item, index)
        events.append(OutputItemEvent(type="response.output_item.done", output_index=index, item=item))
    events.append(ResponseEvent(type="response.completed", response=_response(turn, req, items)))
    return _frames(events)


# The Responses API's own heartbeat (``{"type": "keepalive"}``, which OpenAI sends on long requests).
# Not an SSE comment: Codex's stream idle timer counts parsed events only.
KEEPALIVE = sse_frame(Keepalive(), event="keepalive")


def encode_stream_error(body: ErrorBody) -> bytes:
    """A failure after the stream started: the Responses API's ``error`` stream event."""
    error = body.error
    return sse_frame(
        ErrorEvent(message=error.message, param=error.param, code=error.code or error.type), event="error"
    )


def encode_error(status: int, message: str) -> ErrorBody:
    return openai_error(status, message)


def encode_overflow(prompt_tokens: int, window: int | None) -> ErrorBody:
    """The Responses API's wording; it names no numbers (Codex reads only ``code``)."""
    return openai_overflow(
        "Your input exceeds the context window of this model. Please adjust your input and try again.",
        "input",
    )
