"""What the Gym agent reports about an episode in NeMo Gym's own observability shapes.

NeMo Gym's rollout health checks read ``ng_trajectory`` (turns and model calls), which rollout
collection assembles from what the agent returns. Gym's own harness agents (pi, claude_code,
opencode) return ``ng_agent_observations`` (the invocation, its model-call references, its
conversation and tool calls) and leave the model calls to Gym's model server, which captures
them. Polar's model calls never pass through Gym's model server — Polar's proxy captures them —
so the agent also returns them itself as a producer ``ng_trajectory``: one model call and one turn
per proxied call, with token counts, latency and status. Field names and shapes follow nemo-gym
0.7.0's ``nemo_gym.rollout_observability`` (its models forbid unknown fields).
"""

from __future__ import annotations

import statistics
from typing import Any, Literal

from polar_env.trajectory.models import CallSummary, Trajectory
from polar_env.wire.responses import output_items
from polar_env.wire.shape import to_builtins

SOURCE = "polar"
# what training reads from an item (token ids, and the policy version that sampled them): a verifier needs
# none
_TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs", "policy_version")

InvocationStatus = Literal["completed", "failed", "incomplete", "unknown"]


def plain_items(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Response output items without their token ids (what a conversation or a verifier needs)."""
    return [{k: v for k, v in item.items() if k not in _TOKEN_FIELDS} for item in output]


def agent_observations(
    traj: Trajectory,
    output: list[dict[str, Any]],
    *,
    invocation_id: str,
    status: InvocationStatus,
    duration_ms: float | None,
    error_type: str | None,
) -> dict[str, Any]:
    """``ng_agent_observations``: one invocation (the harness run) and its tool calls."""
    conversation = plain_items(output)
    answered = {it.get("call_id") for it in conversation if it.get("type") == "function_call_output"}
    gaps: list[dict[str, Any]] = []
    tools = []
    for item in conversation:
        if item.get("type") != "function_call":
            continue
        tools.append(
            {
                "kind": "tool_call",
                "invocation_id": invocation_id,
                "tool_call_id": item["call_id"],
                "tool_name": item.get("name"),
                "status": "completed" if item["call_id"] in answered else "incomplete",
            }
        )
        # the proxy sees model calls, not the harness's tool executions
        gaps.append(
            {"code": "tool_timing_unavailable", "invocation_id": invocation_id, "detail": item["call_id"]}
        )
    invocation = {
        "kind": "agent_invocation",
        "invocation_id": invocation_id,
        "status": status,
        "duration_ms": duration_ms,
        "error_type": error_type,
        "model_calls": [{"model_call_id": c.call_id} for c in traj.calls],
        "conversation": conversation,
    }
    return {"source": SOURCE, "records": [invocation, *tools], "gaps": gaps}


def producer_trajectory(
    traj: Trajectory, *, task_id: str, rollout_id: str, invocation_id: str, resolved: bool | None
) -> dict[str, Any]:
    """``ng_trajectory``: every proxied model call, and a turn for each that answered."""
    calls, turns = [], []
    steps = 0
    for call in traj.calls:
        calls.append(_model_call(call, traj.model))
        if call.output is None:
            continue
        answer = to_builtins(output_items(call.output))
        turns.append(
            {
                "invocation_id": invocation_id,
                "task_id": task_id,
                "rollout_id": rollout_id,
                "turn_no": len(turns) + 1,
                "timestamp": call.created_at,
                "question": [m.model_dump(mode="json", exclude_none=True) for m in call.new_messages],
                "answer": answer,
                "reasoning_content": call.output.reasoning,
                "step_count": steps,
                "model_calls": [{"model_call_id": call.call_id}],
            }
        )
        steps += len(call.output.tool_calls)
    if turns and resolved is not None:
        turns[-1]["resolved"] = resolved
    return {
        "schema_version": "1.0",
        "task_id": task_id,
        "rollout_id": rollout_id,
        "turns": turns,
        "model_calls": calls,
    }


def _model_call(call: CallSummary, model: str) -> dict[str, Any]:
    duration_ms = call.timings.get("total_ms")
    failed = call.output is None
    return {
        "model_call_id": call.call_id,
        "started_at": call.created_at,
        "completed_at": call.created_at + duration_ms / 1e3 if duration_ms is not None else None,
        "duration_ms": duration_ms,
        "response_metadata": {
            "model": model,
            "dialect": call.api,
            "finish_reason": call.finish_reason,
            "response_status": "failed" if failed else "completed",
            "error_category": _error_category(call.error) if failed else None,
        },
        "token_stats": {
            "prompt_tokens": call.prompt_tokens,
            "completion_tokens": call.sampled_tokens,
            "total_tokens": call.prompt_tokens + call.sampled_tokens,
        },
    }


def _error_category(error: str | None) -> str:
    """The part of a recorded call error before its detail (``backend``, ``context_overflow``, ...)."""
    return (error or "unknown").split(":", 1)[0].strip() or "unknown"


def latency_summary(traj: Trajectory) -> dict[str, float]:
    """Per-call latency (ms, as the proxy measured it: render + generate) over the episode's calls."""
    values = sorted(c.timings["total_ms"] for c in traj.calls if "total_ms" in c.timings)
    if not values:
        return {"count": 0}
    return {
        "count": len(values),
        "mean": statistics.fmean(values),
        "p50": _quantile(values, 0.5),
        "p95": _quantile(values, 0.95),
        "max": values[-1],
    }


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
