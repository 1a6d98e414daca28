"""The ``sglang`` backend against a test double of SGLang's native ``/generate``.

SGLang is not installed here (its PyPI kernel wheels target CUDA GPUs), so the server is a double that
speaks its wire shape as read from SGLang's source: ``input_ids`` + ``sampling_params`` in;
``meta_info.output_token_logprobs`` as ``[logprob, token_id, text]`` entries (the stop token
included, since SGLang appends a token before checking whether it finishes) and
``meta_info.finish_reason`` as ``{"type": "stop", "matched": id}`` / ``{"type": "length", ...}``.
"""

from __future__ import annotations

from collections import Counter

import pytest
from aiohttp import web
from http_double import serve

from polar_env.backends.base import BackendError, SamplingParams
from polar_env.backends.registry import make_backend

EOS = 2
SCRIPT = [10, 11, 12, EOS, 13]  # what the double "samples", in order


def sglang_double(requests: list[dict], *, reply=None) -> web.Application:
    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        requests.append(body)
        if reply is not None:
            return web.json_response(reply)
        params = body["sampling_params"]
        stops = set(params.get("stop_token_ids") or []) | {EOS}
        out, finish = [], {"type": "length", "length": params["max_new_tokens"]}
        for token in SCRIPT:
            if len(out) == params["max_new_tokens"]:
                break
            out.append(token)
            if token in stops:
                finish = {"type": "stop", "matched": token}
                break
        logprobs = [[-0.1 * (i + 1), t, None] for i, t in enumerate(out)]
        meta = {
            "id": "r1",
            "finish_reason": finish,
            "prompt_tokens": len(body["input_ids"]),
            "completion_tokens": len(out),
            "output_token_logprobs": logprobs if body.get("return_logprob") else [],
        }
        return web.json_response({"text": "...", "output_ids": out, "meta_info": meta})

    app = web.Application()
    app.router.add_post("/generate", generate)
    return app


async def _run(url, sampling, *, session_id=None):
    b = make_backend("sglang", url=url, model="served")
    try:
        return await b.generate([1, 5, 7], sampling, session_id=session_id)
    finally:
        await b.aclose()


async def test_request_shape_and_stop_on_eos():
    seen: list[dict] = []
    async with serve(sglang_double(seen)) as url:
        gen = await _run(
            url, SamplingParams(temperature=0.7, top_p=0.9, max_tokens=16, stop_token_ids=[EOS], seed=4)
        )
    assert gen.token_ids == [10, 11, 12, EOS] and gen.finish_reason == "stop"
    assert gen.logprobs == pytest.approx([-0.1, -0.2, -0.3, -0.4]) and gen.backend == "sglang"
    body = seen[0]
    assert body["input_ids"] == [1, 5, 7] and body["return_logprob"] is True and body["stream"] is False
    assert body["sampling_params"] == {
        "max_new_tokens": 16,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "stop_token_ids": [EOS],
        "sampling_seed": 4,
    }


async def test_stop_token_other_than_eos_and_length():
    async with serve(sglang_double([])) as url:
        stopped = await _run(url, SamplingParams(max_tokens=16, stop_token_ids=[11]))
        cut = await _run(url, SamplingParams(max_tokens=2))
    assert stopped.token_ids == [10, 11] and stopped.finish_reason == "stop"
    assert cut.token_ids == [10, 11] and cut.finish_reason == "length" and len(cut.logprobs) == 2


@pytest.mark.parametrize(
    ("reply", "retryable"),
    [
        ({"meta_info": {"finish_reason": {"type": "abort", "message": "weights updating"}}}, True),
        ({"meta_info": {"finish_reason": {"type": "stop", "matched": 2}}}, False),  # no logprobs
        (
            {
                "meta_info": {
                    "finish_reason": {"type": "stop", "matched": 2},
                    "output_token_logprobs": [[-0.1, 10, None]],
                }
            },
            False,
        ),  # stop id missing
        ({"meta_info": {"finish_reason": None, "output_token_logprobs": []}}, False),
        ({"text": "no meta"}, False),
    ],
)
async def test_bad_replies(reply, retryable):
    async with serve(sglang_double([], reply=reply)) as url:
        with pytest.raises(BackendError) as err:
            await _run(url, SamplingParams(max_tokens=4))
    assert err.value.retryable is retryable


async def test_sessions_spread_over_servers_and_stick():
    a_seen: list[dict] = []
    b_seen: list[dict] = []
    async with serve(sglang_double(a_seen)) as a, serve(sglang_double(b_seen)) as b:
        backend = make_backend("sglang", url=f"{a},{b}", model="served")
        try:
            for i in range(20):
                for _ in range(2):
                    await backend.generate([i], SamplingParams(max_tokens=1), session_id=f"sess-{i}")
        finally:
            await backend.aclose()
    assert a_seen and b_seen
    per_server = [Counter(r["input_ids"][0] for r in seen) for seen in (a_seen, b_seen)]
    assert not set(per_server[0]) & set(per_server[1])  # no session was split over servers
    assert all(n == 2 for c in per_server for n in c.values())


async def test_the_weights_label_and_entries_without_logprobs():
    """SGLang's ``meta_info.weight_version`` labels the weights that served the request (its own test,
    test/srt/test_weight_version.py, asserts the field); entries whose logprob is null leave the turn as
    context."""
    reply = {
        "meta_info": {
            "finish_reason": {"type": "stop", "matched": 2},
            "weight_version": "5",
            "output_token_logprobs": [[None, 10, None], [None, 2, None]],
        }
    }
    async with serve(sglang_double([], reply=reply)) as url:
        gen = await _run(url, SamplingParams(max_tokens=4))
    assert gen.weight_versions == ["5"] and gen.token_ids == [10, 2] and gen.logprobs == []
