"""What the four wire-API codecs share: the decoded request, the 4xx error, SSE framing (the ids the
proxy issues are ``polar_env.wire.ids``, the base model ``polar_env.wire.loose``).

Each API module (``openai_chat``, ``openai_responses``, ``anthropic_messages``,
``gemini_generate_content``) turns a harness body into a :class:`DecodedRequest` and an
:class:`AssistantTurn` back into that API's JSON or SSE frames.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, TypeVar

from aiohttp import web
from pydantic import BaseModel, Field, ValidationError

from polar_env import fastjson
from polar_env.chat.messages import AssistantTurn, Conversation, Message, ToolCall, ToolSpec
from polar_env.proxy.seen import Decoded, Merged, Seen, extends
from polar_env.wire.ids import call_id_from_ref, turn_of
from polar_env.wire.loose import Loose
from polar_env.wire.responses import ToolRoute
from polar_env.wire.shape import Shape, encode

# Text parts and blocks of one message are joined with this; every API uses the same join so a
# conversation decodes to the same canonical text whichever wire it came over.
PART_JOIN = "\n"

TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
IMAGE_PART_TYPES = frozenset({"image", "image_url", "input_image"})
FILE_PART_TYPES = frozenset({"file", "input_file", "document"})

M = TypeVar("M", bound=BaseModel)


class OpenAIRequestFields(Loose):
    """What Chat Completions and Responses requests share, with the same meaning in both."""

    model: str
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: float | None = None  # vLLM's extension: recorded, never sent (a narrowing knob, neutralised)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    top_logprobs: int | None = None


class WireError(Exception):
    """A request the proxy refuses; ``message`` names the defect so the harness log says why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message

    def __reduce__(self):  # raised in a parse worker process (proxy/offload.py), re-raised here
        return type(self), (self.status, self.message)


class ToolChoice(BaseModel):
    """``tool_choice`` reduced to what the engine can enforce: ``required`` and ``function`` by
    prefilling the start of a tool call after the generation prompt; ``none`` is applied when
    decoding (the tools are not offered)."""

    mode: Literal["auto", "required", "function"] = "auto"
    name: str | None = None  # mode == "function"


class DecodedRequest(BaseModel):
    """One harness request, reduced to the canonical conversation plus what the answer must echo."""

    conversation: Conversation
    stream: bool = False
    model: str
    raw_model: str
    requested_sampling: dict[str, Any] = Field(default_factory=dict)  # temperature, top_p, max_tokens
    include_usage: bool = False
    flags: list[str] = Field(default_factory=list)
    # aligned with conversation.messages: for assistant messages the proxy-issued ref the harness sent
    # back (reasoning encrypted_content, thinking signature, message item id), else None
    assistant_refs: list[str | None] = Field(default_factory=list)
    # canonical tool name -> wire name/namespace, for tools whose canonical name is not the wire name
    tool_routes: dict[str, ToolRoute] = Field(default_factory=dict)
    stop: list[str] = Field(default_factory=list)  # stop strings: the reply ends before the first one
    tool_choice: ToolChoice = Field(default_factory=ToolChoice)
    # Anthropic prefill: the text of a final assistant message, which the reply continues
    prefill: str | None = None
    logprobs: bool = False  # answer with the recorded logprob of each sampled token
    enable_thinking: bool | None = (
        None  # the template's flag (Chat Completions' chat_template_kwargs); None: the run's
    )
    # prefix hashes of the conversation's messages (``proxy/seen.py``), when the decoder computed them
    prefix_hashes: list[str] = Field(default_factory=list, exclude=True, repr=False)


