"""The Gemini API (``POST /v1beta/models/{model}:generateContent`` / ``:streamGenerateContent``): Gemini
CLI's.

The model and whether to stream come from the URL, not the body. ``contents`` alternate ``user`` and
``model`` turns made of parts: ``text`` (``thought: true`` for reasoning), ``functionCall`` in model
turns and ``functionResponse`` in user turns, which become ``tool`` messages in order. The proxy
issues every ``functionCall.id`` and puts its ref on the first answer part as ``thoughtSignature``
(base64, as the API's signatures are bytes); Gemini CLI sends both back, which is how the engine
matches a turn to its call.

``streamGenerateContent?alt=sse`` answers with ``data: <GenerateContentResponse>`` events framed by
``\\r\\n\\r\\n`` as the real API does; without ``alt=sse`` the chunks come as one JSON array. Wire
field names are camelCase; the API also accepts snake_case (protobuf JSON), and so does this codec.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from polar_env.chat.messages import AssistantTurn, Conversation, Message, ToolCall, ToolSpec
from polar_env.proxy import volatile
from polar_env.proxy.codecs.common import (
    PART_JOIN,
    DecodedRequest,
    WireError,
    choose_tools,
    dedupe,
    echoed_model,
    flag_structured_output,
    merge_split_turns,
    no_stream_head,
    require_object,
    sampling_of,
    stops_of,
    tool_input,
    user_turn,
    validate,
)
from polar_env.proxy.seen import Seen
from polar_env.wire.gemini_generate_content import (
    Candidate,
    ContentOut,
    CountTokensResponse,
    ErrorBody,
    FunctionCallOut,
    GenerateContentResponse,
    LogprobCandidate,
    LogprobsResult,
    PartOut,
    UsageMetadata,
    google_error,
)
from polar_env.wire.ids import REF_PREFIX, issued_ref
from polar_env.wire.loose import Loose
from polar_env.wire.shape import UNSET, encode

API = "generateContent"
METHODS = ("generateContent", "streamGenerateContent", "countTokens")
FINISH_REASONS = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS"}
# a tool result whose response is one of these keys holding text is shown to the model as that text
RESULT_KEYS = ("output", "result", "content")


class GeminiModel(Loose):
    """Wire model: camelCase on the wire, snake_case accepted too (the API's protobuf JSON does)."""

    model_config = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True)


class FunctionCall(GeminiModel):
    name: str
    args: dict[str, Any] | None = None
    id: str | None = None


class FunctionResponse(GeminiModel):
    name: str
    response: dict[str, Any] | None = None
    id: str | None = None


class Part(GeminiModel):
    text: str | None = None
    thought: bool | None = None
    thought_signature: str | None = None
    function_call: FunctionCall | None = None
    function_response: FunctionResponse | None = None
    inline_data: dict[str, Any] | None = None
    file_data: dict[str, Any] | None = None


class Content(GeminiModel):
    role: Literal["user", "model", "function"] | None = None  # absent: a user turn
    parts: list[Part] = Field(default_factory=list)


