"""Gemini API codec: Gemini CLI's captured requests decode; answers come back as the genai SDK reads
them (SSE ``data:`` events, or one JSON array without ``alt=sse``); through the real proxy the key
is ``x-goog-api-key`` or ``?key=``, and every refusal is in Google's error shape."""

from __future__ import annotations

import base64
import copy
import json

import aiohttp
import pytest
from proxy_client import ledger_calls, running_proxy
from wire_helpers import fixture, on_wire, text_turn, tool_turn

from polar_env.chat.messages import TokenLogprob
from polar_env.proxy.codecs import gemini_generate_content as gemini
from polar_env.proxy.codecs.common import WireError
from polar_env.wire.ids import call_id_from_ref

STREAM = "/v1beta/models/polar-model:streamGenerateContent?alt=sse"


def sse_chunks(raw: bytes) -> list[dict]:
    """The genai SDKs' reading of an SSE answer: ``data:`` events, blank keep-alive lines skipped."""
    text = raw.decode()
    assert text.endswith("\r\n\r\n"), text[-50:]
    return [json.loads(event.strip()[len("data: ") :]) for event in text.split("\r\n\r\n") if event.strip()]


def test_gemini_cli_first_request_decodes():
    req = gemini.decode(fixture("gemini.req1")["body"], "polar-model", stream=True)
    system, user = req.conversation.messages
    assert system.role == "system" and system.content.startswith("You are Gemini CLI")
    assert user.role == "user" and user.content.endswith("\nCreate out.txt containing hi")
    assert "<session_context>" in user.content  # its two text parts joined
    names = [t.name for t in req.conversation.tools]
    assert {"run_shell_command", "replace", "write_file", "read_file"} <= set(names)
    shell = req.conversation.tools[names.index("run_shell_command")]
    assert "command" in shell.parameters["properties"]  # parametersJsonSchema is the schema
    assert req.stream and req.model == "polar-model"
    assert req.requested_sampling == {"temperature": 1, "top_p": 0.95, "top_k": 64}  # recorded; never applied
    assert req.flags == ["unenforced:topK", "stripped:gemini-todays-date"]
    assert "Today's date" not in user.content


def test_a_different_date_decodes_to_the_same_conversation():
    """Gemini CLI writes the date in the user's locale into its first user message (adapter rule)."""
    body = fixture("gemini.req1")["body"]
    shifted = json.loads(json.dumps(body).replace("Monday, November 30, 2026", "Thursday, February 3, 2031"))
    assert shifted != body
    assert gemini.decode(body).conversation == gemini.decode(shifted).conversation


def test_gemini_cli_tool_round_becomes_a_tool_message_with_the_issued_ids():
    req = gemini.decode(fixture("gemini.req2")["body"], "polar-model", stream=True)
    assert [m.role for m in req.conversation.messages] == ["system", "user", "assistant", "tool"]
    assistant, result = req.conversation.messages[2:]
    [call] = assistant.tool_calls
    assert call.name == "run_shell_command" and json.loads(call.arguments) == {"command": "echo hi > out.txt"}
    assert call.id.startswith("call_") and result.tool_call_id == call.id  # ours, echoed by the CLI
    assert result.content.startswith("<untrusted_context>\nOutput: (empty)")  # {"output": text} is the text
    assert call_id_from_ref(req.assistant_refs[2])[:12] == call.id[5:17]  # the signature names the call


def test_parts_map_in_order_and_snake_case_is_accepted():
    req = gemini.decode(
        {
            "system_instruction": {"parts": [{"text": "be brief"}]},
            "contents": [
                {
                    "role": "user",
                    "parts": [{"text": "look"}, {"inline_data": {"mime_type": "image/png", "data": "xx"}}],
                },
                {
                    "role": "model",
                    "parts": [
                        {"text": "hmm", "thought": True},
                        {"text": "calling"},
                        {"functionCall": {"name": "read", "args": {"path": "/x"}}},
                        {"functionCall": {"name": "bash", "args": {"command": "ls"}}},
                    ],
                },
                {
                    "role": "user",
                    "parts": [
                        {"functionResponse": {"name": "bash", "response": {"output": "a\nb"}}},
                        {"functionResponse": {"name": "read", "response": {"error": "no"}}},
                        {"text": "go on"},
                    ],
                },
            ],
            "tools": [
                {
                    "functionDeclarations": [
                        {"name": "read", "parameters": {"type": "OBJECT"}},
                        {"name": "bash"},
                    ]
                },
                {"googleSearch": {}},
            ],
            "generationConfig": {"temperature": 0.3, "max_output_tokens": 99, "stopSequences": ["END"]},
        }
    )
    msgs = req.conversation.messages
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool", "tool", "user"]
    assert (msgs[0].content, msgs[1].content) == ("be brief", "look\n[image]")
    assert (msgs[2].reasoning, msgs[2].content) == ("hmm", "calling")
    read_id, bash_id = (c.id for c in msgs[2].tool_calls)
    # id-less results answer the pending call of the same name, whatever their order
    assert [(m.tool_call_id, m.content) for m in msgs[3:5]] == [
        (bash_id, "a\nb"),
        (read_id, '{"error": "no"}'),
    ]
    assert [t.name for t in req.conversation.tools] == ["read", "bash"]
    assert "skipped_tool:googleSearch" in req.flags and "placeholder:image" in req.flags
    assert req.requested_sampling == {"temperature": 0.3, "max_tokens": 99} and req.stop == ["END"]


