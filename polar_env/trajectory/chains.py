"""The chain builder: a session's calls, grouped into linear trainable token sequences.

The proxy claims, per call, which earlier call it extends (``parent_call_index``); the builder
trusts no claim it can check: a call joins its parent's chain only when its prompt ids really
start with everything the chain holds so far (token-exact: the chain's running SHA-256 continued
with the call's new ids equals the prompt's recorded one) and the parent is still that chain's
tip. Anything else starts a new chain, with the reason recorded. No chain is spliced across a
break, and sampled tokens without usable logprobs are masked, never guessed.
"""

from __future__ import annotations

import math
from typing import Any

from polar_env.grades import GradeResult
from polar_env.trajectory.models import (
    CallSummary,
    Chain,
    ChainBreak,
    Span,
    SpanKind,
    Status,
    Trajectory,
    TrajectoryMetadata,
    TrajectoryStats,
)
from polar_env.trajectory.records import VERSION_LABEL, CallRecord, SessionInfo, ids_digest

REASON_START = "start"
REASON_NOT_TOKEN_EXACT = "not token-exact"
REASON_BRANCH = "branch"
REASON_NO_PARENT = "no parent"
REASON_PARENT_FAILED = "parent has no tokens"


def is_failed(call: CallRecord) -> bool:
    """A failed call (backend error, or nothing sampled) is kept in the record but adds no tokens."""
    return call.error is not None or not call.sampled_ids


def scored(call: CallRecord) -> bool:
    """Its logprobs are one finite number per sampled token: the turn can be trained on; else it is
    context."""
    return len(call.logprobs) == len(call.sampled_ids) and all(map(math.isfinite, call.logprobs))


def sampled_by(call: CallRecord) -> list[int]:
    """The policy versions that sampled ``call``: its own, and the server's later label when the weights
    changed while it generated."""
    numbers = [int(v) for v in call.weight_versions if VERSION_LABEL.fullmatch(v)]
    return sorted({*numbers, *([call.policy_version] if call.policy_version is not None else [])})


def build_chains(calls: list[CallRecord]) -> tuple[list[Chain], dict[int, int]]:
    """Group calls into chains; returns the chains and ``call_index -> chain index``."""
    chains: list[Chain] = []
    digests: list[Any] = []  # per chain: ``ids_digest`` of its input ids so far
    chain_of: dict[int, int] = {}
    tip: dict[int, int] = {}  # chain index -> call index of its last call
    known = {c.call_index for c in calls}
    for call in sorted(calls, key=lambda c: c.call_index):
        if is_failed(call):
            continue
        parent = call.parent_call_index
        reason: str | None
        glue_digest = None
        if parent is None:
            reason = call.break_reason or REASON_NO_PARENT
        elif parent not in known or parent >= call.call_index:
            reason = f"unknown parent {parent}"
        elif parent not in chain_of:
            reason = REASON_PARENT_FAILED
        elif tip[chain_of[parent]] != parent:
            reason = REASON_BRANCH
        elif (glue_digest := _extends(call, chains[chain_of[parent]], digests[chain_of[parent]])) is None:
            reason = REASON_NOT_TOKEN_EXACT
        else:
            reason = None
        if reason is None:
            assert parent is not None  # every call without a parent got a reason
            index = chain_of[parent]
            _extend(chains[index], call)
            digests[index] = ids_digest(call.sampled_ids, glue_digest)
        else:
            index = len(chains)
            chains.append(_start(index, call, reason if index else (call.break_reason or REASON_START)))
            digests.append(ids_digest(chains[index].input_ids))
        chain_of[call.call_index] = index
        tip[index] = call.call_index
    return chains, chain_of


def _extends(call: CallRecord, chain: Chain, digest: Any) -> Any:
    """The digest of ``call``'s prompt when it starts with all of ``chain`` (token-exact), else None.

    With the prompt's recorded SHA-256 (every ledger record has it; the ledger checked it against
    the ids on read) the chain's running digest, continued with the call's new ids, must equal it:
    O(new ids) per call instead of comparing the whole history again.
    """
    n = len(chain.input_ids)
    if len(call.prompt_ids) < n:
        return None
    glue = ids_digest(call.prompt_ids[n:], digest)
    if call.prompt_sha256:
        return glue if glue.hexdigest() == call.prompt_sha256 else None
    return glue if call.prompt_ids[:n] == chain.input_ids else None


def main_chain_index(chains: list[Chain]) -> int | None:
    """The chain NeMo-RL trains on: the earliest chain with a trainable token.

    The earliest chain holds the task prompt, so every rollout of a task exports a chain with
    the same first prompt and NeMo-RL's GRPO groups (formed by first-prompt ids) stay whole even
    when a compaction chain grows longer. ``None`` when no chain has a trainable token.
    """
    return next((chain.index for chain in chains if chain.trainable_tokens), None)


