"""Chat Completions codec: Pi's captured requests decode; answers stream the way Pi reads them."""

from __future__ import annotations

import json

import pytest
from wire_helpers import fixture, on_wire, parse_sse, text_turn, tool_turn

from polar_env.proxy.codecs import openai_chat
from polar_env.proxy.codecs.common import WireError


def test_pi_first_request_decodes():
    req = openai_chat.decode(fixture("pi-chat.req1")["body"])
    assert [m.role for m in req.conversation.messages] == ["system", "user"]
    assert req.conversation.messages[1].content == "Create out.txt"
    assert [t.name for t in req.conversation.tools] == ["read", "bash", "edit", "write"]
    assert req.conversation.tools[1].parameters["required"] == ["command"]
    assert req.stream and req.include_usage
    assert req.requested_sampling == {"max_tokens": 16384}  # max_completion_tokens, normalised
    assert req.model == req.raw_model == "fake-model"
    assert req.assistant_refs == [None, None]


def test_pi_second_request_carries_the_tool_round():
    req = openai_chat.decode(fixture("pi-chat.req2")["body"])
    roles = [m.role for m in req.conversation.messages]
    assert roles == ["system", "user", "assistant", "tool"]
    assistant, result = req.conversation.messages[2:]
    assert assistant.content == ""  # content: null
    [call] = assistant.tool_calls
    assert (call.id, call.name, json.loads(call.arguments)) == (
        "call_331ebc17cec1",
        "bash",
        {"command": "echo hi > out.txt"},
    )
    assert result.tool_call_id == "call_331ebc17cec1" and result.content == "(no output)"


def _base(**kw):
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}


@pytest.mark.parametrize(
    "body, needle",
    [
        ([1, 2], "must be a JSON object"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}, "role"),
        ({"model": "m", "messages": [{"role": "user", "content": 7}]}, "content"),
        ({"model": 3, "messages": [{"role": "user", "content": "hi"}]}, "model"),
        (_base(messages=[{"role": "tool", "content": "x"}]), "tool_call_id"),
        (
            _base(messages=[{"role": "assistant", "tool_calls": [{"id": "a", "type": "function"}]}]),
            "function",
        ),
        (_base(temperature="hot"), "temperature"),
    ],
)
def test_malformed_bodies_are_400_naming_the_problem(body, needle):
    with pytest.raises(WireError) as err:
        openai_chat.decode(body)
    assert err.value.status == 400 and needle in err.value.message


def test_developer_role_parts_and_reasoning_map_to_canonical():
    req = openai_chat.decode(
        _base(
            max_tokens=5,
            temperature=0.2,
            top_p=0.9,
            messages=[
                {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "a"},
                        {"type": "image_url", "image_url": {"url": "x"}},
                    ],
                },
                {"role": "assistant", "content": "ok", "reasoning_content": "thinking"},
            ],
        )
    )
    system, user, assistant = req.conversation.messages
    assert system.role == "system" and system.content == "be brief"
    assert user.content == "a\n[image]" and "placeholder:image" in req.flags
    assert assistant.reasoning == "thinking"
    assert req.requested_sampling == {"temperature": 0.2, "top_p": 0.9, "max_tokens": 5}
    assert not req.stream and not req.include_usage


def test_encode_response_tool_turn():
    req = openai_chat.decode(fixture("pi-chat.req1")["body"])
    body = on_wire(openai_chat.encode_response(tool_turn(), req))
    assert body["id"] == "chatcmpl-c0ffee0002" and body["object"] == "chat.completion"
    assert body["model"] == "fake-model"
    [choice] = body["choices"]
    assert choice["finish_reason"] == "tool_calls"
    msg = choice["message"]
    assert msg["content"] == "Let me look." and msg["reasoning_content"] == "I should list files."
    assert [(c["id"], c["function"]["name"]) for c in msg["tool_calls"]] == [
        ("call_c0ffee_0", "bash"),
        ("call_c0ffee_1", "read"),
    ]
    assert body["usage"] == {"prompt_tokens": 30, "completion_tokens": 20, "total_tokens": 50}


def test_finish_reasons():
    req = openai_chat.decode(_base())
    assert on_wire(openai_chat.encode_response(text_turn(), req))["choices"][0]["finish_reason"] == "stop"
    assert (
        on_wire(openai_chat.encode_response(text_turn(finish_reason="length"), req))["choices"][0][
            "finish_reason"
        ]
        == "length"
    )
    # a turn marked tool_calls whose calls failed to parse is answered as text
    assert (
        on_wire(openai_chat.encode_response(text_turn(finish_reason="tool_calls"), req))["choices"][0][
            "finish_reason"
        ]
        == "stop"
    )


