"""Real request bodies captured from every harness are decoded, rendered and answered,
and the SSE each harness needs comes back event by event (same event order as the real server)."""

from __future__ import annotations

import json
from itertools import groupby

import aiohttp
import pytest
from proxy_client import parse_sse, running_proxy
from wire_helpers import FIXTURES, fixture_adapter, fixture_stems, wire_api_of

from polar_env.harness_adapters import adapter_names, get_adapter


def _first_call(harness: str, requests: list[dict]) -> tuple[str | None, dict | None]:
    """The first tool the scripted model calls and its arguments: the adapter's shell tool running
    ``ls``, where the capture's first model call offers it (aider has none; a full Claude Code run's
    first model call is a tool-less side call)."""
    tool = fixture_adapter(harness).shell_tool
    first = next(r["body"] for r in requests if r["method"] != "HEAD")
    if tool is None or f'"{tool.name}"' not in json.dumps(first.get("tools") or []):
        return None, None
    return tool.name, tool.arguments("ls")


def test_every_harness_in_the_registry_has_captured_requests_of_its_wire_api():
    captured = {name: set() for name in adapter_names()}
    for stem in fixture_stems():
        captured[fixture_adapter(stem).name] |= {
            wire_api_of(r["path"]) for r in _load(stem) if r["method"] == "POST"
        }
    assert {name: get_adapter(name).wire_api in apis for name, apis in captured.items()} == dict.fromkeys(
        captured, True
    ), captured


def _names(events):
    """Event names with repeats collapsed; pings dropped (optional in both directions)."""
    out = []
    for event in events:
        if isinstance(event, dict):  # a Gemini chunk has no type
            out.append(event.get("type", "chunk"))
        elif isinstance(event, str):
            out.append(event)
    return [k for k, _ in groupby(n for n in out if n != "ping")]


def _ours(events):
    names = []
    for name, data in events:
        if data == "[DONE]":
            names.append("[DONE]")
        elif name is None:  # chat completions: chunks, and the trailing usage-only chunk
            names.append("usage" if not data.get("choices") and data.get("usage") else "chunk")
        else:
            names.append(name)
    return [k for k, _ in groupby(n for n in names if n != "ping")]


def _load(harness):
    files = sorted(FIXTURES.glob(f"{harness}.req*.json"))
    return [json.loads(f.read_text()) for f in files]


@pytest.mark.parametrize("harness", fixture_stems())
async def test_fixture_requests_are_answered_with_the_sse_the_harness_needs(
    harness, renderer, scripted_backend_factory, tmp_path
):
    def policy(session_id, call_number, prompt_text):
        if tool and call_number == 0:
            assert tool in prompt_text, "the harness's tools must be rendered into the prompt"
            return "<tool_call>\n" + json.dumps({"name": tool, "arguments": args}) + "\n</tool_call>"
        return "All done."

    requests = _load(harness)
    tool, args = _first_call(harness, requests)
    # harness prompts are long (Codex ~9k tokens); the scripted policy scores a bounded window
    config = dict(max_context=65536, default_max_tokens=64)
    async with (
        running_proxy(renderer, scripted_backend_factory(policy), tmp_path, **config) as proxy,
        aiohttp.ClientSession() as http,
    ):
        sid, key = proxy.create_session(harness)
        base = f"{proxy.base_url}/s/{sid}"
        for captured in requests:
            headers = {"Authorization": f"Bearer {key}", "x-api-key": key}
            async with http.request(
                captured["method"], base + captured["path"], json=captured["body"], headers=headers
            ) as resp:
                raw = await resp.read()
                assert resp.status == 200, raw[:500]
            if captured["method"] == "HEAD":
                continue
            if not (
                captured["body"].get("stream") or "alt=sse" in captured["path"]
            ):  # mini-SWE-agent: LiteLLM asks for one JSON answer
                message = json.loads(raw)["choices"][0]["message"]
                called = [c["function"]["name"] for c in message.get("tool_calls") or []]
                assert called == ([tool] if tool and captured is requests[0] else []), message
                continue
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            ours = _ours(parse_sse(raw))
            theirs = _names(captured["sse_events"])
            if theirs[-1] == "[DONE]" and "usage" in theirs and not captured["body"].get("stream_options"):
                theirs.remove("usage")
            assert ours == theirs, f"{harness} {captured['path']}: {ours} != {theirs}"
