"""Each real harness CLI, in bubblewrap, against the real proxy over its Unix socket.

The backend is the scripted policy (real SmolLM2 tokenizer and model score the chosen text, so ids
and logprobs are real): the first answer is a tool call in the harness's own tool vocabulary that
edits /testbed/hello.py; once a tool result is in the prompt, a final answer. The test asserts the
file change, the exit status, the trajectory (one chain, mask over exactly the sampled tokens), that
every request stayed inside the session, and that two rollouts on two "machines" (another hostname,
user, time zone and temp path; the host kernel varied in the captured request) share their first
prompt token-for-token.
"""

from __future__ import annotations

import asyncio
import json
import platform
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import web
from polar_sandbox_helpers import clock_stopped_until, processes_matching

from polar_env.backends.local import LocalBackend
from polar_env.backends.scripted import ScriptedBackend
from polar_env.chat.template import ChatRenderer
from polar_env.harness_adapters import adapter_names, get_adapter
from polar_env.harness_adapters.policies import final_answer, offered_shell_tool, patch_edit, tool_call
from polar_env.harness_adapters.registry import NOISE_EXCLUDES
from polar_env.harness_adapters.runner import run_episode_in_sandbox
from polar_env.outcomes import FailureKind, classify_episode
from polar_env.proxy.app import ProxyServer
from polar_env.proxy.codecs import anthropic_messages, gemini_generate_content, openai_chat, openai_responses
from polar_env.proxy.engine import EngineConfig
from polar_env.sandbox.base import SandboxSpec
from polar_env.sandbox.bubblewrap import BubblewrapSandbox
from polar_env.tasks.tree import init_single_commit
from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.checks import check_trajectory
from polar_env.trajectory.ledger import Ledger

pytestmark = [pytest.mark.slow, pytest.mark.needs("bwrap", "npm")]

# Qwen Code checks a bare `sed -i` as an edit
EDIT = "cd /testbed && sed -i s/original/edited-by-agent/ hello.py"
FINAL = "Done: hello.py now says edited-by-agent."
HANG = "python3 -c 'import time; time.sleep(3600)' polar-e2e-hang"
# the same edit as a git patch, for harnesses that edit from reply text (aider)
EDIT_PATCH = """diff --git a/hello.py b/hello.py
--- a/hello.py
+++ b/hello.py
@@ -1 +1 @@
-print('original')
+print('edited-by-agent')
"""
# a patch that matches nothing: a text-editing harness asks again, and that second call never gets answered
MISS_PATCH = EDIT_PATCH.replace("-print('original')", "-print('polar-e2e-absent')")


PARALLEL = ["echo one > one.txt", "echo two > two.txt"]
HARNESSES = adapter_names()
# the deadline must pass while the tool hangs, after the first call: its clock stands still until the
# hang has begun (the tool's process runs, or the stalled model holds the harness's call), however long
# the harness's start-up took on a loaded machine, then runs this long; under every harness's own
# command timeout (Cline's 30 s, mini-SWE-agent's 60 s), so the deadline still finds the tool hanging
HANG_DEADLINE_S = 4.0


def policy(session_id: str | None, call_number: int, prompt_text: str) -> str:
    tool = offered_shell_tool(prompt_text)
    if "Loop forever" in prompt_text and tool is not None:  # a runaway: a tool call every turn
        return tool_call(tool, "echo again")
    if "<tool_response>" in prompt_text:
        return final_answer(prompt_text, FINAL)
    if tool is None:  # a harness that edits from the reply text
        return patch_edit(prompt_text, MISS_PATCH if "Hang forever" in prompt_text else EDIT_PATCH, FINAL)
    if "Two commands at once" in prompt_text:  # two tool calls in one sampled turn
        return "\n".join(tool_call(tool, c) for c in PARALLEL)
    # the hang keeps the harness's own shell tool waiting past the test's deadline (its wait_args)
    return tool_call(tool, HANG, wait=True) if "Hang forever" in prompt_text else tool_call(tool, EDIT)


class HangingScriptedBackend(ScriptedBackend):
    """A model that never answers a session's second call once the first prompt asked for a hang: the
    only hang a harness without a shell tool can meet (a test double for a stalled inference server)."""

    hanging: set[str | None]  # sessions with a call held here now

    async def generate(self, prompt_ids, sampling, *, session_id=None):
        if self.answers.calls[session_id] >= 1 and "Hang forever" in self.local.tokenizer.decode(prompt_ids):
            self.hanging.add(session_id)
            await asyncio.Event().wait()  # cancelled by the proxy's drain after the deadline
        return await super().generate(prompt_ids, sampling, session_id=session_id)


