"""Two tool calls sampled in one turn come back in the orders real harnesses send them; each order
must decode to that one assistant turn, so the next prompt is exactly what the model saw plus the
tool results (never a second, template-rendered copy of a call). The chain checker catches the
corruption if it ever happens again. The real Codex CLI case is in test_harness_e2e.py.
"""

from __future__ import annotations

import aiohttp
import pytest
from proxy_client import WEATHER_TOOL, ledger_calls, post, running_proxy
from trajectory_helpers import call, session

from polar_env.backends.instant import InstantBackend
from polar_env.chat.messages import Message, ToolCall
from polar_env.proxy.codecs import anthropic_messages, openai_chat, openai_responses
from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.checks import check_trajectory, duplicate_turns
from polar_env.trajectory.ledger import Ledger

TWO_CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
)
RESULTS = ["sunny, 21 C", "rain, 14 C"]


def responses_history(output: list[dict], order: str) -> list[dict]:
    """The input items a Responses client sends back: ``interleaved`` is Codex's history (each call
    followed by its output), ``grouped`` puts both calls first, ``reversed`` answers B before A."""
    calls = [item for item in output if item["type"] == "function_call"]
    outputs = [
        {"type": "function_call_output", "call_id": c["call_id"], "output": r}
        for c, r in zip(calls, RESULTS, strict=True)
    ]
    echo = [{k: v for k, v in c.items() if k != "status"} for c in calls]
    if order == "interleaved":
        return [echo[0], outputs[0], echo[1], outputs[1]]
    if order == "grouped":
        return echo + outputs
    return echo + outputs[::-1]


def chat_history(message: dict, order: str) -> list[dict]:
    """Chat clients: one assistant message (``grouped``), or one assistant message per call (``split``)."""
    tool = [
        {"role": "tool", "tool_call_id": tc["id"], "content": r}
        for tc, r in zip(message["tool_calls"], RESULTS, strict=True)
    ]
    if order == "grouped":
        return [message, *tool]
    return (
        [{**message, "tool_calls": [tc]} for tc in message["tool_calls"][:1]]
        + tool[:1]
        + [{"role": "assistant", "content": None, "tool_calls": message["tool_calls"][1:]}]
        + tool[1:]
    )


def messages_history(content: list[dict], order: str) -> list[dict]:
    uses = [b for b in content if b["type"] == "tool_use"]
    results = [
        {"type": "tool_result", "tool_use_id": u["id"], "content": r}
        for u, r in zip(uses, RESULTS, strict=True)
    ]
    if order == "grouped":
        return [{"role": "assistant", "content": content}, {"role": "user", "content": results}]
    return [
        {"role": "assistant", "content": [uses[0]]},
        {"role": "user", "content": results[:1]},
        {"role": "assistant", "content": [uses[1]]},
        {"role": "user", "content": results[1:]},
    ]


CASES = [
    ("responses", "interleaved"),
    ("responses", "grouped"),
    ("responses", "reversed"),
    ("chat", "grouped"),
    ("chat", "split"),
    ("messages", "grouped"),
    ("messages", "split"),
]


@pytest.mark.parametrize("api, order", CASES)
async def test_parallel_calls_in_any_order_extend_the_sampled_turn(api, order, renderer, tmp_path):
    # the decoding and the prompt are under test, not the model: every call samples the two calls
    backend = InstantBackend(
        renderer.tokenizer.encode(TWO_CALLS, add_special_tokens=False) + renderer.eos_token_ids[:1]
    )
    user = "Weather in Paris and Rome?"
    async with running_proxy(renderer, backend, tmp_path) as proxy, aiohttp.ClientSession() as http:
        sid, key = proxy.create_session("par")
        base = f"{proxy.base_url}/s/{sid}/v1"
        if api == "responses":
            first = {
                "model": "m",
                "store": False,
                "input": [{"role": "user", "content": user}],
                "tools": [{"type": "function", **WEATHER_TOOL}],
            }
            status, reply = await post(http, base + "/responses", first, key)
            second = {**first, "input": first["input"] + responses_history(reply["output"], order)}
            status2, _ = await post(http, base + "/responses", second, key)
        elif api == "chat":
            first = {
                "model": "m",
                "messages": [{"role": "user", "content": user}],
                "tools": [{"type": "function", "function": WEATHER_TOOL}],
            }
            status, reply = await post(http, base + "/chat/completions", first, key)
            second = {
                **first,
                "messages": first["messages"] + chat_history(reply["choices"][0]["message"], order),
            }
            status2, _ = await post(http, base + "/chat/completions", second, key)
        else:
            first = {
                "model": "m",
                "max_tokens": 64,
                "messages": [{"role": "user", "content": user}],
                "tools": [
                    {
                        "name": WEATHER_TOOL["name"],
                        "description": WEATHER_TOOL["description"],
                        "input_schema": WEATHER_TOOL["parameters"],
                    }
                ],
            }
            status, reply = await post(http, base + "/messages", first, key)
            second = {**first, "messages": first["messages"] + messages_history(reply["content"], order)}
            status2, _ = await post(http, base + "/messages", second, key)
        assert (status, status2) == (200, 200), reply
        calls = await ledger_calls(http, proxy, sid)
    c0, c1 = calls
    issued = [tc["id"] for tc in c0["output"]["tool_calls"]]
    assert len(issued) == 2
    # one assistant turn holding both sampled calls, then the two results in the order sent
    roles = [m["role"] for m in c1["messages"]]
    assert roles == ["user", "assistant", "tool", "tool"], roles
    assert [tc["id"] for tc in c1["messages"][1]["tool_calls"]] == issued
    sent_order = [m["tool_call_id"] for m in c1["messages"][2:]]
    assert sent_order == (issued[::-1] if order == "reversed" else issued)
    # token-exact: the parent's prompt and sampled ids, then only the rendered tool results
    tools = [Message(role="tool", content=RESULTS[issued.index(i)], tool_call_id=i) for i in sent_order]
    assert c1["parent_call_index"] == 0
    assert c1["prompt_ids"] == c0["prompt_ids"] + c0["sampled_ids"] + renderer.render_continuation(
        tools, previous_ended_with_eos=True
    )
    text = renderer.tokenizer.decode(c1["prompt_ids"])
    assert text.count('"city": "Rome"') == 1 and text.count('"city": "Paris"') == 1
    ledger = Ledger(tmp_path)
    assert check_trajectory(build_trajectory(ledger.session(sid), ledger.calls(sid))) == []


