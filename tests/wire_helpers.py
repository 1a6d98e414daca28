"""Shared bits of the wire-codec tests: the captured harness requests and an SSE reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from polar_env.chat.messages import AssistantTurn, ToolCall
from polar_env.harness_adapters import get_adapter
from polar_env.harness_adapters.base import HarnessAdapter
from polar_env.wire.shape import encode

# request bodies and SSE replies captured from the real harness CLIs (redacted credentials)
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "harness_requests"


def fixture_adapter(stem: str) -> HarnessAdapter:
    """The adapter whose harness a fixture's stem names: the harness or an alias of it, then a
    variant after a dash (``pi-chat``, ``claude-bare``, ``codex-gpt55``)."""
    try:
        return get_adapter(stem)
    except KeyError:
        return get_adapter(stem.rsplit("-", 1)[0])


def fixture_stems() -> list[str]:
    """Every captured capture's stem (``pi-chat`` for ``pi-chat.req1.json``)."""
    return sorted({f.name.split(".req")[0] for f in FIXTURES.glob("*.req*.json")})


def wire_api_of(path: str) -> str:
    """The ``proxy.app.API_MODULES`` key a captured request's path is routed to."""
    path = path.split("?")[0]
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/responses"):
        return "responses"
    if path.endswith("/messages"):
        return "messages"
    if "GenerateContent" in path:
        return "gemini"
    raise ValueError(f"no model-call route for {path}")


def fixture(name: str) -> dict[str, Any]:
    """One captured request (``codex.req2``)."""
    return json.loads((FIXTURES / f"{name}.json").read_text())


def parse_sse(frames: list[bytes]) -> list[tuple[str | None, Any]]:
    """(event name, decoded data) per frame; asserts each frame is one well-formed SSE event."""
    events = []
    for frame in frames:
        text = frame.decode()
        assert text.endswith("\n\n") and text.count("\n\n") == 1, f"not one SSE event: {text!r}"
        name, data = None, []
        for line in text[:-2].split("\n"):
            if line.startswith("event: "):
                name = line[len("event: ") :]
            else:
                assert line.startswith("data: "), line
                data.append(line[len("data: ") :])
        payload = "\n".join(data)
        events.append((name, payload if payload == "[DONE]" else json.loads(payload)))
    return events


def text_turn(**kw: Any) -> AssistantTurn:
    return AssistantTurn(
        call_id="c0ffee0001", content="All done.", prompt_tokens=12, completion_tokens=4, model="served", **kw
    )


def tool_turn(**kw: Any) -> AssistantTurn:
    calls = [
        ToolCall(id="call_c0ffee_0", name="bash", arguments='{"command": "ls -la"}'),
        ToolCall(id="call_c0ffee_1", name="read", arguments='{"path": "README.md"}'),
    ]
    return AssistantTurn(
        call_id="c0ffee0002",
        content="Let me look.",
        reasoning="I should list files.",
        tool_calls=calls,
        finish_reason="tool_calls",
        prompt_tokens=30,
        completion_tokens=20,
        model="served",
        **kw,
    )


def on_wire(shape: Any) -> Any:
    """A body exactly as the proxy sends it: the shape encoded, then parsed back as JSON."""
    return json.loads(encode(shape))
