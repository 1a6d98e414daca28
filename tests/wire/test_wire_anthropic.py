"""Anthropic Messages codec: Claude Code's and Pi's captured requests decode; answers stream as Claude Code
reads."""

from __future__ import annotations

import copy
import json

import pytest
from wire_helpers import fixture, on_wire, parse_sse, text_turn, tool_turn

from polar_env.proxy.codecs import anthropic_messages
from polar_env.proxy.codecs.common import WireError
from polar_env.wire.ids import call_id_from_ref


def test_claude_code_first_request_strips_the_billing_header():
    req = anthropic_messages.decode(fixture("claude-bare.req2")["body"])
    system, user = req.conversation.messages
    assert system.role == "system"
    assert system.content == "You are a Claude agent, built on Anthropic's Claude Agent SDK.\nCWD: /testbed\n"
    assert "billing" not in system.content
    assert req.flags == [
        "stripped:x-anthropic-billing-header",
        "stripped:claude-date-line",
        "stripped:claude-todays-date",
    ]
    assert user.role == "user" and user.content.endswith("</system-reminder>\n\n\nCreate out.txt")
    assert [t.name for t in req.conversation.tools] == ["Bash", "Edit", "Read"]
    assert req.conversation.tools[0].parameters["required"] == ["command"]
    assert req.stream and req.requested_sampling == {"max_tokens": 32000}
    assert req.model == "my-policy-model"


def test_claude_code_tool_round_becomes_a_tool_message():
    req = anthropic_messages.decode(fixture("claude-bare.req3")["body"])
    assert [m.role for m in req.conversation.messages] == ["system", "user", "assistant", "tool"]
    assistant, result = req.conversation.messages[2:]
    [call] = assistant.tool_calls
    assert (call.id, call.name) == ("toolu_e22b8dce06284a7d", "Bash")
    assert json.loads(call.arguments) == {
        "command": "echo hi > out.txt",
        "description": "Write hi to out.txt",
    }
    assert (result.tool_call_id, result.content) == (
        "toolu_e22b8dce06284a7d",
        "(Bash completed with no output)",
    )
    assert req.assistant_refs == [None, None, None, None]


def test_claude_title_request_has_no_tools():
    req = anthropic_messages.decode(fixture("claude.req2")["body"])
    assert [m.role for m in req.conversation.messages] == ["system", "user"]
    assert req.conversation.tools == [] and req.raw_model == "claude-opus-4-8"
    assert "stripped:x-anthropic-billing-header" in req.flags


def test_pi_anthropic_second_request():
    req = anthropic_messages.decode(fixture("pi-anthropic.req2")["body"])
    assert [m.role for m in req.conversation.messages] == ["system", "user", "assistant", "tool"]
    assert req.conversation.messages[2].tool_calls[0].name == "bash"
    assert req.conversation.messages[3].content == "(no output)"
    assert req.flags == ["stripped:pi-current-date"]  # Pi's only volatile line is the date


def test_blocks_map_in_order():
    req = anthropic_messages.decode(
        {
            "model": "m",
            "system": "sys",
            "temperature": 0.3,
            "top_p": 0.8,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look"},
                        {"type": "image", "source": {"type": "base64", "data": "xx"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hmm", "signature": "polar:v1:aaa"},
                        {"type": "redacted_thinking", "data": "zzz"},
                        {"type": "text", "text": "calling"},
                        {"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "/x"}},
                        {"type": "tool_use", "id": "t2", "name": "Bash", "input": {"command": "ls"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "file body"}],
                        },
                        {"type": "tool_result", "tool_use_id": "t2", "content": "a\nb", "is_error": True},
                        {"type": "text", "text": "<system-reminder>keep going</system-reminder>"},
                    ],
                },
            ],
        }
    )
    msgs = req.conversation.messages
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert msgs[1].content == "look\n[image]"
    assert (msgs[2].reasoning, msgs[2].content) == ("hmm", "calling")
    assert [c.id for c in msgs[2].tool_calls] == ["t1", "t2"]
    assert [(m.tool_call_id, m.content) for m in msgs[3:5]] == [("t1", "file body"), ("t2", "a\nb")]
    assert msgs[5].content == "<system-reminder>keep going</system-reminder>"
    assert req.assistant_refs == [None, None, "polar:v1:aaa", None, None, None]
    assert "skipped_block:redacted_thinking" in req.flags
    assert req.requested_sampling == {"temperature": 0.3, "top_p": 0.8}


