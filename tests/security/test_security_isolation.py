"""Isolation between sessions and the secrecy of their keys, on one real proxy.

256 sessions talk at once, in random APIs, turn counts and pauses; the backend answers each
call by echoing the marker it finds in *that call's prompt* (real tokenizer), so a
prompt routed to the wrong session, or an answer delivered to the wrong harness, shows up by
content. Then: keys admit only their session, never appear in logs or on disk, the admin API
needs its own secret, and session ids cannot name paths outside the ledger.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import uuid
from pathlib import Path

import aiohttp
import pytest
from proxy_client import ADMIN, post, running_proxy

from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.export import TrajectoryWriter

MARK = re.compile(r"MARK-([0-9a-f]{16})-(\d+)")
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
CONFIG = dict(max_context=4096, default_max_tokens=32)


class EchoBackend:
    """Answers with the last marker of the prompt it was actually given, tokenized for real.

    Not the scripted backend: scoring 500 calls with the real model takes minutes on 2 cores and
    logprobs play no part in isolation, so every sampled token gets a constant logprob.
    """

    name = model = "echo"

    def __init__(self, renderer):
        self.tokenizer, self.eos = renderer.tokenizer, renderer.eos_token_ids[0]

    async def generate(self, prompt_ids, sampling, *, session_id=None):
        from polar_env.backends.base import Generation

        await asyncio.sleep(random.random() * 0.01)  # let calls of other sessions interleave
        found = MARK.findall(self.tokenizer.decode(prompt_ids))
        text = f"ECHO {found[-1][0]}-{found[-1][1]}" if found else "NO MARKER"
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.eos]
        return Generation(
            prompt_ids=list(prompt_ids),
            token_ids=ids,
            logprobs=[-0.1] * len(ids),
            finish_reason="stop",
            backend=self.name,
            model=self.model,
        )

    async def aclose(self) -> None:
        """Nothing to release."""


def _body(api: str, history: list[dict]) -> dict:
    if api == "chat":
        return {"model": "m", "messages": history}
    if api == "responses":
        return {"model": "m", "input": history}
    return {"model": "m", "max_tokens": 32, "messages": history}


def _answer_text(api: str, reply: dict) -> str:
    if api == "chat":
        return reply["choices"][0]["message"]["content"]
    if api == "responses":
        return "".join(
            p["text"] for item in reply["output"] if item["type"] == "message" for p in item["content"]
        )
    return "".join(b["text"] for b in reply["content"] if b["type"] == "text")


async def _harness(
    http, proxy, sid: str, key: str, secret: str, api: str, turns: int, rng: random.Random, seen: dict
) -> None:
    url = f"{proxy.base_url}/s/{sid}{PATHS[api]}"
    history: list[dict] = []
    for turn in range(turns):
        await asyncio.sleep(rng.random() * 0.2)
        history.append({"role": "user", "content": f"please echo MARK-{secret}-{turn}"})
        status, reply = await post(
            http, url, _body(api, history), key, "x-api-key" if api == "messages" else "bearer"
        )
        assert status == 200, reply
        text = _answer_text(api, reply)
        seen[sid].append(text)
        history.append({"role": "assistant", "content": text})


@pytest.mark.slow
async def test_256_interleaved_sessions_never_mix(renderer, tmp_path: Path):
    rng = random.Random(1234)
    backend = EchoBackend(renderer)
    async with (
        running_proxy(renderer, backend, tmp_path, **CONFIG) as proxy,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http,
    ):
        plan = {}
        for _ in range(256):
            sid, key = proxy.create_session()
            plan[sid] = (key, uuid.uuid4().hex[:16], rng.choice(list(PATHS)), rng.randint(1, 3))
        seen: dict[str, list[str]] = {sid: [] for sid in plan}
        await asyncio.gather(
            *(
                _harness(http, proxy, sid, key, secret, api, turns, random.Random(sid), seen)
                for sid, (key, secret, api, turns) in plan.items()
            )
        )
        for sid, (_key, secret, _api, turns) in plan.items():
            # the harness got exactly its own answers, in order
            assert seen[sid] == [f"ECHO {secret}-{t}" for t in range(turns)], sid
            calls = proxy.registry.ledger.calls(sid)
            assert [c.call_index for c in calls] == list(range(turns))
            for turn, call in enumerate(calls):
                dumped = call.model_dump_json()
                assert {m for m, _ in MARK.findall(dumped)} == {secret}  # nobody else's content
                assert call.output.content == f"ECHO {secret}-{turn}"
                assert renderer.tokenizer.decode(call.prompt_ids).count(f"MARK-{secret}-{turn}") == 1


@pytest.fixture
async def two_sessions(renderer, scripted_backend_factory, tmp_path: Path, caplog):
    caplog.set_level(logging.DEBUG)  # every logger, aiohttp's included
    backend = scripted_backend_factory(lambda *_: "fine", context_window=8)
    async with (
        running_proxy(renderer, backend, tmp_path / "data", **CONFIG) as proxy,
        aiohttp.ClientSession() as http,
    ):
        a, key_a = proxy.create_session("sess-a", metadata={"task_id": "t"})
        b, key_b = proxy.create_session("sess-b", metadata={"task_id": "t"})
        yield proxy, http, (a, key_a), (b, key_b)


@pytest.mark.parametrize("api", list(PATHS))
async def test_a_key_admits_only_its_session(two_sessions, api):
    proxy, http, (a, key_a), (b, key_b) = two_sessions
    header = "x-api-key" if api == "messages" else "bearer"
    body = _body(api, [{"role": "user", "content": "hi"}])
    for sid, key, expected in [
        (a, key_a, 200),
        (b, key_b, 200),
        (a, key_b, 401),
        (b, key_a, 401),
        (a, None, 401),
        (a, ADMIN, 401),
        (a, key_a + "x", 401),
        (a, key_a[:-1], 401),
    ]:
        status, reply = await post(http, f"{proxy.base_url}/s/{sid}{PATHS[api]}", body, key, header)
        assert status == expected, (sid, status, reply)
    assert len(proxy.registry.ledger.calls(a)) == len(proxy.registry.ledger.calls(b)) == 1


async def test_keys_never_reach_logs_or_files(two_sessions, tmp_path: Path, caplog):
    proxy, http, (a, key_a), (b, key_b) = two_sessions
    for sid, key in [(a, key_a), (b, key_b), (a, key_b)]:  # a refused attempt too
        await post(
            http,
            f"{proxy.base_url}/s/{sid}/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            key,
        )
    async with http.post(
        f"{proxy.base_url}/admin/sessions",
        json={"session_id": "sess-c"},
        headers={"Authorization": f"Bearer {ADMIN}"},
    ) as resp:
        key_c = (await resp.json())["api_key"]
    for sid in (a, b):
        proxy.registry.close(sid, "completed")
    with TrajectoryWriter(tmp_path / "data" / "trajectories.jsonl") as writer:
        for sid in (a, b):
            writer.write(build_trajectory(proxy.registry.get(sid).info, proxy.registry.ledger.calls(sid)))
    logging.getLogger("polar.proxy").debug("canary")
    assert "canary" in caplog.text  # the proxy's logger is captured (at DEBUG), so a leak would show
    logged = "\n".join(r.getMessage() + repr(r.args) for r in caplog.records) + caplog.text
    files = [p for p in (tmp_path / "data").rglob("*") if p.is_file()]
    assert any(p.name == "calls.jsonl" for p in files) and any(p.name == "trajectories.jsonl" for p in files)
    for key in (key_a, key_b, key_c):
        assert key not in logged
        for path in files:
            assert key.encode() not in path.read_bytes(), path


async def test_admin_api_needs_its_secret(two_sessions):
    proxy, http, (a, key_a), _ = two_sessions
    routes = [
        ("GET", "/admin/sessions"),
        ("POST", "/admin/sessions"),
        ("GET", f"/admin/sessions/{a}"),
        ("GET", f"/admin/sessions/{a}/calls"),
        ("POST", f"/admin/sessions/{a}/close"),
    ]
    for method, path in routes:
        for auth in (None, key_a, ADMIN + "x", "", ADMIN.upper()):
            headers = {"Authorization": f"Bearer {auth}"} if auth is not None else {}
            async with http.request(method, proxy.base_url + path, json={}, headers=headers) as resp:
                assert resp.status == 401, (method, path, auth)
    assert proxy.registry.get(a).info.status == "open"  # the refused close did nothing
    async with http.get(
        f"{proxy.base_url}/admin/sessions", headers={"Authorization": f"Bearer {ADMIN}"}
    ) as resp:
        assert resp.status == 200
        assert all("key_sha256" not in s and "api_key" not in s for s in await resp.json())


TRAVERSALS = [
    "..",
    "../evil",
    "../../etc/passwd",
    "a/b",
    "/abs",
    ".hidden",
    "a\\b",
    "a\x00b",
    "%2e%2e",
    "",
    " ",
    "a b",
    "x" * 129,
    "sessions/../../x",
]


async def test_session_ids_cannot_traverse_paths(two_sessions, tmp_path: Path):
    proxy, http, (_a, key_a), _ = two_sessions
    before = sorted(p for p in tmp_path.rglob("*"))
    for bad in TRAVERSALS:
        if bad:
            with pytest.raises(ValueError):
                proxy.create_session(bad)
        async with http.post(
            f"{proxy.base_url}/admin/sessions",
            json={"session_id": bad or 7},
            headers={"Authorization": f"Bearer {ADMIN}"},
        ) as resp:
            assert resp.status == 400, bad
    # a harness key walking up from its session path reaches no other session and no admin route
    for raw in [
        "/s/..%2F..%2Fetc/v1/chat/completions",
        "/s/%2e%2e/v1/responses",
        "/s/sess-a/../admin/sessions",
        "/s/sess-a/..%2Fsess-b/v1/responses",
        "/s/sess-a%2F..%2Fsess-b/v1/responses",
    ]:
        for method in ("GET", "POST"):
            async with http.request(
                method,
                proxy.base_url + raw,
                json={"model": "m", "input": "x"},
                headers={"Authorization": f"Bearer {key_a}"},
            ) as resp:
                assert resp.status in (401, 404, 405), (method, raw, resp.status)
    # encoded separators in admin paths name no session
    for raw in [
        "/admin/sessions/..%2Fsess-a/calls",
        "/admin/sessions/%2e%2e/calls",
        "/admin/sessions/.%2F/calls",
    ]:
        async with http.get(proxy.base_url + raw, headers={"Authorization": f"Bearer {ADMIN}"}) as resp:
            assert resp.status == 404, raw
    assert sorted(p for p in tmp_path.rglob("*")) == before  # nothing created anywhere
    assert sorted(p.name for p in (tmp_path / "data" / "sessions").iterdir()) == ["sess-a", "sess-b"]


def test_task_ids_cannot_traverse_paths():
    from pydantic import ValidationError

    from polar_env.tasks.models import Task

    base = {"repo": "r/r", "problem_statement": "p", "test_patch": "", "FAIL_TO_PASS": ["t"]}
    assert Task(instance_id="django__django-11099", **base).instance_id == "django__django-11099"
    for bad in ["../x", "..", "a/b", "/etc", ".x", "", "a\x00"]:
        with pytest.raises(ValidationError):
            Task(instance_id=bad, **base)
