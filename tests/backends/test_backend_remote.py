"""HTTP plumbing shared by the remote backends: URL choice and how failures map to BackendError.

The server here is a test double (a real aiohttp server on 127.0.0.1): a real vLLM cannot be made
to answer 503, garbage or nothing on demand.
"""

from __future__ import annotations

import asyncio
import socket
from collections import Counter

import pytest
from aiohttp import web
from http_double import serve

from polar_env.backends.base import BackendError, SamplingParams
from polar_env.backends.remote import normalize_base_url
from polar_env.backends.vllm import VllmBackend

GOOD = {
    "model": "m",
    "choices": [
        {
            "index": 0,
            "text": "",
            "finish_reason": "stop",
            "stop_reason": None,
            "token_ids": [5, 2],
            "prompt_token_ids": [1, 2, 3],
            "logprobs": {"token_logprobs": [-0.5, -0.25]},
        }
    ],
}
# what vLLM sends for the backend's own request (return_tokens_as_token_ids, no return_token_ids:
# the id keys are there, as null)
NO_ECHO = {
    "model": "m",
    "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    "choices": [
        {
            "index": 0,
            "text": "",
            "finish_reason": "stop",
            "stop_reason": None,
            "token_ids": None,
            "prompt_token_ids": None,
            "logprobs": {"tokens": ["token_id:5", "token_id:2"], "token_logprobs": [-0.5, -0.25]},
        }
    ],
}


def test_normalize_base_url():
    assert normalize_base_url("http://h:8000/v1/") == "http://h:8000"
    assert normalize_base_url(" https://h/api ") == "https://h/api"
    with pytest.raises(ValueError):
        normalize_base_url("h:8000")


def test_sessions_stick_to_one_server_and_spread():
    b = VllmBackend(["http://a", "http://b/v1", "http://c"])
    assert b.urls == ["http://a", "http://b", "http://c"]
    assert len({b.pick_url("session-7") for _ in range(10)}) == 1
    spread = Counter(b.pick_url(f"session-{i}") for i in range(300))
    assert set(spread) == set(b.urls) and min(spread.values()) > 50
    assert [b.pick_url() for _ in range(6)] == b.urls * 2  # no session: round-robin


def test_needs_a_url():
    with pytest.raises(ValueError):
        VllmBackend([])


def _app(handler) -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    return app


async def _generate(url: str, **kw):
    b = VllmBackend(url, **kw)
    try:
        return await b.generate([1, 2, 3], SamplingParams(max_tokens=4))
    finally:
        await b.aclose()


async def test_reads_ids_and_logprobs():
    seen = {}

    async def handler(request):
        seen.update(await request.json())
        return web.json_response(NO_ECHO)

    async with serve(_app(handler)) as url:
        gen = await _generate(url, model="m")
    assert gen.token_ids == [5, 2] and gen.logprobs == [-0.5, -0.25] and gen.finish_reason == "stop"
    assert seen["prompt"] == [1, 2, 3] and seen["model"] == "m" and seen["return_tokens_as_token_ids"] is True
    assert "return_token_ids" not in seen  # the proxy holds the prompt ids: no echo asked for
    assert seen["logprobs"] == 0 and seen["top_k"] == 0 and seen["top_p"] == 1.0 and "seed" not in seen


async def test_prompt_length_is_checked_without_echo():
    async def handler(request):
        return web.json_response({**NO_ECHO, "usage": {"prompt_tokens": 4, "completion_tokens": 2}})

    async with serve(_app(handler)) as url:
        with pytest.raises(BackendError, match="changed the prompt ids \\(3 sent, 4 used\\)"):
            await _generate(url)


async def test_verify_prompt_echo_asks_for_and_compares_the_echo():
    seen = {}

    async def handler(request):
        seen.update(await request.json())
        return web.json_response(GOOD)

    async with serve(_app(handler)) as url:
        gen = await _generate(url, verify_prompt_echo=True)
    assert seen["return_token_ids"] is True and gen.token_ids == [5, 2]

    async def missing(request):
        return web.json_response(NO_ECHO)

    async with serve(_app(missing)) as url:
        with pytest.raises(BackendError, match="echoed no prompt_token_ids"):
            await _generate(url, verify_prompt_echo=True)


@pytest.mark.parametrize(
    ("status", "retryable"), [(500, True), (503, True), (429, True), (400, False), (404, False)]
)
async def test_http_status(status, retryable):
    async def handler(request):
        return web.json_response({"error": {"message": "nope"}}, status=status)

    async with serve(_app(handler)) as url:
        with pytest.raises(BackendError) as err:
            await _generate(url)
    assert err.value.status == status and err.value.retryable is retryable and "nope" in str(err.value)


