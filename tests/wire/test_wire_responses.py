"""Responses codec: Codex's and Pi's captured requests decode; answers stream the events Codex needs."""

from __future__ import annotations

import copy
import json

import pytest
from wire_helpers import fixture, on_wire, parse_sse, text_turn, tool_turn

from polar_env.chat.messages import AssistantTurn, TokenLogprob, ToolCall
from polar_env.proxy.codecs import openai_responses
from polar_env.proxy.codecs.common import WireError
from polar_env.wire.ids import call_id_from_ref

MULTI_AGENT = ["close_agent", "resume_agent", "send_input", "spawn_agent", "wait_agent"]


def test_codex_first_request_decodes_developer_messages_and_namespace_tools():
    req = openai_responses.decode(fixture("codex.req1")["body"])
    msgs = req.conversation.messages
    assert [m.role for m in msgs] == ["system", "system", "user", "user"]
    assert msgs[0].content.startswith("You are a coding agent running in the Codex CLI")
    assert msgs[3].content == "Create out.txt"
    names = [t.name for t in req.conversation.tools]
    assert names[:4] == ["exec_command", "write_stdin", "request_user_input", "view_image"]
    assert [n for n in names if n.startswith("multi_agent_v1")] == [
        f"multi_agent_v1__{n}" for n in MULTI_AGENT
    ]
    assert req.tool_routes["multi_agent_v1__spawn_agent"].model_dump() == {
        "name": "spawn_agent",
        "namespace": "multi_agent_v1",
    }
    spawn = next(t for t in req.conversation.tools if t.name == "multi_agent_v1__spawn_agent")
    assert spawn.parameters["type"] == "object"
    assert "skipped_tool:web_search" in req.flags and len(names) == 12
    assert req.stream and req.requested_sampling == {}


def test_codex_gpt55_has_the_freeform_apply_patch_tool():
    req = openai_responses.decode(fixture("codex-gpt55.req1")["body"])
    patch = next(t for t in req.conversation.tools if t.name == "apply_patch")
    assert patch.kind == "custom"
    assert "FREEFORM" in patch.description and "begin_patch" in patch.description  # the lark grammar is kept
    assert "skipped_tool:tool_search" in req.flags


@pytest.mark.parametrize("name", ["codex.req2", "codex-gpt55.req2", "pi-responses.req2"])
def test_second_requests_carry_the_function_call_round(name):
    captured = fixture(name)["body"]
    call_item = next(i for i in captured["input"] if i.get("type") == "function_call")
    req = openai_responses.decode(captured)
    roles = [m.role for m in req.conversation.messages]
    assert roles[-2:] == ["assistant", "tool"] and roles.count("assistant") == 1
    assistant, result = req.conversation.messages[-2:]
    [call] = assistant.tool_calls
    assert (call.id, call.name, call.arguments) == (
        call_item["call_id"],
        call_item["name"],
        call_item["arguments"],
    )
    assert result.tool_call_id == call_item["call_id"]
    assert req.assistant_refs[-2] == call_item["id"]  # the function_call item id the server issued


def test_pi_responses_plain_role_items_and_max_output_tokens():
    req = openai_responses.decode(fixture("pi-responses.req1")["body"])
    assert [m.role for m in req.conversation.messages] == ["system", "user"]
    assert req.requested_sampling == {"max_tokens": 16384}
    assert [t.name for t in req.conversation.tools] == ["read", "bash", "edit", "write"]


def test_previous_response_id_is_refused():
    body = {**fixture("pi-responses.req1")["body"], "previous_response_id": "resp_123"}
    with pytest.raises(WireError) as err:
        openai_responses.decode(body)
    assert err.value.status == 400
    assert err.value.message == (
        "previous_response_id is not supported: this proxy is stateless; send the full input (store=false)"
    )


