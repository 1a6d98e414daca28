"""Which weights sampled each call, and the capture rules (OpenEnv RFC 006), through a real proxy.

The policy server here is Polar's stand-in (``polar policy-server``'s aiohttp app), which serves vLLM's
``/v1/completions`` and vLLM's RL routes for the weights' label (``GET /weight_info``, ``POST
/update_weight_version``); the proxy's unmodified ``vllm`` backend talks to it over HTTP. Its model is the
``InstantBackend`` (no model: these tests are about what the proxy records, not about sampling). The same
reading against the real vLLM server is in tests/backends/test_backend_vllm.py.
"""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web
from proxy_client import running_proxy
from wire_helpers import fixture

from polar_env.backends.base import Generation
from polar_env.backends.instant import InstantBackend
from polar_env.backends.vllm import VllmBackend
from polar_env.cli.policy_server import PolicyServer
from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.checks import check_path
from polar_env.trajectory.export import TrajectoryWriter, to_nemo_gym_result, write_jsonl
from polar_env.trajectory.records import LOGPROBS_UNALIGNED, WEIGHTS_CHANGED

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def policy(renderer):
    server = PolicyServer(
        InstantBackend(renderer.encode_text("ok") + sorted(renderer.eos_token_ids)[:1]),
        model_name="polar-policy",
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def _call(proxy, sid: str, key: str, body: dict | None = None) -> dict:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{proxy.base_url}/s/{sid}/v1/chat/completions",
            json=body or CHAT,
            headers={"Authorization": f"Bearer {key}"},
        ) as resp,
    ):
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def _set_version(policy: PolicyServer, label: str) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"http://127.0.0.1:{policy.port}/update_weight_version", json={"new_version": label}
        ) as resp,
    ):
        assert resp.status == 200 and (await resp.json())["new_version"] == label


async def test_the_servers_weight_version_is_each_calls_version(renderer, policy, tmp_path):
    """No call to the proxy's admin API: the version comes from the inference server, per call, and the
    proxy's fence follows it (so --max-staleness has a version to compare)."""
    backend = VllmBackend(f"http://127.0.0.1:{policy.port}", model="polar-policy")
    async with running_proxy(renderer, backend, tmp_path) as proxy:
        sid, key = proxy.create_session("versions")
        await _call(proxy, sid, key)  # vLLM's label before any sync: "default", not a version
        await _set_version(policy, "3")
        await _call(proxy, sid, key)
        await _set_version(policy, "4")
        await _call(proxy, sid, key)
        assert proxy.engine.fence.version == 4
        calls = proxy.registry.ledger.calls(sid)
        info = proxy.registry.get(sid).info
    await backend.aclose()
    assert [c.weight_versions for c in calls] == [["default"], ["3"], ["4"]]
    assert [(c.policy_version, c.version_source) for c in calls] == [
        (None, None),
        (3, "server"),
        (4, "server"),
    ]
    traj = build_trajectory(info, calls)
    assert traj.stats.policy_versions == [3, 4] and traj.stats.unversioned_calls == 1
    with TrajectoryWriter(tmp_path / "t.jsonl") as writer:
        writer.write(traj)
    notes = " | ".join(check_path(tmp_path / "t.jsonl").notes)
    assert "policy versions 3..4 over 1 episode(s): spread within an episode max 1, 1 span an update" in notes
    assert "1 answered call(s) in 1 episode(s) unversioned" in notes


async def test_a_label_that_moves_during_a_call_counts_both_versions(renderer, policy, tmp_path):
    """A swap while the server generated (vLLM's pause mode ``keep``): the label read after differs from
    the one before; the call is flagged and both versions count in the episode's spread."""

    class Swapping(InstantBackend):
        async def generate(self, prompt_ids, sampling, *, session_id=None) -> Generation:
            await _set_version(policy, "8")  # the trainer's swap, mid-generation
            return await super().generate(prompt_ids, sampling, session_id=session_id)

    policy.backend = Swapping(policy.backend.token_ids)
    backend = VllmBackend(f"http://127.0.0.1:{policy.port}", model="polar-policy")
    async with running_proxy(renderer, backend, tmp_path) as proxy:
        await _set_version(policy, "7")  # after the proxy's start-up probe, which generates too
        sid, key = proxy.create_session("moved")
        await _call(proxy, sid, key)
        (call,) = proxy.registry.ledger.calls(sid)
        info = proxy.registry.get(sid).info
    await backend.aclose()
    assert call.weight_versions == ["7", "8"] and call.policy_version == 7 and WEIGHTS_CHANGED in call.flags
    assert build_trajectory(info, [call]).stats.policy_versions == [7, 8]