@pytest.mark.parametrize(
    ("body", "retryable"),
    [
        ("{not json", True),  # garbled / truncated reply
        ("[1, 2]", False),  # JSON but not an object
        ('{"choices": []}', False),  # object without what the contract promises
        (
            (
                '{"choices": [{"token_ids": [5], "finish_reason": "abort", "logprobs": {"token_logprobs": '
                "[-1]}}]}"
            ),
            True,
        ),
        (
            '{"choices": [{"token_ids": [5], "finish_reason": "stop", "stop_reason": 9,'
            ' "logprobs": {"token_logprobs": [-1]}}]}',
            False,
        ),  # stopped on 9 but 9 is not in the ids
    ],
)
async def test_bad_payloads(body, retryable):
    async def handler(request):
        return web.Response(text=body, content_type="application/json")

    async with serve(_app(handler)) as url:
        with pytest.raises(BackendError) as err:
            await _generate(url)
    assert err.value.retryable is retryable


@pytest.mark.parametrize("logprobs", ['{"token_logprobs": []}', '{"token_logprobs": [-1, -2]}', "null"])
async def test_ids_without_aligned_logprobs_are_an_answer_without_logprobs(logprobs):
    """The sampled ids still answer the harness; no logprobs means the turn is context (OpenEnv RFC 006),
    which the chain builder masks: a backend defect costs a training target, not the episode."""

    async def handler(request):
        return web.Response(
            text='{"choices": [{"token_ids": [5], "finish_reason": "stop", "logprobs": ' + logprobs + "}]}",
            content_type="application/json",
        )

    async with serve(_app(handler)) as url:
        gen = await _generate(url)
    assert gen.token_ids == [5] and gen.logprobs == []


async def test_changed_prompt_is_refused():
    async def handler(request):
        reply = {"choices": [{**GOOD["choices"][0], "prompt_token_ids": [1, 2]}]}
        return web.json_response(reply)

    async with serve(_app(handler)) as url:
        with pytest.raises(BackendError, match="changed the prompt"):
            await _generate(url)


async def test_connection_refused_is_retryable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    with pytest.raises(BackendError) as err:
        await _generate(f"http://127.0.0.1:{port}")
    assert err.value.retryable and err.value.status is None


async def test_timeout_is_retryable():
    release = asyncio.Event()

    async def handler(request):
        await release.wait()
        return web.json_response(GOOD)

    async with serve(_app(handler)) as url:
        with pytest.raises(BackendError, match="timed out") as err:
            await _generate(url, timeout_s=0.3)
        release.set()
    assert err.value.retryable


async def test_one_dropped_connection_is_retried():
    calls = []

    async def handler(request):
        calls.append(1)
        if len(calls) == 1:
            request.transport.close()  # e.g. a keep-alive connection the server closed as we reused it
        return web.json_response(GOOD)

    async with serve(_app(handler)) as url:
        gen = await _generate(url)
    assert gen.token_ids == [5, 2] and len(calls) == 2


async def test_idle_connection_outliving_the_server_keepalive(monkeypatch):
    """The server closes idle connections after 0.3 s; a call 0.5 s later must not hit a dead one,
    even while the event loop was too busy to notice the close."""
    import time

    monkeypatch.setattr("polar_env.backends.remote.KEEPALIVE_S", 0.2)

    async def handler(request):
        return web.json_response(GOOD)

    app = _app(handler)
    b = VllmBackend("http://127.0.0.1:1")
    runner = web.AppRunner(app, keepalive_timeout=0.3)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    b.urls = [f"http://127.0.0.1:{runner.addresses[0][1]}"]
    try:
        for _ in range(2):
            assert (await b.generate([1, 2, 3], SamplingParams())).token_ids == [5, 2]
            time.sleep(0.5)  # blocks the loop, as a CPU-bound caller would
    finally:
        await b.aclose()
        await runner.cleanup()


async def test_dropped_connection_is_retryable():
    async def handler(request):
        request.transport.close()  # the server dies mid-request
        return web.json_response(GOOD)

    async with serve(_app(handler)) as url:
        with pytest.raises(BackendError) as err:
            await _generate(url)
    assert err.value.retryable


async def test_api_key_is_sent():
    seen = {}

    async def handler(request):
        seen["auth"] = request.headers.get("Authorization")
        return web.json_response(GOOD)

    async with serve(_app(handler)) as url:
        await _generate(url, api_key="sk-test")
    assert seen["auth"] == "Bearer sk-test"
