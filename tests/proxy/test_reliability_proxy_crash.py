"""SIGKILL the proxy under load (64 concurrent multi-turn sessions), restart it on the same data
directory: every call a harness got an answer for is recovered, in its session's one token-exact
chain with the answer the harness got, the sessions that were open are marked, and they can go on
extending their chains. The proxy is the real ``polar proxy serve``
in a subprocess (instant backend, so load is the proxy's own)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
from pathlib import Path

import aiohttp
import pytest
from proxy_client import started_proxy

from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.ledger import Ledger

pytestmark = pytest.mark.slow
SECRET = "crash-test-admin"
SESSIONS = 64
ADMIN = {"Authorization": f"Bearer {SECRET}"}


async def _start_proxy(data_dir: Path) -> tuple[subprocess.Popen, str]:
    proc, line = await started_proxy(data_dir, secret=SECRET, timeout_s=120)
    match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
    assert match, line
    return proc, match.group(1)


async def _episode(
    http: aiohttp.ClientSession,
    base: str,
    sid: str,
    key: str,
    answered: list[str],
    close_after: int | None,
    contents: dict[str, str],
) -> None:
    """A harness-like loop: resend the whole history plus a new turn, until the proxy is gone."""
    url = f"{base}/s/{sid}/v1/chat/completions"
    messages = [{"role": "system", "content": f"You are agent {sid}."}]
    for turn in range(10_000):
        messages.append({"role": "user", "content": f"{sid} turn {turn}"})
        try:
            async with http.post(
                url, json={"model": "m", "messages": messages}, headers={"Authorization": f"Bearer {key}"}
            ) as resp:
                assert resp.status == 200, await resp.text()
                reply = await resp.json()
        except (TimeoutError, aiohttp.ClientError):
            return  # the proxy died: this call was never answered
        answered.append(reply["id"].removeprefix("chatcmpl-"))
        contents[answered[-1]] = reply["choices"][0]["message"]["content"]
        messages.append(reply["choices"][0]["message"])
        if close_after is not None and len(answered) == close_after:
            async with http.post(
                f"{base}/admin/sessions/{sid}/close", json={"status": "completed"}, headers=ADMIN
            ) as resp:
                assert resp.status == 200
            return


async def test_sigkill_under_load_loses_no_answered_call(tmp_path: Path):
    data = tmp_path / "data"
    proc, base = await _start_proxy(data)
    try:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=30)
        ) as http:
            keys = {}
            for i in range(SESSIONS):
                async with http.post(
                    f"{base}/admin/sessions", json={"session_id": f"ep{i:02d}"}, headers=ADMIN
                ) as resp:
                    assert resp.status == 201
                    keys[f"ep{i:02d}"] = (await resp.json())["api_key"]
            answered = {sid: [] for sid in keys}
            contents: dict[str, str] = {}  # call id -> the answer the harness got
            closed = {f"ep{i:02d}" for i in range(4)}  # these finish before the crash
            tasks = [
                asyncio.create_task(
                    _episode(http, base, sid, key, answered[sid], 2 if sid in closed else None, contents)
                )
                for sid, key in keys.items()
            ]
            while sum(map(len, answered.values())) < 600:  # well into the load
                await asyncio.sleep(0.05)
            proc.send_signal(signal.SIGKILL)
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
    finally:
        proc.kill()
        proc.wait()
    assert all(len(answered[sid]) == 2 for sid in closed)
    assert sum(len(v) > 2 for v in answered.values()) > SESSIONS // 2  # most sessions were mid-episode
    _answered_calls_are_in_their_trajectories(data, answered, contents)

    proc, base = await _start_proxy(data)
    try:
        async with aiohttp.ClientSession() as http:
            for sid in keys:
                async with http.get(f"{base}/admin/sessions/{sid}/calls", headers=ADMIN) as resp:
                    recorded = [c["call_id"] for c in await resp.json() if c["error"] is None]
                assert set(answered[sid]) <= set(recorded), sid  # nothing answered is lost
                assert len(recorded) - len(answered[sid]) <= 1  # at most the call in flight at the kill
                async with http.get(f"{base}/admin/sessions/{sid}", headers=ADMIN) as resp:
                    info = await resp.json()
                marked = info["metadata"].get("proxy_restarts")
                assert (marked is None) if sid in closed else (marked == 1 and info["status"] == "open"), info
            # a recovered session goes on: its next call extends the recovered chain token-exactly
            sid = "ep10"
            async with http.get(f"{base}/admin/sessions/{sid}/calls", headers=ADMIN) as resp:
                last = (await resp.json())[-1]
            history = [
                *({"role": m["role"], "content": m["content"]} for m in last["messages"]),
                {"role": "assistant", "content": last["output"]["content"]},
                {"role": "user", "content": "after the restart"},
            ]
            async with http.post(
                f"{base}/s/{sid}/v1/chat/completions",
                json={"model": "m", "messages": history},
                headers={"Authorization": f"Bearer {keys[sid]}"},
            ) as resp:
                assert resp.status == 200
            async with http.get(f"{base}/admin/sessions/{sid}/calls", headers=ADMIN) as resp:
                new = (await resp.json())[-1]
            assert new["parent_call_index"] == last["call_index"]
            assert (
                new["prompt_ids"][: len(last["prompt_ids"]) + len(last["sampled_ids"])]
                == last["prompt_ids"] + last["sampled_ids"]
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def _answered_calls_are_in_their_trajectories(
    data: Path, answered: dict[str, list[str]], contents: dict[str, str]
) -> None:
    """What a trainer gets from the crashed ledger: each session's trajectory holds every answered
    call, in one chain, with the tokens whose text the harness got (each prompt rebuilt from the
    compact records and checked against its SHA-256 by the ledger, then chained token-exactly)."""
    ledger = Ledger(data)
    assert not ledger.recover().all_errors
    for sid, ids in answered.items():
        calls = {c.call_id: c for c in ledger.calls(sid)}
        traj = build_trajectory(ledger.session(sid), list(calls.values()))
        in_chain = {s.chain: s for s in traj.calls if s.call_id in ids}
        assert len(traj.chains) == 1 and set(in_chain) == {0}, (sid, traj.stats.breaks)
        chain = traj.chains[0]
        lines = [
            json.loads(line) for line in (data / "sessions" / sid / "calls.jsonl").read_bytes().splitlines()
        ]
        assert all(
            len(line["appended_ids"]) < line["prompt_len"] for line in lines[1:]
        )  # each stores what it adds
        spans = {s.call_index: s for s in chain.spans if s.kind == "sampled"}
        for call_id in ids:
            record = calls[call_id]
            span = spans[record.call_index]
            assert chain.input_ids[span.start : span.end] == record.sampled_ids
            assert chain.input_ids[: span.start] == record.prompt_ids  # the whole prompt, token-exact
            assert record.output.content == contents[call_id]
