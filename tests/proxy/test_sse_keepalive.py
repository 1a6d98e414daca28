"""A streamed answer the backend is slow to produce keeps the connection alive with the API's own
keep-alive (SSE comments for Chat Completions, ``keepalive`` events for Responses, ``ping`` events
for Anthropic), so a harness's timeouts never trip: real Codex (``stream_idle_timeout_ms`` 2 s) and
real Claude Code (``API_TIMEOUT_MS`` 2 s) against a backend that takes 6 s per answer, each with a
control that fails. A real HTTP client with a read timeout checks every API's frames and the
in-stream error after the stream opened.

The slowness is a wrapper that waits before a model-free backend answers the real tokenizer's ids of
"Done.": a real model that is reliably slower than a timeout cannot be had on demand on a shared
CPU, and what is tested is the transport, not the sampling."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from proxy_client import make_proxy

from polar_env.backends.base import BackendError, Generation, SamplingParams
from polar_env.backends.instant import InstantBackend
from polar_env.harness_adapters.claude_code import ClaudeCodeAdapter
from polar_env.harness_adapters.codex import CodexAdapter
from polar_env.harness_adapters.runner import run_episode_in_sandbox
from polar_env.proxy.app import ProxyServer
from polar_env.proxy.codecs import openai_responses
from polar_env.proxy.codecs.common import SSE_COMMENT_KEEPALIVE
from polar_env.sandbox.base import SandboxSpec
from polar_env.sandbox.bubblewrap import BubblewrapSandbox

DELAY_S = 6.0
FINAL = "Done."


class SlowBackend:
    """``inner``, ``delay_s`` late (and failing instead when ``fail`` is set)."""

    def __init__(self, inner: InstantBackend, delay_s: float, *, fail: bool = False):
        self.inner, self.delay_s, self.fail = inner, delay_s, fail
        self.name, self.model = inner.name, inner.model

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Generation:
        await asyncio.sleep(self.delay_s)
        if self.fail:
            raise BackendError("the policy server went away")
        return await self.inner.generate(prompt_ids, sampling, session_id=session_id)

    async def aclose(self) -> None:
        """The wrapped backend belongs to the test."""


class ImpatientCodex(CodexAdapter):
    """Codex with a 2 s stream idle timeout and no stream retries (its provider's own settings)."""

    def config_toml(self, ctx) -> str:
        return (
            super()
            .config_toml(ctx)
            .replace(
                'wire_api = "responses"\n',
                'wire_api = "responses"\nstream_idle_timeout_ms = 2000\nstream_max_retries = 0\n',
            )
        )


class ImpatientClaude(ClaudeCodeAdapter):
    """Claude Code with a 2 s API timeout (``API_TIMEOUT_MS``) and no retries."""

    def env(self, ctx) -> dict[str, str]:
        return {**super().env(ctx), "API_TIMEOUT_MS": "2000", "CLAUDE_CODE_MAX_RETRIES": "0"}


def _proxy(
    renderer, tmp_path: Path, *, keepalive_s: float, delay_s: float = DELAY_S, fail: bool = False
) -> ProxyServer:
    done = renderer.tokenizer.encode(FINAL, add_special_tokens=False) + [
        renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    ]
    return make_proxy(
        renderer,
        SlowBackend(InstantBackend(done), delay_s, fail=fail),
        tmp_path / "ledger",
        admin_secret="admin",
        owns_backend=False,
        keepalive_s=keepalive_s,
        max_context=131072,
    )


async def _episode(adapter, renderer, work: Path, keepalive_s: float):
    proxy = _proxy(renderer, work, keepalive_s=keepalive_s)
    await proxy.start(unix_socket=work / "sock" / "proxy.sock", port=None)
    sid, key = proxy.create_session("episode", sampling={"max_tokens": 16})
    (work / "sock").chmod(0o755)
    (work / "task").mkdir()
    sandbox = BubblewrapSandbox.create(
        work / "task",
        spec=SandboxSpec(
            proxy_socket_dir=work / "sock", harness_dir=adapter.install_dir(), scratch_root=work / "scratch"
        ),
    )
    try:
        return await run_episode_in_sandbox(
            adapter,
            sandbox,
            proxy_socket_dir=work / "sock",
            session_id=sid,
            session_key=key,
            model_name="policy",
            prompt="Say done.",
            timeout_s=90,
        )
    finally:
        await sandbox.destroy()
        await proxy.stop()


@pytest.mark.slow
@pytest.mark.needs("bwrap", "npm")
@pytest.mark.parametrize("adapter", [ImpatientCodex(), ImpatientClaude()], ids=["codex", "claude-code"])
async def test_harness_timeouts_never_trip_on_a_slow_generation(
    adapter, renderer, tmp_path: Path, monkeypatch
):
    """Each control fails the way that harness's timeout works: Claude Code's covers the wait for the
    response headers (no keep-alives: headers after 6 s), Codex's the silence inside the stream
    (keep-alives as SSE comments, which its parser swallows)."""
    adapter.install()
    alive = await _episode(adapter, renderer, tmp_path / "alive", keepalive_s=0.5)
    assert alive.status == "completed" and FINAL in (alive.summary.final_message or ""), (
        alive.error,
        alive.stdout_tail[-3000:],
    )
    if adapter.name == "codex":
        monkeypatch.setattr(openai_responses, "KEEPALIVE", SSE_COMMENT_KEEPALIVE)
        control = await _episode(adapter, renderer, tmp_path / "comments", keepalive_s=0.5)
        assert "idle timeout" in control.stdout_tail, control.stdout_tail[-2000:]
    else:
        control = await _episode(adapter, renderer, tmp_path / "idle", keepalive_s=60.0)
    assert control.status != "completed", control


@pytest.mark.parametrize(
    "api, path, body, keepalive",
    [
        (
            "chat",
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}]},
            b": keep-alive\n\n",
        ),
        ("responses", "/v1/responses", {"input": "hi"}, b'event: keepalive\ndata: {"type":"keepalive"}\n\n'),
        (
            "messages",
            "/v1/messages",
            {"max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
            b'event: ping\ndata: {"type":"ping"}\n\n',
        ),
    ],
)
@pytest.mark.parametrize("fail", [False, True])
async def test_each_api_streams_its_own_keepalive_then_the_answer(
    api, path, body, keepalive, fail, renderer, tmp_path: Path
):
    """A real HTTP client with a 1.5 s read timeout against a 3 s generation: the Responses API's
    opening events at once, keep-alives every 0.5 s, then the answer (or, when the backend fails after
    the stream opened, the API's error event)."""
    proxy = _proxy(renderer, tmp_path, keepalive_s=0.5, delay_s=3.0, fail=fail)
    await proxy.start(port=0)
    sid, key = proxy.create_session("s", sampling={"max_tokens": 16})
    url = f"{proxy.base_url}/s/{sid}{path}"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(sock_read=1.5)) as http,
            http.post(
                url,
                json={"model": "policy", "stream": True, **body},
                headers={"Authorization": f"Bearer {key}", "x-api-key": key},
            ) as resp,
        ):
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
            raw = await resp.read()
    finally:
        await proxy.stop()
    frames = [frame + b"\n\n" for frame in raw.split(b"\n\n") if frame]
    opened = ("event: response.created", "event: response.in_progress") if api == "responses" else ()
    assert [f.split(b"\n")[0].decode() for f in frames[: len(opened)]] == list(
        opened
    )  # the API's own opening
    start = len(opened)
    while frames[start] == keepalive:  # then keep-alives only, until the answer is there
        start += 1
    assert start - len(opened) >= 4, raw[:300]
    rest = b"".join(frames[start:])
    events = [json.loads(line[6:]) for line in rest.decode().splitlines() if line.startswith("data: {")]
    if fail:
        error = events[-1].get("error", events[-1])
        assert "the policy server went away" in json.dumps(error), events
        assert not any("Done" in json.dumps(e) for e in events)
    else:
        assert any(FINAL in json.dumps(e) for e in events), events
