"""Shared by the fuzz tests: harness fixtures as seeds, body mutators, and a proxy on a thread.

The proxy runs on its own event loop in a thread so that plain (synchronous) hypothesis tests can
send it real HTTP requests with a client-side timeout: a hang shows up as a failed example.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from typing import Any

from hypothesis import strategies as st
from wire_helpers import FIXTURES

from polar_env.proxy.app import ProxyServer

API_OF_PATH = {"/v1/chat/completions": "chat", "/v1/responses": "responses", "/v1/messages": "messages"}


def api_of_path(path: str) -> str | None:
    """Which wire API a captured request's path is (Gemini's names the method after the model)."""
    path = path.split("?")[0]
    if path.endswith((":generateContent", ":streamGenerateContent")):
        return "gemini"
    return API_OF_PATH.get(path)


def seed_bodies() -> dict[str, list[dict]]:
    """Real harness request bodies per API, plus a minimal one each."""
    seeds: dict[str, list[dict]] = {
        "chat": [{"model": "m", "messages": [{"role": "user", "content": "hi"}]}],
        "responses": [{"model": "m", "input": "hi"}],
        "messages": [{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}],
        "gemini": [{"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}],
    }
    for path in sorted(FIXTURES.glob("*.json")):
        fixture = json.loads(path.read_text())
        api = api_of_path(fixture["path"])
        if api and isinstance(fixture.get("body"), dict):
            seeds[api].append(fixture["body"])
    return seeds


JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
    | st.sampled_from(
        [
            "user",
            "assistant",
            "system",
            "tool",
            "developer",
            "function_call",
            "function_call_output",
            "message",
            "text",
            "tool_use",
            "tool_result",
            "thinking",
            "reasoning",
            "input_text",
            "image",
            "polar:v1:",
            "msg_",
            "fc__1",
            "model",
            "MODE_UNSPECIFIED",
            "ANY",
            "NONE",
        ]
    )
)
JSON = st.recursive(
    JSON_LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(max_size=12)
            | st.sampled_from(
                [
                    "role",
                    "content",
                    "type",
                    "text",
                    "id",
                    "call_id",
                    "name",
                    "arguments",
                    "input",
                    "tool_calls",
                    "tool_call_id",
                    "tools",
                    "stream",
                    "max_tokens",
                    "contents",
                    "parts",
                    "functionCall",
                    "functionResponse",
                    "args",
                    "response",
                    "thought",
                    "thoughtSignature",
                    "systemInstruction",
                    "functionDeclarations",
                    "generationConfig",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=20,
)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, prefix + (i,))
    return out


@st.composite
def mutated_body(draw, seeds: list[dict]) -> Any:
    """A real body with 1-3 subtrees replaced by random JSON, deleted, or duplicated."""
    body = copy.deepcopy(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(body)
        path = draw(st.sampled_from(paths))
        if not path:
            body = draw(JSON) if draw(st.integers(0, 9)) == 0 else body
            continue
        parent = body
        for p in path[:-1]:
            parent = parent[p]
        action = draw(st.sampled_from(["replace", "delete", "duplicate"]))
        if action == "replace":
            parent[path[-1]] = draw(JSON)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, list):
            parent.insert(path[-1], copy.deepcopy(parent[path[-1]]))
    return body


class ThreadedProxy:
    """Run ``proxy`` on 127.0.0.1 in a thread with its own event loop."""

    def __init__(self, proxy: ProxyServer):
        self.proxy = proxy
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def call(self, coro, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __enter__(self) -> ThreadedProxy:
        self.thread.start()
        self.call(self.proxy.start("127.0.0.1", 0))
        return self

    def __exit__(self, *exc) -> None:
        self.call(self.proxy.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