def test_calls_the_proxy_did_not_issue_are_not_merged():
    """Foreign ids (a history from another provider) name no sampled turn: decoded as sent."""
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "toolu_A", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_A", "content": "a"},
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "toolu_B", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_B", "content": "b"},
        ],
    }
    roles = [m.role for m in openai_chat.decode(body).conversation.messages]
    assert roles == ["user", "assistant", "tool", "assistant", "tool"]


def test_interleaved_codex_items_decode_to_one_turn_with_the_ref_kept():
    a, b = "call_0123456789ab_0", "call_0123456789ab_1"
    body = {
        "model": "m",
        "input": [
            {"role": "user", "content": "go"},
            {"type": "reasoning", "summary": [], "encrypted_content": "polar:v1:0123456789abcdef"},
            {
                "type": "function_call",
                "id": "fc_0123456789abcdef_0",
                "call_id": a,
                "name": "f",
                "arguments": "{}",
            },
            {"type": "function_call_output", "call_id": a, "output": "A"},
            {
                "type": "function_call",
                "id": "fc_0123456789abcdef_1",
                "call_id": b,
                "name": "f",
                "arguments": "{}",
            },
            {"type": "function_call_output", "call_id": b, "output": "B"},
        ],
    }
    req = openai_responses.decode(body)
    assert [m.role for m in req.conversation.messages] == ["user", "assistant", "tool", "tool"]
    assert [tc.id for tc in req.conversation.messages[1].tool_calls] == [a, b]
    assert req.assistant_refs == [None, "polar:v1:0123456789abcdef", None, None]
    blocks = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": a, "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": a, "content": "A"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": b, "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b, "content": "B"}]},
        ],
    }
    assert [m.role for m in anthropic_messages.decode(blocks).conversation.messages] == [
        "user",
        "assistant",
        "tool",
        "tool",
    ]


def test_checker_catches_a_prompt_that_re_renders_a_sampled_call():
    """The pre-fix corruption, as the ledger held it: call 1 extends call 0 token-exactly, but its
    messages hold call B twice (once sampled, once re-rendered after output A)."""
    user = Message(role="user", content="go")
    a = ToolCall(id="call_0", name="shell", arguments='{"cmd": "ls"}')
    b = ToolCall(id="call_0b", name="shell", arguments='{"cmd": "pwd"}')
    c0 = call(0, [1, 2, 3], [10, 11], messages=[user], tool="shell")
    c0.output.tool_calls = [a, b]
    split = [
        user,
        Message(role="assistant", tool_calls=[a, b]),
        Message(role="tool", tool_call_id="call_0", content="x"),
        Message(role="assistant", tool_calls=[b]),
        Message(role="tool", tool_call_id="call_0b", content="y"),
    ]
    c1 = call(1, [1, 2, 3, 10, 11, 5, 6, 7], [12], parent=0, messages=split)
    traj = build_trajectory(session(), [c0, c1])
    assert len(traj.chains) == 1  # token-exact: the chain rules alone accept it
    [defect] = duplicate_turns(traj)
    assert "call 1" in defect and "call_0b" in defect and "call 0 already sampled" in defect
    assert defect in check_trajectory(traj)
    fixed = [user, Message(role="assistant", tool_calls=[a, b]), *split[2:3], split[4]]
    c1.messages = fixed
    assert duplicate_turns(build_trajectory(session(), [c0, c1])) == []
