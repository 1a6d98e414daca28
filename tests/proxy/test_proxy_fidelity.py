"""Logprobs recorded through the proxy equal a fresh forward pass of the same model (float32)."""

from __future__ import annotations

import aiohttp
from proxy_client import ledger_calls, post, running_proxy


async def test_recorded_logprobs_match_a_fresh_forward_pass(renderer, local_backend, tmp_path):
    async with running_proxy(renderer, local_backend, tmp_path) as proxy, aiohttp.ClientSession() as http:
        sid, key = proxy.create_session("fid", sampling={"temperature": 1.0, "top_p": 1.0, "max_tokens": 24})
        body = {"model": "m", "messages": [{"role": "user", "content": "Name three fruits."}]}
        status, reply = await post(http, f"{proxy.base_url}/s/{sid}/v1/chat/completions", body, key)
        assert status == 200
        body["messages"] += [reply["choices"][0]["message"], {"role": "user", "content": "And two more?"}]
        status, _ = await post(http, f"{proxy.base_url}/s/{sid}/v1/chat/completions", body, key)
        assert status == 200
        calls = await ledger_calls(http, proxy, sid)
    worst = 0.0
    for call in calls:
        ids = call["prompt_ids"] + call["sampled_ids"]
        fresh = local_backend.score(ids, len(call["prompt_ids"]))
        assert len(fresh) == len(call["logprobs"]) > 0
        worst = max(worst, max(abs(a - b) for a, b in zip(fresh, call["logprobs"], strict=True)))
    print(f"max abs logprob diff recorded vs fresh forward pass: {worst:.2e}")
    assert worst < 1e-3
    assert (
        calls[1]["prompt_ids"][: len(calls[0]["prompt_ids"]) + len(calls[0]["sampled_ids"])]
        == calls[0]["prompt_ids"] + calls[0]["sampled_ids"]
    )