@pytest.mark.parametrize(
    "body, needle",
    [
        ("hello", "must be a JSON object"),
        ({"input": "hi"}, "model"),
        ({"model": "m"}, "input"),
        ({"model": "m", "input": 5}, "input"),
        ({"model": "m", "input": []}, "input is empty"),
        (
            {"model": "m", "input": [{"type": "function_call", "name": "x", "arguments": "{}"}]},
            "input.0.call_id",
        ),
        ({"model": "m", "input": [{"type": "message", "role": "robot", "content": "x"}]}, "input.0.role"),
        ({"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]}, "stateless"),
        ({"model": "m", "input": [{"type": "hologram"}]}, "unsupported item type 'hologram'"),
        ({"model": "m", "input": "x", "tools": [{"type": "function"}]}, "needs a name"),
        (
            {
                "model": "m",
                "input": "x",
                "tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "web_search"}]}],
            },
            "namespace ns member",
        ),
    ],
)
def test_malformed_bodies_are_400_naming_the_problem(body, needle):
    with pytest.raises(WireError) as err:
        openai_responses.decode(body)
    assert err.value.status == 400 and needle in err.value.message


def test_instructions_string_input_and_harmless_items():
    req = openai_responses.decode(
        {"model": "m", "instructions": "be brief", "input": "hello", "temperature": 0.5, "top_p": 1.0}
    )
    assert [(m.role, m.content) for m in req.conversation.messages] == [
        ("system", "be brief"),
        ("user", "hello"),
    ]
    assert req.requested_sampling == {"temperature": 0.5, "top_p": 1.0}
    req = openai_responses.decode(
        {
            "model": "m",
            "input": [
                {"type": "message", "role": "user", "content": "search"},
                {"type": "web_search_call", "id": "ws_1", "status": "completed"},
            ],
        }
    )
    assert len(req.conversation.messages) == 1 and "skipped_item:web_search_call" in req.flags


def test_consecutive_assistant_items_merge_into_one_message():
    req = openai_responses.decode(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "go"},
                {
                    "type": "reasoning",
                    "id": "rs_x",
                    "summary": [{"type": "summary_text", "text": "plan"}],
                    "encrypted_content": "polar:v1:call1",
                },
                {
                    "type": "message",
                    "id": "msg_call1",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "ok"}],
                },
                {
                    "type": "function_call",
                    "id": "fc_call1_0",
                    "call_id": "c0",
                    "name": "spawn_agent",
                    "namespace": "multi_agent_v1",
                    "arguments": "{}",
                },
                {
                    "type": "custom_tool_call",
                    "id": "ctc_call1_1",
                    "call_id": "c1",
                    "name": "apply_patch",
                    "input": "*** Begin",
                },
                {
                    "type": "function_call_output",
                    "call_id": "c0",
                    "output": [{"type": "input_text", "text": "spawned"}],
                },
                {"type": "custom_tool_call_output", "call_id": "c1", "output": "patched"},
                {"type": "reasoning", "summary": [], "encrypted_content": "polar:v1:call2"},
                {
                    "type": "message",
                    "id": "msg_call2",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "done"}],
                },
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
            ],
        }
    )
    msgs = req.conversation.messages
    assert [m.role for m in msgs] == ["user", "assistant", "tool", "tool", "assistant", "user"]
    first = msgs[1]
    assert (first.content, first.reasoning) == ("ok", "plan")
    assert [(c.id, c.name, c.kind) for c in first.tool_calls] == [
        ("c0", "multi_agent_v1__spawn_agent", "function"),
        ("c1", "apply_patch", "custom"),
    ]
    assert first.tool_calls[1].arguments == "*** Begin"
    assert msgs[2].content == "spawned" and msgs[3].tool_call_id == "c1"
    assert (msgs[4].content, msgs[4].reasoning) == ("done", "")
    assert req.assistant_refs == [None, "polar:v1:call1", None, None, "polar:v1:call2", None]


def test_assistant_items_of_different_calls_do_not_merge():
    req = openai_responses.decode(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "go"},
                {
                    "type": "message",
                    "id": "msg_aaa",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "one"}],
                },
                {
                    "type": "message",
                    "id": "msg_bbb",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "two"}],
                },
            ],
        }
    )
    assert [m.content for m in req.conversation.messages[1:]] == ["one", "two"]
    assert req.assistant_refs[1:] == ["msg_aaa", "msg_bbb"]


# -- encoding ----------------------------------------------------------------------------------
def _names(frames):
    events = parse_sse(frames)
    for name, data in events:
        assert name == data["type"]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    return [name for name, _ in events], events


def test_stream_text_turn_is_the_codex_sequence():
    req = openai_responses.decode(fixture("codex.req2")["body"])
    names, events = _names(openai_responses.encode_stream(text_turn(), req))
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[0][1]["response"]["status"] == "in_progress"
    done = events[-2][1]["item"]
    assert done["id"] == "msg_c0ffee0001" and done["content"][0]["text"] == "All done."
    final = events[-1][1]["response"]
    assert final["id"] == "resp_c0ffee0001" and final["status"] == "completed"
    assert final["output"] == [done]
    assert final["usage"]["input_tokens"] == 12 and final["usage"]["total_tokens"] == 16


