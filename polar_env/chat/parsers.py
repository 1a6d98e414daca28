"""Parse a model's decoded output into reasoning, content and tool calls.

Two tool-call styles: Hermes JSON (Qwen3, our SmolLM2 template) and Qwen3-Coder XML (Qwen3.5).
Parsing works on decoded text only; the sampled token ids stay the record (never re-encoded).
Whatever the model wrote, parsing never raises: a tool call that cannot be read makes the whole
answer plain content with ``malformed=True``, so the harness gets text and the turn is marked.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from polar_env.chat.messages import ToolCall

ToolFormat = Literal["hermes", "qwen3_coder"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"

_XML_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>\n?(.*?)</function>\s*", re.DOTALL)
PARAM_OPEN, PARAM_CLOSE = "<parameter=", "</parameter>"


class MalformedToolCall(ValueError):
    """A tool-call block the parser could not read (caught inside this module)."""


@dataclass
class ParsedOutput:
    text: str
    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    malformed: bool = False


def split_reasoning(text: str, *, started_in_think: bool = False) -> tuple[str | None, str]:
    """Return ``(reasoning, rest)``.

    ``started_in_think``: the prompt already opened ``<think>`` (Qwen3.5), so the output holds
    only ``</think>``; if that never comes (cut by length) everything is reasoning.
    """
    stripped = text.lstrip()
    if stripped.startswith(THINK_OPEN):
        started_in_think, text = True, stripped[len(THINK_OPEN) :]
    if THINK_CLOSE in text:
        reasoning, rest = text.split(THINK_CLOSE, 1)
        return reasoning.strip("\n") or None, rest
    if started_in_think:
        return text.strip("\n") or None, ""
    return None, text


def parse_hermes_call(body: str) -> list[tuple[str, str]]:
    """``{"name": .., "arguments": {..}}`` (or a list of such) -> ``[(name, arguments_json)]``."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as e:  # also: too many digits, nesting deeper than the stack
        raise MalformedToolCall(f"bad JSON in tool call: {type(e).__name__}") from None
    objs = obj if isinstance(obj, list) else [obj]
    calls = []
    for item in objs:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise MalformedToolCall("tool call has no name")
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, dict):
            calls.append((item["name"], json.dumps(args, ensure_ascii=False)))
        elif isinstance(args, str):  # already JSON text (or a free-text tool's input)
            calls.append((item["name"], args))
        else:
            raise MalformedToolCall("tool call arguments are neither an object nor a string")
    return calls


def parse_xml_call(body: str) -> list[tuple[str, str]]:
    """``<function=NAME><parameter=K>\\nV\\n</parameter></function>`` -> ``[(name, arguments_json)]``."""
    match = _XML_FUNCTION.fullmatch(body)
    if not match:
        raise MalformedToolCall("tool call is not one <function=...>...</function> block")
    name, inner = match.group(1).strip(), match.group(2)
    args: dict[str, Any] = {}
    params, outside = _xml_params(inner)
    for key, raw in params:
        args[key.strip()] = _param_value(raw)
    if outside.strip():
        raise MalformedToolCall("unexpected text between parameters")
    return [(name, json.dumps(args, ensure_ascii=False))]


def _xml_params(inner: str) -> tuple[list[tuple[str, str]], str]:
    """``(name, raw value)`` of each ``<parameter=NAME>VALUE</parameter>`` and the text outside
    them; a linear scan (a regex search is quadratic on thousands of unclosed tags)."""
    params, outside, pos = [], [], 0
    while (start := inner.find(PARAM_OPEN, pos)) >= 0:
        name_end = inner.find(">", start)
        name = inner[start + len(PARAM_OPEN) : name_end] if name_end >= 0 else ""
        end = inner.find(PARAM_CLOSE, name_end + 1) if name and "\n" not in name else -1
        if end < 0:
            break
        outside.append(inner[pos:start])
        params.append((name, inner[name_end + 1 : end]))
        pos = end + len(PARAM_CLOSE)
    outside.append(inner[pos:])
    return params, "".join(outside)


def _param_value(raw: str) -> Any:
    value = raw[1:] if raw.startswith("\n") else raw
    value = value[:-1] if value.endswith("\n") else value
    try:
        return json.loads(value)
    except (ValueError, RecursionError):  # not JSON (or too many digits / too deep): keep the text
        return value


def _call_blocks(text: str) -> tuple[list[str], str]:
    """The bodies of ``<tool_call>...</tool_call>`` blocks and the text outside them (each block
    replaced by NUL). A linear scan: a regex search is quadratic on thousands of unclosed tags."""
    blocks, outside, pos = [], [], 0
    while (start := text.find(CALL_OPEN, pos)) >= 0:
        end = text.find(CALL_CLOSE, start + len(CALL_OPEN))
        if end < 0:
            break
        outside.append(text[pos:start] + "\x00")
        blocks.append(text[start + len(CALL_OPEN) : end])
        pos = end + len(CALL_CLOSE)
    outside.append(text[pos:])
    return blocks, "".join(outside)


def parse_text(text: str, tool_format: ToolFormat, *, started_in_think: bool = False) -> ParsedOutput:
    """Split ``text`` (decoded output, end token removed) into reasoning, content and tool calls."""
    reasoning, rest = split_reasoning(text, started_in_think=started_in_think)
    out = ParsedOutput(text=text, reasoning=reasoning, content=rest.strip())
    if CALL_OPEN not in rest and CALL_CLOSE not in rest:
        return out
    parse_call = parse_hermes_call if tool_format == "hermes" else parse_xml_call
    try:
        calls = []
        blocks, outside = _call_blocks(rest)
        for block in blocks:
            calls.extend(parse_call(block.strip("\n") if tool_format == "hermes" else block))
        if CALL_OPEN in outside or CALL_CLOSE in outside:
            raise MalformedToolCall("unterminated or stray tool-call tag")
        # content is what the model wrote before its calls (text between or after them is kept too)
        content = "\n".join(p.strip() for p in outside.split("\x00") if p.strip())
    except MalformedToolCall:
        out.malformed = True
        return out
    out.content = content
    out.tool_calls = [ToolCall(id=f"call_{i}", name=n, arguments=a) for i, (n, a) in enumerate(calls)]
    return out
