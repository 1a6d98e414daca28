"""Request features each API's provider honours: stop sequences, tool_choice, n, logprobs,
structured output, Anthropic prefill. Each is honoured as the provider does it, refused with a 400
in the API's shape, or accepted and flagged on the record (docs/proxy.md has the table).

A request is sent as a client sends it; the test checks the status, the answer, the record, and
the prompt ids decoded against the text the provider's model would see.
"""

from __future__ import annotations

import aiohttp
import pytest
from proxy_client import WEATHER_TOOL, ledger_calls, post, running_proxy

from polar_env.chat.messages import Message

SAID = {  # session id -> what the scripted policy answers there (the real model scores it)
    "stop": "Line one.\nEND\nnever shown",
    "forced": '{"city": "Paris"}}\n</tool_call>',
    "required": '{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
    "prefill": ' 1, "b": 2}',
}
USER = {"role": "user", "content": "What is the weather in Paris?"}
CHAT_TOOLS = [{"type": "function", "function": WEATHER_TOOL}]
ANTHROPIC_TOOLS = [
    {
        "name": "get_weather",
        "description": WEATHER_TOOL["description"],
        "input_schema": WEATHER_TOOL["parameters"],
    }
]


def policy(session_id, call_number, prompt_text):
    return SAID.get((session_id or "").split("-")[0], "It is sunny.")


@pytest.fixture
async def proxy(renderer, scripted_backend_factory, tmp_path):
    async with running_proxy(
        renderer, scripted_backend_factory(policy, context_window=64), tmp_path
    ) as proxy:
        yield proxy


async def _session(proxy, name):
    sid, key = proxy.create_session(name)
    return f"{proxy.base_url}/s/{sid}/v1", sid, key


async def test_stop_sequences_cut_the_reply_and_the_chain_continues_the_recorded_ids(proxy, renderer):
    async with aiohttp.ClientSession() as http:
        base, sid, key = await _session(proxy, "stop-chat")
        first = {"model": "m", "messages": [USER], "stop": ["\nEND", "zzz"]}
        status, reply = await post(http, base + "/chat/completions", first, key)
        assert status == 200 and reply["choices"][0]["message"]["content"] == "Line one."
        assert reply["choices"][0]["finish_reason"] == "stop"
        # the harness sends back the text it got (without the stop string), then a new user turn
        second = {
            **first,
            "messages": [USER, reply["choices"][0]["message"], {"role": "user", "content": "go on"}],
        }
        status, _ = await post(http, base + "/chat/completions", second, key)
        assert status == 200
        c0, c1 = await ledger_calls(http, proxy, sid)

        base, asid, key = await _session(proxy, "stop-anthropic")
        body = {"model": "m", "max_tokens": 64, "messages": [USER], "stop_sequences": ["\nEND"]}
        status, reply = await post(http, base + "/messages", body, key)
        assert status == 200 and reply["content"] == [{"type": "text", "text": "Line one."}]
        assert (reply["stop_reason"], reply["stop_sequence"]) == ("stop_sequence", "\nEND")
        status, events = await post(http, base + "/messages", {**body, "stream": True}, key)
        delta = next(data for name, data in events if name == "message_delta")["delta"]
        assert delta == {"stop_reason": "stop_sequence", "stop_sequence": "\nEND"}
    # the record: cut ids (through the token that completed the stop string), their logprobs, why
    sampled_text = renderer.tokenizer.decode(c0["sampled_ids"])
    assert sampled_text.startswith("Line one.\nEND") and "never" not in sampled_text
    assert len(c0["logprobs"]) == len(c0["sampled_ids"])
    assert (c0["stop_sequence"], c0["finish_reason"], c0["requested_sampling"]["stop"]) == (
        "\nEND",
        "stop",
        ["\nEND", "zzz"],
    )
    # token-exact: the next prompt continues the recorded ids, closing the turn the model did not close
    assert c1["parent_call_index"] == 0
    glue = renderer.render_continuation(
        [Message(role="user", content="go on")], previous_ended_with_eos=False
    )
    assert c1["prompt_ids"] == c0["prompt_ids"] + c0["sampled_ids"] + glue