def _kinds(events):
    kinds = []
    for _, data in events:
        if data == "[DONE]":
            kinds.append("[DONE]")
        elif not data["choices"]:
            kinds.append("usage")
        else:
            choice = data["choices"][0]
            kinds.append(choice["finish_reason"] or "+".join(sorted(choice["delta"])) or "empty")
    return kinds


def test_stream_text_turn_event_sequence():
    req = openai_chat.decode(fixture("pi-chat.req2")["body"])
    events = parse_sse(openai_chat.encode_stream(text_turn(), req))
    assert _kinds(events) == ["content+role", "content", "stop", "usage", "[DONE]"]
    assert all(name is None for name, _ in events)
    assert events[-2][1]["usage"]["total_tokens"] == 16
    no_usage = openai_chat.decode({**fixture("pi-chat.req2")["body"], "stream_options": None})
    assert _kinds(parse_sse(openai_chat.encode_stream(text_turn(), no_usage)))[-2:] == ["stop", "[DONE]"]


def test_stream_tool_turn_reassembles_like_pi():
    req = openai_chat.decode(fixture("pi-chat.req1")["body"])
    events = parse_sse(openai_chat.encode_stream(tool_turn(), req))
    assert _kinds(events) == [
        "content+role",
        "reasoning_content",
        "content",
        "tool_calls",
        "tool_calls",
        "tool_calls",
        "usage",
        "[DONE]",
    ]
    content, calls = "", {}
    for _, data in events[:-2]:
        delta = data["choices"][0]["delta"]
        content += delta.get("content") or ""
        for tc in delta.get("tool_calls") or []:
            slot = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
            slot["id"] = tc.get("id") or slot["id"]
            slot["name"] += tc["function"].get("name", "")
            slot["arguments"] += tc["function"].get("arguments", "")
    assert content == "Let me look."
    assert calls[0] == {"id": "call_c0ffee_0", "name": "bash", "arguments": '{"command": "ls -la"}'}
    assert calls[1]["id"] == "call_c0ffee_1"


def test_round_trip_tool_turn_then_follow_up():
    first = fixture("pi-chat.req1")["body"]
    req = openai_chat.decode(first)
    turn = tool_turn()
    answer = on_wire(openai_chat.encode_response(turn, req))["choices"][0]["message"]
    follow = {
        **first,
        "messages": first["messages"]
        + [answer]
        + [
            {"role": "tool", "tool_call_id": c["id"], "content": f"out {i}"}
            for i, c in enumerate(answer["tool_calls"])
        ],
    }
    again = openai_chat.decode(follow)
    assistant = again.conversation.messages[2]
    assert assistant == turn.as_message()
    assert [m.role for m in again.conversation.messages] == ["system", "user", "assistant", "tool", "tool"]
    assert [m.tool_call_id for m in again.conversation.messages[3:]] == ["call_c0ffee_0", "call_c0ffee_1"]


def test_error_body_shape():
    body = on_wire(openai_chat.encode_error(400, "messages: Field required"))
    assert body["error"]["message"] == "messages: Field required"
    assert body["error"]["type"] == "invalid_request_error"
    assert on_wire(openai_chat.encode_error(503, "down"))["error"]["type"] == "server_error"


def test_custom_tools_and_calls():
    req = openai_chat.decode(
        _base(
            tools=[
                {
                    "type": "custom",
                    "custom": {
                        "name": "apply_patch",
                        "description": "patch files",
                        "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"},
                    },
                },
                {"type": "web_search"},
            ],
            messages=[
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "custom", "custom": {"name": "apply_patch", "input": "*** x"}}
                    ],
                },
            ],
        )
    )
    [tool] = req.conversation.tools
    assert tool.kind == "custom" and "start: x" in tool.description and "lark" in tool.description
    assert "skipped_tool:web_search" in req.flags
    [call] = req.conversation.messages[1].tool_calls
    assert (call.kind, call.arguments) == ("custom", "*** x")
    turn = tool_turn().model_copy(update={"tool_calls": [call]})
    wire = on_wire(openai_chat.encode_response(turn, req))["choices"][0]["message"]["tool_calls"][0]
    assert wire == {"id": "c1", "type": "custom", "custom": {"name": "apply_patch", "input": "*** x"}}
