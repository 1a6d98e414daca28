"""The agent's own model calls are never the harness's (proxy/run_slots.py, outcomes.is_harness).

A tool process the agent runs holds the session's key and can call the proxy; the forwarder tags
such calls ``tool`` (``unknown`` where they went around it). They must not pause the episode's
deadline, take run slots ahead of harness calls, or count as evidence that the backend was slow.
"""

from __future__ import annotations

import asyncio

import pytest
from test_outcomes import three_turn, timed

from polar_env.outcomes import FailureKind, classify_episode, is_harness
from polar_env.proxy.run_slots import RunEnded, RunSlots


async def test_agent_calls_wait_behind_harness_calls_and_never_stop_the_clock():
    slots = RunSlots(1)
    assert await slots.enter("a") == 0.0  # a's harness holds the one slot
    tool_calls = [asyncio.ensure_future(slots.enter("a", harness=False)) for _ in range(4)]  # a's tool queues four
    sibling = asyncio.ensure_future(slots.enter("b"))  # b's harness comes later
    await asyncio.sleep(0.05)
    assert slots.waited_s("a") == 0.0  # the tool's waits are not a's: its deadline clock runs on
    slots.leave("a")
    await asyncio.sleep(0)
    assert sibling.done() and not any(t.done() for t in tool_calls)  # the sibling's harness call went first
    slots.leave("b")
    await asyncio.sleep(0)
    assert sum(t.done() for t in tool_calls) == 1 and slots.agent_calls["a"] == 1  # one at a time per session
    late = asyncio.ensure_future(slots.enter("c"))  # a harness call arriving now goes ahead of the rest
    await asyncio.sleep(0)
    slots.leave("a", harness=False)
    await asyncio.sleep(0)
    assert late.done() and sum(t.done() for t in tool_calls) == 1
    slots.release("a")  # a's run stage ends: its tool's queued calls fail, holding nothing
    await asyncio.sleep(0)
    assert all(isinstance(t.exception(), RunEnded) for t in tool_calls if t.done() and t.exception())
    assert sum(isinstance(t.exception(), RunEnded) for t in tool_calls if t.done() and t.exception()) == 3
    slots.leave("c")
    assert slots.busy == 0 and slots.waiting == 0 and slots.waited_s("b") > 0.0


def test_a_slow_backend_is_judged_from_harness_calls_only():
    """A wrong patch whose tool made slow calls (long prompts, max_tokens 1) up to the deadline: no harness
    call in flight, so the deadline is the harness's (graded), never the backend's (masked)."""
    calls = [timed(c, at=1000.0 + 10 * i, total_s=1.0, generate_s=1.0) for i, c in enumerate(three_turn())]
    for c in calls:
        c.sampled_ids = list(range(10))
        c.origin = "harness"
    agent = [timed(c, at=1050.0 + i, total_s=60.0, generate_s=60.0).model_copy(update={"origin": "tool"})
             for i, c in enumerate(three_turn())]
    for c in agent:
        c.sampled_ids = [1]
    kind = classify_episode("timeout", [*calls, *agent], deadline_at=1100.0)
    assert kind is FailureKind.deadline_harness and not kind.outside_policy
    # the control: the same slow calls made by the harness are the backend's
    assert classify_episode("timeout", [*calls, *[c.model_copy(update={"origin": "harness"}) for c in agent]],
                            deadline_at=1100.0) is FailureKind.deadline_backend
    assert is_harness(None) and is_harness("harness") and not is_harness("tool") and not is_harness("unknown")


@pytest.mark.parametrize("setting", ["serve", "refuse"])
async def test_agent_calls_setting(setting: str, embedded_dir, renderer, tmp_path):
    """``agent_calls=refuse`` answers a tool's call 403 in its API's shape (nothing recorded); ``serve`` answers."""
    import aiohttp

    from polar_env.backends.instant import InstantBackend
    from polar_env.proxy.app import ORIGIN_HEADER, ProxyServer
    from polar_env.proxy.engine import EngineConfig

    backend = InstantBackend(token_ids=renderer.tokenizer.encode("OK", add_special_tokens=False)
                             + renderer.eos_token_ids[:1])
    proxy = ProxyServer.create(renderer=renderer, backend=backend, data_dir=tmp_path / "d", admin_secret="s" * 24,
                               config=EngineConfig(agent_calls=setting))
    await proxy.start(port=0)
    try:
        sid, key = proxy.create_session("ep", metadata={"origin_tagged": True})
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        async with aiohttp.ClientSession() as http:
            for origin, expect in (("harness", 200), ("tool", 200 if setting == "serve" else 403)):
                headers = {"Authorization": f"Bearer {key}", ORIGIN_HEADER: f"{origin} {proxy.origin_key}"}
                async with http.post(f"{proxy.base_url}/s/{sid}/v1/chat/completions", json=body,
                                     headers=headers) as r:
                    assert r.status == expect, await r.text()
                    if expect == 403:
                        assert "agent-calls" in (await r.json())["error"]["message"]
        origins = [c.origin for c in proxy.registry.ledger.calls(sid)]
        assert origins == (["harness", "tool"] if setting == "serve" else ["harness"])
    finally:
        await proxy.stop()
