"""The policy version every call records and the weight-sync fence, over real HTTP (proxy/policy.py).

A session's calls carry the version that sampled them; a pause holds new calls (streamed ones get
keep-alives, then the answer) while the call in flight finishes with the old version, or is aborted,
recorded and sampled again with the new one; the admin bodies are typed (400 naming the field); a
pause nobody resumes opens by itself. The backend is model-free and slow on purpose (the tokenizer
is real): what is tested is the fence, not the sampling."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
from proxy_client import ADMIN, running_proxy

from polar_env.backends.instant import InstantBackend
from polar_env.proxy.policy import Admission, PolicyFence
from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.export import grpo_rows, to_nemo_gym_result
from polar_env.trajectory.sft import sft_rows


class SlowBackend:
    """``InstantBackend``, ``delay_s`` late: a generation that is in flight when the fence closes."""

    def __init__(self, inner: InstantBackend, delay_s: float):
        self.inner, self.delay_s = inner, delay_s
        self.name, self.model = inner.name, inner.model
        self.started = 0

    async def generate(self, prompt_ids, sampling, *, session_id=None):
        self.started += 1
        await asyncio.sleep(self.delay_s)
        return await self.inner.generate(prompt_ids, sampling, session_id=session_id)

    async def aclose(self) -> None:
        """The wrapped backend belongs to the test."""


def _backend(renderer, delay_s: float) -> SlowBackend:
    ids = renderer.tokenizer.encode("Done.", add_special_tokens=False) + list(renderer.eos_token_ids)[:1]
    return SlowBackend(InstantBackend(ids), delay_s)


ADMIN_H = {"Authorization": f"Bearer {ADMIN}"}


async def _chat(http, proxy, sid, key, text: str, stream: bool = False):
    async with http.post(
        f"{proxy.base_url}/s/{sid}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "m", "stream": stream, "messages": [{"role": "user", "content": text}]},
    ) as r:
        return r.status, await r.read()


async def test_calls_carry_the_version_and_the_fence_holds_new_calls(renderer, tmp_path: Path):
    backend = _backend(renderer, 1.0)
    async with (
        running_proxy(
            renderer,
            backend,
            tmp_path,
            keepalive_s=0.2,
            max_context=2048,
            default_max_tokens=8,
            policy_version=0,
        ) as proxy,
        aiohttp.ClientSession() as http,
    ):
        sid, key = proxy.create_session("ep")
        assert (await _chat(http, proxy, sid, key, "first"))[0] == 200
        in_flight = asyncio.ensure_future(_chat(http, proxy, sid, key, "second"))
        while backend.started < 2:
            await asyncio.sleep(0.01)
        async with http.post(f"{proxy.base_url}/admin/pause", headers=ADMIN_H, json={"timeout_s": 30}) as r:
            pause = await r.json()
        assert r.status == 200 and pause["drained"] and pause["in_flight"] == 1 and pause["drain_ms"] > 500, (
            pause
        )
        assert (await in_flight)[0] == 200  # it finished, with the old version (below)
        held = asyncio.ensure_future(_chat(http, proxy, sid, key, "third", stream=True))
        await asyncio.sleep(1.5)
        assert not held.done() and backend.started == 2  # waiting at the fence, not generating
        async with http.post(f"{proxy.base_url}/admin/resume", headers=ADMIN_H, json={"version": 1}) as r:
            resumed = await r.json()
        status, body = await held
        assert status == 200 and b": keep-alive" in body and b"Done." in body, body[:300]
        window = resumed["window"]
        assert window["held_calls"] == 1 and window["held_ms_max"] > 1000 and window["version_after"] == 1, (
            window
        )
        async with http.get(f"{proxy.base_url}/admin/policy", headers=ADMIN_H) as r:
            state = await r.json()
        assert state["version"] == 1 and not state["paused"] and len(state["windows"]) == 1
        calls = sorted(proxy.registry.ledger.calls(sid), key=lambda c: c.call_index)
    assert [c.policy_version for c in calls] == [0, 0, 1]
    # the wait is timed apart: the held call's generation took what the unheld one's did
    assert (
        calls[2].timings["fence_ms"] > 1000
        and calls[2].timings["generate_ms"] < calls[1].timings["generate_ms"] + 500
    )
    traj = build_trajectory(proxy.registry.get(sid).info, calls, reward=1.0)
    assert traj.stats.policy_versions == [0, 1]  # the episode spans the update
    assert [c.policy_version for c in traj.calls] == [0, 0, 1]
    result = to_nemo_gym_result(traj).row()
    assert result["policy_version_spread"] == 1 and result["polar"]["policy_versions"] == [0, 1]
    carriers = [item for item in result["response"]["output"] if "generation_token_ids" in item]
    assert [item["policy_version"] for item in carriers] == [0]  # the main chain: the first call's
    rows = grpo_rows([traj])
    assert sorted(v for row in rows for v in row["policy_versions"]) == [0, 0, 1]
    assert all("policy_versions" in row for row in sft_rows([traj], "trl-sft", only_resolved=False))


async def test_abort_records_the_attempt_and_samples_again_after_the_swap(renderer, tmp_path: Path):
    backend = _backend(renderer, 2.0)
    async with (
        running_proxy(
            renderer,
            backend,
            tmp_path,
            max_context=2048,
            default_max_tokens=8,
            policy_version=3,
        ) as proxy,
        aiohttp.ClientSession() as http,
    ):
        sid, key = proxy.create_session("ep")
        call = asyncio.ensure_future(_chat(http, proxy, sid, key, "hello"))
        while backend.started < 1:
            await asyncio.sleep(0.01)
        async with http.post(
            f"{proxy.base_url}/admin/pause", headers=ADMIN_H, json={"in_flight": "abort"}
        ) as r:
            pause = await r.json()
        assert pause["aborted"] == 1 and pause["drained"] and pause["drain_ms"] < 1000, pause
        async with http.post(f"{proxy.base_url}/admin/resume", headers=ADMIN_H, json={"version": 4}) as r:
            assert r.status == 200
        status, body = await call
        [record] = proxy.registry.ledger.calls(sid)
    assert status == 200 and b"Done." in body  # the harness saw a slower answer, not an error
    assert backend.started == 2 and record.policy_version == 4 and "fence_aborted" in record.flags


async def test_admin_bodies_are_typed_and_a_forgotten_pause_opens_itself(renderer, tmp_path: Path):
    async with (
        running_proxy(renderer, _backend(renderer, 0.0), tmp_path) as proxy,
        aiohttp.ClientSession() as http,
    ):
        for path, body, field in [
            ("/admin/policy", {"version": -1}, "version"),
            ("/admin/policy", {"versoin": 2}, "versoin"),
            ("/admin/pause", {"in_flight": "kill"}, "in_flight"),
            ("/admin/resume", {"version": "x"}, "version"),
        ]:
            async with http.post(proxy.base_url + path, headers=ADMIN_H, json=body) as r:
                assert r.status == 400 and field in (await r.json())["error"]["message"], (path, body)
        async with http.post(proxy.base_url + "/admin/pause", json={}) as r:
            assert r.status == 401
        async with http.post(proxy.base_url + "/admin/pause", headers=ADMIN_H, json={"timeout_s": 0.3}) as r:
            assert r.status == 200
        assert proxy.engine.fence.paused
        await asyncio.sleep(0.6)
        assert not proxy.engine.fence.paused and proxy.engine.fence.windows[-1].timed_out


async def test_the_open_fence_costs_next_to_nothing():
    """The per-call price of the open fence: a few hundred nanoseconds, against milliseconds a call."""
    fence = PolicyFence(0)

    async def generation() -> int:
        return 1

    n = 20000
    started = time.perf_counter()
    for _ in range(n):
        await fence.generate(generation)
    fenced = (time.perf_counter() - started) / n
    started = time.perf_counter()
    for _ in range(n):
        await generation()
    bare = (time.perf_counter() - started) / n
    assert fenced - bare < 20e-6, (fenced, bare)


async def test_admission_bounds_staleness_and_never_holds_a_started_episode():
    """K = 1, two episodes a step: four start at version 0; the fifth waits for version 1."""
    fence = PolicyFence(0)
    admission = Admission(fence, max_staleness=1, per_step=2)
    assert [await admission.admit() for _ in range(4)] == [0, 0, 0, 0]
    fifth = asyncio.ensure_future(admission.admit())
    await asyncio.sleep(0.2)
    assert not fifth.done() and admission.lag(4) == 2
    fence.set_version(1)
    assert await fifth == 1 and admission.waited_ms >= 150
    sixth = asyncio.ensure_future(admission.admit())
    await asyncio.sleep(0)
    assert (await sixth) == 1  # the same step as the fifth: no wait