# A JSON escape of a UTF-16 surrogate: a body without one cannot hold a lone surrogate after parsing
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def scrub_surrogates(value: Any) -> Any:
    """``value`` with every lone UTF-16 surrogate replaced by U+FFFD (keys and strings, recursively).

    The one rule for text that is not valid Unicode: Node harnesses that cut a tool output mid-emoji
    send ``"\\ud83d"``; replaced here, at decode time, the same text is hashed, rendered, tokenized
    and written to the ledger (no encoder downstream can fail on it), as a provider does.
    """
    if isinstance(value, str):
        return _LONE_SURROGATE.sub(REPLACEMENT, value)
    if isinstance(value, list):
        return [scrub_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {scrub_surrogates(k): scrub_surrogates(v) for k, v in value.items()}
    return value


def parse_json_body(raw: bytes) -> Any:
    """A request body as JSON, lone surrogates replaced (:func:`scrub_surrogates`); bad JSON is a 400."""
    try:
        body = fastjson.loads(raw)
    except (ValueError, RecursionError) as exc:  # bad JSON/UTF-8, too many digits, too deep
        raise WireError(400, f"request body is not valid JSON: {type(exc).__name__}: {exc}"[:500]) from None
    return scrub_surrogates(body) if _SURROGATE_ESCAPE.search(raw) else body


# An SSE comment line: clients skip it, and the bytes keep connection-level idle timeouts from
# tripping (Chat Completions has no keep-alive event of its own).
SSE_COMMENT_KEEPALIVE = b": keep-alive\n\n"


def json_response(body: Shape | BaseModel | Sequence[Shape] | list[Any], status: int = 200) -> web.Response:
    """A JSON answer, encoded by ``wire.shape`` (aiohttp's own ``json_response`` uses the stdlib codec)."""
    return web.Response(body=encode(body), status=status, content_type="application/json")


def sse_frame(data: Shape | str, event: str | None = None) -> bytes:
    """One server-sent event; a shape is sent as compact JSON (one line: JSON escapes newlines),
    a string (``[DONE]``) as it is."""
    head = f"event: {event}\n".encode() if event else b""
    if not isinstance(data, str):
        return head + b"data: " + encode(data) + b"\n\n"
    return head + "".join(f"data: {line}\n" for line in data.split("\n")).encode() + b"\n"


def _turn_key(message: Message, ref: str | None) -> str | None:
    """The sampled turn a tool-calling assistant message comes from, if every id names the same one."""
    keys = {turn_of(tc.id) for tc in message.tool_calls}
    ref_call = call_id_from_ref(ref)
    if ref_call:
        keys.add(ref_call[:12])
    return keys.pop() if len(keys) == 1 and None not in keys else None


def merge_split_turns(
    messages: list[Message], refs: list[str | None], seen: Seen | None = None
) -> tuple[list[Message], list[str | None]]:
    """Put the tool calls of one sampled turn back into one assistant message.

    Codex records each function call followed by its output (call A, output A, call B, output B);
    decoded as sent, that is two assistant turns, and the prompt would re-render call B after
    output A, which the model never saw. An assistant message that holds only tool calls, follows
    tool results only, and whose calls (and ref) name the same proxy-issued turn as the assistant
    message before those results, joins that message; the results keep their order after it.

    With ``seen`` (the session's last request), an input that extends the last one's continues
    from the state its merge ended in: only the appended messages are walked.
    """
    known = seen.merged if seen is not None else None
    if known is not None and extends(messages, known.messages) and extends(refs, known.refs):
        start, out, out_refs, last = len(known.messages), list(known.out), list(known.out_refs), known.last
    else:
        start, out, out_refs, last = 0, [], [], None  # last: index in ``out`` of the latest assistant message
    for message, ref in zip(messages[start:], refs[start:], strict=True):
        if (
            message.role == "assistant"
            and last is not None
            and message.tool_calls
            and not message.content
            and message.reasoning is None
            and len(out) > last + 1
            and all(m.role == "tool" for m in out[last + 1 :])
        ):
            key = _turn_key(message, ref)
            if key is not None and key == _turn_key(out[last], out_refs[last]):
                out[last] = out[last].model_copy(
                    update={"tool_calls": out[last].tool_calls + message.tool_calls}
                )
                continue
        if message.role == "assistant":
            last = len(out)
        out.append(message)
        out_refs.append(ref)
    if seen is not None:
        seen.merged = Merged(list(messages), list(refs), list(out), list(out_refs), last)
    return out, out_refs


def user_turn(items: Iterable[str | Message]) -> list[Message]:
    """A user turn's parts in order as messages: runs of text join into one user message, each tool
    result (a ``tool`` message) stays where it was (Anthropic blocks, Gemini parts)."""
    out: list[Message] = []
    texts: list[str] = []
    for item in items:
        if isinstance(item, str):
            texts.append(item)
            continue
        if texts:
            out.append(Message(role="user", content=PART_JOIN.join(texts)))
            texts = []
        out.append(item)
    if texts:
        out.append(Message(role="user", content=PART_JOIN.join(texts)))
    return out


def require_object(body: Any, api: str) -> dict:
    if not isinstance(body, dict):
        raise WireError(400, f"{api} request body must be a JSON object, got {type(body).__name__}")
    return body


def validate(model: type[M], data: Any, api: str, where: str = "") -> M:
    """``model.model_validate`` whose failure is a 400 naming the first offending fields.

    ``where`` is the path of ``data`` inside the body (``input.3``) when it is not the whole body.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors()[:3]:
            loc = ".".join([where] * bool(where) + [str(p) for p in err["loc"]]) or "body"
            problems.append(f"{loc}: {err['msg']}")
        raise WireError(400, f"invalid {api} request: " + "; ".join(problems)) from None


def validate_items(
    model: type[M], body: dict, key: str, api: str, seen: Seen | None, *, redo_last: bool = False
) -> tuple[M, int, Decoded | None]:
    """``(request, k, known)``: ``body`` validated without its first ``k`` ``key`` items, those equal
    to the items the session's last request (``seen``) decoded into ``known``; a request is still
    refused as a whole, its error naming the item by its index in the request."""
    raw = body.get(key)
    known = seen.decoded if seen is not None and isinstance(raw, list) else None
    k = seen.reusable_items(raw, redo_last) if seen is not None and isinstance(raw, list) else 0
    if not k or not isinstance(raw, list):  # (k > 0 only for a list)
        return validate(model, body, api), 0, known
    try:
        return validate(model, {**body, key: raw[k:]}, api), k, known
    except WireError:
        return validate(model, body, api), 0, known  # raises, naming the item by its index


def decode_items(
    raw: list[Any],
    items: list[Any],
    k: int,
    known: Decoded | None,
    decode: Callable[[int, Any, list[str]], Iterable[tuple[Message, str | None]]],
) -> tuple[Decoded, list[str]]:
    """A request's wire items decoded: the first ``k`` as ``known`` (the session's last request)
    decoded them, then ``items`` (the validated rest, numbered from ``k``) by ``decode(index, item,
    flags)`` into messages and refs; with every item's flags, in order."""
    messages, refs, ends, item_flags = known.upto(k) if known is not None else ([], [], [], [])
    flags = [f for item in item_flags for f in item]
    for index, item in enumerate(items, start=k):
        raised: list[str] = []
        for message, ref in decode(index, item, raised):
            messages.append(message)
            refs.append(ref)
        ends.append(len(messages))
        item_flags.append(tuple(raised))
        flags += raised
    return Decoded(raw, messages, refs, ends, item_flags), flags


