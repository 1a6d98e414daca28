"""Backend faults behind the real ``vllm`` backend kind, seen by a harness over real HTTP.

A stock vLLM server cannot be made to answer 500, hang half-way through a body or send broken
JSON on demand, so the faults come from a small aiohttp test double that speaks vLLM's
``/v1/completions`` (token ids in, token ids + logprobs out). Everything else is real: the
``vllm`` backend from the registry, the proxy on 127.0.0.1, the ledger on disk, the chain builder.
"""

from __future__ import annotations

import socket
from pathlib import Path

import aiohttp
import pytest
from proxy_client import post, running_proxy
from reliability_helpers import faulty_vllm

from polar_env.backends.registry import make_backend
from polar_env.trajectory.chains import build_trajectory

REQUESTS = {  # api -> (path, body, key header) as each harness family sends it
    "chat": (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        "bearer",
    ),
    "responses": ("/v1/responses", {"model": "m", "input": "hi"}, "bearer"),
    "messages": (
        "/v1/messages",
        {"model": "m", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]},
        "x-api-key",
    ),
}


@pytest.fixture
async def double(renderer):
    async with faulty_vllm(renderer) as fault:
        yield fault


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RETRIES = 2
CONFIG = dict(max_context=2048, default_max_tokens=32, backend_retries=RETRIES, retry_backoff_s=0.01)


async def _call(http: aiohttp.ClientSession, proxy, api: str, stream: bool = False):
    sid, key = proxy.create_session()
    path, body, header = REQUESTS[api]
    status, reply = await post(
        http, f"{proxy.base_url}/s/{sid}{path}", {**body, "stream": stream}, key, header
    )
    return sid, status, reply


def _assert_api_error(api: str, status: int, reply: dict, expect_status: int) -> str:
    """The error is in the harness's own API shape, so its SDK's retry logic recognises it."""
    assert status == expect_status
    if api == "messages":
        assert reply["type"] == "error" and reply["error"]["type"] in ("api_error", "overloaded_error")
        message = reply["error"]["message"]
    else:
        assert reply["error"]["type"] == "server_error" and "param" in reply["error"]
        message = reply["error"]["message"]
    assert "inference backend failed" in message
    return message


FAULTS = [  # mode, HTTP status the harness sees, what the recorded error names
    ("500", 503, "HTTP 500"),
    ("invalid_json", 503, "invalid JSON"),
    ("truncated", 503, "invalid JSON"),
    ("timeout", 503, "timed out"),
    ("hang_mid", 503, "timed out"),
]


@pytest.mark.parametrize("api", list(REQUESTS))
@pytest.mark.parametrize("mode,http_status,recorded", FAULTS)
async def test_backend_fault_reaches_harness_in_its_api_shape_and_ledger(
    renderer, double, tmp_path: Path, api, mode, http_status, recorded
):
    double.mode = mode
    backend = make_backend("vllm", url=double.url, model="m", timeout_s=0.5)
    async with (
        running_proxy(renderer, backend, tmp_path, **CONFIG) as proxy,
        aiohttp.ClientSession() as http,
    ):
        sid, status, reply = await _call(http, proxy, api, stream=(api != "chat"))
        _assert_api_error(api, status, reply, http_status)
        assert double.hits[mode] == 1 + RETRIES  # retried, and only as often as configured
        [call] = proxy.registry.ledger.calls(sid)
        assert call.error and recorded in call.error and call.output is None
        assert call.prompt_ids  # what was asked is kept even though nothing came back


@pytest.mark.parametrize("api", list(REQUESTS))
async def test_connection_refused_is_retryable_and_recorded(renderer, tmp_path: Path, api):
    backend = make_backend("vllm", url=f"http://127.0.0.1:{_closed_port()}", model="m", timeout_s=2)
    async with (
        running_proxy(renderer, backend, tmp_path, **CONFIG) as proxy,
        aiohttp.ClientSession() as http,
    ):
        sid, status, reply = await _call(http, proxy, api)
        message = _assert_api_error(api, status, reply, 503)
        assert "Connect" in message
        [call] = proxy.registry.ledger.calls(sid)
        assert "Connect" in call.error


async def test_transient_500_is_retried_to_success(renderer, double, tmp_path: Path):
    double.mode, double.fail_first = "flaky", RETRIES
    backend = make_backend("vllm", url=double.url, model="m", timeout_s=2)
    async with (
        running_proxy(renderer, backend, tmp_path, **CONFIG) as proxy,
        aiohttp.ClientSession() as http,
    ):
        sid, status, reply = await _call(http, proxy, "chat")
        assert status == 200 and reply["choices"][0]["message"]["content"] == "Hello there"
        assert double.hits["flaky"] == RETRIES + 1
        [call] = proxy.registry.ledger.calls(sid)
        assert call.error is None and call.sampled_ids == double.answer_ids


async def test_retries_are_off_when_configured_off(renderer, double, tmp_path: Path):
    double.mode = "500"
    backend = make_backend("vllm", url=double.url, model="m", timeout_s=2)
    config = dict(max_context=2048, default_max_tokens=32, backend_retries=0)
    async with (
        running_proxy(renderer, backend, tmp_path, **config) as proxy,
        aiohttp.ClientSession() as http,
    ):
        _, status, _ = await _call(http, proxy, "responses")
        assert status == 503 and double.hits["500"] == 1


async def test_fault_mid_episode_keeps_the_partial_trajectory(renderer, double, tmp_path: Path):
    """Turn 1 answered, turn 2 fails at the backend: the trajectory is ``error`` with both calls."""
    backend = make_backend("vllm", url=double.url, model="m", timeout_s=2)
    async with (
        running_proxy(renderer, backend, tmp_path, **CONFIG) as proxy,
        aiohttp.ClientSession() as http,
    ):
        sid, key = proxy.create_session(metadata={"task_id": "t"})
        url = f"{proxy.base_url}/s/{sid}/v1/chat/completions"
        messages = [{"role": "user", "content": "hi"}]
        status, reply = await post(http, url, {"model": "m", "messages": messages}, key)
        assert status == 200
        messages += [reply["choices"][0]["message"], {"role": "user", "content": "and now?"}]
        double.mode = "500"
        status, _ = await post(http, url, {"model": "m", "messages": messages}, key)
        assert status == 503
        info = proxy.registry.close(sid, "error")
        calls = proxy.registry.ledger.calls(sid)
    traj = build_trajectory(info, calls)
    assert traj.status == "error"
    assert traj.stats.calls == 2 and traj.stats.failed_calls == 1
    assert [c.call_index for c in traj.calls] == [0, 1] and traj.calls[1].error
    assert traj.stats.trainable_tokens == len(double.answer_ids)  # turn 1's tokens are still trainable
