"""`polar view` on real trajectories, checked as data and in a real headless Chromium.

Fast tests build ledger records of a short coding episode with the real SmolLM2 tokenizer and
Polar's chat template (prompts rendered, answers encoded, continuations token-exact) and run
them through ``build_trajectory``. The slow Chromium test drives the same episode through the real
proxy with a scripted policy whose answers the real model scores, so ids, chains and logprobs are
the proxy's own; it checks the page over the DevTools protocol: no console error or exception, no
network request, the episode rows, a rendered chain, a hover tooltip, and a screenshot.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from proxy_client import post, running_proxy
from repo_paths import REPO

from polar_env.backends.local import LocalBackend
from polar_env.backends.scripted import ScriptedBackend
from polar_env.chat.messages import AssistantTurn, Message, ToolCall, ToolSpec
from polar_env.chat.template import ChatRenderer
from polar_env.cli import main as polar_main
from polar_env.cli.view import PageSource, start_server
from polar_env.rewards.grading import FailureKind, GradeResult
from polar_env.rewards.patch import ApplyMethod
from polar_env.rollout.outputs import summarize
from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.export import TrajectoryWriter, grpo_rows, write_jsonl
from polar_env.trajectory.ledger import Ledger
from polar_env.trajectory.models import Trajectory
from polar_env.trajectory.records import CallRecord, SessionInfo
from polar_env.viewer.tokens import TokenText

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

BASH_TOOL = {
    "name": "bash",
    "description": "Run a shell command in the repository",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}
SOURCE = 'def add(a, b):\n    """Return the sum — café ✓."""\n    return a - b\n'
SCRIPT = [  # (assistant text, tool result) for each turn of the coding episode
    (
        "Let me read the code first.\n<tool_call>\n"
        + json.dumps({"name": "bash", "arguments": {"command": "cat calc.py"}})
        + "\n</tool_call>",
        SOURCE,
    ),
    (
        "The bug: add() subtracts.\n<tool_call>\n"
        + json.dumps({"name": "bash", "arguments": {"command": "sed -i 's/a - b/a + b/' calc.py"}})
        + "\n</tool_call>",
        "",
    ),
    (
        "<tool_call>\n"
        + json.dumps({"name": "bash", "arguments": {"command": "python -m pytest -q tests"}})
        + "\n</tool_call>",
        "..\n2 passed in 0.01s",
    ),
    ("Fixed add() in calc.py: it now returns a + b, and both tests pass.", None),
]
TITLE = "Fix add() in calc.py"


def policy(session_id, call_number, prompt_text):
    """The coding script, turn by turn; a title when the harness asks for one."""
    if "Write a title" in prompt_text:
        return TITLE
    return SCRIPT[min(prompt_text.count("<tool_response>"), len(SCRIPT) - 1)][0]


def grading(resolved: bool) -> dict:
    result = GradeResult(
        instance_id="calc__add-1",
        resolved=resolved,
        reward=1.0 if resolved else 0.0,
        failure_kind=FailureKind.none,
        patch_applied=True,
        apply_method=ApplyMethod.git_apply,
        fail_to_pass={"tests/test_calc.py::test_add": "PASSED" if resolved else "FAILED"},
        pass_to_pass={"tests/test_calc.py::test_sub": "PASSED"},
        log_tail="tests/test_calc.py::test_add " + ("PASSED" if resolved else "FAILED"),
        flags=[] if resolved else ["reset:test"],
        flag_evidence={} if resolved else {"reset:test": "tests/test_calc.py"},
    )
    return result.model_dump(mode="json")


async def _episode(http, proxy, sid, key, turns, *, user="Fix the bug in calc.py: add() is wrong."):
    body = {
        "model": "smol",
        "tools": [{"type": "function", "function": BASH_TOOL}],
        "messages": [
            {"role": "system", "content": "You are a coding agent. Use the bash tool."},
            {"role": "user", "content": user},
        ],
    }
    url = f"{proxy.base_url}/s/{sid}/v1/chat/completions"
    for turn in range(turns):
        status, reply = await post(http, url, body, key)
        assert status == 200, reply
        answer = reply["choices"][0]["message"]
        body = copy.deepcopy(body)
        body["messages"].append(answer)
        if answer.get("tool_calls"):
            result = SCRIPT[turn][1]
            body["messages"].append(
                {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": result}
            )


async def _title(http, proxy, sid, key):
    body = {
        "model": "smol",
        "messages": [
            {"role": "system", "content": "Write a title for this conversation."},
            {"role": "user", "content": "Fix the bug in calc.py"},
        ],
    }
    status, reply = await post(http, f"{proxy.base_url}/s/{sid}/v1/chat/completions", body, key)
    assert status == 200, reply


def coding_records(
    renderer: ChatRenderer,
    sid: str,
    turns: int,
    *,
    start: int = 0,
    user: str = "Fix the bug in calc.py: add() is wrong.",
) -> list[CallRecord]:
    """Ledger records of ``turns`` turns of SCRIPT, as the proxy would write them (a new chain from
    call ``start``): each prompt extends the previous prompt + answer by the rendered tool result."""
    tok = renderer.tokenizer
    tools = [ToolSpec(**BASH_TOOL)]
    messages = [
        Message(role="system", content="You are a coding agent. Use the bash tool."),
        Message(role="user", content=user),
    ]
    prompt = renderer.render_prompt(messages, tools)
    records = []
    for k in range(turns):
        text, result = SCRIPT[k]
        content, _, call = text.partition("<tool_call>")
        calls = []
        if call:
            parsed = json.loads(call.replace("</tool_call>", ""))
            calls = [
                ToolCall(id=f"call_{sid}_{k}", name=parsed["name"], arguments=json.dumps(parsed["arguments"]))
            ]
        sampled = tok.encode(text, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
        index = start + k
        records.append(
            CallRecord(
                session_id=sid,
                call_index=index,
                call_id=f"{sid}-c{index}",
                api="chat",
                created_at=1000.0 + index,
                messages=list(messages),
                prompt_ids=list(prompt),
                sampled_ids=sampled,
                logprobs=[-0.4 * (j % 9) for j in range(len(sampled))],
                output=AssistantTurn(
                    call_id=f"{sid}-c{index}",
                    content=content.strip(),
                    tool_calls=calls,
                    finish_reason="tool_calls" if calls else "stop",
                ),
                finish_reason="stop",
                parent_call_index=index - 1 if k else None,
                reused_prefix_len=0,
                break_reason=None
                if k
                else ("first call" if index == 0 else "history rewritten (compaction)"),
                backend="local",
                model="SmolLM2-135M-Instruct",
            )
        )
        appended = [Message(role="tool", tool_call_id=calls[0].id, content=result)] if calls else []
        messages += [Message(role="assistant", content=content.strip(), tool_calls=calls), *appended]
        prompt = prompt + sampled + renderer.render_continuation(appended, previous_ended_with_eos=True)
    return records


@pytest.fixture(scope="module")
def record_episodes(embedded_dir) -> list[Trajectory]:
    """Three rollouts of one task from ledger records: resolved in one chain, unresolved with a
    compaction (two chains), and a timeout after one call."""
    renderer = ChatRenderer.from_pretrained(embedded_dir)
    out = []
    for n, calls in enumerate(
        [
            coding_records(renderer, "calc-roll0", 4),
            coding_records(renderer, "calc-roll1", 2)
            + coding_records(renderer, "calc-roll1", 2, start=2, user="Summary so far: continue."),
            coding_records(renderer, "calc-roll2", 1),
        ]
    ):
        info = SessionInfo(
            session_id=f"calc-roll{n}",
            key_sha256="0" * 64,
            created_at=1000.0 + n,
            metadata={"task_id": "calc__add-1", "group_id": "g-calc", "harness": "pi"},
        )
        out.append(
            build_trajectory(
                info,
                calls,
                status="timeout" if n == 2 else "completed",
                error="episode timed out after 1800 s" if n == 2 else None,
                reward=1.0 if n == 0 else 0.0,
                grading=None if n == 2 else grading(resolved=n == 0),
            )
        )
    return [*out, failed_episode(renderer)]


def failed_episode(renderer: ChatRenderer) -> Trajectory:
    """An errored episode: a failed call (in no chain), then a call whose logprobs were lost
    (an unscored span: nothing trainable, no main chain)."""
    first, second = coding_records(renderer, "broken", 2)
    failed = first.model_copy(
        update={
            "sampled_ids": [],
            "logprobs": [],
            "output": None,
            "finish_reason": None,
            "error": "backend error: 503 Service Unavailable",
        }
    )
    lost = second.model_copy(
        update={
            "logprobs": [],
            "parent_call_index": None,
            "break_reason": "first call",
            "prompt_ids": first.prompt_ids,
            "messages": first.messages,
        }
    )
    info = SessionInfo(
        session_id="broken",
        key_sha256="0" * 64,
        created_at=2000.0,
        metadata={"task_id": "calc__add-1", "group_id": "g-other", "harness": "codex"},
    )
    return build_trajectory(
        info, [failed, lost], status="error", error="harness exited with status 1", reward=0.0
    )


def write_run(episodes: list[Trajectory], path: Path) -> Path:
    """A rollout directory: the trajectories, plus a GRPO batch the viewer must skip."""
    with TrajectoryWriter(path / "trajectories.jsonl") as writer:
        for traj in episodes:
            writer.write(traj)
    write_jsonl(path / "grpo_batch.jsonl", grpo_rows([t for t in episodes if t.reward is not None]))
    return path


@pytest.fixture(scope="module")
def proxy_episodes(embedded_dir, tmp_path_factory) -> list[Trajectory]:
    """The same three rollouts through the real proxy, the first with a title side call."""
    renderer = ChatRenderer.from_pretrained(embedded_dir)
    local = LocalBackend.from_pretrained(embedded_dir)
    data = tmp_path_factory.mktemp("proxy")

    async def run() -> list[Trajectory]:
        async with (
            running_proxy(renderer, ScriptedBackend(local, policy, context_window=256), data) as proxy,
            aiohttp.ClientSession() as http,
        ):
            sessions = []
            for n in range(3):
                sid, key = proxy.create_session(
                    f"calc-roll{n}",
                    sampling={"temperature": 1.0, "max_tokens": 96},
                    metadata={"task_id": "calc__add-1", "group_id": "g-calc", "harness": "pi"},
                )
                sessions.append(sid)
                if n == 0:
                    await _episode(http, proxy, sid, key, 4)
                    await _title(http, proxy, sid, key)
                elif n == 1:
                    await _episode(http, proxy, sid, key, 2)
                    await _episode(
                        http, proxy, sid, key, 2, user="Summary so far: you read calc.py. Continue."
                    )
                else:
                    await _episode(http, proxy, sid, key, 1)
        ledger = Ledger(data)
        out = []
        for n, sid in enumerate(sessions):
            status = "timeout" if n == 2 else "completed"
            out.append(
                build_trajectory(
                    ledger.session(sid),
                    ledger.calls(sid),
                    status=status,
                    error="episode timed out after 1800 s" if n == 2 else None,
                    reward=1.0 if n == 0 else 0.0,
                    grading=None if n == 2 else grading(resolved=n == 0),
                )
            )
        return out

    return asyncio.run(run())


@pytest.fixture
def run_dir(record_episodes, tmp_path) -> Path:
    return write_run(record_episodes, tmp_path)


def json_blocks(page: str) -> dict[str, object]:
    return {
        m.group(1): json.loads(m.group(2))
        for m in re.finditer(r'<script type="application/json" id="([^"]+)">(.*?)</script>', page, re.S)
    }


def check_page(page: str, episodes: list[Trajectory], embedded_dir: Path) -> dict[str, dict]:
    """The page is offline and embeds each episode faithfully; returns its JSON blocks."""
    # offline: outside the embedded data there is no URL at all, and no external script/style/link
    code = re.sub(r'<script type="application/json".*?</script>', "", page, flags=re.S)
    assert not re.search(r"https?://|//cdn|<link\b|<script[^>]*\bsrc=|@import|url\(", code)
    blocks = json_blocks(page)
    index = blocks["polar-index"]
    assert [e["session_id"] for e in index["episodes"]] == [t.session_id for t in episodes]
    assert index["skipped"] and "grpo_batch.jsonl" in index["skipped"][0]
    assert index["models"] == [episodes[0].model] and index["tokenizer"] == embedded_dir.name
    # the header counts as `polar rollout`/`demo` print (a masked episode is not graded, and is still an
    # episode)
    cli = summarize(episodes)
    assert f"{cli['episodes']} episodes · resolved {cli['resolved']}/{cli['episodes']}" in index["headline"]
    if ungraded := sum(t.grading is None for t in episodes):
        assert f"({ungraded} not graded" in index["headline"]
    tok = ChatRenderer.from_pretrained(embedded_dir).tokenizer
    for k, traj in enumerate(episodes):
        ep = blocks[f"polar-ep-{k}"]
        assert [c["index"] for c in ep["chains"]] == [c.index for c in traj.chains]
        for shown, chain in zip(ep["chains"], traj.chains, strict=True):
            texts = [shown["fix"].get(str(i), ep["vocab"][str(t)]) for i, t in enumerate(shown["ids"])]
            # the token texts read exactly like the tokenizer's decoding of the chain
            assert "".join(texts) == tok.decode(chain.input_ids, skip_special_tokens=False)
            sampled = [s for s in shown["spans"] if s["kind"] == "sampled"]
            assert sum(len(s["lp"]) for s in sampled) == chain.trainable_tokens
            assert all(
                lp == round(chain.logprobs[s["start"] + j], 4)
                for s in sampled
                for j, lp in enumerate(s["lp"])
            )
    ep0, ep1 = blocks["polar-ep-0"], blocks["polar-ep-1"]
    assert "café ✓" in "".join(
        ch["fix"].get(str(i), ep0["vocab"][str(t)]) for ch in ep0["chains"] for i, t in enumerate(ch["ids"])
    )
    assert ep0["grading"]["fail_to_pass"] == {"tests/test_calc.py::test_add": "PASSED"}
    assert ep1["grading"]["fail_to_pass"] == {"tests/test_calc.py::test_add": "FAILED"}
    assert len(ep1["chains"]) == 2 and "compacted" in ep1["chains"][1]["why"]
    tool_call = next(c for c in ep0["call_list"] if c["output"]["tool_calls"])["output"]["tool_calls"][0]
    assert tool_call["name"] == "bash" and "cat calc.py" in tool_call["arguments"]
    return blocks


def test_page_embeds_every_episode_and_works_offline(run_dir, record_episodes, embedded_dir, capsys):
    out = run_dir / "page" / "view.html"
    assert polar_main(["view", str(run_dir), "--out", str(out), "--tokenizer", str(embedded_dir)]) == 0
    assert "4 episodes from 1 file(s)" in capsys.readouterr().out
    blocks = check_page(out.read_text(), record_episodes, embedded_dir)
    broken = blocks["polar-ep-3"]
    assert broken["main_chain"] is None and [s["kind"] for s in broken["chains"][0]["spans"]] == [
        "prompt",
        "unscored",
    ]
    assert broken["call_list"][0]["chain"] is None and "503" in broken["call_list"][0]["error"]


def test_split_utf8_characters_are_joined(embedded_dir):
    text = TokenText.load(embedded_dir)
    tok = ChatRenderer.from_pretrained(embedded_dir).tokenizer
    ids = tok.encode("naïve 日本語 🙂 ok", add_special_tokens=False)
    table = text.table(ids)
    assert any("\ufffd" in table[i] for i in ids)  # the tokenizer really splits characters
    fixes = text.fixups(ids, table)
    assert "".join(fixes.get(k, table[i]) for k, i in enumerate(ids)) == "naïve 日本語 🙂 ok"
    assert TokenText.load(None).table([5, 7]) == {5: "⟨5⟩", 7: "⟨7⟩"}


def test_single_file_default_out_and_cli_routing(run_dir, embedded_dir, capsys):
    file = run_dir / "trajectories.jsonl"
    assert polar_main(["view", str(file), "--tokenizer", str(embedded_dir)]) == 0
    assert (run_dir / "trajectories.html").stat().st_size > 10_000
    assert polar_main(["view", str(run_dir / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


async def test_serve_rebuilds_when_trajectories_change(run_dir, record_episodes, embedded_dir):
    source = PageSource(run_dir, TokenText.load(embedded_dir))
    runner, url = await start_server(source.page, port=0)
    try:
        assert url.startswith("http://127.0.0.1:")
        async with aiohttp.ClientSession() as http:
            async with http.get(url) as resp:
                assert resp.status == 200 and resp.content_type == "text/html"
                assert len(json_blocks(await resp.text())["polar-index"]["episodes"]) == 4
            with TrajectoryWriter(run_dir / "more" / "extra.jsonl") as writer:
                writer.write(record_episodes[0].model_copy(update={"session_id": "calc-roll3"}))
            async with http.get(url) as resp:
                assert len(json_blocks(await resp.text())["polar-index"]["episodes"]) == 5
    finally:
        await runner.cleanup()


def test_serve_prints_url_and_stops_on_ctrl_c(run_dir, embedded_dir):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "polar_env.cli",
            "view",
            str(run_dir),
            "--serve",
            "--port",
            "0",
            "--tokenizer",
            str(embedded_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout.readline().startswith("wrote ")
        url = proc.stdout.readline().split()[1]
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url, timeout=30) as resp:
            assert b'id="polar-index"' in resp.read()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- headless Chromium over the DevTools protocol --------------------------------------------------
class DevTools:
    """A minimal DevTools-protocol client: commands by id, every event kept."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self.ws, self.events, self._pending, self._n = ws, [], {}, 0
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data:
                fut = self._pending.pop(data["id"])
                if "error" in data:
                    fut.set_exception(RuntimeError(f"{data['error']}"))
                else:
                    fut.set_result(data.get("result", {}))
            else:
                self.events.append(data)

    async def send(self, method: str, **params) -> dict:
        self._n += 1
        fut = asyncio.get_running_loop().create_future()
        self._pending[self._n] = fut
        await self.ws.send_json({"id": self._n, "method": method, "params": params})
        return await asyncio.wait_for(fut, 120)

    async def eval(self, expression: str):
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_event(self, method: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events:
                if event["method"] == method:
                    return event
            await asyncio.sleep(0.05)
        raise TimeoutError(method)

    def problems(self) -> list[str]:
        """Console errors, uncaught exceptions, and any request that left the file."""
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                out.append(f"exception: {p['exceptionDetails']}")
            elif e["method"] == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert", "warning"):
                out.append(f"console.{p['type']}: {[a.get('value') for a in p['args']]}")
            elif e["method"] == "Log.entryAdded" and p["entry"]["level"] in ("error", "warning"):
                out.append(f"log: {p['entry']}")
            elif e["method"] == "Network.requestWillBeSent" and not p["request"]["url"].startswith("file:"):
                out.append(f"network request: {p['request']['url']}")
        return out


async def open_in_chromium(page: Path, tmp: Path):
    """Start headless Chromium on ``page``; returns (process, DevTools client, http session)."""
    profile = tmp / "chromium-profile"
    proc = subprocess.Popen(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            "--window-size=1400,900",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 60
    while not (port_file.is_file() and port_file.read_text().count("\n") >= 1):
        assert proc.poll() is None and time.monotonic() < deadline, "chromium did not start"
        await asyncio.sleep(0.1)
    port = int(port_file.read_text().split()[0])
    http = aiohttp.ClientSession()
    async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
        target = next(t for t in await resp.json() if t["type"] == "page")
    ws = await http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0)
    tools = DevTools(ws)
    for domain in ("Runtime", "Log", "Page", "Network"):
        await tools.send(f"{domain}.enable")
    await tools.send(
        "Emulation.setDeviceMetricsOverride", width=1400, height=900, deviceScaleFactor=1, mobile=False
    )
    await tools.send("Page.navigate", url=page.resolve().as_uri())
    await tools.wait_event("Page.loadEventFired")
    return proc, tools, http


async def close_chromium(proc, tools, http) -> None:
    await tools.ws.close()
    await http.close()
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium")
async def test_page_in_headless_chromium(proxy_episodes, embedded_dir, tmp_path):
    episodes = [*proxy_episodes, failed_episode(ChatRenderer.from_pretrained(embedded_dir))]
    run_dir = write_run(episodes, tmp_path / "run")
    page = run_dir / "viewer.html"
    assert polar_main(["view", str(run_dir), "--tokenizer", str(embedded_dir)]) == 0
    blocks = check_page(page.read_text(), episodes, embedded_dir)
    assert (
        len(blocks["polar-ep-0"]["chains"]) == 2 and "side call" in blocks["polar-ep-0"]["chains"][1]["why"]
    )
    proc, tools, http = await open_in_chromium(page, tmp_path)
    try:
        assert await tools.eval("document.querySelectorAll('#episodes tbody tr').length") == len(episodes)
        assert (
            await tools.eval("document.getElementById('summary').textContent")
            == json_blocks(page.read_text())["polar-index"]["headline"]
        )
        # the first episode is selected on load: its main chain with one trained span per call
        main = episodes[0].chains[0]
        assert await tools.eval("document.querySelectorAll('#chain-view .seg.sampled').length") == len(
            main.call_indices
        )
        assert (
            await tools.eval("document.querySelectorAll('#chain-view .toks b').length")
            == main.trainable_tokens
        )
        assert (
            await tools.eval("document.querySelectorAll('#grading .tests tr').length") == 3
        )  # header + 2 tests
        # grading's tampering flags are shown in the episode list
        assert "reset:test" in await tools.eval("document.querySelector('#episodes tbody').innerText")
        # folded spans are filled when opened; the tool results are there, folded
        assert await tools.eval("document.querySelectorAll('#chain-view details.seg .toks i').length") == 0
        await tools.eval("document.querySelector('#chain-view details.seg.inter').open = true")
        await asyncio.sleep(0.2)
        inter = next(s for s in main.spans if s.kind == "interstitial")
        assert (
            await tools.eval(
                "document.querySelector('#chain-view details.seg.inter').querySelectorAll('.toks i').length"
            )
            == inter.end - inter.start
        )
        # the second rollout: its compaction chain explains the break
        await tools.eval("document.querySelector('#episodes tbody tr[data-k=\"1\"]').click()")
        await tools.eval("document.querySelector('#chain-tabs button[data-c=\"1\"]').click()")
        head = await tools.eval("document.querySelector('.chain-head').textContent")
        assert "new chain because" in head and "compacted" in head
        # the errored episode: its failed call is listed, its unscored tokens are shown as masked
        await tools.eval("document.querySelector('#episodes tbody tr[data-k=\"3\"]').click()")
        assert "503" in await tools.eval("document.querySelector('.failed-call').textContent")
        unscored = episodes[3].chains[0].spans[1]
        assert (
            await tools.eval("document.querySelectorAll('#chain-view .seg.unscored .toks u').length")
            == unscored.end - unscored.start
        )
        # the resolved episode with its first tool result open; a hovered token shows id and logprob
        await tools.eval(
            "document.querySelector('#episodes tbody tr[data-k=\"0\"]').click();"
            "document.querySelector('#chain-view details.seg.inter').open = true; 1"
        )
        box = await tools.eval(
            "(() => { const r = document.querySelectorAll('#chain-view .toks b')[3]"
            ".getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        await tools.send("Input.dispatchMouseEvent", type="mouseMoved", x=box[0], y=box[1])
        tip = await tools.eval("document.getElementById('tip').textContent")
        assert "trained (loss mask 1) · logprob -" in tip and " · id " in tip
        await asyncio.sleep(0.3)
        shot = base64.b64decode((await tools.send("Page.captureScreenshot", format="png"))["data"])
        assert tools.problems() == []
    finally:
        await close_chromium(proc, tools, http)
    png = tmp_path / "viewer.png"
    png.write_bytes(shot)
    assert shot.startswith(b"\x89PNG") and len(shot) > 40_000
    if os.environ.get("POLAR_WRITE_SCREENSHOT") == "1":
        (REPO / "docs" / "img").mkdir(parents=True, exist_ok=True)
        (REPO / "docs" / "img" / "viewer.png").write_bytes(shot)


def long_episode(tok, n_calls: int = 40) -> Trajectory:
    """A ~100k-token, 40-turn episode built from ledger records: real token ids of real text
    (tool results of ~2k tokens, answers of ~300), logprobs fixed by position."""
    source = (REPO / "polar_env" / "trajectory" / "export.py").read_text()
    result_ids = tok.encode(source, add_special_tokens=False)[:2000]
    answer_ids = tok.encode("Now I will run the tests. " * 40, add_special_tokens=False)[:300]
    info = SessionInfo(
        session_id="long",
        key_sha256="0" * 64,
        created_at=1000.0,
        metadata={"task_id": "long", "harness": "codex"},
    )
    prompt = tok.encode(
        "<|im_start|>system\nYou are a coding agent.<|im_end|>\n" + source[:20000], add_special_tokens=False
    )
    calls = []
    for k in range(n_calls):
        calls.append(
            CallRecord(
                session_id="long",
                call_index=k,
                call_id=f"c{k}",
                api="responses",
                created_at=1000.0 + k,
                messages=[Message(role="user", content="fix it")],
                prompt_ids=list(prompt),
                sampled_ids=answer_ids,
                logprobs=[-0.02 * (j % 200) for j in range(len(answer_ids))],
                output=AssistantTurn(call_id=f"c{k}", content="run tests"),
                finish_reason="stop",
                parent_call_index=k - 1 if k else None,
                reused_prefix_len=0,
                backend="local",
                model="smol",
            )
        )
        prompt = prompt + answer_ids + result_ids
    return build_trajectory(info, calls, reward=0.0)


@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium")
async def test_100k_token_episode_renders_fast(embedded_dir, tmp_path):
    tok = ChatRenderer.from_pretrained(embedded_dir).tokenizer
    traj = long_episode(tok)
    assert len(traj.chains) == 1 and len(traj.chains[0].input_ids) > 90_000
    with TrajectoryWriter(tmp_path / "runs" / "long.jsonl") as writer:
        writer.write(traj)
    t0 = time.monotonic()
    assert polar_main(["view", str(tmp_path / "runs"), "--tokenizer", str(embedded_dir)]) == 0
    build_s = time.monotonic() - t0
    proc, tools, http = await open_in_chromium(tmp_path / "runs" / "viewer.html", tmp_path)
    try:
        timing = await tools.eval(
            "(() => { let t = performance.now(); document.querySelector('#episodes tbody tr').click();"
            " const select = performance.now() - t; t = performance.now();"
            " document.querySelector('#chain-tabs button[data-all]').click();"
            " const all = performance.now() - t; document.body.offsetHeight;"
            " return [select, all, performance.now() - t, document.querySelectorAll('.toks > *').length]; "
            "})()"
        )
        assert tools.problems() == []
    finally:
        await close_chromium(proc, tools, http)
    select_ms, open_all_ms, layout_ms, elements = timing
    print(
        f"100k-token episode: build {build_s:.1f} s, select {select_ms:.0f} ms, "
        f"open all folds {open_all_ms:.0f} ms (+layout {layout_ms:.0f} ms), {elements} token elements"
    )
    assert elements == len(traj.chains[0].input_ids)
    assert select_ms < 2000 and layout_ms < 10_000