def flatten_parts(content: str | list | None, flags: list[str]) -> str:
    """Text of a content value (string or list of parts); images and files become placeholders."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        part = part if isinstance(part, dict) else part.model_dump()
        kind = part.get("type", "text")
        if kind in TEXT_PART_TYPES:
            texts.append(str(part.get("text") or ""))
        elif kind == "refusal":
            texts.append(str(part.get("refusal") or ""))
        elif kind in IMAGE_PART_TYPES:
            texts.append("[image]")
            flags.append("placeholder:image")
        elif kind in FILE_PART_TYPES:
            texts.append("[file]")
            flags.append("placeholder:file")
        else:
            flags.append(f"skipped_part:{kind}")
    return PART_JOIN.join(texts)


def sampling_of(
    temperature: float | None, top_p: float | None, max_tokens: int | None, top_k: float | None = None
) -> dict[str, Any]:
    """The sampling a harness asked for (each call records it); values no backend accepts are a 400 here,
    not a 502 later. ``top_k`` is only recorded: no backend is sent a harness's top-k."""
    if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
        raise WireError(400, f"temperature must be a finite number >= 0, got {temperature}")
    if top_p is not None and not (math.isfinite(top_p) and 0 < top_p <= 1):
        raise WireError(400, f"top_p must be in (0, 1], got {top_p}")
    if max_tokens is not None and max_tokens < 1:
        raise WireError(400, f"max_tokens must be at least 1, got {max_tokens}")
    asked = {
        "temperature": temperature,
        "top_p": top_p,
        "max_tokens": max_tokens,
        "top_k": top_k if top_k is not None and math.isfinite(top_k) else None,
    }
    return {k: v for k, v in asked.items() if v is not None}