def test_stream_tool_turn_with_reasoning():
    req = openai_responses.decode(fixture("pi-responses.req1")["body"])
    names, events = _names(openai_responses.encode_stream(tool_turn(), req))
    call_events = [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        *call_events,
        *call_events,
        "response.completed",
    ]
    items = [data["item"] for name, data in events if name == "response.output_item.done"]
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call", "function_call"]
    assert items[0]["encrypted_content"] == "polar:v1:c0ffee0002"
    assert items[0]["summary"] == [{"type": "summary_text", "text": "I should list files."}]
    assert [(i["call_id"], i["name"], i["arguments"]) for i in items[2:]] == [
        ("call_c0ffee_0", "bash", '{"command": "ls -la"}'),
        ("call_c0ffee_1", "read", '{"path": "README.md"}'),
    ]
    assert [data["output_index"] for name, data in events if name == "response.output_item.added"] == [
        0,
        1,
        2,
        3,
    ]
    assert events[-1][1]["response"]["output"] == items


def test_stream_without_reasoning_or_text_is_the_captured_tool_call_sequence():
    req = openai_responses.decode(fixture("codex.req1")["body"])
    turn = AssistantTurn(
        call_id="abc",
        tool_calls=[ToolCall(id="call_1", name="exec_command", arguments='{"cmd": "ls"}')],
        finish_reason="tool_calls",
    )
    names, _ = _names(openai_responses.encode_stream(turn, req))
    assert names == fixture("codex.req1")["sse_events"]


def test_namespaced_and_custom_calls_go_back_the_way_codex_routes_them():
    req = openai_responses.decode(fixture("codex.req1")["body"])
    gpt55 = openai_responses.decode(fixture("codex-gpt55.req1")["body"])
    turn = AssistantTurn(
        call_id="abc",
        finish_reason="tool_calls",
        tool_calls=[ToolCall(id="call_1", name="multi_agent_v1__spawn_agent", arguments='{"message": "hi"}')],
    )
    [item] = on_wire(openai_responses.encode_response(turn, req))["output"]
    assert (item["type"], item["name"], item["namespace"]) == (
        "function_call",
        "spawn_agent",
        "multi_agent_v1",
    )
    # the parser may not know the tool is free-form: the request's tool list decides
    patch = AssistantTurn(
        call_id="def",
        finish_reason="tool_calls",
        tool_calls=[ToolCall(id="call_2", name="apply_patch", arguments="*** Begin Patch\n*** End Patch\n")],
    )
    names, events = _names(openai_responses.encode_stream(patch, gpt55))
    assert (
        "response.custom_tool_call_input.delta" in names and "response.custom_tool_call_input.done" in names
    )
    item = events[-1][1]["response"]["output"][0]
    assert (item["type"], item["call_id"], item["input"]) == (
        "custom_tool_call",
        "call_2",
        "*** Begin Patch\n*** End Patch\n",
    )
    assert "namespace" not in on_wire(openai_responses.encode_response(tool_turn(), req))["output"][2]


def test_length_is_incomplete_but_still_completed_event():
    req = openai_responses.decode({"model": "m", "input": "hi", "stream": True})
    body = on_wire(openai_responses.encode_response(text_turn(finish_reason="length"), req))
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    names, events = _names(openai_responses.encode_stream(text_turn(finish_reason="length"), req))
    assert names[-1] == "response.completed" and events[-1][1]["response"]["status"] == "incomplete"
    assert on_wire(openai_responses.encode_response(text_turn(), req))["incomplete_details"] is None


