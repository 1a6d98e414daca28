"""Shared by the reliability tests: a fault-injecting vLLM double and a scriptable fake harness.

The double exists because a real vLLM server cannot be told to fail on demand; the fake harness
is a real process (a stdlib Python script) run by the real runner inside the real bubblewrap
sandbox, talking HTTP to the real proxy through the real forwarder.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import ClassVar

from aiohttp import web

from polar_env.backends.logprobs_mode import PROBE_TEMPERATURE
from polar_env.harness_adapters.base import HarnessAdapter, HarnessContext, HarnessSummary, json_lines
from polar_env.harness_adapters.sources import NpmPackage


class FaultyVllm:
    """vLLM's completions endpoint with one injectable fault; counts the requests it got."""

    def __init__(self, answer_ids: list[int]):
        self.answer_ids = answer_ids
        self.mode = "ok"
        self.fail_first = 0  # with mode "flaky": this many 500s, then good answers
        self.hits = Counter()
        self.probes = 0
        self.release = asyncio.Event()  # lets hanging handlers end when the test is over

    def good(self, prompt: list[int]) -> dict:
        return {
            "model": "double",
            "choices": [
                {
                    "index": 0,
                    "prompt_token_ids": prompt,
                    "token_ids": self.answer_ids,
                    "finish_reason": "stop",
                    "logprobs": {"token_logprobs": [-0.25] * len(self.answer_ids)},
                    "stop_reason": None,
                }
            ],
        }

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("temperature") == PROBE_TEMPERATURE and body.get("max_tokens") == 1:
            self.probes += 1  # the proxy's start-up logprobs probe, not a call: a server that cannot say
            return web.Response(status=404, text="no logprobs probe here")
        self.hits[self.mode] += 1
        mode = self.mode
        if mode == "flaky":
            mode = "500" if self.hits["flaky"] <= self.fail_first else "ok"
        if mode == "ok_then_500":
            mode = "ok" if self.hits["ok_then_500"] <= 1 else "500"
        if mode == "ok":
            return web.json_response(self.good(body["prompt"]))
        if mode == "500":
            return web.Response(status=500, text="Internal Server Error: CUDA out of memory")
        if mode == "invalid_json":
            return web.Response(status=200, text="<html>proxy error</html>", content_type="application/json")
        if mode == "truncated":
            return web.Response(
                status=200, text='{"choices": [{"token_ids": [1, 2', content_type="application/json"
            )
        if mode == "timeout":  # never answers within the backend's timeout
            await _wait(self.release, 30)
            return web.json_response(self.good(body["prompt"]))
        if mode == "hang_mid":  # headers and half a body, then silence
            resp = web.StreamResponse(
                status=200, headers={"Content-Type": "application/json", "Content-Length": "4096"}
            )
            await resp.prepare(request)
            await resp.write(b'{"choices": [{"token_ids": [')
            await _wait(self.release, 30)
            return resp
        raise AssertionError(mode)


async def _wait(event: asyncio.Event, timeout: float) -> None:
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        pass


