"""Each real harness meets a context overflow through the proxy and reacts as with its provider.

The window is set just past each harness's first prompt (``MARGIN`` tokens more); the scripted
policy's first answer runs a command whose output overflows it, so the next request is refused by
the proxy in the API's own shape (Responses ``context_length_exceeded``, Anthropic "prompt is too
long", Chat Completions ``context_length_exceeded``). What each harness then does is asserted and
printed: whether it compacts (a summarization call, then a new chain), retries, or stops, and that
it never sends the same failing request more than twice.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
from test_harness_e2e import RecordingProxy, rollout, smol  # noqa: F401  (fixture)

from polar_env.backends.scripted import ScriptedBackend
from polar_env.harness_adapters import get_adapter
from polar_env.proxy.engine import MAX_IDENTICAL_FAILURES, EngineConfig
from polar_env.proxy.sessions import prefix_hashes
from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.export import grpo_rows
from polar_env.trajectory.ledger import Ledger

pytestmark = [pytest.mark.slow, pytest.mark.needs("bwrap", "npm")]

MARGIN = 5200  # the flood overflows it by ~500 tokens in every harness; Claude Code's compaction request fits
FLOOD = "seq 100000 100800"  # ~5,000 tokens of tool output, well past MARGIN
SUMMARY = "Summary: I ran seq and its output was long; nothing is left to do."
FINAL = "Done."
TOOL_FOR = {"exec_command": "cmd", "Bash": "command", "bash": "command", "run_shell_command": "command"}
# each harness's own compaction request (codex-rs templates/compact, Claude Code's compact prompt,
# Pi's compaction.js SUMMARIZATION_PROMPT)
COMPACTION_MARKERS = (
    "CONTEXT CHECKPOINT COMPACTION",
    "detailed summary of the conversation so far",
    "context checkpoint summary",
)


def make_policy(engine, tokenizer):
    import json

    def policy(session_id: str | None, call_number: int, prompt_text: str) -> str:
        if call_number == 0:  # the window: this harness's first prompt plus MARGIN
            engine.config.max_context = len(tokenizer.encode(prompt_text, add_special_tokens=False)) + MARGIN
        last = prompt_text.rsplit("<|im_start|>", 2)[-2]  # the last message before the answer
        if "<tool_response>" in last or SUMMARY in prompt_text:
            return FINAL
        if any(marker in last for marker in COMPACTION_MARKERS):
            return SUMMARY
        for name, arg in TOOL_FOR.items():
            if f'"name": "{name}"' in prompt_text:
                return (
                    "<tool_call>\n" + json.dumps({"name": name, "arguments": {arg: FLOOD}}) + "\n</tool_call>"
                )
        return FINAL

    return policy


@pytest.fixture
async def small_window_proxy(smol, tmp_path: Path):  # noqa: F811
    renderer, local = smol
    server = RecordingProxy.create(
        renderer=renderer,
        backend=ScriptedBackend(local, lambda *a: FINAL, context_window=256),
        data_dir=tmp_path / "ledger",
        admin_secret="admin",
        config=EngineConfig(default_max_tokens=256),
    )
    server.engine.backend.answers.policy = make_policy(server.engine, renderer.tokenizer)
    server.seen, server.bodies = [], []
    await server.start(unix_socket=tmp_path / "sock" / "proxy.sock", port=None)
    yield server
    await server.stop()


@pytest.mark.parametrize("harness", ["codex", "claude-code", "pi", "gemini-cli"])
async def test_harness_reacts_to_the_providers_overflow_error(harness, small_window_proxy, tmp_path: Path):
    adapter = get_adapter(harness)
    adapter.install()
    sid, run, _edited, _patch = await rollout(
        adapter,
        small_window_proxy,
        tmp_path,
        f"{harness}-overflow",
        prompt="List the numbers, then stop.",
        timeout_s=300,
    )
    ledger = Ledger(tmp_path / "ledger")
    calls = ledger.calls(sid)
    traj = build_trajectory(ledger.session(sid), calls, status=run.status)
    overflows = [c for c in calls if c.error and c.error.startswith("context overflow")]
    repeats = Counter((c.api, prefix_hashes(c.messages)[-1]) for c in calls if c.error)
    story = [
        (
            c.call_index,
            len(c.prompt_ids),
            "overflow" if c in overflows else ("ok" if c.output else c.error),
            c.break_reason,
            (c.output.content[:40] if c.output else None),
        )
        for c in calls
    ]
    print(
        f"\n{harness}: status={run.status} exit={run.exit_code} error={run.error}\n  calls: {story}\n"
        f"  chains: {[(ch.call_indices, ch.start_reason) for ch in traj.chains]}",
        file=sys.stderr,
    )
    detail = (story, run.stdout_tail[-2000:], run.stderr_tail[-2000:])
    assert overflows and overflows[0].call_index == 1, detail  # the request carrying the flood
    assert max(repeats.values()) <= MAX_IDENTICAL_FAILURES and len(calls) <= 6, detail
    compactions = [c for c in calls if any(m in c.messages[-1].content for m in COMPACTION_MARKERS)]
    if harness == "codex":
        # Codex maps context_length_exceeded to its ContextWindowExceeded: the turn fails at once,
        # with no retry, saying so (codex-rs: "ran out of room in the model's context window")
        assert len(calls) == 2 and run.status == "error", detail
        assert "context window" in (run.summary.error or ""), detail
    elif harness == "claude-code":
        # Claude Code parses "prompt is too long: N tokens > M maximum" and compacts reactively: its
        # compaction request (smaller than the refused one) is answered with the summary, a new
        # chain, and the turn goes on from the compacted history to the final answer
        assert compactions and compactions[0].output.content == SUMMARY, detail
        assert traj.chains[1].start_reason == "history rewritten (compaction or edited history)", detail
        assert run.status == "completed" and calls[-1].output.content == FINAL, detail
        # --train-paths: all trains the compacted history's chain too, main only the first
        graded = traj.model_copy(update={"reward": 1.0})
        trained = [ch.index for ch in traj.chains if ch.trainable_tokens]
        assert (
            len(trained) >= 2 and [r["chain"] for r in grpo_rows([graded], train_paths="all")] == trained
        ), detail
        assert [r["chain"] for r in grpo_rows([graded], train_paths="main")] == [traj.main_chain], detail
    elif harness == "gemini-cli":
        # Gemini CLI compacts only ahead of its own idea of the window, never on the API's refusal:
        # "The input token count (N) exceeds the maximum number of tokens allowed (M)." ends the turn
        # at once, without a retry, and the CLI exits non-zero reporting it
        assert len(calls) == 2 and run.status == "error", detail
        assert "exceeds the maximum number of tokens" in (run.summary.error or ""), detail
    else:
        # Pi matches "maximum context length is N tokens", compacts (a summarization side call that
        # succeeds: a new chain) and retries once; the retry keeps the recent flood and overflows
        # again, and Pi stops cleanly (exit 0) reporting the overflow
        [summary] = [ch for ch in traj.chains if ch.index > 0]
        assert compactions and calls[summary.call_indices[0]].output.content == SUMMARY, detail
        assert summary.start_reason == "tools changed (sub-agent or side call)", detail
        assert run.exit_code == 0 and "maximum context length" in (run.error or ""), detail
