"""Bad input gets the right 4xx with a message, in the shape of the API that was called."""

from __future__ import annotations

import json

import aiohttp
import pytest
from proxy_client import ADMIN, running_proxy

from polar_env.trajectory.ledger import Ledger


def _message(body):
    error = body.get("error", body)
    return error["message"] if isinstance(error, dict) else str(error)


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def proxy(renderer, scripted_backend_factory, tmp_path):
    async with running_proxy(
        renderer, scripted_backend_factory(lambda *a: "hello"), tmp_path, max_body_mb=64 / 1024
    ) as proxy:
        yield proxy


async def test_auth_routing_and_malformed_bodies(proxy):
    sid, key = proxy.create_session("alpha")
    other_sid, other_key = proxy.create_session("beta")
    url = f"{proxy.base_url}/s/{sid}/v1/chat/completions"
    async with aiohttp.ClientSession() as http:

        async def call(u, body=None, key=None, data=None, method="POST"):
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            async with http.request(method, u, json=body, data=data, headers=headers) as resp:
                return resp.status, await resp.json(content_type=None)

        status, body = await call(url, CHAT, key)
        assert status == 200 and body["choices"][0]["message"]["content"] == "hello"
        # wrong key, another session's key, no key, unknown session: 401, never auto-created
        for bad in ("nope", other_key, None):
            status, body = await call(url, CHAT, bad)
            assert status == 401 and "key" in _message(body)
        status, body = await call(f"{proxy.base_url}/s/ghost/v1/chat/completions", CHAT, key)
        assert status == 401 and "unknown session" in _message(body)
        assert proxy.registry.get("ghost") is None
        # malformed bodies
        status, body = await call(url, data=b"{not json", key=key)
        assert status == 400 and "not valid JSON" in _message(body)
        status, body = await call(url, {"model": "m"}, key)
        assert status == 400 and "messages" in _message(body)
        status, body = await call(url, [1, 2], key)
        assert status == 400
        # stateless Responses API only
        status, body = await call(
            f"{proxy.base_url}/s/{sid}/v1/responses",
            {"model": "m", "input": "hi", "previous_response_id": "resp_1"},
            key,
        )
        assert status == 400 and "previous_response_id" in _message(body)
        # unknown route
        status, body = await call(f"{proxy.base_url}/s/{sid}/v1/embeddings", {"input": "x"}, key)
        assert status == 404 and "/v1/embeddings" in _message(body)
        # oversized body
        status, body = await call(url, {**CHAT, "pad": "x" * 100_000}, key)
        assert status == 413 and "too large" in _message(body)
        # the admin API is protected
        status, body = await call(f"{proxy.base_url}/admin/sessions", {}, key)
        assert status == 401
        status, body = await call(f"{proxy.base_url}/admin/sessions", {"session_id": "../etc"}, ADMIN)
        assert status == 400 and "invalid session id" in _message(body)
        status, body = await call(f"{proxy.base_url}/admin/sessions", {"session_id": "gamma"}, ADMIN)
        assert status == 201 and body["api_key"] and body["urls"]["openai"].endswith("/s/gamma/v1")
        status, body = await call(f"{proxy.base_url}/admin/sessions", {"session_id": "gamma"}, ADMIN)
        assert status == 400 and "already exists" in _message(body)


async def test_anthropic_errors_and_extras(proxy):
    sid, key = proxy.create_session("anthro")
    base = f"{proxy.base_url}/s/{sid}"
    async with aiohttp.ClientSession() as http:
        async with http.post(
            base + "/v1/messages?beta=true", json={"model": "m", "max_tokens": 5}, headers={"x-api-key": key}
        ) as resp:
            body = await resp.json()
            assert resp.status == 400 and body["type"] == "error" and "messages" in body["error"]["message"]
        async with http.post(
            base + "/v1/messages/count_tokens",
            json={"model": "m", "messages": [{"role": "user", "content": "hello there"}]},
            headers={"x-api-key": key},
        ) as resp:
            assert resp.status == 200 and (await resp.json())["input_tokens"] > 2
        async with http.head(base) as resp:
            assert resp.status == 200
        async with http.get(base + "/v1/models", headers={"x-api-key": key}) as resp:
            assert resp.status == 200 and (await resp.json())["data"][0]["id"]


async def test_session_sampling_still_answers_to_its_old_name_policy(proxy, tmp_path):
    """Forced sampling was called ``policy`` in the admin API and in ledgers before it became
    ``sampling`` (docs/architecture.md, "Names"): both old forms still work; giving both is a 400."""
    admin = {"Authorization": f"Bearer {ADMIN}"}
    async with aiohttp.ClientSession() as http:
        for name in ("sampling", "policy"):
            body = {"session_id": f"by-{name}", name: {"temperature": 0.5}}
            async with http.post(f"{proxy.base_url}/admin/sessions", json=body, headers=admin) as resp:
                assert resp.status == 201, await resp.text()
            assert proxy.registry.get(f"by-{name}").info.sampling == {"temperature": 0.5}
        both = {"sampling": {"temperature": 0.5}, "policy": {"temperature": 0.7}}
        async with http.post(f"{proxy.base_url}/admin/sessions", json=both, headers=admin) as resp:
            assert resp.status == 400 and "old name" in _message(await resp.json())
    session_file = tmp_path / "sessions" / "by-sampling" / "session.json"
    written = json.loads(session_file.read_text())
    written["policy"] = written.pop("sampling")  # as a ledger from before the rename has it
    session_file.write_text(json.dumps(written))
    assert Ledger(tmp_path).session("by-sampling").sampling == {"temperature": 0.5}


async def test_session_metadata_is_checked_against_the_trajectorys_types(proxy):
    """A session's metadata becomes its trajectory's (``TrajectoryMetadata``): the caller's own keys pass
    as given; one of Polar's keys with the wrong type is a 400 naming it (not a trajectory that cannot be
    built when the session closes)."""
    admin = {"Authorization": f"Bearer {ADMIN}"}
    async with aiohttp.ClientSession() as http:
        body = {"session_id": "meta-ok", "metadata": {"sample": 3, "mine": {"x": [1]}}}
        async with http.post(f"{proxy.base_url}/admin/sessions", json=body, headers=admin) as resp:
            assert resp.status == 201, await resp.text()
        assert proxy.registry.get("meta-ok").info.metadata == {"sample": 3, "mine": {"x": [1]}}
        bad = {"session_id": "meta-bad", "metadata": {"sample": "third"}}
        async with http.post(f"{proxy.base_url}/admin/sessions", json=bad, headers=admin) as resp:
            assert resp.status == 400 and "metadata.sample" in _message(await resp.json())
    assert proxy.registry.get("meta-bad") is None


async def test_session_sampling_overrides_the_harness(proxy):
    sid, key = proxy.create_session("pol", sampling={"temperature": 0.7, "top_p": 0.9, "max_tokens": 16})
    async with aiohttp.ClientSession() as http:
        body = {**CHAT, "temperature": 0.1, "top_p": 0.9, "max_tokens": 500}
        async with http.post(
            f"{proxy.base_url}/s/{sid}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
        ) as resp:
            assert resp.status == 200
    (record,) = proxy.registry.ledger.calls(sid)
    assert record.sampling.temperature == 0.7 and record.sampling.top_p == 0.9
    assert record.sampling.max_tokens == 16
    assert sorted(record.overridden) == ["max_tokens", "temperature"]
    assert record.requested_sampling["temperature"] == 0.1
