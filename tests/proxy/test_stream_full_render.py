"""The stream equals the full render: for multi-turn episodes of every wire dialect (captured
harness requests continued the way each harness continues them), the proxy's prompt ids (first
prompt + sampled ids + appended tails) equal the template's full render of the same conversation,
call by call, with the bundled Qwen3.5 and Hermes templates. The one difference by design (a new
user turn after thinking turns: the template drops that thinking, the stream keeps it) is
declared: flagged on the call, counted by ``polar check``, or removed with ``--history-thinking drop``.

The model is the real SmolLM2 scoring scripted answers; the answers are written in the
template's own format, as a model trained on it samples them.
"""

from __future__ import annotations

import copy
import json

import aiohttp
import pytest
from proxy_client import ledger_calls, post, running_proxy
from wire_helpers import fixture

from polar_env.chat.messages import Message, ToolCall, ToolSpec
from polar_env.chat.template import ChatRenderer
from polar_env.proxy.engine import HISTORY_THINKING_DROPPED
from polar_env.trajectory.checks import check_path
from polar_env.trajectory.records import HISTORY_THINKING_KEPT

pytestmark = pytest.mark.slow  # real proxy over HTTP, the real model scoring each answer

# dialect -> (captured first request, endpoint, the shell tool the harness offers, its argument)
DIALECTS = {
    "chat": ("pi-chat.req1", "/v1/chat/completions", "bash", "command"),
    "responses": ("codex.req1", "/v1/responses", "exec_command", "cmd"),
    "anthropic": ("claude-bare.req2", "/v1/messages", "Bash", "command"),
    "gemini": ("gemini.req1", "/v1beta/models/polar-model:generateContent", "run_shell_command", "command"),
}
OUTPUTS = {"ls": "README.md\nsrc\n", "pwd": "/work\n", "cat README.md": "# Demo\n\n"}  # trailing newlines
SECOND_USER = "Now also add a test."


def script(tool: str, arg: str) -> list[Message]:
    """What the model answers, call by call: parallel calls with reasoning, a bare call with
    whitespace-only text, a final answer; then (after a second user turn) a last answer."""

    def call(i: int, cmd: str) -> ToolCall:
        return ToolCall(id=f"s{i}", name=tool, arguments=json.dumps({arg: cmd}))

    return [
        Message(
            role="assistant",
            content="Looking around.",
            reasoning="List, then locate.",
            tool_calls=[call(0, "ls"), call(1, "pwd")],
        ),
        Message(role="assistant", content="", reasoning="Read it.", tool_calls=[call(2, "cat README.md")]),
        Message(role="assistant", content="The project is a demo.", reasoning="Enough seen."),
        Message(role="assistant", content="Test added.", reasoning="A second task."),
    ]


def sampled_text(renderer: ChatRenderer, turn: Message) -> str:
    """The text a model trained on the template samples for ``turn`` (after the generation prompt)."""
    user = [Message(role="user", content="q")]
    prompt = renderer.render_text(user, [], add_generation_prompt=True)
    full = renderer.render_text(user + [turn], [], add_generation_prompt=False)
    assert full.startswith(prompt)
    return full[len(prompt) :].removesuffix(renderer.end_of_turn + renderer._glue)


def follow_up(dialect: str, body: dict, reply: dict, user: str | None) -> dict:
    """``body`` continued as the harness continues it: its answer, the tool results, a user turn."""
    body = copy.deepcopy(body)
    if dialect == "chat":
        message = reply["choices"][0]["message"]
        body["messages"].append(message)
        body["messages"] += [
            {
                "role": "tool",
                "tool_call_id": c["id"],
                "content": OUTPUTS[json.loads(c["function"]["arguments"])["command"]],
            }
            for c in message.get("tool_calls") or []
        ]
        if user:
            body["messages"].append({"role": "user", "content": user})
    elif dialect == "responses":
        body["input"] += reply["output"]
        body["input"] += [
            {
                "type": "function_call_output",
                "call_id": item["call_id"],
                "output": OUTPUTS[json.loads(item["arguments"])["cmd"]],
            }
            for item in reply["output"]
            if item["type"] == "function_call"
        ]
        if user:
            body["input"].append(
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": user}]}
            )
    elif dialect == "anthropic":
        body["messages"].append({"role": "assistant", "content": reply["content"]})
        results = [
            {"type": "tool_result", "tool_use_id": b["id"], "content": OUTPUTS[b["input"]["command"]]}
            for b in reply["content"]
            if b["type"] == "tool_use"
        ]
        if results:
            body["messages"].append({"role": "user", "content": results})
        if user:
            body["messages"].append({"role": "user", "content": [{"type": "text", "text": user}]})
    else:
        content = reply["candidates"][0]["content"]
        body["contents"].append(content)
        results = [
            {
                "functionResponse": {
                    "name": p["functionCall"]["name"],
                    "response": {"output": OUTPUTS[p["functionCall"]["args"]["command"]]},
                }
            }
            for p in content["parts"]
            if "functionCall" in p
        ]
        if results:
            body["contents"].append({"role": "user", "parts": results})
        if user:
            body["contents"].append({"role": "user", "parts": [{"text": user}]})
    return body


