"""The agent's own model calls are never the harness's (proxy/run_slots.py, outcomes.is_harness).

A tool process the agent runs holds the session's key and can call the proxy; the forwarder tags
such calls ``tool`` (``unknown`` where they went around it). They must not pause the episode's
deadline, take run slots ahead of harness calls, or count as evidence that the backend was slow.
"""

from __future__ import annotations

import asyncio

import pytest
from trajectory_helpers import three_turn, timed

from polar_env.outcomes import FailureKind, classify_episode, is_harness
from polar_env.proxy.run_slots import RunEnded, RunSlots


async def test_agent_calls_wait_behind_harness_calls_and_never_stop_the_clock():
    slots = RunSlots(1)
    assert await slots.enter("a") == 0.0  # a's harness holds the one slot
    tool_calls = [
        asyncio.ensure_future(slots.enter("a", harness=False)) for _ in range(4)
    ]  # a's tool queues four
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
    agent = [
        timed(c, at=1050.0 + i, total_s=60.0, generate_s=60.0).model_copy(update={"origin": "tool"})
        for i, c in enumerate(three_turn())
    ]
    for c in agent:
        c.sampled_ids = [1]
    kind = classify_episode("timeout", [*calls, *agent], deadline_at=1100.0)
    assert kind is FailureKind.deadline_harness and not kind.outside_policy
    # the control: the same slow calls made by the harness are the backend's
    assert (
        classify_episode(
            "timeout",
            [*calls, *[c.model_copy(update={"origin": "harness"}) for c in agent]],
            deadline_at=1100.0,
        )
        is FailureKind.deadline_backend
    )
    assert is_harness(None) and is_harness("harness") and not is_harness("tool") and not is_harness("unknown")


@pytest.mark.parametrize("setting", ["serve", "refuse"])
async def test_agent_calls_setting(setting: str, embedded_dir, renderer, proxy_factory, tmp_path):
    """``agent_calls=refuse`` answers a tool's call 403 in its API's shape (nothing recorded); ``serve``
    answers."""
    import aiohttp

    from polar_env.backends.instant import InstantBackend
    from polar_env.proxy.app import ORIGIN_HEADER

    backend = InstantBackend(
        token_ids=renderer.tokenizer.encode("OK", add_special_tokens=False) + renderer.eos_token_ids[:1]
    )
    proxy = proxy_factory(backend, tmp_path / "d", admin_secret="s" * 24, agent_calls=setting)
    await proxy.start(port=0)
    try:
        sid, key = proxy.create_session("ep", metadata={"origin_tagged": True})
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        async with aiohttp.ClientSession() as http:
            for origin, expect in (("harness", 200), ("tool", 200 if setting == "serve" else 403)):
                headers = {"Authorization": f"Bearer {key}", ORIGIN_HEADER: f"{origin} {proxy.origin_key}"}
                async with http.post(
                    f"{proxy.base_url}/s/{sid}/v1/chat/completions", json=body, headers=headers
                ) as r:
                    assert r.status == expect, await r.text()
                    if expect == 403:
                        assert "agent-calls" in (await r.json())["error"]["message"]
        origins = [c.origin for c in proxy.registry.ledger.calls(sid)]
        assert origins == (["harness", "tool"] if setting == "serve" else ["harness"])
    finally:
        await proxy.stop()


# A tool process the agent starts: four threads keep the session's calls queued (long prompts, max_tokens 1)
# until the sandbox goes, with the key and URL the harness was given.
FLOOD = """
import json, os, threading, time, urllib.request
cfg = json.load(open(os.path.join(os.environ["PI_CODING_AGENT_DIR"], "models.json")))
url = next(iter(cfg["providers"].values()))["baseUrl"] + "/chat/completions"
headers = {"Authorization": "Bearer " + os.environ["POLAR_SESSION_KEY"], "Content-Type": "application/json"}
def loop(n):
    for i in range(10 ** 6):  # every request differs (the proxy stops a session that repeats one)
        body = json.dumps({"model": "policy", "max_tokens": 1, "messages": [
            {"role": "user", "content": f"flood {n} {i} " + "lorem ipsum " * 3000}]}).encode()
        try:
            urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=600).read()
        except Exception:
            time.sleep(0.2)
for n in range(4):
    threading.Thread(target=loop, args=(n,)).start()
"""


