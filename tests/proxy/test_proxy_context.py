"""Context windows: the proxy refuses an overflowing call itself, in each API's own error shape.

Real proxy, real tokenizer, real model (scripted text scored by SmolLM2). The window is the user's
(``EngineConfig.max_context``) or the backend's own; a backend's own overflow refusal (vLLM's 400)
is answered the same way. A harness that repeats a failing request is stopped at the second one.
"""

from __future__ import annotations

import aiohttp
from aiohttp import web
from http_double import serve
from proxy_client import ledger_calls, post, running_proxy

from polar_env.backends.registry import make_backend

WINDOW = 64
LONG = "tell me everything about the sea " * 40  # ~280 tokens: past a 64-token window
BODIES = {
    "chat": ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": LONG}]}),
    "responses": ("/v1/responses", {"model": "m", "input": LONG}),
    "messages": (
        "/v1/messages",
        {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": LONG}]},
    ),
}


def small_window():
    return dict(max_context=WINDOW, default_max_tokens=8)


async def test_each_api_answers_an_overflow_in_its_providers_shape(
    renderer, scripted_backend_factory, tmp_path
):
    backend = scripted_backend_factory(lambda *_: "never sampled")
    async with (
        running_proxy(renderer, backend, tmp_path, **small_window()) as proxy,
        aiohttp.ClientSession() as http,
    ):
        answers = {}
        for api, (path, body) in BODIES.items():
            sid, key = proxy.create_session(f"s-{api}")
            status, answer = await post(http, f"{proxy.base_url}/s/{sid}{path}", body, key)
            assert status == 400, answer
            answers[api] = answer
            [record] = await ledger_calls(http, proxy, sid)
            assert record["error"].startswith("context overflow") and record["output"] is None
            assert not record["sampled_ids"]
    assert backend.answers.calls == {}  # refused before the backend
    chat, responses = answers["chat"]["error"], answers["responses"]["error"]
    assert chat["code"] == responses["code"] == "context_length_exceeded"
    assert chat["type"] == responses["type"] == "invalid_request_error"
    assert chat["message"].startswith(f"This model's maximum context length is {WINDOW} tokens.")
    n = int(chat["message"].split("resulted in ")[1].split()[0])  # one text: the same prompt in every API
    assert n > WINDOW
    assert responses["message"].startswith("Your input exceeds the context window of this model.")
    assert answers["messages"] == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": f"prompt is too long: {n} tokens > {WINDOW - 1} maximum",
        },
    }


async def test_an_identical_failing_call_stops_the_session_at_the_second(
    renderer, scripted_backend_factory, tmp_path
):
    backend = scripted_backend_factory(lambda *_: "fine")
    path, body = BODIES["chat"]
    async with (
        running_proxy(renderer, backend, tmp_path, **small_window()) as proxy,
        aiohttp.ClientSession() as http,
    ):
        sid, key = proxy.create_session("storm")
        statuses = [(await post(http, f"{proxy.base_url}/s/{sid}{path}", body, key)) for _ in range(4)]
        records = await ledger_calls(http, proxy, sid)
        info = proxy.registry.get(sid).info
    codes = [answer["error"]["code"] for _status, answer in statuses]
    assert [s for s, _ in statuses] == [400] * 4
    assert codes[:2] == ["context_length_exceeded"] * 2 and codes[2:] == [None, None]
    assert (
        "episode stopped: the harness sent the same failing request 2 times"
        in statuses[2][1]["error"]["message"]
    )
    assert len(records) == 2 and all(r["error"].startswith("context overflow") for r in records)
    assert "same failing request 2 times" in info.metadata["stopped"]


async def test_different_failing_calls_do_not_stop_the_session(renderer, scripted_backend_factory, tmp_path):
    backend = scripted_backend_factory(lambda *_: "ok")
    async with (
        running_proxy(renderer, backend, tmp_path, **small_window()) as proxy,
        aiohttp.ClientSession() as http,
    ):
        sid, key = proxy.create_session("compacting")
        for cut in (0, 1, 2):  # what a harness trimming its history sends
            text = LONG[cut * 10 :]
            status, answer = await post(
                http,
                f"{proxy.base_url}/s/{sid}/v1/chat/completions",
                {"model": "m", "messages": [{"role": "user", "content": text}]},
                key,
            )
            assert status == 400 and answer["error"]["code"] == "context_length_exceeded"
        status, answer = await post(
            http,
            f"{proxy.base_url}/s/{sid}/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "short"}]},
            key,
        )
        assert status == 200, answer
        assert proxy.registry.get(sid).stopped is None


def fake_vllm(window: int, refused: list[int]) -> web.Application:
    """Stands in for vLLM where a real one is too heavy to provoke: its /v1/models and its 400 on a
    prompt past ``max_model_len`` (the wording of vLLM 0.32's OpenAI server)."""

    async def models(_request):
        return web.json_response({"object": "list", "data": [{"id": "m", "max_model_len": window}]})

    async def completions(request):
        n = len((await request.json())["prompt"])
        refused.append(n)
        return web.json_response(
            {
                "error": {
                    "message": f"This model's maximum context length is {window} tokens. "
                    f"However, your request has {n} input tokens.",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            },
            status=400,
        )

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    return app


async def test_the_backends_window_and_its_own_overflow_error(renderer, tmp_path):
    refused: list[int] = []
    async with serve(fake_vllm(4096, refused)) as url:
        backend = make_backend("vllm", url=url, model="m")
        # the window comes from the backend: this prompt fits the proxy's view, and vLLM refuses it
        async with (
            running_proxy(renderer, backend, tmp_path, max_context=None, default_max_tokens=8) as proxy,
            aiohttp.ClientSession() as http,
        ):
            assert await proxy.engine.context_window() == 4096
            sid, key = proxy.create_session("backend-overflow")
            status, answer = await post(
                http, f"{proxy.base_url}/s/{sid}/v1/messages", BODIES["messages"][1], key
            )
            [record] = await ledger_calls(http, proxy, sid)
        await backend.aclose()
    assert status == 400 and refused[-1] < 4096  # (the proxy's start-up logprobs probe was refused too)
    assert answer["error"]["message"] == f"prompt is too long: {refused[-1]} tokens > 4095 maximum"
    assert (
        record["error"].startswith("context overflow") and "maximum context length is 4096" in record["error"]
    )