async def test_tool_choice_is_enforced_by_prefilling_the_call_or_hiding_the_tools(proxy, renderer):
    async with aiohttp.ClientSession() as http:
        base, sid, key = await _session(proxy, "forced")
        body = {
            "model": "m",
            "input": [USER],
            "tools": [{"type": "function", **WEATHER_TOOL}],
            "tool_choice": {"type": "function", "name": "get_weather"},
        }
        status, reply = await post(http, base + "/responses", body, key)
        assert status == 200
        [call] = [item for item in reply["output"] if item["type"] == "function_call"]
        assert (call["name"], call["arguments"]) == ("get_weather", '{"city": "Paris"}')

        base, rsid, key = await _session(proxy, "required")
        body = {"model": "m", "messages": [USER], "tools": CHAT_TOOLS, "tool_choice": "required"}
        status, reply = await post(http, base + "/chat/completions", body, key)
        assert status == 200 and reply["choices"][0]["finish_reason"] == "tool_calls"
        assert reply["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == '{"city": "Rome"}'

        base, nsid, key = await _session(proxy, "none")
        body = {
            "model": "m",
            "max_tokens": 32,
            "messages": [USER],
            "tools": ANTHROPIC_TOOLS,
            "tool_choice": {"type": "none"},
        }
        status, reply = await post(http, base + "/messages", body, key)
        assert status == 200 and reply["content"][0]["text"] == "It is sunny."

        for route, bad in (
            (
                "/chat/completions",
                {
                    "model": "m",
                    "messages": [USER],
                    "tools": CHAT_TOOLS,
                    "tool_choice": {"type": "function", "function": {"name": "nope"}},
                },
            ),
            (
                "/messages",
                {"model": "m", "max_tokens": 8, "messages": [USER], "tool_choice": {"type": "any"}},
            ),
        ):
            status, answer = await post(http, base + route, bad, key)
            assert status == 400 and "tool" in answer["error"]["message"], answer
        [forced] = await ledger_calls(http, proxy, sid)
        [required] = await ledger_calls(http, proxy, rsid)
        [hidden] = await ledger_calls(http, proxy, nsid)
    prompt = renderer.tokenizer.decode(forced["prompt_ids"])
    assert prompt.endswith('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": ')
    assert forced["prefill"] == '<tool_call>\n{"name": "get_weather", "arguments": '
    assert "tool_choice:function=get_weather(prefilled)" in forced["flags"]
    assert renderer.tokenizer.decode(required["prompt_ids"]).endswith("<|im_start|>assistant\n<tool_call>\n")
    assert "tool_choice:required(prefilled)" in required["flags"]
    assert hidden["tools"] == [] and "get_weather" not in renderer.tokenizer.decode(hidden["prompt_ids"])
    assert "tool_choice:none(tools hidden)" in hidden["flags"]


async def test_n_logprobs_and_structured_output(proxy, renderer):
    async with aiohttp.ClientSession() as http:
        base, sid, key = await _session(proxy, "extras")
        status, answer = await post(
            http, base + "/chat/completions", {"model": "m", "messages": [USER], "n": 2}, key
        )
        assert status == 400 and "n=2" in answer["error"]["message"]
        schema = {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}}
        status, reply = await post(
            http,
            base + "/chat/completions",
            {"model": "m", "messages": [USER], "logprobs": True, "response_format": schema},
            key,
        )
        assert status == 200
        chat_lp = reply["choices"][0]["logprobs"]["content"]
        status, reply = await post(
            http,
            base + "/responses",
            {
                "model": "m",
                "input": "hi",
                "include": ["message.output_text.logprobs"],
                "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
            },
            key,
        )
        assert status == 200
        part = reply["output"][0]["content"][0]
        calls = await ledger_calls(http, proxy, sid)
    assert len(calls) == 2  # the refused n=2 never reached the engine
    for record, served, text in (
        (calls[0], chat_lp, "It is sunny."),
        (calls[1], part["logprobs"], part["text"]),
    ):
        # served from the record: every sampled token but the end-of-turn one, in order
        assert [t["logprob"] for t in served] == record["logprobs"][:-1]
        assert "".join(t["token"] for t in served) == text == "It is sunny."
        assert "unenforced:response_format=json_schema" in record["flags"]


async def test_anthropic_prefill_continues_the_assistant_turn(proxy, renderer):
    prefill = '{"a":'
    async with aiohttp.ClientSession() as http:
        base, sid, key = await _session(proxy, "prefill")
        body = {"model": "m", "max_tokens": 32, "messages": [USER, {"role": "assistant", "content": prefill}]}
        status, reply = await post(http, base + "/messages", body, key)
        assert status == 200 and reply["content"] == [{"type": "text", "text": ' 1, "b": 2}'}]
        # the SDK's way on: the prefill and its continuation as one assistant turn
        whole = prefill + reply["content"][0]["text"]
        nxt = {
            **body,
            "messages": [USER, {"role": "assistant", "content": whole}, {"role": "user", "content": "ok"}],
        }
        status, _ = await post(http, base + "/messages", nxt, key)
        assert status == 200
        status, answer = await post(
            http,
            base + "/messages",
            {**body, "messages": [USER, {"role": "assistant", "content": "trailing "}]},
            key,
        )
        assert status == 400 and "trailing whitespace" in answer["error"]["message"]
        c0, c1 = await ledger_calls(http, proxy, sid)
    # the prompt ends inside the assistant turn, exactly where the prefill stops: no end-of-turn
    assert renderer.tokenizer.decode(c0["prompt_ids"]).endswith(
        '<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n{"a":'
    )
    assert c0["prefill"] == prefill and [m["role"] for m in c0["messages"]] == ["user"]
    assert c0["output"]["content"] == whole
    glue = renderer.render_continuation([Message(role="user", content="ok")], previous_ended_with_eos=True)
    assert c1["parent_call_index"] == 0 and c1["prompt_ids"] == c0["prompt_ids"] + c0["sampled_ids"] + glue
