"""Per-episode budgets at the proxy: past ``max_calls`` or ``max_sampled_tokens`` every call is refused
with a 400 in the called API's own error shape (which no harness retries), the refused call is on
record with failure kind ``episode_budget``, and the episode is classified so.

Real proxy over real HTTP and the real tokenizer; the backend answers instantly (what it samples
does not matter here, only how many calls and tokens)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from proxy_client import ADMIN, ledger_calls, post, running_proxy

from polar_env.backends.instant import InstantBackend
from polar_env.outcomes import FailureKind, classify_episode
from polar_env.trajectory.records import CallRecord

BODIES = {
    "chat": ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    "responses": ("/v1/responses", {"model": "m", "input": "hi"}),
    "messages": (
        "/v1/messages",
        {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
    ),
    "gemini": (
        "/v1beta/models/m:generateContent",
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
    ),
}


def _message(api: str, answer: dict) -> str:
    """The error message, found where each API's own clients read it."""
    assert set(answer) == ({"type", "error"} if api == "messages" else {"error"}), answer
    error = answer["error"]
    if api == "gemini":
        assert (error["code"], error["status"]) == (400, "INVALID_ARGUMENT")
    else:
        assert error["type"] == "invalid_request_error"
    return error["message"]


@pytest.fixture
def instant(renderer):
    """Eight sampled tokens per call, the last one the end of the turn."""
    ids = renderer.tokenizer.encode("one two three four five six seven", add_special_tokens=False)[:7]
    return InstantBackend(ids + renderer.eos_token_ids[:1])


@pytest.mark.parametrize("api", list(BODIES))
async def test_calls_past_max_calls_are_refused_in_the_apis_shape(api, renderer, instant, tmp_path):
    path, body = BODIES[api]
    async with running_proxy(renderer, instant, tmp_path) as proxy, aiohttp.ClientSession() as http:
        sid, key = proxy.create_session(f"b-{api}", budget={"max_calls": 2})
        url = f"{proxy.base_url}/s/{sid}{path}"
        assert [(await post(http, url, body, key))[0] for _ in range(2)] == [200, 200]
        status, answer = await post(http, url, body, key)
        assert status == 400
        assert "episode budget exhausted: the episode's budget of 2 model calls is spent" in _message(
            api, answer
        )
        calls = await ledger_calls(http, proxy, sid)
    assert [c["failure_kind"] for c in calls] == [None, None, "episode_budget"]
    records = [CallRecord.model_validate(c) for c in calls]
    assert records[-1].output is None and records[-1].error.startswith("budget: ")
    # the harness may exit cleanly or with an error on the refusal: the proxy's budget decided the episode
    for status in ("completed", "error"):
        assert classify_episode(status, records) is FailureKind.episode_budget


async def test_the_sampled_tokens_budget_caps_the_last_call_then_refuses(renderer, instant, tmp_path):
    path, body = BODIES["chat"]
    async with running_proxy(renderer, instant, tmp_path) as proxy, aiohttp.ClientSession() as http:
        sid, key = proxy.create_session("tokens", budget={"max_sampled_tokens": 13})
        url = f"{proxy.base_url}/s/{sid}{path}"
        first = await post(http, url, body, key)
        second = await post(http, url, body, key)  # 5 tokens of room left: cut to them
        third = await post(http, url, body, key)
        calls = await ledger_calls(http, proxy, sid)
    assert (first[0], second[0], third[0]) == (200, 200, 400)
    assert second[1]["choices"][0]["finish_reason"] == "length"
    assert "budget of 13 sampled tokens is spent" in _message("chat", third[1])
    assert [len(c["sampled_ids"]) for c in calls] == [8, 5, 0]
    assert "budget:max_tokens=5" in calls[1]["flags"] and calls[1]["sampling"]["max_tokens"] == 5
    assert calls[2]["failure_kind"] == "episode_budget"


async def test_admin_api_sets_the_budget_and_refuses_a_bad_one(renderer, instant, tmp_path):
    async with running_proxy(renderer, instant, tmp_path) as proxy, aiohttp.ClientSession() as http:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        async with http.post(
            f"{proxy.base_url}/admin/sessions",
            headers=admin,
            json={"session_id": "a1", "budget": {"max_calls": 1}},
        ) as resp:
            assert resp.status == 201
            key = (await resp.json())["api_key"]
        async with http.get(f"{proxy.base_url}/admin/sessions/a1", headers=admin) as resp:
            assert (await resp.json())["budget"] == {"max_calls": 1, "max_sampled_tokens": None}
        path, body = BODIES["gemini"]
        statuses = [(await post(http, f"{proxy.base_url}/s/a1{path}", body, key))[0] for _ in range(2)]
        assert statuses == [200, 400]
        async with http.post(
            f"{proxy.base_url}/admin/sessions",
            headers=admin,
            json={"session_id": "a2", "budget": {"max_calls": 0}},
        ) as resp:
            assert resp.status == 400 and "max_calls" in (await resp.json())["error"]["message"]


class _HeldBackend(InstantBackend):
    """Holds its first answer until released, so a second call runs while the first one's
    reservation is out (a harness's side call beside its main call)."""

    def __init__(self, token_ids: list[int]):
        super().__init__(token_ids)
        self.first_started, self.release = asyncio.Event(), asyncio.Event()
        self.calls = 0

    async def generate(self, prompt_ids, sampling, *, session_id=None):
        self.calls += 1
        if self.calls == 1:
            self.first_started.set()
            await self.release.wait()
        return await super().generate(prompt_ids, sampling, session_id=session_id)


async def test_a_parallel_call_waits_for_a_reservation_instead_of_being_refused(renderer, instant, tmp_path):
    """The first call asks for more than the budget and reserves all of it; a call beside it is
    not refused for tokens nobody has sampled yet: it waits, then gets what is really left."""
    backend = _HeldBackend(instant.token_ids)
    path, body = BODIES["chat"]
    async with running_proxy(renderer, backend, tmp_path) as proxy, aiohttp.ClientSession() as http:
        sid, key = proxy.create_session("parallel", budget={"max_sampled_tokens": 12})
        url = f"{proxy.base_url}/s/{sid}{path}"
        first = asyncio.create_task(post(http, url, {**body, "max_tokens": 100}, key))
        await asyncio.wait_for(backend.first_started.wait(), 30)
        second = asyncio.create_task(post(http, url, body, key))
        await asyncio.sleep(0.3)
        assert not second.done()  # waiting on the first call's reservation, not refused
        backend.release.set()
        (s1, a1), (s2, a2) = await first, await second
        calls = await ledger_calls(http, proxy, sid)
    assert (s1, s2) == (200, 200), (a1, a2)
    assert [len(c["sampled_ids"]) for c in calls] == [8, 4]  # never past the budget of 12
    assert all(c["failure_kind"] is None for c in calls)