@pytest.mark.parametrize(
    "body, needle",
    [
        (None, "must be a JSON object"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
        (
            {"model": "m", "messages": [{"role": "system", "content": [{"type": "image"}]}]},
            "messages.0.content.0",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
            "messages.0.content.0.tool_use_id",
        ),
        ({"model": "m", "messages": [{"role": "user", "content": [{"type": "sparkle"}]}]}, "'sparkle'"),
        (
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}]}
                ],
            },
            "belong in assistant",
        ),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "system": 5}, "system"),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"description": "no name"}],
            },
            "tools.0.name",
        ),
    ],
)
def test_malformed_bodies_are_400_naming_the_problem(body, needle):
    with pytest.raises(WireError) as err:
        anthropic_messages.decode(body)
    assert err.value.status == 400 and needle in err.value.message


def test_mid_conversation_system_message_is_kept_in_place():
    req = anthropic_messages.decode(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "system", "content": [{"type": "text", "text": "now be terse"}]},
                {"role": "user", "content": "again"},
            ],
        }
    )
    assert [(m.role, m.content) for m in req.conversation.messages] == [
        ("user", "hi"),
        ("assistant", "hello"),
        ("system", "now be terse"),
        ("user", "again"),
    ]


def test_count_tokens_body_decodes_without_stream():
    body = {k: v for k, v in fixture("claude-bare.req2")["body"].items() if k not in ("max_tokens", "stream")}
    req = anthropic_messages.decode_count_tokens({**body, "stream": True})
    assert not req.stream and len(req.conversation.messages) == 2 and len(req.conversation.tools) == 3
    assert on_wire(anthropic_messages.encode_count(42)) == {"input_tokens": 42}


def test_encode_response_shapes_and_stop_reasons():
    req = anthropic_messages.decode(fixture("claude-bare.req2")["body"])
    body = on_wire(anthropic_messages.encode_response(tool_turn(), req))
    assert body["id"] == "msg_c0ffee0002" and body["type"] == "message" and body["role"] == "assistant"
    assert body["model"] == "my-policy-model" and body["stop_reason"] == "tool_use"
    assert [b["type"] for b in body["content"]] == ["thinking", "text", "tool_use", "tool_use"]
    assert body["content"][0]["signature"] == "polar:v1:c0ffee0002"
    assert body["content"][2]["input"] == {"command": "ls -la"}
    assert body["usage"]["input_tokens"] == 30 and body["usage"]["output_tokens"] == 20
    assert body["usage"]["cache_creation_input_tokens"] == body["usage"]["cache_read_input_tokens"] == 0
    assert body["stop_sequence"] is None
    assert on_wire(anthropic_messages.encode_response(text_turn(), req))["stop_reason"] == "end_turn"
    long = on_wire(anthropic_messages.encode_response(text_turn(finish_reason="length"), req))
    assert long["stop_reason"] == "max_tokens"