def build_trajectory(
    session: SessionInfo,
    calls: list[CallRecord],
    *,
    status: Status | None = None,
    error: str | None = None,
    reward: float | None = None,
    grading: GradeResult | None = None,
    ended_at: float | None = None,
) -> Trajectory:
    """Rebuild one episode from its ledger records.

    ``status`` defaults to the session's own (an episode still ``open`` counts as completed);
    ``ended_at`` defaults to the session's ``closed_at``.
    """
    calls = sorted(calls, key=lambda c: c.call_index)
    chains, chain_of = build_chains(calls)
    main = main_chain_index(chains)
    by_index = {c.call_index: c for c in calls}
    summaries = [_summary(c, chain_of.get(c.call_index), by_index) for c in calls]
    sampled = sum(len(c.sampled_ids) for c in calls)
    answered = [c for c in calls if not is_failed(c)]
    per_chain = [ch.trainable_tokens for ch in chains]  # each a pass over the chain's mask: once
    trainable = sum(per_chain)
    stats = TrajectoryStats(
        calls=len(calls),
        failed_calls=sum(1 for c in calls if is_failed(c)),
        chains=len(chains),
        sampled_tokens=sampled,
        trainable_tokens=trainable,
        trainable_fraction=trainable / sampled if sampled else 0.0,
        main_chain_tokens=per_chain[main] if main is not None else 0,
        masked_tokens=sum(len(ch.loss_mask) for ch in chains) - trainable,
        unscored_tokens=sum(s.end - s.start for ch in chains for s in ch.spans if s.kind == "unscored"),
        breaks=[
            ChainBreak(call_index=ch.call_indices[0], chain=ch.index, reason=ch.start_reason)
            for ch in chains[1:]
        ],
        policy_versions=sorted({v for c in answered for v in sampled_by(c)}),
        context_only_turns=sum(1 for c in answered if not scored(c)),
        unversioned_calls=sum(1 for c in answered if c.policy_version is None),
        single_call=sum(1 for c in answered if c.origin not in ("tool", "unknown")) == 1,
    )
    meta = dict(session.metadata)
    meta.setdefault("logprobs_mode", session.logprobs_mode)  # the proxy's start-up probe of its backend
    if status is None:
        status = "completed" if session.status == "open" else session.status
    if error is None and status == "error":
        error = meta.get("error")
    model = str(meta.get("model") or next((c.model for c in calls if c.model), ""))
    backend = str(meta.get("backend") or next((c.backend for c in calls if c.backend), ""))
    return Trajectory(
        session_id=session.session_id,
        task_id=_opt_str(meta.get("task_id")),
        group_id=_opt_str(meta.get("group_id")),
        harness=_opt_str(meta.get("harness")),
        model=model,
        backend=backend,
        created_at=session.created_at,
        ended_at=ended_at if ended_at is not None else session.closed_at,
        metadata=TrajectoryMetadata.model_validate(meta),
        status=status,
        error=error,
        chains=chains,
        main_chain=main,
        calls=summaries,
        stats=stats,
        reward=reward,
        grading=grading,
    )


def _start(index: int, call: CallRecord, reason: str) -> Chain:
    chain = Chain(
        index=index,
        call_indices=[call.call_index],
        start_reason=reason,
        input_ids=list(call.prompt_ids),
        loss_mask=[0] * len(call.prompt_ids),
        logprobs=[0.0] * len(call.prompt_ids),
        spans=[_span(0, len(call.prompt_ids), "prompt", call.call_index)],
    )
    _add_sampled(chain, call)
    return chain


def _extend(chain: Chain, call: CallRecord) -> None:
    start = len(chain.input_ids)
    glue = call.prompt_ids[start:]
    chain.call_indices.append(call.call_index)
    if glue:
        chain.input_ids.extend(glue)
        chain.loss_mask.extend([0] * len(glue))
        chain.logprobs.extend([0.0] * len(glue))
        chain.spans.append(_span(start, start + len(glue), "interstitial", call.call_index))
    _add_sampled(chain, call)


def _add_sampled(chain: Chain, call: CallRecord) -> None:
    start = len(chain.input_ids)
    n = len(call.sampled_ids)
    ok = scored(call)
    chain.input_ids.extend(call.sampled_ids)
    chain.loss_mask.extend([1 if ok else 0] * n)
    chain.logprobs.extend(call.logprobs if ok else [0.0] * n)
    chain.spans.append(_span(start, start + n, "sampled" if ok else "unscored", call.call_index))


def _span(start: int, end: int, kind: SpanKind, call_index: int) -> Span:
    """A span of ints the builder computed itself: built without pydantic's validation (hundreds a
    trajectory)."""
    return Span.model_construct(start=start, end=end, kind=kind, call_index=call_index)


def _summary(call: CallRecord, chain: int | None, by_index: dict[int, CallRecord]) -> CallSummary:
    offset = 0
    parent = by_index.get(call.parent_call_index) if call.parent_call_index is not None else None
    if parent is not None and not is_failed(parent):
        n = len(parent.messages)
        if call.messages[:n] == parent.messages:  # pydantic field equality: no re-serialisation
            offset = min(n + 1, len(call.messages))  # + the parent's own answer
    # model_construct: every value comes from a validated record (or is computed here); validating
    # them again would cost more than the rest of the summary
    return CallSummary.model_construct(
        call_index=call.call_index,
        call_id=call.call_id,
        api=call.api,
        created_at=call.created_at,
        chain=chain,
        parent_call_index=call.parent_call_index,
        messages_offset=offset,
        new_messages=call.messages[offset:],
        output=call.output,
        finish_reason=call.finish_reason,
        prompt_tokens=len(call.prompt_ids),
        sampled_tokens=len(call.sampled_ids),
        flags=list(call.flags),
        error=call.error,
        timings=dict(call.timings),
        policy_version=call.policy_version,
        requested_sampling=dict(call.requested_sampling),
        sampling=call.sampling.model_dump(exclude={"stop_token_ids"}) if call.output is not None else {},
        version_source=call.version_source,
        origin=call.origin,
    )


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)
