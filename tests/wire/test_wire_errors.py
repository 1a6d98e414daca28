"""Requests as real clients send them that used to crash the proxy or lose the call: each gets an
answer in its API's shape, and every request that reaches the engine is in the ledger.

Lone UTF-16 surrogates follow one rule (replaced by U+FFFD when the body is decoded); the property
test sends any accepted request, surrogates included, and checks the ledger has no index gap.
"""

from __future__ import annotations

import http.client
import json
import logging

import aiohttp
import brotli
import pytest
from fuzz_helpers import ThreadedProxy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proxy_client import ledger_calls, make_proxy, post, running_proxy

from polar_env.backends.instant import InstantBackend

CUT = "cut \ud83d"  # what a Node harness sends after cutting a tool output mid-emoji


@pytest.fixture
async def proxy(renderer, scripted_backend_factory, tmp_path):
    backend = scripted_backend_factory(lambda *a: "ok", context_window=64)
    async with running_proxy(renderer, backend, tmp_path) as proxy:
        yield proxy


def _requests(model: str = "m") -> dict[str, dict]:
    """One request per API whose tool result, user text and model name hold a lone surrogate."""
    return {
        "messages": {
            "model": model,
            "max_tokens": 16,
            "messages": [
                {"role": "user", "content": "run it"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "cat x"}}
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": CUT}],
                },
            ],
        },
        "chat/completions": {
            "model": model,
            "messages": [
                {"role": "user", "content": CUT},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": CUT},
            ],
        },
        "responses": {
            "model": model,
            "input": [
                {"role": "user", "content": "run it"},
                {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": CUT},
            ],
        },
    }


async def test_lone_surrogates_are_replaced_and_every_call_recorded(proxy, renderer):
    sid, key = proxy.create_session("surrogates")
    async with aiohttp.ClientSession() as http:
        for route, body in _requests(model="cut-\udc00-model").items():
            # json.dumps escapes the lone surrogate as \ud83d, exactly as JSON.stringify does in Node
            status, answer = await post(http, f"{proxy.base_url}/s/{sid}/v1/{route}", body, key)
            assert status == 200, (route, answer)
        async with http.post(
            f"{proxy.base_url}/s/{sid}/v1/messages/count_tokens",
            json={"model": "m", "messages": [{"role": "user", "content": CUT}]},
            headers={"x-api-key": key},
        ) as resp:
            assert resp.status == 200 and (await resp.json())["input_tokens"] > 0
        calls = await ledger_calls(http, proxy, sid)
    assert [c["call_index"] for c in calls] == [0, 1, 2] and all(c["output"] for c in calls)
    for call in calls:
        tool = next(m for m in call["messages"] if m["role"] == "tool")
        assert tool["content"] == "cut \ufffd"  # the one rule: U+FFFD, in the record ...
        assert "cut \ufffd" in renderer.tokenizer.decode(call["prompt_ids"])  # ... and in what the model saw


async def test_error_bodies_are_in_the_api_shape(proxy):
    sid, key = proxy.create_session("errors")
    base = f"{proxy.base_url}/s/{sid}/v1"
    user = {"role": "user", "content": "hi"}
    async with aiohttp.ClientSession() as http:
        status, body = await post(
            http,
            base + "/messages",
            {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": []}]},
            key,
        )
        assert status == 400 and body["type"] == "error" and "non-empty content" in body["error"]["message"]
        for bad in ([], {"model": "m", "messages": []}):
            status, body = await post(http, base + "/messages/count_tokens", bad, key)
            assert status == 400 and body["type"] == "error", body
        for route, body in (
            ("/messages", {"model": "m", "max_tokens": 0, "messages": [user]}),
            ("/chat/completions", {"model": "m", "max_tokens": -1, "messages": [user]}),
            ("/responses", {"model": "m", "max_output_tokens": 0, "input": "hi"}),
        ):
            status, answer = await post(http, base + route, body, key)
            error = answer["error"]
            assert status == 400 and "max_tokens must be at least 1" in error["message"], answer
            assert ("type" in answer) == (route == "/messages")  # Anthropic's envelope vs OpenAI's
        # brotli bodies (Content-Encoding: br) are decoded like gzip ones
        raw = brotli.compress(json.dumps({"model": "m", "max_tokens": 8, "messages": [user]}).encode())
        async with http.post(
            base + "/messages",
            data=raw,
            headers={"x-api-key": key, "Content-Encoding": "br", "Content-Type": "application/json"},
        ) as resp:
            assert resp.status == 200 and (await resp.json())["content"][0]["text"] == "ok"
        # CORS preflights and other methods: 405 naming what is allowed, in the API's shape
        async with http.options(base + "/messages") as resp:
            body = await resp.json()
            assert resp.status == 405 and resp.headers["Allow"] == "POST" and body["type"] == "error"
        async with http.options(base + "/chat/completions") as resp:
            body = await resp.json()
            assert (
                resp.status == 405
                and resp.headers["Allow"] == "POST"
                and "OPTIONS" in body["error"]["message"]
            )
        calls = await ledger_calls(http, proxy, sid)
    assert len(calls) == 1  # only the brotli request reached the engine


async def test_client_disconnect_is_one_log_line(proxy, caplog):
    sid, key = proxy.create_session("gone")
    body = json.dumps(
        {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    import asyncio

    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(
        f"POST /s/{sid}/v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.transport.abort()  # the harness is killed while its call runs
    with caplog.at_level(logging.INFO):
        await proxy.drain(sid)
        await asyncio.sleep(0.2)
    assert len(proxy.registry.ledger.calls(sid)) == 1  # the call is recorded all the same
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


# -- property: no ledger gap under any accepted request -------------------------------------------
SURROGATE = st.integers(0xD800, 0xDFFF).map(chr)  # hypothesis' text() never draws these on its own
ANY_TEXT = st.lists(st.characters() | SURROGATE, max_size=12).map("".join)


@st.composite
def accepted_request(draw):
    text = draw(ANY_TEXT)
    bodies = _requests(model=draw(ANY_TEXT).strip() or "m")
    route = draw(st.sampled_from(sorted(bodies)))
    body = json.loads(json.dumps(bodies[route]).replace(json.dumps(CUT)[1:-1], json.dumps(text)[1:-1]))
    return route, body


@pytest.fixture(scope="module")
def threaded(renderer, tmp_path_factory):
    backend = InstantBackend(
        renderer.tokenizer.encode("Hi", add_special_tokens=False) + renderer.eos_token_ids[:1]
    )
    proxy = make_proxy(
        renderer, backend, tmp_path_factory.mktemp("gaps"), max_context=4096, default_max_tokens=8
    )
    sid, key = proxy.create_session("gaps")
    with ThreadedProxy(proxy) as served:
        yield proxy, served, sid, key


@settings(
    deadline=None, max_examples=60, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(request=accepted_request())
def test_ledger_has_no_index_gap_under_any_accepted_request(threaded, request):
    proxy, served, sid, key = threaded
    route, body = request
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    try:
        conn.request(
            "POST",
            f"/s/{sid}/v1/{route}",
            body=json.dumps(body).encode(),
            headers={"x-api-key": key, "Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        answer = resp.read()
    finally:
        conn.close()
    assert resp.status == 200, answer
    calls = proxy.registry.ledger.calls(sid)
    assert [c.call_index for c in calls] == list(range(len(calls)))
    assert all(c.output is not None and c.error is None for c in calls)