def test_stream_text_turn_event_sequence():
    req = anthropic_messages.decode(fixture("claude.req2")["body"])
    events = parse_sse(anthropic_messages.encode_stream(text_turn(), req))
    assert [n for n, _ in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(name == data["type"] for name, data in events)
    assert events[0][1]["message"]["content"] == [] and events[0][1]["message"]["stop_reason"] is None
    assert events[3][1]["delta"] == {"type": "text_delta", "text": "All done."}
    assert events[5][1]["delta"]["stop_reason"] == "end_turn" and events[5][1]["usage"]["output_tokens"] == 4


def test_stream_tool_turn_event_sequence():
    req = anthropic_messages.decode(fixture("claude-bare.req2")["body"])
    events = parse_sse(anthropic_messages.encode_stream(tool_turn(), req))
    block = ["content_block_start", "content_block_delta", "content_block_stop"]
    assert [n for n, _ in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        *block,
        *block,
        *block,
        "message_delta",
        "message_stop",
    ]
    deltas = [d["delta"]["type"] for n, d in events if n == "content_block_delta"]
    assert deltas == [
        "thinking_delta",
        "signature_delta",
        "text_delta",
        "input_json_delta",
        "input_json_delta",
    ]
    assert [d["index"] for n, d in events if n == "content_block_start"] == [0, 1, 2, 3]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def _reassemble(events):
    """How Claude Code rebuilds the assistant message from the stream."""
    blocks, partial = [], {}
    for name, data in events:
        if name == "content_block_start":
            blocks.append(dict(data["content_block"]))
            partial[data["index"]] = ""
        elif name == "content_block_delta":
            delta, block = data["delta"], blocks[data["index"]]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            elif delta["type"] == "input_json_delta":
                partial[data["index"]] += delta["partial_json"]
        elif name == "content_block_stop" and blocks[data["index"]]["type"] == "tool_use":
            blocks[data["index"]]["input"] = json.loads(partial[data["index"]] or "{}")
    return blocks


@pytest.mark.parametrize("stream", [False, True])
def test_round_trip_tool_turn_then_follow_up(stream):
    first = fixture("claude-bare.req2")["body"]
    req = anthropic_messages.decode(first)
    turn = tool_turn()
    if stream:
        blocks = _reassemble(parse_sse(anthropic_messages.encode_stream(turn, req)))
    else:
        blocks = on_wire(anthropic_messages.encode_response(turn, req))["content"]
    assert blocks == on_wire(anthropic_messages.encode_response(turn, req))["content"]
    follow = copy.deepcopy(first)
    follow["messages"] += [
        {"role": "assistant", "content": blocks},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": b["id"], "content": "ok"}
                for b in blocks
                if b["type"] == "tool_use"
            ],
        },
    ]
    again = anthropic_messages.decode(follow)
    msgs = again.conversation.messages
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool", "tool"]
    assistant = msgs[2]
    assert (assistant.content, assistant.reasoning) == (turn.content, turn.reasoning)
    assert [(c.id, c.name, json.loads(c.arguments)) for c in assistant.tool_calls] == [
        (c.id, c.name, json.loads(c.arguments)) for c in turn.tool_calls
    ]
    assert assistant == turn.as_message()  # json.dumps of the parsed input gives the same text back
    assert call_id_from_ref(again.assistant_refs[2]) == turn.call_id


def test_custom_tool_text_is_wrapped_as_an_input_object():
    from polar_env.chat.messages import ToolCall

    assert anthropic_messages.tool_input(
        ToolCall(id="a", name="p", arguments="*** Begin", kind="custom")
    ) == {"input": "*** Begin"}
    assert anthropic_messages.tool_input(ToolCall(id="a", name="p", arguments='{"x": 1}')) == {"x": 1}


def test_error_body_shape():
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    assert on_wire(anthropic_messages.encode_error(400, "bad")) == body
    assert on_wire(anthropic_messages.encode_error(529, "busy"))["error"]["type"] == "overloaded_error"
    assert on_wire(anthropic_messages.encode_error(502, "down"))["error"]["type"] == "api_error"
    assert on_wire(anthropic_messages.encode_error(401, "who"))["error"]["type"] == "authentication_error"
    assert parse_sse(
        [anthropic_messages.encode_stream_error(anthropic_messages.encode_error(400, "bad"))]
    ) == [("error", body)]