def stops_of(stop: str | list[str] | None, limit: int | None = None) -> list[str]:
    """Stop strings as a list; an empty one would end every reply at once, so it is a 400."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if any(not s for s in stops):
        raise WireError(400, "stop sequences must be non-empty strings")
    if limit is not None and len(stops) > limit:
        raise WireError(400, f"at most {limit} stop sequences are allowed, got {len(stops)}")
    return stops


def openai_tool_choice(choice: str | dict[str, Any] | None, flags: list[str]) -> tuple[str, str | None]:
    """(mode, tool name) of an OpenAI ``tool_choice`` (Chat and Responses); forms the engine cannot enforce
    are flagged."""
    if choice is None or choice in ("auto", "none", "required"):
        return choice or "auto", None
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        inner = choice.get(choice["type"])
        name = inner.get("name") if isinstance(inner, dict) else choice.get("name")
        if isinstance(name, str) and name:
            return "function", name
    kind = choice.get("type") if isinstance(choice, dict) else choice
    flags.append(f"unenforced:tool_choice={kind}")
    return "auto", None


def choose_tools(
    tools: list[ToolSpec], mode: str, name: str | None, flags: list[str]
) -> tuple[list[ToolSpec], ToolChoice]:
    """Apply a decoded ``tool_choice``: ``none`` offers no tools (the model cannot call what it is
    not shown), ``required``/``function`` need the tools they name; the flag says what was done."""
    if mode == "auto":
        return tools, ToolChoice()
    if mode == "none":
        if tools:
            flags.append("tool_choice:none(tools hidden)")
        return [], ToolChoice()
    if not tools:
        raise WireError(400, f"tool_choice {mode!r} needs tools, and the request offers none")
    if mode == "function":
        if name not in {t.name for t in tools}:
            raise WireError(400, f"tool_choice names tool {name!r}, which is not among the request's tools")
        flags.append(f"tool_choice:function={name}(prefilled)")
        return tools, ToolChoice(mode="function", name=name)
    flags.append("tool_choice:required(prefilled)")
    return tools, ToolChoice(mode="required")


def flag_structured_output(kind: str | None, flags: list[str]) -> None:
    """A JSON-schema / JSON-object reply format cannot be enforced on raw sampling: accepted, flagged."""
    if kind and kind != "text":
        flags.append(f"unenforced:response_format={kind}")


def refuse_n(n: int | None) -> None:
    if n is not None and n != 1:
        raise WireError(400, f"n={n} is not supported: each call samples one reply (send n requests)")


def custom_tool_description(description: str, fmt: dict[str, Any] | None) -> str:
    """A free-text tool's description with its input grammar appended: the model must see the format."""
    if not fmt or fmt.get("type") != "grammar":
        return description
    return (
        f"{description}\n\nInput format ({fmt.get('syntax', 'grammar')} grammar):\n"
        f"{fmt.get('definition', '')}"
    )


def tool_input(tc: ToolCall) -> dict[str, Any]:
    """A call's arguments as the object Anthropic (``input``) and Gemini (``args``) send; text that is
    not a JSON object (a custom tool's) is wrapped as ``{"input": text}``."""
    try:
        value = json.loads(tc.arguments)
    except (ValueError, RecursionError):  # also too many digits / too deep
        value = None
    return value if isinstance(value, dict) else {"input": tc.arguments}


def finish_of(turn: AssistantTurn) -> str:
    """stop / length / tool_calls as the harness must see it: tool calls only when there are some."""
    if turn.finish_reason == "length":
        return "length"
    return "tool_calls" if turn.tool_calls else "stop"


def no_stream_head(req: DecodedRequest, call_id: str, model: str, created: int) -> list[bytes]:
    """A stream that opens with nothing before its answer exists (only keep-alives meanwhile)."""
    return []


def echoed_model(turn: AssistantTurn, req: DecodedRequest) -> str:
    """Answer under the model name the harness asked for; some harnesses check it."""
    return req.raw_model or turn.model


def dedupe(flags: list[str]) -> list[str]:
    return list(dict.fromkeys(flags))
