"""Real request bodies captured from every harness are decoded, rendered and answered,
and the SSE each harness needs comes back event by event (same event order as the real server)."""

from __future__ import annotations

import json
from itertools import groupby

import aiohttp
import pytest
from proxy_client import parse_sse, running_proxy
from wire_helpers import FIXTURES

from polar_env.proxy.engine import EngineConfig

# (first tool the scripted model calls, its arguments) per harness capture
FIRST_CALL = {
    "codex": ("exec_command", {"cmd": "ls"}),
    "codex-gpt55": ("exec_command", {"cmd": "ls"}),
    "pi-anthropic": ("bash", {"command": "ls"}),
    "pi-chat": ("bash", {"command": "ls"}),
    "pi-responses": ("bash", {"command": "ls"}),
    "claude-bare": ("Bash", {"command": "ls"}),
    "claude": (None, None),
    "mini-swe-agent": ("bash", {"command": "ls"}),
    "aider": (None, None),  # no tools: it edits from a diff in the text
    "qwen-code": ("run_shell_command", {"command": "ls"}),
    "opencode": ("bash", {"command": "ls"}),
    "cline": ("run_commands", {"commands": ["ls"]}),
    "hermes-agent": ("terminal", {"command": "ls"}),
    "openhands": ("terminal", {"command": "ls", "security_risk": "LOW"}),
}


def _names(events):
    """Event names with repeats collapsed; pings dropped (optional in both directions)."""
    out = []
    for event in events:
        if isinstance(event, dict):
            out.append(event.get("type"))
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


@pytest.mark.parametrize("harness", sorted(FIRST_CALL))
async def test_fixture_requests_are_answered_with_the_sse_the_harness_needs(harness, renderer,
                                                                           scripted_backend_factory, tmp_path):
    tool, args = FIRST_CALL[harness]

    def policy(session_id, call_number, prompt_text):
        if tool and call_number == 0:
            assert tool in prompt_text, "the harness's tools must be rendered into the prompt"
            return '<tool_call>\n' + json.dumps({"name": tool, "arguments": args}) + '\n</tool_call>'
        return "All done."

    requests = _load(harness)
    assert requests, f"no fixtures for {harness} in {FIXTURES}"
    # harness prompts are long (Codex ~9k tokens); the scripted policy scores a bounded window
    config = EngineConfig(max_context=65536, default_max_tokens=64)
    async with running_proxy(renderer, scripted_backend_factory(policy), tmp_path, config=config) as proxy, \
            aiohttp.ClientSession() as http:
        sid, key = proxy.create_session(harness)
        base = f"{proxy.base_url}/s/{sid}"
        for captured in requests:
            headers = {"Authorization": f"Bearer {key}", "x-api-key": key}
            async with http.request(captured["method"], base + captured["path"],
                                    json=captured["body"], headers=headers) as resp:
                raw = await resp.read()
                assert resp.status == 200, raw[:500]
            if captured["method"] == "HEAD":
                continue
            if not captured["body"].get("stream"):  # mini-SWE-agent: LiteLLM asks for one JSON answer
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
