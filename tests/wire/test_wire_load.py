"""A 5 MB request (a harness pasting a huge tool output) must not hold the proxy: /health and every
other session keep answering while it is parsed, rendered, tokenized and recorded, and a request
that cannot fit the context is refused before any tokenizing.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from contextlib import contextmanager

import aiohttp
from proxy_client import ledger_calls, post, running_proxy

from polar_env.backends.instant import InstantBackend

BIG = "The build log repeats the same warning line again. " * 100_000  # 5.1 MB of text


async def _health_latencies(http: aiohttp.ClientSession, url: str, until: asyncio.Task) -> list[float]:
    """Each probe's wait, counted from when it was due (10 ms after the previous answer), not from
    when it was sent: a hold that starts while the poller sleeps delays the send, and would
    otherwise not be seen at all."""
    latencies = []
    while not until.done():
        due = time.perf_counter() + 0.01
        await asyncio.sleep(0.01)
        async with http.get(url) as resp:
            assert resp.status == 200
            await resp.read()
        latencies.append(time.perf_counter() - due)
    return latencies


async def _big_request_with_health_polled(proxy, http: aiohttp.ClientSession, sid: str, key: str):
    # serialized up front: the client's own JSON encoding would block this (shared) loop
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": BIG}]}).encode()
    started = time.perf_counter()
    task = asyncio.ensure_future(
        http.post(
            f"{proxy.base_url}/s/{sid}/v1/chat/completions",
            data=raw,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
    )
    latencies = await _health_latencies(http, f"{proxy.base_url}/health", task)
    async with await task as resp:
        return resp.status, await resp.json(), latencies, time.perf_counter() - started


@contextmanager
def _ahead_of_other_jobs(levels: int = 10):
    """This process ``levels`` nice levels ahead of the machine's other jobs while it measures (where
    it may: root), so what is measured is what the proxy holds, not the cores other jobs take; the
    threads and the parse worker the proxy starts meanwhile inherit it."""
    try:
        os.nice(-levels)
    except PermissionError:
        yield
        return
    try:
        yield
    finally:
        os.nice(levels)


async def test_health_answers_within_50_ms_while_a_5_mb_request_is_processed(renderer, tmp_path):
    """A Qwen3.5-class window (262144 tokens): the 5 MB text is not refused on its length alone, so
    it is parsed (in a worker process), hashed, sized and recorded while /health is polled every
    10 ms. The rule: an attempt passes when every probe answered within 50 ms; the test passes
    when one of three attempts does. A step that holds the loop (or the GIL) for 50 ms repeats in
    every attempt and fails all three; a scheduling hiccup of a machine whose cores other jobs
    share lands in one attempt, not in every one (and the test runs ahead of those jobs)."""
    backend = InstantBackend(
        renderer.tokenizer.encode("Seen.", add_special_tokens=False) + renderer.eos_token_ids[:1]
    )
    config = dict(max_context=262_144, default_max_tokens=8)
    with _ahead_of_other_jobs():
        await _health_while_big_requests(renderer, backend, config, tmp_path)


async def _health_while_big_requests(renderer, backend, config: dict, tmp_path) -> None:
    async with (
        running_proxy(renderer, backend, tmp_path, **config) as proxy,
        aiohttp.ClientSession() as http,
    ):
        slowest = []
        for attempt in range(3):
            sid, key = proxy.create_session(f"big{attempt}")
            status, answer, latencies, took = await _big_request_with_health_polled(proxy, http, sid, key)
            assert status == 400 and "context" in answer["error"]["message"], answer
            [call] = await ledger_calls(http, proxy, sid)
            assert (
                call["error"].startswith("context overflow") and call["prompt_ids"] == []
            )  # no megabytes of ids
            assert len(latencies) >= 3, (took, latencies)
            print(
                f"{len(latencies)} health checks in {took:.2f} s: median "
                f"{statistics.median(latencies) * 1e3:.1f} ms, slowest {max(latencies) * 1e3:.1f} ms"
            )
            slowest.append(max(latencies))
            if slowest[-1] < 0.05:
                break
    assert min(slowest) < 0.05, f"/health took {[round(s * 1e3) for s in slowest]} ms during the 5 MB request"


async def test_a_request_that_cannot_fit_is_refused_before_tokenizing(renderer, tmp_path):
    backend = InstantBackend(
        renderer.tokenizer.encode("Seen.", add_special_tokens=False) + renderer.eos_token_ids[:1]
    )
    config = dict(max_context=8192, default_max_tokens=8)  # the embedded model's window
    async with (
        running_proxy(renderer, backend, tmp_path, **config) as proxy,
        aiohttp.ClientSession() as http,
    ):
        sid, key = proxy.create_session("huge")
        body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": BIG}]}
        started = time.perf_counter()
        status, answer = await post(http, f"{proxy.base_url}/s/{sid}/v1/messages", body, key)
        took = time.perf_counter() - started
        [call] = await ledger_calls(http, proxy, sid)
    assert status == 400 and answer["type"] == "error" and "too long" in answer["error"]["message"], answer
    assert call["error"].startswith("context overflow") and call["prompt_ids"] == []  # no megabytes of ids
    assert "render_ms" not in call["timings"], call["timings"]  # refused before anything was rendered
    assert took < 5, took  # tokenizing 5 MB whole takes 10-20 s on this machine


async def test_a_large_body_refused_by_its_parse_worker_gets_the_apis_400(renderer, tmp_path):
    """Bodies from 256 KB are parsed in a worker process: its refusal comes back as the same 400, in
    the called API's shape, that a small body gets, and the proxy goes on parsing afterwards."""
    backend = InstantBackend(
        renderer.tokenizer.encode("Seen.", add_special_tokens=False) + renderer.eos_token_ids[:1]
    )
    async with running_proxy(renderer, backend, tmp_path) as proxy, aiohttp.ClientSession() as http:
        sid, key = proxy.create_session("cut")
        headers = {"x-api-key": key, "Content-Type": "application/json"}
        cut = json.dumps({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": BIG}]})[:-3]
        async with http.post(
            f"{proxy.base_url}/s/{sid}/v1/messages", data=cut.encode(), headers=headers
        ) as resp:
            status, answer = resp.status, await resp.json()
        assert status == 400 and answer["type"] == "error", answer
        assert answer["error"]["message"].startswith("request body is not valid JSON"), answer
        no_message = json.dumps(
            {
                "model": "m",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": []}],
                "metadata": {"pad": "x" * (300 << 10)},
            }
        )
        async with http.post(
            f"{proxy.base_url}/s/{sid}/v1/messages", data=no_message.encode(), headers=headers
        ) as resp:
            status, answer = resp.status, await resp.json()
        assert status == 400 and answer["error"]["message"].startswith(
            "messages.0: all messages must have non-empty"
        ), answer
        assert await ledger_calls(http, proxy, sid) == []  # refused before the engine: nothing to record
