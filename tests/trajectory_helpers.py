"""Hand-built ledger records for the trajectory tests (no proxy needed to exercise the chain rules)."""

from __future__ import annotations

from polar_env.chat.messages import AssistantTurn, Message, ToolCall
from polar_env.trajectory.records import CallRecord, SessionInfo


def session(session_id: str = "s1", **metadata) -> SessionInfo:
    return SessionInfo(
        session_id=session_id,
        key_sha256="0" * 64,
        created_at=1000.0,
        metadata={"task_id": "t1", "group_id": "g1", "harness": "codex", **metadata},
    )


def call(
    index: int,
    prompt: list[int],
    sampled: list[int],
    *,
    parent: int | None = None,
    reason: str | None = None,
    messages: list[Message] | None = None,
    tool: str | None = None,
    logprobs: list[float] | None = None,
    error: str | None = None,
    session_id: str = "s1",
) -> CallRecord:
    calls = [ToolCall(id=f"call_{index}", name=tool, arguments='{"cmd": "ls"}')] if tool else []
    turn = (
        None
        if error
        else AssistantTurn(
            call_id=f"c{index}",
            content="" if tool else f"answer {index}",
            tool_calls=calls,
            finish_reason="tool_calls" if tool else "stop",
        )
    )
    return CallRecord(
        session_id=session_id,
        call_index=index,
        call_id=f"c{index}",
        api="responses",
        created_at=1000.0 + index,
        messages=messages or [Message(role="user", content="fix the bug")],
        prompt_ids=prompt,
        sampled_ids=[] if error else sampled,
        logprobs=[]
        if error
        else (logprobs if logprobs is not None else [-0.1 * (k + 1) for k in range(len(sampled))]),
        output=turn,
        finish_reason=None if error else "stop",
        parent_call_index=parent,
        reused_prefix_len=0,
        break_reason=reason,
        error=error,
        backend="local",
        model="smol",
    )


def three_turn() -> list[CallRecord]:
    """prompt P, tool call, tool result, tool call, tool result, final answer: one chain."""
    p0 = [1, 2, 3, 4]
    s0 = [10, 11, 12]
    p1 = p0 + s0 + [5, 6]
    s1 = [13, 14]
    p2 = p1 + s1 + [7, 8, 9]
    s2 = [15, 16, 17, 18]
    user = Message(role="user", content="fix the bug")
    a0 = Message(
        role="assistant", tool_calls=[ToolCall(id="call_0", name="shell", arguments='{"cmd": "ls"}')]
    )
    t0 = Message(role="tool", tool_call_id="call_0", content="a.py")
    a1 = Message(
        role="assistant", tool_calls=[ToolCall(id="call_1", name="shell", arguments='{"cmd": "ls"}')]
    )
    t1 = Message(role="tool", tool_call_id="call_1", content="ok")
    calls = [
        call(0, p0, s0, messages=[user], tool="shell"),
        call(1, p1, s1, parent=0, messages=[user, a0, t0], tool="shell"),
        call(2, p2, s2, parent=1, messages=[user, a0, t0, a1, t1]),
    ]
    return [calls[0], *(reusing(c, p) for p, c in zip(calls, calls[1:], strict=False))]


def reusing(record: CallRecord, parent: CallRecord) -> CallRecord:
    """``record`` with the reuse the proxy declares for a call extending ``parent`` (its ids,
    messages and tools), so the ledger stores only what it adds."""
    return record.model_copy(
        update={
            "reused_prefix_len": len(parent.prompt_ids) + len(parent.sampled_ids),
            "reused_messages": len(parent.messages),
            "reused_tools": True,
        }
    )


def long_chain(calls: int, appended: int = 50, sampled: int = 20) -> list[CallRecord]:
    """A proxy-shaped episode: each call extends the previous one by a tool result and declares it."""
    records, prompt = [], list(range(300))
    for i in range(calls):
        ids = [1000 + i * sampled + k for k in range(sampled)]
        record = call(
            i,
            prompt,
            ids,
            parent=i - 1 if i else None,
            tool="shell",
            messages=[Message(role="user", content="fix")]
            + [Message(role="tool", content=f"out {k}", tool_call_id=f"call_{k}") for k in range(i)],
        )
        records.append(reusing(record, records[-1]) if records else record)
        prompt = prompt + ids + [5000 + i * appended + k for k in range(appended)]
    return records


def timed(record: CallRecord, *, at: float, total_s: float, generate_s: float | None = None) -> CallRecord:
    """The call stamped as made at ``at`` and lasting ``total_s`` (``generate_s`` of it sampling)."""
    timings = {"total_ms": total_s * 1e3}
    if generate_s is not None:
        timings["generate_ms"] = generate_s * 1e3
    return record.model_copy(update={"created_at": at, "timings": timings})
