"""Time to turn a session's records into a trajectory and export it (NeMo Gym result, GRPO rows).

The records are synthetic but shaped like a real agent episode: 200 calls of one chain, each
prompt = the previous prompt + its sampled ids + an appended tool result, so the last prompt
holds the whole episode (25k..100k tokens).
"""

from __future__ import annotations

import json
import time
from typing import Any

from polar_env.bench.common import median
from polar_env.chat.messages import AssistantTurn, Message
from polar_env.trajectory.records import CallRecord, SessionInfo

SAMPLED_PER_CALL = 60


def synthetic_records(total_tokens: int, calls: int = 200, *, vocab: int = 49_000
                      ) -> tuple[SessionInfo, list[CallRecord]]:
    """One chain of ``calls`` calls whose final sequence is about ``total_tokens`` long."""
    system = 1_000
    appended = max(1, (total_tokens - system) // calls - SAMPLED_PER_CALL)
    stream = [(i * 7919) % vocab for i in range(total_tokens + calls * (appended + SAMPLED_PER_CALL))]
    info = SessionInfo(session_id="bench-builder", key_sha256="0" * 64, created_at=0.0,
                       metadata={"task_id": "bench"})
    messages = [Message(role="system", content="You are a coding agent."), Message(role="user", content="Fix it.")]
    records, cursor, prompt_len = [], 0, system
    for i in range(calls):
        prompt = stream[:prompt_len]
        sampled = stream[prompt_len: prompt_len + SAMPLED_PER_CALL]
        turn = AssistantTurn(call_id=f"c{i}", content=f"step {i}", prompt_tokens=len(prompt),
                             completion_tokens=len(sampled))
        records.append(CallRecord(
            session_id=info.session_id, call_index=i, call_id=f"c{i}", api="chat", created_at=float(i),
            messages=list(messages), prompt_ids=prompt, sampled_ids=sampled,
            logprobs=[-0.25] * len(sampled), output=turn, finish_reason="stop",
            parent_call_index=i - 1 if i else None, reused_prefix_len=cursor,
            break_reason=None if i else "first call"))
        messages += [turn.as_message(), Message(role="tool", content=f"result {i}", tool_call_id=f"t{i}")]
        cursor = prompt_len + SAMPLED_PER_CALL
        prompt_len = cursor + appended
    return info, records


def time_once(info: SessionInfo, records: list[CallRecord]) -> dict[str, float]:
    from polar_env.trajectory.chains import build_trajectory
    from polar_env.trajectory.export import grpo_rows, to_nemo_gym_result

    t0 = time.perf_counter()
    traj = build_trajectory(info, records, reward=1.0)
    t1 = time.perf_counter()
    result = to_nemo_gym_result(traj)
    rows = grpo_rows([traj])
    t2 = time.perf_counter()
    blob = json.dumps(result, separators=(",", ":")) + json.dumps(rows, separators=(",", ":"))
    t3 = time.perf_counter()
    if not rows or not traj.chains or len(traj.chains) != 1:
        raise RuntimeError(f"builder produced {len(traj.chains)} chains and {len(rows)} rows; expected 1 and 1")
    return {"build_ms": (t1 - t0) * 1e3, "export_ms": (t2 - t1) * 1e3, "build_export_ms": (t2 - t0) * 1e3,
            "json_ms": (t3 - t2) * 1e3, "json_mb": len(blob) / 2**20,
            "sequence_tokens": len(traj.chains[0].input_ids)}


def measure(sizes: list[int], runs: int, calls: int = 200) -> dict[str, Any]:
    out: dict[str, Any] = {"calls": calls, "runs": runs, "sizes": {}}
    for size in sizes:
        info, records = synthetic_records(size, calls)
        samples = [time_once(info, records) for _ in range(runs)]
        out["sizes"][str(size)] = {k: median([s[k] for s in samples]) for k in samples[0]}
    return out