class RecordingProxy(ProxyServer):
    """The real proxy plus a middleware that notes every request path it receives (and keeps the
    bodies of model calls)."""

    seen: list[tuple[str, str]]
    bodies: list[tuple[str, bytes]]

    def app(self) -> web.Application:
        app = super().app()

        @web.middleware
        async def record(request: web.Request, handler):
            self.seen.append((request.method, request.path))
            if request.method == "POST":
                self.bodies.append((request.path, await request.read()))
            return await handler(request)

        app.middlewares.insert(0, record)
        return app


@pytest.fixture(scope="module")
def smol(embedded_dir):
    return ChatRenderer.from_pretrained(embedded_dir), LocalBackend.from_pretrained(embedded_dir)


@pytest.fixture
async def proxy(smol, tmp_path: Path):
    renderer, local = smol
    backend = HangingScriptedBackend(local, policy, context_window=256)
    backend.hanging = set()
    server = RecordingProxy.create(
        renderer=renderer,
        backend=backend,
        data_dir=tmp_path / "ledger",
        admin_secret="admin",
        config=EngineConfig(max_context=131072, default_max_tokens=256),
    )
    server.seen, server.bodies, server.model = [], [], backend
    await server.start(unix_socket=tmp_path / "sock" / "proxy.sock", port=None)
    yield server
    await server.stop()


async def rollout(
    adapter,
    proxy: RecordingProxy,
    tmp_path: Path,
    name: str,
    *,
    prompt: str = "Change original to edited in hello.py.",
    timeout_s: float = 240,
    machine: dict | None = None,
    budget: dict | None = None,
    paused_s=None,
):
    task = tmp_path / "task"
    if not task.exists():
        task.mkdir(parents=True)
        (task / "hello.py").write_text("print('original')\n")
        init_single_commit(task)  # as every task tree is (tasks/tree.py)
    sid, key = proxy.create_session(
        name,
        sampling={"temperature": 1.0, "top_p": 1.0, "max_tokens": 256},
        metadata={"task_id": "hello", "harness": adapter.name},
        budget=budget,
    )
    sock = proxy.unix_socket.parent
    sock.chmod(0o755)
    spec = SandboxSpec(
        proxy_socket_dir=sock, harness_dir=adapter.install_dir(), scratch_root=tmp_path / "scratch"
    )
    sb = BubblewrapSandbox.create(task, spec=replace(spec, **(machine or {})))
    try:
        run = await run_episode_in_sandbox(
            adapter,
            sb,
            proxy_socket_dir=sock,
            session_id=sid,
            session_key=key,
            model_name="policy",
            prompt=prompt,
            timeout_s=timeout_s,
            paused_s=paused_s,
        )
        edited = (sb.testbed / "hello.py").read_text()
        patch = (await sb.diff(NOISE_EXCLUDES)).decode()
    finally:
        await sb.destroy()
    return sid, run, edited, patch


def assert_clean_edit(
    adapter, proxy: RecordingProxy, ledger_dir: Path, sid: str, run, edited: str, patch: str
):
    """The real CLI made the edit with its own tools and exited cleanly; its calls form one chain whose
    loss mask is exactly the sampled tokens."""
    detail = (run.status, run.exit_code, run.stdout_tail[-3000:], run.stderr_tail[-3000:])
    assert run.status == "completed" and run.exit_code == 0, detail
    assert edited == "print('edited-by-agent')\n", detail
    assert "+print('edited-by-agent')" in patch
    assert not any(d in patch for d in adapter.noise_dirs), patch
    assert run.summary.tool_calls >= 1 and run.summary.final_message and FINAL in run.summary.final_message, (
        detail
    )

    ledger = Ledger(ledger_dir)
    calls = ledger.calls(sid)
    # a tool harness: the edit, then the final answer; a text-editing one: the edit is its final answer
    assert len(calls) >= (1 if adapter.text_edit else 2), [c.output for c in calls]
    traj = build_trajectory(ledger.session(sid), calls, status=run.status)
    assert check_trajectory(traj) == []
    assert len(traj.chains) == 1 and traj.chains[0].call_indices == list(range(len(calls))), [
        (ch.call_indices, ch.start_reason) for ch in traj.chains
    ]
    chain = traj.chains[0]
    sampled = set()
    for c in calls:
        start = len(c.prompt_ids)
        assert chain.input_ids[:start] == c.prompt_ids
        assert chain.input_ids[start : start + len(c.sampled_ids)] == c.sampled_ids
        sampled |= set(range(start, start + len(c.sampled_ids)))
    assert {i for i, m in enumerate(chain.loss_mask) if m} == sampled
    if adapter.text_edit:
        assert calls[-1].output.content.startswith(FINAL) and "```diff" in calls[-1].output.content
    elif adapter.finish_command:  # it ends by running that command, the final text printed after it
        assert (
            calls[0].output.tool_calls and adapter.finish_command in calls[-1].output.tool_calls[0].arguments
        )
    else:
        assert calls[0].output.tool_calls and calls[-1].output.content.strip() == FINAL