@pytest.mark.slow
@pytest.mark.needs("bwrap", "npm")
async def test_a_tool_process_queuing_calls_cannot_extend_its_episode(embedded_dir, renderer, tmp_path):
    """Real Pi episodes on one run slot: A's shell starts a tool process that keeps four calls queued
    (long prompts, ``max_tokens`` 1) and leaves a wrong edit, then outwaits its deadline; B, a sibling,
    applies the gold patch meanwhile. A ends within its deadline plus the drain allowance, is a
    ``deadline_harness`` graded 0 (not masked, though its tool's calls were in flight at the deadline);
    B's harness calls are served and it earns 1.0."""
    import base64

    from reliability_helpers import scripted_proxy

    from polar_env.episodes import EpisodeSettings, run_episode
    from polar_env.harness_adapters.policies import DONE, shell_call
    from polar_env.tasks.loader import load_tasks

    task = next(t for t in load_tasks("bundled") if t.instance_id == "marshmallow-code__marshmallow-1359")
    flood = base64.b64encode(FLOOD.encode()).decode()
    gold = base64.b64encode(task.patch.encode()).decode()
    commands = {
        "flood": f"cd /testbed && echo '# not a fix' >> src/marshmallow/fields.py && echo {flood} | base64 -d"
        " > /tmp/flood.py && (python3 /tmp/flood.py >/dev/null 2>&1 &) && sleep 1000",
        "sibling": f"cd /testbed && echo {gold} | base64 -d | git apply",
    }
    flooding = asyncio.Event()
    deadline_s, drain_allowance_s = 45.0, 30.0  # the drain allowance: ProxyServer.drain's default timeout

    def policy(session_id: str | None, call_number: int, prompt_text: str) -> str:
        if "flood " in prompt_text and "lorem ipsum lorem" in prompt_text:
            flooding.set()
            return "ok"
        who = "flood" if session_id and session_id.startswith("flood.") else "sibling"
        return DONE if "<tool_response>" in prompt_text else shell_call(prompt_text, commands[who])

    async with scripted_proxy(embedded_dir, renderer, policy, tmp_path) as proxy:
        proxy.engine.run_slots = RunSlots(1)

        async def episode(name: str, timeout_s: float):
            if name == "sibling":
                await asyncio.wait_for(flooding.wait(), 300)  # B's calls meet A's queue
            return await run_episode(
                proxy,
                task,
                episode_id=f"{name}.s0",
                settings=EpisodeSettings(
                    harness="pi",
                    timeout=timeout_s,
                    max_tokens=4096,
                ),
                scratch_root=tmp_path / name,
            )

        flood, sibling = await asyncio.gather(episode("flood", deadline_s), episode("sibling", 300.0))

    tool = [
        c for c in flood.calls if not is_harness(c.origin)
    ]  # ``tool``, or ``unknown`` (a detached process)
    timings = flood.trajectory.metadata.timings.model_dump()
    ran_s = timings["harness_start_s"] + timings["wait_s"] + timings["model_s"] + timings["tool_s"]
    detail = (flood.failure_kind, flood.trajectory.error, timings, len(tool))
    assert len(tool) >= 4, detail  # the tool process did call, and was served as the agent's own
    assert ran_s <= deadline_s + 5.0 and timings["drain_s"] <= drain_allowance_s + 5.0, detail
    assert flood.failure_kind is FailureKind.deadline_harness and not flood.trajectory.masked, detail
    assert flood.grade is not None and flood.grade.reward == 0.0 and flood.trajectory.reward == 0.0, detail
    deadline_at = flood.harness.ended_at
    assert any(
        c.created_at <= deadline_at
        and (c.output is None or c.created_at + c.timings.get("total_ms", 0.0) / 1e3 >= deadline_at)
        for c in tool
    ), detail  # in flight at the deadline
    assert sibling.failure_kind is FailureKind.none and sibling.grade is not None, sibling.trajectory.error
    assert sibling.grade.reward == 1.0 and not sibling.trajectory.masked
    assert all(c.output is not None for c in sibling.calls if c.origin == "harness")