@pytest.mark.parametrize("stream", [False, True])
def test_round_trip_tool_turn_then_follow_up(stream):
    first = fixture("codex.req1")["body"]
    req = openai_responses.decode(first)
    turn = tool_turn()
    if stream:
        items = [
            d["item"]
            for n, d in parse_sse(openai_responses.encode_stream(turn, req))
            if n == "response.output_item.done"
        ]
    else:
        items = on_wire(openai_responses.encode_response(turn, req))["output"]
    follow = copy.deepcopy(first)
    follow["input"] += items + [
        {"type": "function_call_output", "call_id": i["call_id"], "output": "ok"}
        for i in items
        if i["type"] == "function_call"
    ]
    again = openai_responses.decode(follow)
    msgs = again.conversation.messages
    assert [m.role for m in msgs[-3:]] == ["assistant", "tool", "tool"]
    assistant = msgs[-3]
    assert assistant == turn.as_message()
    assert [(c.id, c.name, json.loads(c.arguments)) for c in assistant.tool_calls] == [
        (c.id, c.name, json.loads(c.arguments)) for c in turn.tool_calls
    ]
    ref = again.assistant_refs[-3]
    assert ref == "polar:v1:c0ffee0002" and call_id_from_ref(ref) == turn.call_id


def test_round_trip_text_turn_ref_is_the_message_id():
    first = fixture("pi-responses.req1")["body"]
    req = openai_responses.decode(first)
    items = on_wire(openai_responses.encode_response(text_turn(), req))["output"]
    again = openai_responses.decode(
        {**first, "input": first["input"] + items + [{"role": "user", "content": "more"}]}
    )
    assert again.conversation.messages[-2] == text_turn().as_message()
    assert again.assistant_refs[-2] == "msg_c0ffee0001"


def test_error_body_shape():
    body = on_wire(openai_responses.encode_error(400, "bad input"))
    assert body == {
        "error": {"message": "bad input", "type": "invalid_request_error", "param": None, "code": None}
    }


def test_keys_sent_as_null_and_keys_left_out():
    """The SDKs' types need ``error``, ``incomplete_details`` and (in progress) ``usage`` present as null;
    a part without logprobs has no ``logprobs`` key, and the in-progress items have no text yet."""
    req = openai_responses.decode(fixture("codex.req2")["body"])
    body = on_wire(openai_responses.encode_response(text_turn(), req))
    assert list(body) == [
        "id",
        "object",
        "created_at",
        "status",
        "error",
        "incomplete_details",
        "model",
        "output",
        "parallel_tool_calls",
        "tool_choice",
        "tools",
        "usage",
    ]
    assert body["error"] is None and body["usage"]["output_tokens_details"] == {"reasoning_tokens": 0}
    assert body["output"][0]["content"] == [{"type": "output_text", "text": "All done.", "annotations": []}]
    events = [data for _, data in parse_sse(openai_responses.encode_stream(tool_turn(), req))]
    assert events[0]["response"]["usage"] is None and events[0]["response"]["output"] == []
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert [a.get("summary", a.get("content", a.get("arguments"))) for a in added] == [[], [], "", ""]
    assert [a.get("status") for a in added] == [None, "in_progress", "in_progress", "in_progress"]


def test_logprobs_ride_on_the_text_part_and_its_events():
    req = openai_responses.decode(fixture("codex.req2")["body"])
    logprobs = [TokenLogprob(token="All", logprob=-0.25, bytes=[65, 108, 108])]
    events = {
        name: data
        for name, data in parse_sse(openai_responses.encode_stream(text_turn(logprobs=logprobs), req))
    }
    wire = [{"token": "All", "logprob": -0.25, "bytes": [65, 108, 108], "top_logprobs": []}]
    assert (
        events["response.output_text.delta"]["logprobs"]
        == wire
        == events["response.output_text.done"]["logprobs"]
    )
    assert events["response.content_part.done"]["part"]["logprobs"] == wire
    assert events["response.completed"]["response"]["output"][0]["content"][0]["logprobs"] == wire
    plain = {name: data for name, data in parse_sse(openai_responses.encode_stream(text_turn(), req))}
    assert plain["response.output_text.done"]["logprobs"] == []


def test_keepalive_and_the_stream_error_event():
    assert openai_responses.KEEPALIVE == b'event: keepalive\ndata: {"type":"keepalive"}\n\n'
    [(name, event)] = parse_sse(
        [openai_responses.encode_stream_error(openai_responses.encode_error(500, "gone"))]
    )
    assert name == event["type"] == "error"  # OpenAI's ResponseErrorEvent; the kind goes in code
    assert (event["message"], event["param"], event["code"], event["sequence_number"]) == (
        "gone",
        None,
        "server_error",
        0,
    )
    [(_, event)] = parse_sse([openai_responses.encode_stream_error(openai_responses.encode_overflow(9, 8))])
    assert (event["param"], event["code"]) == ("input", "context_length_exceeded")
