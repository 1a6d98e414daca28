"""Each wire API, streamed and not, round-trips a two-turn tool-using conversation token-exactly.

Real aiohttp server, real HTTP client, the real SmolLM2 tokenizer and model: the scripted policy
chooses the text, the real model scores it, so the ids and logprobs are real.
"""

from __future__ import annotations

import copy
import json

import aiohttp
import pytest
from proxy_client import WEATHER_TOOL, ledger_calls, post, running_proxy

TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
FINAL = "It is sunny in Paris."


def weather_policy(session_id, call_number, prompt_text):
    return TOOL_CALL if call_number == 0 else FINAL


# -- how each harness builds its next request from the answer it got ----------------------------
def chat_first(stream):
    return {
        "model": "m",
        "stream": stream,
        "stream_options": {"include_usage": True} if stream else None,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the weather in Paris?"},
        ],
        "tools": [{"type": "function", "function": WEATHER_TOOL}],
    }


def chat_answer(reply, stream):
    if not stream:
        return reply["choices"][0]["message"]
    message = {"role": "assistant", "content": "", "tool_calls": []}
    for _, chunk in reply:
        if chunk == "[DONE]" or not chunk["choices"]:
            continue
        delta = chunk["choices"][0]["delta"]
        message["content"] += delta.get("content") or ""
        for tc in delta.get("tool_calls") or []:
            while len(message["tool_calls"]) <= tc["index"]:
                message["tool_calls"].append(
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
            slot = message["tool_calls"][tc["index"]]
            slot["id"] = tc.get("id") or slot["id"]
            fn = tc.get("function") or {}
            slot["function"]["name"] += fn.get("name") or ""
            slot["function"]["arguments"] += fn.get("arguments") or ""
    return message


def chat_next(first, answer):
    body = copy.deepcopy(first)
    body["messages"] += [
        answer,
        {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": "sunny, 21 C"},
    ]
    return body


def responses_first(stream):
    return {
        "model": "m",
        "stream": stream,
        "store": False,
        "instructions": "You are a helpful assistant.",
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "What is the weather in Paris?"}],
            }
        ],
        "tools": [{"type": "function", **WEATHER_TOOL}],
    }


def responses_answer(reply, stream):
    if not stream:
        return reply["output"]
    return [data["item"] for name, data in reply if name == "response.output_item.done"]


def responses_next(first, items):
    body = copy.deepcopy(first)
    call = next(i for i in items if i["type"] == "function_call")
    body["input"] += items + [
        {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny, 21 C"}
    ]
    return body


def messages_first(stream):
    return {
        "model": "m",
        "stream": stream,
        "max_tokens": 64,
        "system": "You are a helpful assistant.",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [
            {
                "name": WEATHER_TOOL["name"],
                "description": WEATHER_TOOL["description"],
                "input_schema": WEATHER_TOOL["parameters"],
            }
        ],
    }


def messages_answer(reply, stream):
    if not stream:
        return reply["content"]
    blocks, partial = [], {}
    for name, data in reply:
        if name == "content_block_start":
            blocks.append(dict(data["content_block"]))
            partial[data["index"]] = ""
        elif name == "content_block_delta":
            delta, block = data["delta"], blocks[data["index"]]
            if delta["type"] == "text_delta":
                block["text"] = block.get("text", "") + delta["text"]
            elif delta["type"] == "input_json_delta":
                partial[data["index"]] += delta["partial_json"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
        elif name == "content_block_stop" and blocks[data["index"]]["type"] == "tool_use":
            blocks[data["index"]]["input"] = json.loads(partial[data["index"]] or "{}")
    return blocks


def messages_next(first, blocks):
    body = copy.deepcopy(first)
    use = next(b for b in blocks if b["type"] == "tool_use")
    body["messages"] += [
        {"role": "assistant", "content": blocks},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "sunny, 21 C"}],
        },
    ]
    return body


APIS = {
    "chat": ("/v1/chat/completions", chat_first, chat_answer, chat_next, "openai"),
    "responses": ("/v1/responses", responses_first, responses_answer, responses_next, "openai"),
    "messages": ("/v1/messages", messages_first, messages_answer, messages_next, "anthropic"),
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("api", list(APIS))
async def test_two_turn_tool_conversation_is_token_exact(
    api, stream, renderer, scripted_backend_factory, tmp_path
):
    route, first, answer_of, next_of, family = APIS[api]
    backend = scripted_backend_factory(weather_policy)
    async with running_proxy(renderer, backend, tmp_path) as proxy, aiohttp.ClientSession() as http:
        sid, key = proxy.create_session("s1")
        base = proxy.base_url + f"/s/{sid}"
        body1 = first(stream)
        status, reply1 = await post(
            http, base + route, body1, key, "bearer" if family == "openai" else "x-api-key"
        )
        assert status == 200, reply1
        answer = answer_of(reply1, stream)
        status, reply2 = await post(
            http, base + route, next_of(body1, answer), key, "bearer" if family == "openai" else "x-api-key"
        )
        assert status == 200, reply2
        calls = await ledger_calls(http, proxy, sid)

    assert len(calls) == 2
    c0, c1 = calls
    assert c0["output"]["tool_calls"][0]["name"] == "get_weather"
    assert json.loads(c0["output"]["tool_calls"][0]["arguments"]) == {"city": "Paris"}
    exact = c0["prompt_ids"] + c0["sampled_ids"]
    assert c1["prompt_ids"][: len(exact)] == exact
    assert c1["parent_call_index"] == 0 and c1["break_reason"] is None
    assert len(c1["prompt_ids"]) > len(exact)  # the tool result and next header were appended
    assert c1["output"]["content"].strip() == FINAL
    for call in calls:
        assert len(call["logprobs"]) == len(call["sampled_ids"]) > 0
        assert all(lp <= 0.0 for lp in call["logprobs"])


async def test_a_tool_call_id_sent_back_in_another_charset_still_names_its_call(
    renderer, scripted_backend_factory, tmp_path
):
    """OpenClaw sends the issued ``call_<id>_0`` back as ``call<id>0`` (its providers' charset); the
    call it answers is still found, so the episode stays one chain."""
    async with (
        running_proxy(renderer, scripted_backend_factory(weather_policy), tmp_path) as proxy,
        aiohttp.ClientSession() as http,
    ):
        sid, key = proxy.create_session("s1")
        url = proxy.base_url + f"/s/{sid}/v1/chat/completions"
        body1 = chat_first(True)
        status, reply1 = await post(http, url, body1, key, "bearer")
        answer = chat_answer(reply1, True)
        issued = answer["tool_calls"][0]["id"]
        answer["tool_calls"][0]["id"] = "".join(ch for ch in issued if ch.isalnum())
        status, reply2 = await post(http, url, chat_next(body1, answer), key, "bearer")
        assert status == 200, reply2
        calls = await ledger_calls(http, proxy, sid)
    assert "_" in issued and answer["tool_calls"][0]["id"] != issued
    assert calls[1]["parent_call_index"] == 0 and calls[1]["break_reason"] is None