async def run_episode(
    renderer, scripted_backend_factory, tmp_path, dialect: str, history_thinking: str = "keep"
):
    name, path, tool, arg = DIALECTS[dialect]
    turns = [sampled_text(renderer, t) for t in script(tool, arg)]
    policy = lambda session_id, n, prompt_text: turns[n]  # noqa: E731
    body = copy.deepcopy(fixture(name)["body"])
    body["stream"] = False
    body.pop("stream_options", None)
    config = dict(max_context=65536, default_max_tokens=256, history_thinking=history_thinking)
    async with (
        running_proxy(
            renderer, scripted_backend_factory(policy, context_window=64), tmp_path, **config
        ) as proxy,
        aiohttp.ClientSession() as http,
    ):
        sid, key = proxy.create_session(f"{dialect}-{history_thinking}")
        for n in range(len(turns)):
            status, reply = await post(
                http,
                f"{proxy.base_url}/s/{sid}{path}",
                body,
                key,
                header="x-api-key" if dialect == "anthropic" else "bearer",
            )
            assert status == 200, reply
            if n < len(turns) - 1:
                body = follow_up(dialect, body, reply, SECOND_USER if n == 2 else None)
        calls = await ledger_calls(http, proxy, sid)
    return calls


@pytest.fixture(scope="module", params=["qwen3_coder_tools", "chatml_hermes_tools"])
def template_renderer(request, embedded_dir) -> ChatRenderer:
    return ChatRenderer.from_pretrained(embedded_dir, chat_template=request.param)


def full_render(renderer: ChatRenderer, call: dict) -> list[int]:
    messages = [Message.model_validate(m) for m in call["messages"]]
    tools = [ToolSpec.model_validate(t) for t in call["tools"]]
    return renderer.render_prompt(messages, tools)


@pytest.mark.parametrize("dialect", DIALECTS)
async def test_prompt_ids_equal_the_full_render_call_by_call(
    template_renderer, scripted_backend_factory, tmp_path, dialect
):
    calls = await run_episode(template_renderer, scripted_backend_factory, tmp_path, dialect)
    assert len(calls) == 4 and all(c["error"] is None for c in calls)
    # one chain: each call extends the one before (no re-render of history)
    assert [c["parent_call_index"] for c in calls] == [None, 0, 1, 2]
    assert [c["output"]["tool_calls"] != [] for c in calls] == [True, True, False, False]
    roles = [m["role"] for m in calls[1]["messages"][-3:]]
    assert roles == ["assistant", "tool", "tool"]  # the parallel calls' results, merged by the template
    for c in calls[:3]:
        assert c["prompt_ids"] == full_render(template_renderer, c), f"call {c['call_index']} differs"
        assert HISTORY_THINKING_KEPT not in c["flags"]
    # the last call follows a second user turn: the template drops the earlier thinking, the
    # stream keeps it; declared on the call, and exactly that is the difference
    last = calls[3]
    assert HISTORY_THINKING_KEPT in last["flags"]
    full = full_render(template_renderer, last)
    assert last["prompt_ids"] != full
    text = template_renderer.tokenizer.decode(last["prompt_ids"])
    assert "Enough seen." in text and "Enough seen." not in template_renderer.tokenizer.decode(full)
    if dialect == "anthropic":  # a Claude Code episode with a second user turn: polar check counts it
        report = check_path(tmp_path)
        assert report.ok, report.render()
        notes = [n for n in report.notes if n.startswith("declared render differences")]
        assert len(notes) == 1 and "1 call(s) in 1 episode(s)" in notes[0] and "anthropic-keep x1" in notes[0]


async def test_history_thinking_drop_starts_a_new_chain_equal_to_the_full_render(
    embedded_dir, scripted_backend_factory, tmp_path
):
    renderer = ChatRenderer.from_pretrained(embedded_dir, chat_template="qwen3_coder_tools")
    calls = await run_episode(
        renderer, scripted_backend_factory, tmp_path, "anthropic", history_thinking="drop"
    )
    assert [c["parent_call_index"] for c in calls] == [None, 0, 1, None]
    assert calls[3]["break_reason"] == HISTORY_THINKING_DROPPED
    assert all(c["prompt_ids"] == full_render(renderer, c) for c in calls)