@pytest.mark.parametrize(
    "config, mode, name",
    [
        ({"mode": "NONE"}, "auto", None),  # the tools are hidden
        ({"mode": "ANY"}, "required", None),
        ({"mode": "ANY", "allowedFunctionNames": ["bash"]}, "function", "bash"),
        ({"mode": "AUTO"}, "auto", None),
    ],
)
def test_function_calling_config_maps_to_tool_choice(config, mode, name):
    body = {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "tools": [{"functionDeclarations": [{"name": "bash"}, {"name": "read"}]}],
        "toolConfig": {"functionCallingConfig": config},
    }
    req = gemini.decode(body)
    assert (req.tool_choice.mode, req.tool_choice.name) == (mode, name)
    assert bool(req.conversation.tools) == (config["mode"] != "NONE")


@pytest.mark.parametrize(
    "body, needle",
    [
        (None, "must be a JSON object"),
        ({}, "contents"),
        ({"contents": []}, "contents"),
        ({"contents": [{"role": "robot", "parts": [{"text": "x"}]}]}, "contents.0.role"),
        ({"contents": [{"role": "user", "parts": []}]}, "contents.0.parts must not be empty"),
        (
            {"contents": [{"role": "user", "parts": [{"functionCall": {"name": "x"}}]}]},
            "belong in model turns",
        ),
        (
            {"contents": [{"role": "model", "parts": [{"functionResponse": {"name": "x"}}]}]},
            "belong in user turns",
        ),
        (
            {"contents": [{"role": "user", "parts": [{"functionResponse": {"response": {}}}]}]},
            "contents.0.parts.0.functionResponse.name",
        ),
        ({"contents": [{"role": "user", "parts": [{}]}]}, "contents.0.parts.0: a part here needs text"),
        (
            {
                "contents": [{"parts": [{"text": "x"}]}],
                "tools": [{"functionDeclarations": [{"description": "no name"}]}],
            },
            "tools.0.functionDeclarations.0.name",
        ),
        (
            {"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"candidateCount": 2}},
            "candidateCount",
        ),
        ({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"topP": 0}}, "top_p"),
        (
            {"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"maxOutputTokens": 0}},
            "max_tokens",
        ),
        ({"contents": [{"parts": [{"text": "x"}]}], "cachedContent": "cachedContents/1"}, "cachedContent"),
        (
            {
                "contents": [{"parts": [{"text": "x"}]}],
                "toolConfig": {"functionCallingConfig": {"mode": "ANY"}},
            },
            "needs tools",
        ),
    ],
)
def test_malformed_bodies_are_400_naming_the_problem(body, needle):
    with pytest.raises(WireError) as err:
        gemini.decode(body)
    assert err.value.status == 400 and needle in err.value.message, err.value.message


def test_unknown_method_is_a_404():
    assert gemini.parse_target("gemini-x:streamGenerateContent") == ("gemini-x", "streamGenerateContent")
    for target in ("gemini-x", "gemini-x:embedContent", ":generateContent"):
        with pytest.raises(WireError) as err:
            gemini.parse_target(target)
        assert err.value.status == 404


def test_encode_response_shapes_and_finish_reasons():
    req = gemini.decode(fixture("gemini.req1")["body"], "polar-model")
    body = on_wire(gemini.encode_response(tool_turn(), req))
    [candidate] = body["candidates"]
    parts = candidate["content"]["parts"]
    assert candidate["content"]["role"] == "model" and candidate["finishReason"] == "STOP"
    assert parts[0] == {"text": "I should list files.", "thought": True}
    assert parts[1] == {
        "text": "Let me look.",
        "thoughtSignature": base64.b64encode(b"polar:v1:c0ffee0002").decode(),
    }
    assert parts[2]["functionCall"] == {"id": "call_c0ffee_0", "name": "bash", "args": {"command": "ls -la"}}
    assert body["usageMetadata"] == {
        "promptTokenCount": 30,
        "candidatesTokenCount": 20,
        "totalTokenCount": 50,
    }
    assert body["modelVersion"] == "polar-model" and body["responseId"] == "c0ffee0002"
    assert (
        on_wire(gemini.encode_response(text_turn(finish_reason="length"), req))["candidates"][0][
            "finishReason"
        ]
        == "MAX_TOKENS"
    )


def test_stream_sends_reasoning_then_the_answer_with_finish_and_usage():
    req = gemini.decode(fixture("gemini.req1")["body"], "polar-model", stream=True)
    frames = gemini.encode_stream(tool_turn(), req)
    assert all(f.startswith(b"data: ") and f.endswith(b"\r\n\r\n") for f in frames)
    first, last = sse_chunks(b"".join(frames))
    assert first["candidates"][0]["content"]["parts"] == [{"text": "I should list files.", "thought": True}]
    assert "finishReason" not in first["candidates"][0] and "usageMetadata" not in first
    assert (
        last["candidates"][0]["finishReason"] == "STOP"
        and last["usageMetadata"]["candidatesTokenCount"] == 20
    )
    text_only = sse_chunks(b"".join(gemini.encode_stream(text_turn(), req)))
    assert len(text_only) == 1 and text_only[0]["candidates"][0]["content"]["parts"][0]["text"] == "All done."


@pytest.mark.parametrize("stream", [False, True])
def test_round_trip_tool_turn_then_follow_up(stream):
    first = fixture("gemini.req1")["body"]
    req = gemini.decode(first, "polar-model", stream=stream)
    turn = tool_turn()
    if stream:  # how Gemini CLI keeps a streamed turn: the parts of every chunk, in order
        parts = [
            p
            for frame in gemini.encode_stream(turn, req)
            for c in sse_chunks(frame)
            for p in c["candidates"][0]["content"]["parts"]
        ]
    else:
        parts = on_wire(gemini.encode_response(turn, req))["candidates"][0]["content"]["parts"]
    follow = copy.deepcopy(first)
    results = [
        {
            "functionResponse": {
                "id": p["functionCall"]["id"],
                "name": p["functionCall"]["name"],
                "response": {"output": "ok"},
            }
        }
        for p in parts
        if "functionCall" in p
    ]
    follow["contents"] += [{"role": "model", "parts": parts}, {"role": "user", "parts": results}]
    again = gemini.decode(follow, "polar-model")
    msgs = again.conversation.messages
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool", "tool"]
    assert msgs[2] == turn.as_message()  # json.dumps of the sent args gives the same text back
    assert call_id_from_ref(again.assistant_refs[2]) == turn.call_id
    assert [m.tool_call_id for m in msgs[3:]] == [tc.id for tc in turn.tool_calls]


def test_error_bodies_are_googles_shape():
    assert on_wire(gemini.encode_error(400, "bad")) == {
        "error": {"code": 400, "message": "bad", "status": "INVALID_ARGUMENT"}
    }
    assert on_wire(gemini.encode_error(401, "who"))["error"]["status"] == "UNAUTHENTICATED"
    assert on_wire(gemini.encode_error(429, "slow"))["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert on_wire(gemini.encode_error(503, "down"))["error"]["status"] == "UNAVAILABLE"
    assert on_wire(gemini.encode_overflow(5000, 4096))["error"]["message"] == (
        "The input token count (5000) exceeds the maximum number of tokens allowed (4095)."
    )
    # after the stream started: the bare error object on one line, not a data: event
    line = gemini.encode_stream_error(gemini.encode_error(500, "boom"))
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {"error": {"code": 500, "message": "boom", "status": "INTERNAL"}}


def test_json_array_stream_and_count_tokens_bodies():
    """Without ``alt=sse`` the chunks come as one array; logprobs ride on the last chunk's candidate."""
    req = gemini.decode(fixture("gemini.req1")["body"], "polar-model", stream=True, sse=False)
    turn = tool_turn(
        logprobs=[
            TokenLogprob(token="a", logprob=-0.5, bytes=[97]),
            TokenLogprob(token="b", logprob=-1.5, bytes=[98]),
        ]
    )
    first, last = on_wire(gemini.encode_response(turn, req))
    assert first["candidates"][0] == {
        "content": {"role": "model", "parts": [{"text": "I should list files.", "thought": True}]},
        "index": 0,
    }
    assert "usageMetadata" not in first and last["usageMetadata"]["totalTokenCount"] == 50
    candidate = last["candidates"][0]
    assert candidate["avgLogprobs"] == -1.0 and candidate["logprobsResult"] == {
        "chosenCandidates": [{"token": "a", "logProbability": -0.5}, {"token": "b", "logProbability": -1.5}],
        "topCandidates": [],
    }
    assert on_wire(gemini.encode_count(42)) == {"totalTokens": 42}


async def test_gemini_cli_requests_through_the_proxy(renderer, scripted_backend_factory, tmp_path):
    """The two captured requests, replayed: one chain, the key in either place Gemini clients put it,
    every refusal in Google's shape, countTokens, and the JSON-array stream without ``alt=sse``."""

    def policy(session_id, call_number, prompt_text):
        if call_number == 0:
            assert "run_shell_command" in prompt_text
            return '<tool_call>\n{"name": "run_shell_command", "arguments": {"command": "ls"}}\n</tool_call>'
        return "All done."

    config = dict(max_context=65536, default_max_tokens=64)
    async with (
        running_proxy(renderer, scripted_backend_factory(policy), tmp_path, **config) as proxy,
        aiohttp.ClientSession() as http,
    ):
        sid, key = proxy.create_session("g")
        base = f"{proxy.base_url}/s/{sid}"
        first, second = fixture("gemini.req1")["body"], copy.deepcopy(fixture("gemini.req2")["body"])
        async with http.post(base + STREAM, json=first, headers={"x-goog-api-key": key}) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
            [chunk] = sse_chunks(await resp.read())
        parts = chunk["candidates"][0]["content"]["parts"]
        assert parts[0]["functionCall"]["name"] == "run_shell_command"
        # the CLI sends back what it got: the model turn as answered, then the result under that call's id
        second["contents"][-2]["parts"] = parts
        second["contents"][-1]["parts"][0]["functionResponse"]["id"] = parts[0]["functionCall"]["id"]
        async with http.post(base + STREAM.replace("?alt=sse", "?alt=sse&key=" + key), json=second) as resp:
            assert resp.status == 200
            [chunk] = sse_chunks(await resp.read())
        assert chunk["candidates"][0]["content"]["parts"][0]["text"] == "All done."
        small = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        async with http.post(
            base + "/v1beta/models/polar-model:streamGenerateContent",
            json=small,
            headers={"x-goog-api-key": key},
        ) as resp:  # no alt=sse: one JSON array
            [chunk] = await resp.json()
            assert resp.status == 200 and chunk["candidates"][0]["finishReason"] == "STOP"
        async with http.post(
            base + "/v1beta/models/polar-model:countTokens",
            json={"contents": first["contents"]},
            headers={"x-goog-api-key": key},
        ) as resp:
            assert resp.status == 200 and (await resp.json())["totalTokens"] > 100
        calls = await ledger_calls(http, proxy, sid)
        assert [(c["api"], c["parent_call_index"]) for c in calls] == [
            ("gemini", None),
            ("gemini", 0),
            ("gemini", None),
        ]
        refusals = [
            (base + STREAM, first, {"x-goog-api-key": "pk-wrong"}, 401, "UNAUTHENTICATED"),
            (base + STREAM, first, {}, 401, "UNAUTHENTICATED"),
            (
                base + "/v1beta/models/polar-model:embedContent",
                first,
                {"x-goog-api-key": key},
                404,
                "NOT_FOUND",
            ),
            (base + STREAM, {"contents": []}, {"x-goog-api-key": key}, 400, "INVALID_ARGUMENT"),
            (
                base + "/v1beta/models/polar-model:generateContent",
                b"{not json",
                {"x-goog-api-key": key},
                400,
                "INVALID_ARGUMENT",
            ),
        ]
        for url, body, headers, status, kind in refusals:
            data = body if isinstance(body, bytes) else json.dumps(body)
            async with http.post(url, data=data, headers=headers) as resp:
                error = (await resp.json())["error"]
                assert (resp.status, error["code"], error["status"]) == (status, status, kind), error
                assert error["message"]
        async with http.get(base + STREAM, headers={"x-goog-api-key": key}) as resp:
            assert resp.status == 405 and (await resp.json())["error"]["code"] == 405