@asynccontextmanager
async def faulty_vllm(renderer) -> AsyncIterator[FaultyVllm]:
    """A FaultyVllm on 127.0.0.1 answering "Hello there" + EOS in mode ``ok``; ``.url`` is its base."""
    fault = FaultyVllm(
        renderer.tokenizer.encode("Hello there", add_special_tokens=False) + renderer.eos_token_ids[:1]
    )
    app = web.Application()
    app.router.add_post("/v1/completions", fault.completions)
    runner = web.AppRunner(app, shutdown_timeout=1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    fault.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield fault
    finally:
        fault.release.set()
        await runner.cleanup()


# The fake harness: stdlib Python inside the sandbox; MODE picks the misbehaviour. It prints one
# JSON event per model call (like the real CLIs' --json streams) so the summary can count them.
FAKE_HARNESS = r"""
import json, os, sys, time, urllib.error, urllib.request
MODE, BASE, KEY = sys.argv[1], os.environ["FAKE_BASE"], os.environ["FAKE_KEY"]

def call(text):
    body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": text}]}).encode()
    req = urllib.request.Request(BASE + "/chat/completions", body, {"Authorization": "Bearer " + KEY,
                                                                   "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status = resp.status
    except urllib.error.HTTPError as e:
        status = e.code
    print(json.dumps({"type": "call", "status": status}), flush=True)
    return status

if MODE == "crash":
    call("first turn")
    sys.stderr.write("fake-harness: segfault in tool runner\n")
    os._exit(3)
if MODE == "hang":
    call("first turn")
    if os.fork() == 0:  # an orphan that ignores SIGTERM, as stubborn tool processes do
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.setsid()
        time.sleep(3600)
    time.sleep(3600)
if MODE == "flood":
    call("first turn")
    chunk = b"x" * (1 << 20) + b"\n"
    for _ in range(int(os.environ.get("FLOOD_MB", "32"))):
        sys.stdout.buffer.write(chunk)
    sys.stdout.flush()
    print(json.dumps({"type": "done"}), flush=True)
if MODE == "retry_forever":
    while True:
        if call("again") == 200:
            pass
        time.sleep(0.05)
if MODE == "give_up":  # turn 1 fine, turn 2 gets a 5xx, the harness stops and exits 0
    call("first turn")
    call("second turn")
    print(json.dumps({"type": "done"}), flush=True)
"""


class FakeHarness(HarnessAdapter):
    """A harness adapter whose 'CLI' is FAKE_HARNESS; ``marker`` makes its processes findable."""

    name: ClassVar[str] = "fake"
    source: ClassVar[NpmPackage] = NpmPackage("none", "0", "fake")  # never installed: install() is overridden

    def __init__(self, mode: str, marker: str, install_root: Path, env: dict[str, str] | None = None):
        self.mode, self.marker, self.root, self.extra_env = mode, marker, install_root, env or {}

    def install_dir(self, root: Path | None = None) -> Path:
        d = self.root / "fake-harness"
        d.mkdir(parents=True, exist_ok=True)
        return d

    def install(self, root: Path | None = None, *, timeout_s: float = 0) -> Path:
        return self.install_dir()

    def config_files(self, ctx: HarnessContext) -> dict[str, str]:
        return {f"{ctx.home}/fake_harness.py": FAKE_HARNESS}

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {"FAKE_BASE": ctx.base_url, "FAKE_KEY": ctx.session_key, **self.extra_env}

    def command(self, ctx: HarnessContext, prompt: str) -> list[str]:
        return ["/usr/bin/python3", f"{ctx.home}/fake_harness.py", self.mode, self.marker]

    def summarize(self, stdout: str) -> HarnessSummary:
        events, bad = json_lines(stdout)
        return HarnessSummary(
            turns=sum(e.get("type") == "call" for e in events),
            finished=any(e.get("type") == "done" for e in events),
            events=len(events),
            unparsed_lines=bad,
        )


def polar_cgroups() -> set[str]:
    """Names of the per-sandbox cgroups that exist now (to prove none is left behind)."""
    found = set()
    for controller in ("memory", "pids"):
        root = Path("/sys/fs/cgroup") / controller / "polar"
        if root.is_dir():
            found |= {f"{controller}/{p.name}" for p in root.iterdir() if p.is_dir()}
    return found


async def wait_gone(pids_of, marker: str, seconds: float = 5.0) -> list[int]:
    """Poll until no host process mentions ``marker``; return what is left."""
    for _ in range(int(seconds * 10)):
        left = pids_of(marker)
        if not left:
            return []
        await asyncio.sleep(0.1)
    return pids_of(marker)


@asynccontextmanager
async def scripted_proxy(embedded_dir: Path, renderer, policy, tmp_path: Path) -> AsyncIterator:
    """The real proxy on a Unix socket under ``tmp_path/sock``, answering through a scripted
    ``policy`` (the embedded model scores its answers): for harness episodes whose commands a test picks."""
    import os

    from proxy_client import make_proxy

    from polar_env.backends.local import LocalBackend
    from polar_env.backends.scripted import ScriptedBackend

    local = LocalBackend.from_pretrained(embedded_dir)
    proxy = make_proxy(
        renderer,
        ScriptedBackend(local, policy, context_window=256),
        tmp_path / "ledger",
        admin_secret="admin",
        max_context=131072,
        default_max_tokens=4096,
    )
    await proxy.start(unix_socket=tmp_path / "sock" / "proxy.sock", port=None)
    os.chmod(tmp_path / "sock", 0o755)
    try:
        yield proxy
    finally:
        await proxy.stop()