class FunctionDeclaration(GeminiModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # the API's OpenAPI subset
    parameters_json_schema: dict[str, Any] | None = None  # plain JSON Schema (what Gemini CLI sends)


class Tool(GeminiModel):
    function_declarations: list[FunctionDeclaration] | None = None


class FunctionCallingConfig(GeminiModel):
    mode: Literal["MODE_UNSPECIFIED", "AUTO", "ANY", "NONE", "VALIDATED"] | None = None
    allowed_function_names: list[str] | None = None


class ToolConfig(GeminiModel):
    function_calling_config: FunctionCallingConfig | None = None


class GenerationConfig(GeminiModel):
    temperature: float | None = None
    top_p: float | None = None
    top_k: float | None = None
    max_output_tokens: int | None = None
    candidate_count: int | None = None
    stop_sequences: list[str] | None = None
    response_mime_type: str | None = None
    response_schema: dict[str, Any] | None = None
    response_json_schema: Any = None
    response_logprobs: bool | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    thinking_config: dict[str, Any] | None = None


class GenerateContentRequest(GeminiModel):
    contents: list[Content] = Field(min_length=1)
    system_instruction: Content | str | None = None
    tools: list[Tool] | None = None
    tool_config: ToolConfig | None = None
    generation_config: GenerationConfig | None = None
    safety_settings: list[dict[str, Any]] | None = None
    cached_content: str | None = None


class GeminiRequest(DecodedRequest):
    """The decoded request; ``json_array``: streamed without ``alt=sse``, answered as one JSON array."""

    json_array: bool = False


def parse_target(target: str) -> tuple[str, str]:
    """``{model}:{method}`` from the URL's last segment; an unknown method is a 404, as the API answers."""
    model, sep, method = target.rpartition(":")
    if not sep or not model or method not in METHODS:
        raise WireError(
            404,
            f"unknown method {target!r}: use models/MODEL:generateContent, "
            ":streamGenerateContent or :countTokens",
        )
    return model, method


# -- decoding ----------------------------------------------------------------------------------
def decode(
    body: Any, model: str = "", stream: bool = False, sse: bool = True, seen: Seen | None = None
) -> GeminiRequest:
    """One ``generateContent`` body; ``model`` and ``stream`` come from the URL; ``seen``: the
    session's last request, whose stripped messages are reused (proxy/seen.py)."""
    req = validate(GenerateContentRequest, require_object(body, API), API)
    flags: list[str] = []
    messages: list[Message] = []
    refs: list[str | None] = []
    if req.system_instruction is not None:
        system = req.system_instruction
        text = (
            system
            if isinstance(system, str)
            else PART_JOIN.join(
                _text(p, f"systemInstruction.parts.{j}", flags) for j, p in enumerate(system.parts)
            )
        )
        messages.append(Message(role="system", content=text))
        refs.append(None)
    pending: list[ToolCall] = []  # calls of the latest model turn not yet answered (pairs id-less results)
    for index, content in enumerate(req.contents):
        if not content.parts:
            raise WireError(400, f"invalid {API} request: contents.{index}.parts must not be empty")
        if content.role == "model":
            message, ref = _model_turn(index, content.parts, flags)
            messages.append(message)
            refs.append(ref)
            pending = list(message.tool_calls)
        else:
            for message in _user_turn(index, content.parts, pending, flags):
                messages.append(message)
                refs.append(None)
    messages, refs = merge_split_turns(messages, refs)
    tools = _tools(req.tools or [], flags)
    tools, choice = choose_tools(tools, *_tool_choice(req.tool_config, flags), flags)
    config = req.generation_config or GenerationConfig()
    if config.candidate_count is not None and config.candidate_count != 1:
        raise WireError(
            400,
            f"candidateCount={config.candidate_count} is not supported: each call samples one "
            "candidate (send several requests)",
        )
    if req.cached_content:
        raise WireError(400, "cachedContent is not supported: send the full contents each turn")
    for name in ("top_k", "seed", "presence_penalty", "frequency_penalty"):
        if getattr(config, name) is not None:
            flags.append(f"unenforced:{to_camel(name)}")
    structured = config.response_schema is not None or config.response_json_schema is not None
    flag_structured_output(
        "json_schema"
        if structured
        else "json_object"
        if config.response_mime_type == "application/json"
        else None,
        flags,
    )
    decoded = GeminiRequest(
        conversation=Conversation(messages=messages, tools=tools),
        stream=stream and sse,
        json_array=stream and not sse,
        model=model.strip(),
        raw_model=model,
        requested_sampling=sampling_of(
            config.temperature, config.top_p, config.max_output_tokens, config.top_k
        ),
        flags=dedupe(flags),
        assistant_refs=refs,
        stop=stops_of(config.stop_sequences, limit=5),
        tool_choice=choice,
        logprobs=bool(config.response_logprobs),
    )
    return volatile.apply(decoded, seen=seen)


def encode_count(tokens: int) -> CountTokensResponse:
    """``:countTokens``' answer (the prompt's tokens by the real chat template)."""
    return CountTokensResponse(total_tokens=tokens)


def decode_count_tokens(body: Any, model: str = "") -> GeminiRequest:
    """``:countTokens`` takes ``contents`` (and tools, system) or a whole ``generateContentRequest``."""
    if isinstance(body, dict) and isinstance(body.get("generateContentRequest"), dict):
        body = body["generateContentRequest"]
    return decode(body, model)


def _text(part: Part, where: str, flags: list[str]) -> str:
    """Text of a part that may only hold text (system instructions, user text); media are placeholders."""
    if part.text is not None:
        return part.text
    if part.inline_data is not None or part.file_data is not None:
        flags.append("placeholder:image" if part.inline_data is not None else "placeholder:file")
        return "[image]" if part.inline_data is not None else "[file]"
    raise WireError(400, f"invalid {API} request: {where}: a part here needs text")


def _user_turn(index: int, parts: list[Part], pending: list[ToolCall], flags: list[str]) -> list[Message]:
    return user_turn(_user_items(index, parts, pending, flags))


def _user_items(
    index: int, parts: list[Part], pending: list[ToolCall], flags: list[str]
) -> Iterator[str | Message]:
    for j, part in enumerate(parts):
        if part.function_response is not None:
            yield _tool_result(part.function_response, pending)
        elif part.function_call is not None:
            raise WireError(
                400,
                f"invalid {API} request: contents.{index}.parts.{j}: functionCall parts "
                "belong in model turns",
            )
        elif part.thought:
            flags.append("skipped_part:thought")
        else:
            yield _text(part, f"contents.{index}.parts.{j}", flags)


def _tool_result(response: FunctionResponse, pending: list[ToolCall]) -> Message:
    """A ``tool`` message; without an id it answers the first pending call of that name."""
    call_id = response.id
    if call_id:
        match = next((c for c in pending if c.id == call_id), None)
    else:
        match = next((c for c in pending if c.name == response.name), None)
    if match is not None:
        pending.remove(match)
        call_id = match.id
    value = response.response or {}
    keys = [k for k in RESULT_KEYS if k in value]
    text = (
        value[keys[0]]
        if len(value) == 1 and keys and isinstance(value[keys[0]], str)
        else json.dumps(value, ensure_ascii=False)
    )
    return Message(role="tool", content=text, tool_call_id=call_id or response.name, name=response.name)


def _model_turn(index: int, parts: list[Part], flags: list[str]) -> tuple[Message, str | None]:
    texts: list[str] = []
    thoughts: list[str] | None = None
    calls: list[ToolCall] = []
    ref = None
    for j, part in enumerate(parts):
        ref = ref or signed_ref(part.thought_signature)
        if part.function_call is not None:
            fc = part.function_call
            calls.append(
                ToolCall(
                    id=fc.id or f"{fc.name}_{index}_{j}",
                    name=fc.name,
                    arguments=json.dumps(fc.args or {}, ensure_ascii=False),
                )
            )
        elif part.function_response is not None:
            raise WireError(
                400,
                f"invalid {API} request: contents.{index}.parts.{j}: functionResponse parts "
                "belong in user turns",
            )
        elif part.thought:
            thoughts = (thoughts or []) + [part.text or ""]
        elif part.text is not None:
            texts.append(part.text)
        else:
            flags.append("skipped_part:model_media")
    reasoning = None if thoughts is None else PART_JOIN.join(thoughts)
    return Message(
        role="assistant", content=PART_JOIN.join(texts), reasoning=reasoning, tool_calls=calls
    ), ref


def _tools(tools: list[Tool], flags: list[str]) -> list[ToolSpec]:
    out = []
    for tool in tools:
        for decl in tool.function_declarations or []:
            schema = (
                decl.parameters_json_schema if decl.parameters_json_schema is not None else decl.parameters
            )
            out.append(ToolSpec.function(decl.name, decl.description, schema))
        flags += [
            f"skipped_tool:{name}" for name in (tool.model_extra or {})
        ]  # googleSearch, codeExecution, ...
    return out


def _tool_choice(config: ToolConfig | None, flags: list[str]) -> tuple[str, str | None]:
    calling = (config.function_calling_config if config else None) or FunctionCallingConfig()
    mode = calling.mode or "AUTO"
    if mode == "NONE":
        return "none", None
    if mode == "ANY":
        names = calling.allowed_function_names or []
        if len(names) == 1:
            return "function", names[0]
        if names:
            flags.append("unenforced:allowedFunctionNames")
        return "required", None
    if mode == "VALIDATED":
        flags.append("unenforced:tool_choice=VALIDATED")
    return "auto", None


def signed_ref(signature: str | None) -> str | None:
    """The proxy's ref inside a ``thoughtSignature`` it issued; None for any other signature."""
    try:
        ref = base64.b64decode(signature or "", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return ref if ref.startswith(REF_PREFIX) else None


# -- encoding ----------------------------------------------------------------------------------
def signature(call_id: str) -> str:
    """The turn's ref as a ``thoughtSignature``: base64, as the API's signatures are bytes."""
    return base64.b64encode(issued_ref(call_id).encode()).decode()


def answer_parts(turn: AssistantTurn) -> tuple[list[PartOut], list[PartOut]]:
    """(thought parts, answer parts); the first answer part carries the turn's ref as its signature."""
    thoughts = [] if turn.reasoning is None else [PartOut(text=turn.reasoning, thought=True)]
    answer = [PartOut(text=turn.content)] if turn.content or not turn.tool_calls else []
    answer += [
        PartOut(function_call=FunctionCallOut(id=tc.id, name=tc.name, args=tool_input(tc)))
        for tc in turn.tool_calls
    ]
    answer[0].thought_signature = signature(turn.call_id)
    return thoughts, answer


def finish_reason(turn: AssistantTurn) -> str:
    """STOP or MAX_TOKENS: Gemini has no finish reason of its own for tool calls."""
    return FINISH_REASONS["length" if turn.finish_reason == "length" else "stop"]


def _usage(turn: AssistantTurn) -> UsageMetadata:
    return UsageMetadata(
        prompt_token_count=turn.prompt_tokens,
        candidates_token_count=turn.completion_tokens,
        total_token_count=turn.prompt_tokens + turn.completion_tokens,
    )


def _chunk(
    turn: AssistantTurn, req: DecodedRequest, parts: list[PartOut], done: bool
) -> GenerateContentResponse:
    """One response chunk; the last (``done``) tells the finish reason, the logprobs and the usage."""
    candidate = Candidate(content=ContentOut(parts=parts))
    if done:
        candidate.finish_reason = finish_reason(turn)
        if turn.logprobs:
            candidate.avg_logprobs = sum(t.logprob for t in turn.logprobs) / len(turn.logprobs)
            candidate.logprobs_result = LogprobsResult(
                chosen_candidates=[
                    LogprobCandidate(token=t.token, log_probability=t.logprob) for t in turn.logprobs
                ]
            )
    return GenerateContentResponse(
        candidates=[candidate],
        usage_metadata=_usage(turn) if done else UNSET,
        model_version=echoed_model(turn, req),
        response_id=turn.call_id,
    )


def encode_response(
    turn: AssistantTurn, req: DecodedRequest
) -> GenerateContentResponse | list[GenerateContentResponse]:
    """The ``generateContent`` body; for a stream without ``alt=sse``, the chunks as one JSON array."""
    if getattr(req, "json_array", False):
        return stream_chunks(turn, req)
    thoughts, answer = answer_parts(turn)
    return _chunk(turn, req, thoughts + answer, done=True)


def stream_chunks(turn: AssistantTurn, req: DecodedRequest) -> list[GenerateContentResponse]:
    """Reasoning first, then the answer with ``finishReason`` and ``usageMetadata`` (the last chunk)."""
    thoughts, answer = answer_parts(turn)
    return ([_chunk(turn, req, thoughts, done=False)] if thoughts else []) + [
        _chunk(turn, req, answer, done=True)
    ]


def sse_event(data: GenerateContentResponse) -> bytes:
    """One ``data:`` event, ``\\r\\n``-framed as the API's own streams are."""
    return b"data: " + encode(data) + b"\r\n\r\n"


def encode_stream(turn: AssistantTurn, req: DecodedRequest) -> list[bytes]:
    """The ``alt=sse`` stream: one ``data:`` event per chunk; the API sends no end marker."""
    return [sse_event(chunk) for chunk in stream_chunks(turn, req)]


# An empty line: not an event to an SSE reader, and Gemini CLI's stream reader skips whitespace
# before ``data:``; a comment line would stall that reader (it expects every event to start ``data:``).
KEEPALIVE = b"\n"
encode_stream_head = no_stream_head


def encode_stream_error(body: ErrorBody) -> bytes:
    """A failure after the stream started: the bare error object, which the genai SDKs raise as an
    ``ApiError`` with its code (an error inside a ``data:`` event would read as an empty answer)."""
    return encode(body) + b"\n"


def encode_error(status: int, message: str) -> ErrorBody:
    """Google's error body; the genai SDKs raise it as ``ApiError`` and Gemini CLI retries 429 and 5xx."""
    return google_error(status, message)


def encode_overflow(prompt_tokens: int, window: int | None) -> ErrorBody:
    """The API's own wording for a prompt over the window (M: the longest prompt that leaves one token)."""
    limit = window - 1 if window else prompt_tokens - 1
    return encode_error(
        400,
        f"The input token count ({prompt_tokens}) exceeds the maximum number of tokens allowed ({limit}).",
    )
