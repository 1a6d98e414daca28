"""Real Codex, Claude Code and Pi each wait out a 30 s weight-sync pause and finish their episode.

Each harness is set to give up far sooner: Codex after 2 s of silence in a stream
(``stream_idle_timeout_ms``), Claude Code after 2 s without response headers (``API_TIMEOUT_MS``),
Pi after 2 s without response headers (``retry.provider.timeoutMs`` in its settings), none of them
retrying. The fence is closed before they start; once all three calls wait at it, it stays closed
30 s, then opens with version 1. The streamed answer's headers go out at once and keep-alives follow
every 0.5 s, so each harness sees a slow answer, not a silent one. The backend is model-free (the
real tokenizer's ids of "Done."): what is tested is the transport across the pause."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from test_sse_keepalive import ImpatientClaude, ImpatientCodex

from polar_env.backends.instant import InstantBackend
from polar_env.harness_adapters.pi import PiAdapter
from polar_env.harness_adapters.runner import run_episode_in_sandbox
from polar_env.proxy.app import ProxyServer
from polar_env.sandbox.base import SandboxSpec
from polar_env.sandbox.bubblewrap import BubblewrapSandbox

PAUSE_S = 30.0
FINAL = "Done."


class ImpatientPi(PiAdapter):
    """Pi with a 2 s request timeout and no retries (its settings' ``retry`` block)."""

    def config_files(self, ctx) -> dict[str, str]:
        files = super().config_files(ctx)
        path = f"{self.agent_dir(ctx)}/settings.json"
        settings = json.loads(files[path])
        settings["retry"] = {"enabled": False, "provider": {"timeoutMs": 2000, "maxRetries": 0}}
        files[path] = json.dumps(settings, indent=2) + "\n"
        return files


async def _episode(proxy: ProxyServer, adapter, work: Path, sock: Path):
    sid, key = proxy.create_session(adapter.name, sampling={"max_tokens": 16})
    (work / "task").mkdir(parents=True)
    sandbox = BubblewrapSandbox.create(
        work / "task",
        spec=SandboxSpec(
            proxy_socket_dir=sock, harness_dir=adapter.install_dir(), scratch_root=work / "scratch"
        ),
    )
    try:
        run = await run_episode_in_sandbox(
            adapter,
            sandbox,
            proxy_socket_dir=sock,
            session_id=sid,
            session_key=key,
            model_name="policy",
            prompt="Say done.",
            timeout_s=PAUSE_S + 90,
        )
    finally:
        await sandbox.destroy()
    return sid, run


@pytest.mark.slow
@pytest.mark.needs("bwrap", "npm")
async def test_codex_claude_code_and_pi_wait_out_a_pause_longer_than_their_timeouts(
    renderer, proxy_factory, tmp_path: Path
):
    adapters = [ImpatientCodex(), ImpatientClaude(), ImpatientPi()]
    for adapter in adapters:
        adapter.install()
    done = renderer.tokenizer.encode(FINAL, add_special_tokens=False) + [
        renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    ]
    proxy = proxy_factory(
        InstantBackend(done), admin_secret="admin", keepalive_s=0.5, max_context=131072, policy_version=0
    )
    sock = tmp_path / "sock"
    await proxy.start(unix_socket=sock / "proxy.sock", port=None)
    sock.chmod(0o755)
    fence = proxy.engine.fence
    try:
        await fence.pause()
        episodes = asyncio.gather(*(_episode(proxy, a, tmp_path / a.name, sock) for a in adapters))
        deadline = time.monotonic() + 120
        while fence.state().waiting < len(adapters) and time.monotonic() < deadline and not episodes.done():
            await asyncio.sleep(0.2)
        assert fence.state().waiting == len(adapters), "not every harness reached the fence"
        await asyncio.sleep(PAUSE_S)
        window = fence.resume(1)
        results = await episodes
    finally:
        await proxy.stop()
    assert window is not None and window.held_calls >= len(adapters) and window.held_ms_max >= PAUSE_S * 1e3
    for sid, run in results:
        assert run.status == "completed" and FINAL in (run.summary.final_message or ""), (
            sid,
            run.error,
            run.stdout_tail[-3000:],
        )
        calls = sorted(proxy.registry.ledger.calls(sid), key=lambda c: c.call_index)
        assert calls and all(c.error is None for c in calls), [c.error for c in calls]
        assert calls[0].timings["fence_ms"] >= PAUSE_S * 1e3, (sid, calls[0].timings)
        assert {c.policy_version for c in calls} == {1}, sid
