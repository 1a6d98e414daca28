"""Ledger bytes, and the time to turn a session's ledger into a trajectory and export it.

The records are synthetic but shaped like a real agent episode: 200 calls of one chain, each
prompt = the previous prompt + its sampled ids + an appended tool result (about four characters of
text a token, as in real tool output), so the last prompt holds the whole episode (25k..100k
tokens). They go through a real ``Ledger`` the way the proxy writes them (declaring what each call
reuses from its parent) and are read back, so ``ledger_bytes_per_token`` is what the episode costs
on disk per distinct token and the timings start from what ``Ledger.calls`` hands the builder.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import median
from polar_env.chat.messages import AssistantTurn, Message
from polar_env.trajectory.ledger import Ledger
from polar_env.trajectory.records import CallRecord, SessionInfo, ids_digest

SAMPLED_PER_CALL = 60
CHARS_PER_TOKEN = 4


def _logprob(i: int) -> float:
    return -((i * 2654435761) % 1_000_003) / 333_334.0  # full-precision floats, like a backend's


def synthetic_records(
    total_tokens: int, calls: int = 200, *, vocab: int = 49_000
) -> tuple[SessionInfo, list[CallRecord]]:
    """One chain of ``calls`` calls whose final sequence is about ``total_tokens`` long."""
    system = 1_000
    appended = max(1, (total_tokens - system) // calls - SAMPLED_PER_CALL)
    stream = [(i * 7919) % vocab for i in range(total_tokens + calls * (appended + SAMPLED_PER_CALL))]
    info = SessionInfo(
        session_id="bench-builder", key_sha256="0" * 64, created_at=0.0, metadata={"task_id": "bench"}
    )
    messages = [
        Message(role="system", content="You are a coding agent."),
        Message(role="user", content="Fix it."),
    ]
    records: list[CallRecord] = []
    cursor, prompt_len = 0, system
    for i in range(calls):
        prompt = stream[:prompt_len]
        sampled = stream[prompt_len : prompt_len + SAMPLED_PER_CALL]
        turn = AssistantTurn(
            call_id=f"c{i}",
            content=f"step {i} " + "x" * (CHARS_PER_TOKEN * SAMPLED_PER_CALL),
            prompt_tokens=len(prompt),
            completion_tokens=len(sampled),
        )
        parent = records[-1] if records else None
        records.append(
            CallRecord(
                session_id=info.session_id,
                call_index=i,
                call_id=f"c{i}",
                api="chat",
                created_at=float(i),
                messages=list(messages),
                prompt_ids=prompt,
                sampled_ids=sampled,
                logprobs=[_logprob(prompt_len + k) for k in range(len(sampled))],
                output=turn,
                finish_reason="stop",
                parent_call_index=i - 1 if i else None,
                reused_prefix_len=cursor,
                reused_messages=len(parent.messages) if parent else 0,
                reused_tools=parent is not None,
                prompt_sha256=ids_digest(prompt).hexdigest(),
                break_reason=None if i else "first call",
            )
        )
        messages += [
            turn.as_message(),
            Message(
                role="tool", content=f"result {i} " + "y" * (CHARS_PER_TOKEN * appended), tool_call_id=f"t{i}"
            ),
        ]
        cursor = prompt_len + SAMPLED_PER_CALL
        prompt_len = cursor + appended
    return info, records


def through_ledger(
    info: SessionInfo, records: list[CallRecord], root: Path
) -> tuple[list[CallRecord], int, float]:
    """Append ``records`` to a fresh ledger under ``root`` and read them back:
    (records as read, bytes on disk, read ms)."""
    ledger = Ledger(root)
    ledger.create_session(info)
    for record in records:
        ledger.append(record)
    ledger.close()
    size = (root / "sessions" / info.session_id / "calls.jsonl").stat().st_size
    t0 = time.perf_counter()
    back = ledger.calls(info.session_id)
    return back, size, (time.perf_counter() - t0) * 1e3


def time_once(info: SessionInfo, records: list[CallRecord]) -> dict[str, float]:
    from polar_env.trajectory.chains import build_trajectory
    from polar_env.trajectory.export import grpo_rows, jsonl_line, to_nemo_gym_result

    t0 = time.perf_counter()
    traj = build_trajectory(info, records, reward=1.0)
    t1 = time.perf_counter()
    result = to_nemo_gym_result(traj, arrays=True)  # as the agent server and `polar rollout` export it
    rows = grpo_rows([traj])
    t2 = time.perf_counter()
    lines = [jsonl_line(result.row()), *map(jsonl_line, rows)]  # what the exports write, a line at a time
    t3 = time.perf_counter()
    if not rows or not traj.chains or len(traj.chains) != 1:
        raise RuntimeError(
            f"builder produced {len(traj.chains)} chains and {len(rows)} rows; expected 1 and 1"
        )
    return {
        "build_ms": (t1 - t0) * 1e3,
        "export_ms": (t2 - t1) * 1e3,
        "build_export_ms": (t2 - t0) * 1e3,
        "json_ms": (t3 - t2) * 1e3,
        "json_mb": sum(map(len, lines)) / 2**20,
        "sequence_tokens": len(traj.chains[0].input_ids),
    }


def measure(sizes: list[int], runs: int, calls: int = 200) -> dict[str, Any]:
    out: dict[str, Any] = {"calls": calls, "runs": runs, "sizes": {}}
    for size in sizes:
        info, written = synthetic_records(size, calls)
        with tempfile.TemporaryDirectory(prefix="polar-bench-ledger-") as tmp:
            reads = [through_ledger(info, written, Path(tmp) / str(k)) for k in range(runs)]
        records, ledger_bytes = reads[0][0], reads[0][1]
        samples = [time_once(info, records) for _ in range(runs)]
        row = {k: median([s[k] for s in samples]) for k in samples[0]}
        row.update(
            {
                "ledger_bytes": ledger_bytes,
                "ledger_read_ms": median([r[2] for r in reads]),
                "ledger_bytes_per_token": ledger_bytes / row["sequence_tokens"],
            }
        )
        out["sizes"][str(size)] = row
    return out