# What differs between two nodes of a cluster that a sandbox spec could still leak: hostname, user,
# time zone, the host path of the workspace (each rollout has its own tmp_path).
MACHINES = [
    {},
    {"hostname": "node-b", "user": "worker", "env": {**SandboxSpec().env, "TZ": "America/New_York"}},
]
DECODE = {
    "/v1/messages": anthropic_messages.decode,
    "/v1/responses": openai_responses.decode,
    "/v1/chat/completions": openai_chat.decode,
    "/v1beta/models/policy:streamGenerateContent": gemini_generate_content.decode,
}


def _first_difference(renderer, a: list[int], b: list[int]) -> str:
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return (
        f"differ at token {i}: {renderer.tokenizer.decode(a[i - 20 : i + 20])!r} vs "
        f"{renderer.tokenizer.decode(b[i - 20 : i + 20])!r}"
    )


@pytest.mark.parametrize("harness", HARNESSES)
async def test_real_harness_edits_through_proxy_and_two_machines_share_first_prompt_ids(
    harness, proxy: RecordingProxy, smol, tmp_path: Path
):
    """Each rollout: the real CLI in bubblewrap edits the file through the proxy and nothing else. And
    GRPO groups by first-prompt ids: samples of one task on two machines must form one group."""
    renderer, _ = smol
    adapter = get_adapter(harness)
    adapter.install()
    firsts, bodies, sids = [], [], []
    for n, machine in enumerate(MACHINES):
        sid, run, edited, patch = await rollout(
            adapter, proxy, tmp_path / f"r{n}", f"{harness}-g{n}", machine=machine
        )
        assert_clean_edit(adapter, proxy, tmp_path / "ledger", sid, run, edited, patch)
        sids.append(sid)
        firsts.append(Ledger(tmp_path / "ledger").calls(sid)[0].prompt_ids)
        bodies.append(next(b for p, b in proxy.bodies if p.startswith(f"/s/{sid}/")))
    assert proxy.seen, "the harness reached the proxy"
    outside = [(m, p) for m, p in proxy.seen if not any(p.startswith(f"/s/{sid}/") for sid in sids)]
    assert outside == [], outside
    assert firsts[0] == firsts[1], _first_difference(renderer, *firsts)

    # the host kernel cannot differ between two sandboxes on one host: vary it in the captured request
    path = next(p for p, _ in proxy.bodies if p.startswith(f"/s/{harness}-g0/"))
    decode = DECODE[path.removeprefix(f"/s/{harness}-g0")]
    kernel = platform.release()
    text = bodies[0].decode()
    if harness == "claude-code":  # its "# Environment" message carries "OS Version: Linux <uname -r>"
        assert f"OS Version: Linux {kernel}" in text
    other = json.loads(text.replace(kernel, "5.15.0-1042-azure"))
    ids = [
        renderer.render_prompt(r.conversation.messages, r.conversation.tools)
        for r in (decode(json.loads(text)), decode(other))
    ]
    assert ids[0] == firsts[0] and ids[1] == ids[0], _first_difference(renderer, ids[0], ids[1])