async def test_a_server_without_versions_leaves_calls_unversioned_and_check_says_so(renderer, tmp_path):
    """NeMo-RL's vLLM HTTP server has no version route (404): calls are recorded, unversioned, and
    ``polar check`` says "none recorded" rather than reporting no spread."""

    async def completions(request):
        return web.json_response(
            {
                "choices": [
                    {
                        "token_ids": [renderer.encode_text("ok")[0]],
                        "finish_reason": "length",
                        "logprobs": {"token_logprobs": [-1.0]},
                    }
                ]
            }
        )

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    backend = VllmBackend(f"http://127.0.0.1:{port}", model="m")
    try:
        async with running_proxy(renderer, backend, tmp_path) as proxy:
            sid, key = proxy.create_session("plain")
            await _call(proxy, sid, key)
            await _call(proxy, sid, key)
            calls, info = proxy.registry.ledger.calls(sid), proxy.registry.get(sid).info
    finally:
        await backend.aclose()
        await runner.cleanup()
    assert all(c.policy_version is None and c.weight_versions == [] for c in calls)
    result = to_nemo_gym_result(build_trajectory(info, calls))
    write_jsonl(tmp_path / "nemo.jsonl", [result.row()])
    notes = " | ".join(check_path(tmp_path / "nemo.jsonl").notes)
    assert "policy versions: none recorded (2 answered call(s) in 1 episode(s) unversioned" in notes
    assert "spread" not in notes


async def test_harness_narrowing_knobs_are_neutralised_and_recorded(renderer, tmp_path):
    """Gemini CLI's real first request asks top_p 0.95 and topK 64: the backend samples at top_p 1 with no
    top-k, the call records what was asked and flags it; a trainer's forced top_p is not the harness's."""
    body = fixture("gemini.req1")["body"]
    async with running_proxy(
        renderer,
        InstantBackend(renderer.encode_text("ok")),
        tmp_path,
        max_context=32768,
        default_max_tokens=64,
    ) as proxy:
        sid, key = proxy.create_session("gemini")
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{proxy.base_url}/s/{sid}/v1beta/models/polar:generateContent",
                json=body,
                headers={"x-goog-api-key": key},
            ) as resp,
        ):
            assert resp.status == 200, await resp.text()
        forced, forced_key = proxy.create_session("forced", sampling={"top_p": 0.9})
        await _call(proxy, forced, forced_key, {**CHAT, "top_p": 0.5, "top_k": 20})
        (call,) = proxy.registry.ledger.calls(sid)
        (trainer,) = proxy.registry.ledger.calls(forced)
        traj = build_trajectory(proxy.registry.get(sid).info, [call])
    assert call.requested_sampling["top_p"] == 0.95 and call.requested_sampling["top_k"] == 64
    assert call.sampling.top_p == 1.0 and "neutralised:top_p,top_k" in call.flags
    assert traj.calls[0].requested_sampling["top_k"] == 64 and traj.calls[0].sampling["top_p"] == 1.0
    assert (
        trainer.sampling.top_p == 0.9 and "neutralised:top_k" in trainer.flags
    )  # the trainer's choice stands


async def test_a_turn_without_aligned_logprobs_is_context_and_counted(renderer, tmp_path):
    """Test double: no server at hand sends sampled ids without their logprobs, so a backend drops them on
    the second call. The harness still gets its answer; the turn is context (mask 0), counted, checked."""
    ids = renderer.encode_text("ok")

    class Dropping(InstantBackend):
        calls = 0

        async def generate(self, prompt_ids, sampling, *, session_id=None) -> Generation:
            gen = await super().generate(prompt_ids, sampling, session_id=session_id)
            Dropping.calls += 1
            return gen.model_copy(update={"logprobs": []}) if Dropping.calls == 2 else gen

    async with running_proxy(renderer, Dropping(ids), tmp_path) as proxy:
        sid, key = proxy.create_session("unaligned")
        first = await _call(proxy, sid, key)
        history = [*CHAT["messages"], first["choices"][0]["message"], {"role": "user", "content": "more"}]
        second = await _call(proxy, sid, key, {**CHAT, "messages": history})
        assert second["choices"][0]["message"]["content"]  # answered all the same
        calls, info = proxy.registry.ledger.calls(sid), proxy.registry.get(sid).info
    assert LOGPROBS_UNALIGNED in calls[1].flags and LOGPROBS_UNALIGNED not in calls[0].flags
    traj = build_trajectory(info, calls)
    (chain,) = traj.chains
    unscored = [s for s in chain.spans if s.kind == "unscored"]
    assert [s.call_index for s in unscored] == [1] and traj.stats.context_only_turns == 1
    assert not any(chain.loss_mask[unscored[0].start : unscored[0].end])
    assert traj.stats.trainable_tokens == len(ids)  # the first turn still trains
    with TrajectoryWriter(tmp_path / "t.jsonl") as writer:
        writer.write(traj)
    assert any(
        "1 turn(s) in 1 episode(s) had no aligned logprobs" in n
        for n in check_path(tmp_path / "t.jsonl").notes
    )
    assert to_nemo_gym_result(traj).row()["context_only_turns"] == 1
