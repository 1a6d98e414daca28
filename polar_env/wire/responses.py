"""The OpenAI Responses API's items: the request side's as pydantic models (what
``proxy/codecs/openai_responses.py`` decodes), and the output items of a canonical turn as shapes
(``wire/openai_responses.py``): what the proxy answers Codex with and what a NeMo Gym result or
observation records of the same turn, with the same ids (``trajectory/export.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel

from polar_env.chat.messages import AssistantTurn, ToolCall, ToolSpec
from polar_env.wire.ids import issued_ref
from polar_env.wire.loose import Loose
from polar_env.wire.openai_responses import (
    CustomToolCallOut,
    FunctionCallOut,
    ItemStatus,
    LogprobOut,
    MessageOut,
    OutputItem,
    OutputText,
    ReasoningOut,
    SummaryText,
)
from polar_env.wire.shape import UNSET, UnsetType


class ContentPart(Loose):
    type: str = "input_text"
    text: str | None = None


class MessageItem(Loose):
    type: Literal["message"] = "message"
    id: str | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ContentPart]


class FunctionCallItem(Loose):
    type: Literal["function_call"]
    id: str | None = None
    call_id: str
    name: str
    namespace: str | None = None
    arguments: str = ""


class CustomToolCallItem(Loose):
    type: Literal["custom_tool_call"]
    id: str | None = None
    call_id: str
    name: str
    input: str = ""


class TextPart(Loose):
    type: str = "summary_text"
    text: str = ""


class ReasoningItem(Loose):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[TextPart] = []
    content: list[TextPart] | None = None
    encrypted_content: str | None = None


class ToolRoute(BaseModel):
    """How to name a tool call on the way back when the canonical name was flattened (Codex namespaces)."""

    name: str
    namespace: str | None = None


def message_item(
    call_id: str, text: str, status: ItemStatus = "completed", logprobs: list[LogprobOut] | UnsetType = UNSET
) -> MessageOut:
    """An assistant output message (also the empty one an export hangs token ids on)."""
    return MessageOut(id=f"msg_{call_id}", content=[OutputText(text=text, logprobs=logprobs)], status=status)


def _kind_of(tc: ToolCall, tools: Sequence[ToolSpec] | None) -> str:
    if tc.kind == "custom" or tools is None:
        return tc.kind
    spec = next((t for t in tools if t.name == tc.name), None)
    return spec.kind if spec else "function"


def output_items(
    turn: AssistantTurn,
    tools: Sequence[ToolSpec] | None = None,
    routes: Mapping[str, ToolRoute] | None = None,
) -> list[OutputItem]:
    """The completed output items of a turn: reasoning (carrying the call ref), message, tool calls.

    The same items, with the same ids, go to the harness and into NeMo Gym exports; an export knows
    no request (``tools``, ``routes`` None): tool kinds come from the calls and no namespaces are restored.
    """
    items: list[OutputItem] = []
    if turn.reasoning is not None:
        summary = [SummaryText(text=turn.reasoning)] if turn.reasoning else []
        items.append(
            ReasoningOut(id=f"rs_{turn.call_id}", summary=summary, encrypted_content=issued_ref(turn.call_id))
        )
    if turn.content or not turn.tool_calls:
        items.append(message_item(turn.call_id, turn.content, logprobs=_logprobs(turn)))
    for i, tc in enumerate(turn.tool_calls):
        if _kind_of(tc, tools) == "custom":
            items.append(
                CustomToolCallOut(
                    id=f"ctc_{turn.call_id}_{i}",
                    call_id=tc.id,
                    name=tc.name,
                    input=tc.arguments,
                    status="completed",
                )
            )
        else:
            route = routes.get(tc.name) if routes is not None else None
            items.append(
                FunctionCallOut(
                    id=f"fc_{turn.call_id}_{i}",
                    call_id=tc.id,
                    name=route.name if route else tc.name,
                    namespace=route.namespace if route and route.namespace else UNSET,
                    arguments=tc.arguments,
                    status="completed",
                )
            )
    return items


def _logprobs(turn: AssistantTurn) -> list[LogprobOut] | UnsetType:
    if turn.logprobs is None:
        return UNSET
    return [
        LogprobOut(token=t.token, logprob=t.logprob, bytes=t.bytes, top_logprobs=t.top_logprobs)
        for t in turn.logprobs
    ]