@pytest.mark.parametrize("harness", HARNESSES)
async def test_hung_tool_is_killed_and_partial_trajectory_kept(
    harness, proxy: RecordingProxy, tmp_path: Path
):
    adapter = get_adapter(harness)
    adapter.install()
    name = f"{harness}-hang"  # its session id
    hung = clock_stopped_until(
        lambda: bool(processes_matching("polar-e2e-hang")) or name in proxy.model.hanging
    )
    sid, run, edited, _ = await rollout(
        adapter, proxy, tmp_path, name, prompt="Hang forever.", timeout_s=HANG_DEADLINE_S, paused_s=hung
    )
    assert hung() < 300, "the hang began"
    # a call still being answered at the deadline is recorded once answered (as the episode lifecycle
    # drains it); a call the stalled model holds is never answered and is cancelled
    await proxy.drain(sid, timeout_s=1 if sid in proxy.model.hanging else 300)
    assert run.status == "timeout" and run.exit_code is None, (
        run.stdout_tail[-2000:],
        run.stderr_tail[-2000:],
    )
    assert edited == "print('original')\n"
    assert processes_matching("polar-e2e-hang") == []
    ledger = Ledger(tmp_path / "ledger")
    calls = ledger.calls(sid)
    if (
        adapter.text_edit
    ):  # the edit that missed, then the retry the model never answered (recorded as cancelled)
        assert len(calls) == 2 and calls[1].output is None and calls[1].error, [c.error for c in calls]
        assert "polar-e2e-absent" in calls[0].output.content
    else:  # the call that started the hung tool; a harness whose own command limit is shorter than the
        # deadline (Cline's is a fixed 30 s) asks again, and that call meets the stalled model: cancelled
        assert calls[0].output.tool_calls and HANG in calls[0].output.tool_calls[0].arguments, calls[0].output
        assert len(calls) <= 2 and all(c.output is None and c.error for c in calls[1:]), (
            run.duration_s,
            [c.error for c in calls],
        )
    traj = build_trajectory(ledger.session(sid), calls, status=run.status)
    assert traj.status == "timeout" and len(traj.chains) == 1 and check_trajectory(traj) == []


async def test_codex_parallel_calls_extend_the_sampled_turn(proxy: RecordingProxy, smol, tmp_path: Path):
    """Two tool calls sampled in one turn, run by the real Codex CLI: whatever order its history sends
    them back in (0.171 sends both calls, then both outputs; the interleaved call A, output A, call B,
    output B form is in test_wire_parallel.py), the next prompt is the sampled turn (both calls,
    once) followed by both outputs, token-exact."""
    renderer, _ = smol
    adapter = get_adapter("codex")
    adapter.install()
    sid, run, _, patch = await rollout(
        adapter, proxy, tmp_path, "codex-parallel", prompt="Two commands at once."
    )
    assert run.status == "completed" and run.exit_code == 0, (
        run.stdout_tail[-2000:],
        run.stderr_tail[-2000:],
    )
    assert "+one" in patch and "+two" in patch  # both calls ran
    ledger = Ledger(tmp_path / "ledger")
    c0, c1, *_ = calls = ledger.calls(sid)
    assert [tc.arguments for tc in c0.output.tool_calls] == [json.dumps({"cmd": c}) for c in PARALLEL]
    appended = c1.messages[len(c0.messages) :]
    assert [m.role for m in appended] == ["assistant", "tool", "tool"], [m.role for m in appended]
    assert [tc.id for tc in appended[0].tool_calls] == [tc.id for tc in c0.output.tool_calls]
    assert c1.parent_call_index == 0
    assert c1.prompt_ids == c0.prompt_ids + c0.sampled_ids + renderer.render_continuation(
        appended[1:], previous_ended_with_eos=True
    )
    text = renderer.tokenizer.decode(c1.prompt_ids)
    assert all(text.count(c) == 1 for c in PARALLEL), text[-1500:]
    traj = build_trajectory(ledger.session(sid), calls, status=run.status)
    assert len(traj.chains) == 1 and check_trajectory(traj) == []


async def test_runaway_harness_is_stopped_by_the_episode_budget(proxy: RecordingProxy, tmp_path: Path):
    """A policy that never stops calling tools, in the real Pi: the proxy's budget (3 calls) refuses the
    4th call in Chat Completions' error shape, Pi ends its run on it long before the deadline, and the
    episode is classified ``episode_budget``. (Gemini CLI's reaction to the same 400 is in
    test_harness_context.py; every API's refusal shape in test_proxy_budgets.py.)"""
    adapter = get_adapter("pi")
    adapter.install()
    sid, run, _, _ = await rollout(
        adapter, proxy, tmp_path, "pi-runaway", prompt="Loop forever.", timeout_s=600, budget={"max_calls": 3}
    )
    calls = Ledger(tmp_path / "ledger").calls(sid)
    detail = ([(c.call_index, c.error) for c in calls], run.status, run.stdout_tail[-1500:])
    # it ends on the refusal (the calls before it may take minutes on a loaded machine)
    assert run.status != "timeout" and run.ended_at - calls[-1].created_at < 60, detail
    assert [c.failure_kind for c in calls] == [None, None, None, FailureKind.episode_budget], detail
    assert all(c.output.tool_calls for c in calls[:3]), detail
    assert classify_episode(run.status, calls) is FailureKind.episode_budget
