"""`polar proxy serve --workers 2`, the real command over real HTTP: the front spreads sessions
over the workers, each worker answers and records only its own sessions, keys admit only their
session on every port, the admin API reaches every session through the front, and a restart
recovers each worker's sessions from its directory. Instant backend: the proxy alone."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
from pathlib import Path

import aiohttp
import psutil
import pytest
from proxy_client import serve_proxy, started_proxy

from polar_env.trajectory.ledger import Ledger

pytestmark = pytest.mark.slow
SECRET = "workers-test-admin"
ADMIN = {"Authorization": f"Bearer {SECRET}"}
SESSIONS = 8
TURNS = 3


async def _start(data_dir: Path) -> tuple[subprocess.Popen, str, list[str]]:
    proc, line = await started_proxy(data_dir, "--workers", "2", secret=SECRET)
    match = re.search(r"listening on (http://127\.0\.0\.1:\d+) \(admin API; 2 workers: (\S+) (\S+)\)", line)
    assert match, line
    return proc, match.group(1), [match.group(2), match.group(3)]


def _worker_pids(proc: subprocess.Popen) -> list[int]:
    """The front's worker processes (not multiprocessing's resource tracker)."""
    return [p.pid for p in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(p.cmdline())]


async def _episode(http: aiohttp.ClientSession, url: str, key: str) -> list[str]:
    messages = [{"role": "system", "content": "You are an agent."}]
    ids = []
    for turn in range(TURNS):
        messages.append({"role": "user", "content": f"turn {turn} of {url}"})
        async with http.post(
            f"{url}/chat/completions",
            json={"model": "m", "messages": messages},
            headers={"Authorization": f"Bearer {key}"},
        ) as resp:
            assert resp.status == 200, await resp.text()
            reply = await resp.json()
        messages.append(reply["choices"][0]["message"])
        ids.append(reply["id"].removeprefix("chatcmpl-"))
    return ids


async def test_sessions_spread_over_worker_processes(tmp_path: Path):
    data = tmp_path / "data"
    proc, front, workers = await _start(data)
    try:
        worker_pids = _worker_pids(proc)
        assert len(worker_pids) == 2
        async with aiohttp.ClientSession() as http:
            sessions = {}
            for i in range(SESSIONS):
                async with http.post(
                    f"{front}/admin/sessions", json={"session_id": f"ep{i}"}, headers=ADMIN
                ) as resp:
                    assert resp.status == 201
                    body = await resp.json()
                sessions[body["session_id"]] = (body["api_key"], body["urls"]["openai"])
            async with http.post(
                f"{front}/admin/sessions", json={"session_id": "ep0"}, headers=ADMIN
            ) as resp:
                assert resp.status == 400 and "already exists" in (await resp.json())["error"]["message"]
            owner = {
                sid: next(w for w in workers if url.startswith(w + "/")) for sid, (_, url) in sessions.items()
            }
            assert sorted(list(owner.values()).count(w) for w in workers) == [SESSIONS // 2] * 2  # balanced

            answered = await asyncio.gather(*(_episode(http, url, key) for key, url in sessions.values()))

            # a key admits only its session, on every port; the front serves no model call
            (a, (key_a, url_a)), (b, (key_b, _)) = list(sessions.items())[:2]
            other = next(w for w in workers if w != owner[a])
            for url, key in (
                (url_a, key_b),
                (f"{other}/s/{a}/v1", key_a),
                (f"{owner[b]}/s/{a}/v1", "pk-nope"),
            ):
                async with http.get(f"{url}/models", headers={"Authorization": f"Bearer {key}"}) as resp:
                    assert resp.status == 401, url
            async with http.get(
                f"{front}/s/{a}/v1/models", headers={"Authorization": f"Bearer {key_a}"}
            ) as resp:
                assert resp.status == 404 and "session's own urls" in (await resp.json())["error"]["message"]
            async with http.get(f"{front}/admin/sessions") as resp:
                assert resp.status == 401

            # the admin API reaches each session through the front
            async with http.get(f"{front}/admin/sessions", headers=ADMIN) as resp:
                assert sorted(s["session_id"] for s in await resp.json()) == sorted(sessions)
            for sid, ids in zip(sessions, answered, strict=True):
                async with http.get(f"{front}/admin/sessions/{sid}/calls", headers=ADMIN) as resp:
                    calls = await resp.json()
                assert [c["call_id"] for c in calls] == ids
                assert [c["parent_call_index"] for c in calls] == [None, 0, 1]  # one chain

            # the policy version and the weight-sync fence reach every worker through the front
            async with http.post(f"{front}/admin/policy", json={"version": 5}, headers=ADMIN) as resp:
                assert resp.status == 200
            async with http.post(f"{front}/admin/pause", json={}, headers=ADMIN) as resp:
                assert resp.status == 200 and all(
                    w["answer"]["drained"] for w in (await resp.json())["workers"]
                )
            for worker in workers:
                async with http.get(f"{worker}/admin/policy", headers=ADMIN) as resp:
                    state = await resp.json()
                assert state["version"] == 5 and state["paused"], worker
            async with http.post(f"{front}/admin/resume", json={"version": 6}, headers=ADMIN) as resp:
                answers = (await resp.json())["workers"]
            assert [w["answer"]["version"] for w in answers] == [6, 6]

            async with http.post(
                f"{front}/admin/sessions/{a}/close", json={"status": "completed"}, headers=ADMIN
            ) as resp:
                assert resp.status == 200 and (await resp.json())["status"] == "completed"
            async with http.get(f"{front}/admin/sessions/nope", headers=ADMIN) as resp:
                assert resp.status == 404
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    assert proc.returncode == 0
    assert not any(
        psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in worker_pids
    )

    # every call is in its owner's ledger, and only there
    for k, worker in enumerate(workers):
        ledger = Ledger(data / f"worker-{k}")
        assert sorted(s.session_id for s in ledger.sessions()) == sorted(
            s for s in sessions if owner[s] == worker
        )
        for sid in (s for s in sessions if owner[s] == worker):
            assert len(ledger.calls(sid)) == TURNS

    # a one-process proxy refuses the directory rather than serve it without those sessions
    refused = serve_proxy(data, secret=SECRET)
    assert refused.wait(120) == 2
    assert "start with the --workers it was served with" in refused.stdout.read()

    # a restart recovers every session into the worker that owns it; SIGKILL of the front stops the workers
    proc, front, workers = await _start(data)
    try:
        worker_pids = _worker_pids(proc)
        async with aiohttp.ClientSession() as http:
            for sid, ids in zip(sessions, answered, strict=True):
                async with http.get(f"{front}/admin/sessions/{sid}/calls", headers=ADMIN) as resp:
                    assert [c["call_id"] for c in await resp.json()] == ids
    finally:
        proc.kill()
        proc.wait()
    _, alive = psutil.wait_procs(
        [psutil.Process(pid) for pid in worker_pids if psutil.pid_exists(pid)], timeout=60
    )
    assert not alive
