"""Whatever fails inside a model call, the call is in the ledger with its reason and the harness
gets an answer in its API's shape; an episode's end waits for (or cancels) its calls in flight.

The backends here are test doubles: a proxy bug and a generation that outlives its harness cannot
be provoked on demand with a real model."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from proxy_client import running_proxy

from polar_env.backends.base import Generation, SamplingParams

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class Exploding:
    name, model = "exploding", "m"

    async def generate(self, prompt_ids, sampling: SamplingParams, *, session_id=None) -> Generation:
        raise RuntimeError("a bug in a backend")

    async def aclose(self) -> None: ...


class Slow:
    name, model = "slow", "m"

    def __init__(self, eos: int):
        self.eos = eos

    async def generate(self, prompt_ids, sampling: SamplingParams, *, session_id=None) -> Generation:
        await asyncio.sleep(3600)
        return Generation(
            prompt_ids=prompt_ids,
            token_ids=[self.eos],
            logprobs=[-0.1],
            finish_reason="stop",
            backend=self.name,
        )

    async def aclose(self) -> None: ...


async def test_an_unexpected_failure_is_recorded_and_answered_in_the_api_shape(renderer, tmp_path):
    async with running_proxy(renderer, Exploding(), tmp_path) as proxy, aiohttp.ClientSession() as http:
        sid, key = proxy.create_session("boom")
        async with http.post(
            f"{proxy.base_url}/s/{sid}/v1/chat/completions",
            json=BODY,
            headers={"Authorization": f"Bearer {key}"},
        ) as resp:
            body = await resp.json()
        assert resp.status == 500 and "RuntimeError" in body["error"]["message"]
    (record,) = proxy.registry.ledger.calls(sid)
    assert record.error == "proxy: RuntimeError: a bug in a backend" and record.prompt_ids


async def test_drain_cancels_a_call_whose_harness_is_gone_and_keeps_its_record(renderer, tmp_path):
    async with (
        running_proxy(renderer, Slow(renderer.eos_token_ids[0]), tmp_path) as proxy,
        aiohttp.ClientSession() as http,
    ):
        sid, key = proxy.create_session("gone")
        request = asyncio.ensure_future(
            http.post(
                f"{proxy.base_url}/s/{sid}/v1/chat/completions",
                json=BODY,
                headers={"Authorization": f"Bearer {key}"},
            )
        )
        while not proxy._inflight.get(sid):
            await asyncio.sleep(0.01)
        request.cancel()  # the harness was killed at its deadline
        await proxy.drain(sid, timeout_s=0.2)
        (record,) = proxy.registry.ledger.calls(sid)
        assert record.error.startswith("cancelled") and record.output is None


def test_forced_sampling_values_are_checked(renderer, tmp_path):
    from polar_env.proxy.sessions import SessionRegistry
    from polar_env.trajectory.ledger import Ledger

    registry = SessionRegistry(Ledger(tmp_path), set(renderer.eos_token_ids))
    for bad in ({"max_tokens": "lots"}, {"temperature": float("nan")}, {"top_p": -1}, {"temperature": True}):
        with pytest.raises(ValueError, match="non-negative number"):
            registry.create(sampling=bad)
    session, _ = registry.create("ok", sampling={"temperature": 0.7, "max_tokens": 64})
    closed = registry.close("ok", "timeout")
    assert registry.close("ok", "completed").status == "timeout" == closed.status
