"""Trajectories from real proxy traffic: real aiohttp proxy, real SmolLM2 tokenizer and model.

A scripted policy picks the assistant text (the 135M model rarely makes useful tool calls) and the
real model scores it, so ids and logprobs are real; the fidelity test samples with the model itself.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import aiohttp
import pytest
from proxy_client import ADMIN, WEATHER_TOOL, post, running_proxy
from repo_paths import TESTS

from polar_env.backends.local import LocalBackend
from polar_env.backends.scripted import ScriptedBackend
from polar_env.chat.template import ChatRenderer
from polar_env.cli import main as polar_main
from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.checks import check_group, check_nemo_result, check_trajectory, rescore
from polar_env.trajectory.export import TrajectoryWriter, to_nemo_gym_result
from polar_env.trajectory.ledger import Ledger

TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
FINAL = "It is sunny in Paris."
TITLE = "Weather in Paris"
RESULT = "sunny, 21 C"


def policy(session_id, call_number, prompt_text):
    """Two tool calls, then an answer; a title when asked for one."""
    if "title" in prompt_text.split("<|im_start|>user", 1)[0]:
        return TITLE
    return TOOL_CALL if prompt_text.count(RESULT) < 2 else FINAL


@pytest.fixture(scope="module")
def smol(embedded_dir):
    local = LocalBackend.from_pretrained(embedded_dir)
    yield ChatRenderer.from_pretrained(embedded_dir), local


def first_body(system="You are a helpful assistant.", user="What is the weather in Paris?"):
    return {
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "tools": [{"type": "function", "function": WEATHER_TOOL}],
    }


def next_body(body, reply):
    body = copy.deepcopy(body)
    answer = reply["choices"][0]["message"]
    body["messages"].append(answer)
    if answer.get("tool_calls"):
        body["messages"].append(
            {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": RESULT}
        )
    else:
        body["messages"].append({"role": "user", "content": "Thanks. And tomorrow?"})
    return body


async def run_episode(http, proxy, sid, key, turns=3, body=None):
    body = body or first_body()
    url = f"{proxy.base_url}/s/{sid}/v1/chat/completions"
    for _ in range(turns):
        status, reply = await post(http, url, body, key)
        assert status == 200, reply
        body = next_body(body, reply)
    return body


def ledger_of(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path)


async def test_three_turn_tool_session_is_one_chain(smol, tmp_path):
    renderer, local = smol
    async with (
        running_proxy(renderer, ScriptedBackend(local, policy), tmp_path) as proxy,
        aiohttp.ClientSession() as http,
    ):
        results = []
        for n in range(2):  # two rollouts of the same task: one GRPO group
            sid, key = proxy.create_session(
                f"roll{n}",
                sampling={"temperature": 1.0, "top_p": 1.0, "max_tokens": 64},
                metadata={"task_id": "weather", "group_id": "g-weather"},
            )
            await run_episode(http, proxy, sid, key)
            ledger = ledger_of(tmp_path)
            calls = ledger.calls(sid)
            traj = build_trajectory(ledger.session(sid), calls, reward=float(n))
            assert len(calls) == 3 and [c.output.tool_calls != [] for c in calls] == [True, True, False]
            assert len(traj.chains) == 1 and traj.stats.breaks == []
            chain = traj.chains[0]
            sampled = set()
            for c in calls:
                start = len(c.prompt_ids)
                assert chain.input_ids[start : start + len(c.sampled_ids)] == c.sampled_ids
                sampled |= set(range(start, start + len(c.sampled_ids)))
            assert {i for i, m in enumerate(chain.loss_mask) if m} == sampled
            assert renderer.tokenizer.decode(chain.input_ids).count(RESULT) == 2
            assert check_trajectory(traj) == []
            # the recorded logprobs are the model's: one forward pass over the chain agrees
            assert rescore(traj, local)["max_abs_diff"] < 1e-3
            result = to_nemo_gym_result(traj, responses_create_params={"input": [], "temperature": 1.0}).row()
            assert check_nemo_result(result) == []
            results.append(result)
    assert check_group(results, renderer.tokenizer) == []


async def test_compaction_and_side_call_make_three_named_chains(smol, tmp_path):
    renderer, local = smol
    async with (
        running_proxy(renderer, ScriptedBackend(local, policy), tmp_path) as proxy,
        aiohttp.ClientSession() as http,
    ):
        sid, key = proxy.create_session("frag", sampling={"max_tokens": 64})
        await run_episode(http, proxy, sid, key, turns=2)
        title = {
            "model": "m",
            "messages": [
                {"role": "system", "content": "Write a short title for the conversation."},
                {"role": "user", "content": "What is the weather in Paris?"},
            ],
        }
        await run_episode(http, proxy, sid, key, turns=1, body=title)
        compacted = first_body(user="Summary so far: you looked up the weather once. Continue.")
        await run_episode(http, proxy, sid, key, turns=2, body=compacted)
    ledger = ledger_of(tmp_path)
    traj = build_trajectory(ledger.session(sid), ledger.calls(sid), reward=1.0)
    assert [ch.call_indices for ch in traj.chains] == [[0, 1], [2], [3, 4]]
    reasons = [b.reason for b in traj.stats.breaks]
    assert "side call" in reasons[0] and "compaction" in reasons[1], reasons
    assert traj.stats.trainable_tokens == traj.stats.sampled_tokens
    assert check_trajectory(traj) == []
    result = to_nemo_gym_result(traj, responses_create_params={"input": []}).row()
    assert check_nemo_result(result) == [] and result["num_chains"] == 3


CHILD = textwrap.dedent("""
    import asyncio, json, sys
    from pathlib import Path
    sys.path[:0] = [{tests!r}, {here!r}]
    from test_trajectory_proxy_e2e import policy
    from polar_env.backends.local import LocalBackend
    from polar_env.backends.scripted import ScriptedBackend
    from polar_env.chat.template import ChatRenderer
    from polar_env.proxy.settings import ProxySettings, build_proxy

    async def main():
        model = Path({model!r})
        proxy = build_proxy(ProxySettings(max_context=2048), data_dir=Path({data!r}), admin_secret={admin!r},
                            model=(ChatRenderer.from_pretrained(model),
                                   ScriptedBackend(LocalBackend.from_pretrained(model), policy)),
                            default_max_tokens=64)
        await proxy.start("127.0.0.1", 0)
        sid, key = proxy.create_session("killed", metadata={{"task_id": "weather"}})
        print(json.dumps({{"url": proxy.base_url, "sid": sid, "key": key}}), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
""")


@pytest.mark.slow
async def test_sigkilled_proxy_restarts_with_every_answered_call(smol, embedded_dir, tmp_path):
    renderer, local = smol
    script = CHILD.format(
        tests=str(TESTS),
        here=str(Path(__file__).parent),
        model=str(embedded_dir),
        data=str(tmp_path),
        admin=ADMIN,
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        info = json.loads(child.stdout.readline())
        answered = 0
        async with aiohttp.ClientSession() as http:
            body = first_body()
            url = f"{info['url']}/s/{info['sid']}/v1/chat/completions"
            for _ in range(2):
                status, reply = await post(http, url, body, info["key"])
                assert status == 200
                answered += 1
                body = next_body(body, reply)
            child.send_signal(signal.SIGKILL)  # mid-session: the harness is about to send turn 3
            child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    # restart on the same directory: the session, its key and its calls are back
    async with (
        running_proxy(renderer, ScriptedBackend(local, policy), tmp_path) as proxy,
        aiohttp.ClientSession() as http,
    ):
        status, reply = await post(
            http, f"{proxy.base_url}/s/{info['sid']}/v1/chat/completions", body, info["key"]
        )
        assert status == 200, reply
    ledger = ledger_of(tmp_path)
    assert ledger.recover().ok
    calls = ledger.calls(info["sid"])
    assert [c.call_index for c in calls] == list(range(answered + 1))
    traj = build_trajectory(ledger.session(info["sid"]), calls)
    # the call after the restart extends the calls from before it, token-exactly
    assert len(traj.chains) == 1 and traj.chains[0].call_indices == [0, 1, 2]
    assert check_trajectory(traj) == []


async def test_polar_check_rescore_on_sampled_logprobs(smol, embedded_dir, tmp_path, capsys):
    renderer, local = smol
    async with running_proxy(renderer, local, tmp_path / "proxy") as proxy, aiohttp.ClientSession() as http:
        sid, key = proxy.create_session(
            "sampled", sampling={"temperature": 1.0, "top_p": 1.0, "max_tokens": 12}
        )
        body = {"model": "m", "messages": [{"role": "user", "content": "Name three fruits."}]}
        await run_episode(http, proxy, sid, key, turns=2, body=body)
        async with http.post(
            f"{proxy.base_url}/admin/sessions/{sid}/close", headers={"Authorization": f"Bearer {ADMIN}"}
        ) as resp:
            assert resp.status == 200
    ledger = ledger_of(tmp_path / "proxy")
    traj = build_trajectory(ledger.session(sid), ledger.calls(sid), reward=0.0)
    assert len(traj.chains) == 1 and traj.stats.trainable_tokens > 2
    path = tmp_path / "trajectories.jsonl"
    with TrajectoryWriter(path) as writer:
        writer.write(traj)
    assert polar_main(["check", str(path), "--rescore", str(embedded_dir)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "rescore:" in x)
    max_diff = float(line.split("max |diff| ")[1].split(",")[0])
    assert max_diff < 1e-3, out
