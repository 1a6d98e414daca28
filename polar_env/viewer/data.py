"""What the page embeds: trajectories found under a path, turned into compact JSON payloads.

The page keeps one summary row per episode for the list and one payload per episode (parsed only
when the episode is selected): chain token ids, a per-episode id -> text table, logprobs of the
sampled spans, the calls' messages (long texts cut) and the grading report.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polar_env.chat.messages import Message
from polar_env.trajectory.checks import detect_kind
from polar_env.trajectory.exploits import attempts_of
from polar_env.trajectory.export import read_trajectories
from polar_env.trajectory.models import Trajectory
from polar_env.viewer.tokens import TokenText

TEXT_LIMIT = 2000  # characters kept of a message, an answer or a tool call's arguments
LOG_LIMIT = 8000  # characters kept of the grader's log tail

# Why a chain starts: the reasons chains.py and the proxy write, in words a reader can act on.
_BREAK_EXPLANATIONS = (
    ("start", "the episode's first request"),
    ("first call", "the episode's first request"),
    ("no parent", "the request extends no earlier call, and the proxy gave no reason"),
    ("tools changed", "the request offers other tools than any earlier call: a sub-agent or a side call"),
    (
        "different system prompt",
        "the request has a system prompt no earlier call had: a side call (title, summary, sub-agent)",
    ),
    (
        "history rewritten",
        "the request keeps the system prompt and tools but not the earlier "
        "conversation: the harness compacted or edited its history",
    ),
    ("compaction", "the harness replaced the history with a summary"),
    ("side call", "a request outside the main conversation (title, summary, sub-agent)"),
    ("no prefix match", "the request extends no earlier call's conversation"),
    ("branch", "the parent call already has a continuation in its chain: a retry or a fork"),
    (
        "not token-exact",
        "the proxy linked it to a parent, but its prompt tokens differ from the "
        "parent's prompt + answer, so they cannot be spliced",
    ),
    ("parent has no tokens", "its parent call failed and sampled nothing"),
    ("unknown parent", "its parent call is not in the episode"),
)


def explain_break(reason: str) -> str:
    """A sentence for a chain's ``start_reason`` (empty when the reason is not a known one)."""
    low = reason.lower()
    for key, text in _BREAK_EXPLANATIONS:
        if low.startswith(key):
            return text
    return next((text for key, text in _BREAK_EXPLANATIONS[2:] if key in low), "")


@dataclass
class Loaded:
    """Trajectories found under a path; ``skipped`` names files or lines that are not trajectories."""

    episodes: list[tuple[Trajectory, str]] = field(default_factory=list)  # (trajectory, source file)
    sources: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def trajectory_files(path: Path) -> list[Path]:
    """``path`` itself, or every ``*.jsonl`` under it (other JSONL kinds are filtered by ``load``)."""
    path = Path(path)
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*.jsonl") if p.is_file())


def load(path: Path) -> Loaded:
    """Read the Polar trajectory files under ``path``; a session seen twice (a resumed rollout)
    keeps its last trajectory. Episodes are ordered by group, then start time."""
    out = Loaded()
    by_session: dict[str, tuple[Trajectory, str]] = {}
    for file in trajectory_files(path):
        if detect_kind(file) != "polar":  # GRPO batches, NeMo results: not trajectories
            out.skipped.append(f"{file}: not a Polar trajectory file")
            continue
        out.sources.append(str(file))
        try:
            for traj in read_trajectories(file):
                by_session.pop(traj.session_id, None)
                by_session[traj.session_id] = (traj, str(file))
        except ValueError as exc:
            out.skipped.append(str(exc).splitlines()[0])
    out.episodes = sorted(
        by_session.values(), key=lambda e: (e[0].group_id or e[0].task_id or e[0].session_id, e[0].created_at)
    )
    return out


def _cut(text: str | None, limit: int = TEXT_LIMIT) -> str:
    if not text:
        return ""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more characters)"


def _finite(x: float) -> float | None:
    return round(x, 4) if math.isfinite(x) else None


def summary(traj: Trajectory, source: str) -> dict[str, Any]:
    """One row of the episode list."""
    stats, grading = traj.stats, traj.grading
    return {
        "session_id": traj.session_id,
        "task_id": traj.task_id,
        "group_id": traj.group_id,
        "harness": traj.harness,
        "model": traj.model,
        "backend": traj.backend,
        "status": traj.status,
        "error": _cut(traj.error, 300),
        "reward": traj.reward,
        "resolved": grading.resolved if grading else None,
        "failure_kind": (grading.failure_kind.value if grading else None)
        if traj.failure_kind == "none"
        else traj.failure_kind.value,
        "flags": grading.flags if grading else [],
        "exploits": list(attempts_of(traj)),
        "masked": traj.masked,
        "chains": stats.chains,
        "calls": stats.calls,
        "failed_calls": stats.failed_calls,
        "sampled": stats.sampled_tokens,
        "trainable": stats.trainable_tokens,
        "main_tokens": stats.main_chain_tokens,
        "tokens": sum(len(ch.input_ids) for ch in traj.chains),
        "created_at": traj.created_at,
        "duration": (traj.ended_at - traj.created_at) if traj.ended_at else None,
        "source": source,
    }


def _message(m: Message) -> dict[str, Any]:
    return {
        "role": m.role,
        "content": _cut(m.content),
        "reasoning": _cut(m.reasoning),
        "tool_calls": [{"id": c.id, "name": c.name, "arguments": _cut(c.arguments)} for c in m.tool_calls],
        "tool_call_id": m.tool_call_id,
        "name": m.name,
    }


def episode(traj: Trajectory, source: str, text: TokenText) -> dict[str, Any]:
    """Everything the detail view of one episode shows."""
    table = text.table(i for ch in traj.chains for i in ch.input_ids)
    chains = []
    for ch in traj.chains:
        spans = []
        for s in ch.spans:
            span: dict[str, Any] = {"kind": s.kind, "call": s.call_index, "start": s.start, "end": s.end}
            if s.kind == "sampled":
                span["lp"] = [_finite(x) for x in ch.logprobs[s.start : s.end]]
            spans.append(span)
        chains.append(
            {
                "index": ch.index,
                "calls": ch.call_indices,
                "start_reason": ch.start_reason,
                "why": explain_break(ch.start_reason),
                "main": ch.index == traj.main_chain,
                "tokens": len(ch.input_ids),
                "trainable": ch.trainable_tokens,
                "sampled": ch.sampled_tokens,
                "ids": ch.input_ids,
                "fix": {str(k): v for k, v in text.fixups(ch.input_ids, table).items()},
                "spans": spans,
            }
        )
    calls = []
    for c in traj.calls:
        out = c.output
        calls.append(
            {
                "index": c.call_index,
                "call_id": c.call_id,
                "api": c.api,
                "chain": c.chain,
                "parent": c.parent_call_index,
                "finish_reason": c.finish_reason,
                "prompt_tokens": c.prompt_tokens,
                "sampled_tokens": c.sampled_tokens,
                "flags": c.flags,
                "error": c.error,
                "timings": c.timings,
                "messages_offset": c.messages_offset,
                "new_messages": [_message(m) for m in c.new_messages],
                "output": None
                if out is None
                else {
                    "content": _cut(out.content),
                    "reasoning": _cut(out.reasoning),
                    "malformed_tool_call": out.malformed_tool_call,
                    "tool_calls": [
                        {"id": t.id, "name": t.name, "kind": t.kind, "arguments": _cut(t.arguments)}
                        for t in out.tool_calls
                    ],
                },
            }
        )
    grading = traj.grading.model_dump(mode="json") if traj.grading else None
    if grading:
        grading["log_tail"] = _cut(grading["log_tail"], LOG_LIMIT)
    return {
        **summary(traj, source),
        "ended_at": traj.ended_at,
        "metadata": traj.metadata.model_dump(mode="json"),
        "main_chain": traj.main_chain,
        "stats": traj.stats.model_dump(),
        "grading": grading,
        "exploit_attempts": attempts_of(traj),
        "vocab": {str(k): v for k, v in table.items()},
        "chains": chains,
        "call_list": calls,
    }


def headline(trajectories: list[Trajectory]) -> str:
    """The header's counts, over every episode as ``polar rollout``/``demo`` count them (resolved of
    all episodes, not of the graded ones: a masked episode is not graded, and still one of them)."""
    n = len(trajectories)
    parts = [f"{n:,} episodes"]
    if n:
        resolved = sum(bool(t.grading and t.grading.resolved) for t in trajectories)
        masked = sum(t.masked for t in trajectories)
        ungraded = sum(t.grading is None for t in trajectories)
        notes = [f"{ungraded} not graded"] * bool(ungraded) + [f"{masked} masked"] * bool(masked)
        parts.append(f"resolved {resolved}/{n}" + (f" ({', '.join(notes)})" if notes else ""))
    rewards = [t.reward for t in trajectories if t.reward is not None]
    if rewards:
        parts.append(f"mean reward {sum(rewards) / len(rewards):.3f}")
    parts.append(f"sampled {sum(t.stats.sampled_tokens for t in trajectories):,}")
    parts.append(f"trained {sum(t.stats.trainable_tokens for t in trajectories):,} tokens")
    return " · ".join(parts)


def index(loaded: Loaded, text: TokenText, *, title: str, generated_at: float) -> dict[str, Any]:
    """The page's header data and episode list."""
    models = sorted({t.model for t, _ in loaded.episodes if t.model})
    return {
        "title": title,
        "generated_at": generated_at,
        "tokenizer": text.name,
        "models": models,
        "sources": loaded.sources,
        "skipped": loaded.skipped,
        "headline": headline([t for t, _ in loaded.episodes]),
        "episodes": [summary(t, s) for t, s in loaded.episodes],
    }


def episodes(loaded: Loaded, text: TokenText) -> Iterable[dict[str, Any]]:
    for traj, source in loaded.episodes:
        yield episode(traj, source, text)
