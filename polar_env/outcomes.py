"""How an episode ended and what it earns: the one failure-kind enum and the reward/mask table.

Every way an episode can fail is classified once, into a ``FailureKind`` carried on the records
(``CallRecord``, ``GradeResult``, ``Trajectory``, the NeMo ``/run`` result). What a kind earns is one
table (``OutcomeTable``): the reward, and whether the sample is masked (kept in its GRPO group,
given no loss). Failures outside the policy are masked, never scored 0 and never dropped: a
dropped member shrinks its group, a 0 teaches the policy about our machines. Only causes the agent
cannot produce are outside it, decided by the supervisor (the proxy's ledger, the sandbox's own
start-up signal), never read from the tested process's output: a harness the agent killed or
kept past the deadline is graded like any other. A run may override
rows (``polar rollout --outcome KIND=mask``, the Gym agent's ``outcomes``). docs/outcomes.md is
the table in prose.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from enum import StrEnum
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

WIRE_PREFIX = "polar:"  # NeMo Gym's shared failure vocabulary has no SWE-bench kinds: ours are namespaced


class FailureKind(StrEnum):
    # -- the policy's own doing: the patch is graded; a resolved patch still earns its reward
    none = "none"  # tests ran: the grade's reward (1.0 resolved, 0.0 tests fail)
    empty_patch = "empty_patch"
    apply_failed = "apply_failed"
    test_timeout = "test_timeout"  # the patched tests hit grading's own deadline
    test_crash = "test_crash"  # the test run produced no valid results (e.g. an interpreter crash)
    context_overflow = "context_overflow"  # the conversation outgrew the model's context
    budget_exhausted = "budget_exhausted"  # the last answer was cut by the per-call token budget
    episode_budget = (
        "episode_budget"  # the proxy refused a call past the episode's calls/sampled-tokens budget
    )
    harness_crashed = "harness_crashed"  # the harness failed after its first model call
    deadline_sampling = "deadline_sampling"  # deadline hit while the policy was still sampling at speed
    # the agent can end its own harness (kill it, sleep past the deadline): graded, not masked
    deadline_harness = "deadline_harness"  # deadline hit with no model call in flight
    harness_killed = (
        "harness_killed"  # the harness died of a signal that was not the deadline (the agent, OOM)
    )
    patch_broke_sandbox = (
        "patch_broke_sandbox"  # the patched tree stops the grading sandbox starting; the base's starts
    )
    # a grading step failed on the submission that passes on the task's control (its solution or base):
    # a tree the grader cannot copy, a verifier output it broke (rewards/grader.py, "masks only by control")
    broke_grading = "broke_grading"
    # -- outside the policy: not graded, masked
    harness_start_failed = "harness_start_failed"  # the harness ended before its first model call
    sandbox_failure = "sandbox_failure"  # tree, sandbox or workspace could not be made or read
    backend_failure = "backend_failure"  # a model call failed at the inference server
    proxy_failure = "proxy_failure"  # a model call failed inside Polar's proxy (a bug of ours)
    deadline_backend = "deadline_backend"  # deadline hit while the backend served below its floor rate
    infrastructure = "infrastructure"  # grading could not run (test env, grading sandbox, grader bug)
    task_defect = "task_defect"  # the task cannot be graded (no FAIL_TO_PASS, test patch does not apply)
    no_reward = "no_reward"  # a Harbor verifier wrote no reward, an empty or an unparsable one (never a 0)
    input_error = "input_error"  # the request named no task or an unknown one
    lost_session = "lost_session"  # the resources server has no workspace for the episode
    cancelled = "cancelled"  # the episode was abandoned: its caller went away or the server shut down

    @property
    def wire(self) -> str | None:
        """The string NeMo Gym results carry (``polar:<kind>``); None for a clean run."""
        return None if self is FailureKind.none else WIRE_PREFIX + self.value

    @classmethod
    def from_wire(cls, value: str | None) -> FailureKind:
        if not value:
            return cls.none
        return cls(value.removeprefix(WIRE_PREFIX))

    @property
    def outside_policy(self) -> bool:
        """The policy did not cause it: grading would say nothing about the policy, so it is skipped."""
        return self in _OUTSIDE_POLICY


_OUTSIDE_POLICY = frozenset(
    {
        FailureKind.harness_start_failed,
        FailureKind.sandbox_failure,
        FailureKind.backend_failure,
        FailureKind.proxy_failure,
        FailureKind.deadline_backend,
        FailureKind.infrastructure,
        FailureKind.task_defect,
        FailureKind.no_reward,
        FailureKind.input_error,
        FailureKind.lost_session,
        FailureKind.cancelled,
    }
)


class Outcome(BaseModel):
    """One row of the table: the reward a kind earns and whether the sample is masked."""

    model_config = ConfigDict(frozen=True)
    reward: float | None = None  # None: the grader's reward (only for FailureKind.none)
    mask: bool = False


MASKED = Outcome(reward=0.0, mask=True)
ZERO = Outcome(reward=0.0, mask=False)
DEFAULT_OUTCOMES: dict[FailureKind, Outcome] = {
    kind: (MASKED if kind.outside_policy else ZERO) for kind in FailureKind
} | {FailureKind.none: Outcome()}


class OutcomeTable(BaseModel):
    """The per-run reward/mask table (defaults: ``DEFAULT_OUTCOMES``) and the deadline classifier's floor."""

    rows: dict[FailureKind, Outcome] = Field(default_factory=lambda: dict(DEFAULT_OUTCOMES))
    # below this many sampled tokens per second of generation, a deadline is the backend's, not the policy's
    min_backend_tokens_per_s: float = Field(default=5.0, ge=0.0)

    @field_validator("rows")
    @classmethod
    def _over_defaults(cls, rows: dict[FailureKind, Outcome]) -> dict[FailureKind, Outcome]:
        return {**DEFAULT_OUTCOMES, **rows}

    def apply(self, kind: FailureKind, graded_reward: float | None = None) -> tuple[float | None, bool]:
        """``(reward, mask)`` for an episode of ``kind``; ``graded_reward`` is the grader's reward
        (None when nothing was graded: the reward stays None where the row defers to the grader)."""
        row = self.rows[kind]
        return (row.reward if row.reward is not None else graded_reward), row.mask


def parse_outcome(item: str) -> tuple[FailureKind, Outcome]:
    """One ``--outcome`` item: ``KIND=mask`` (reward 0, masked) or ``KIND=REWARD`` (unmasked)."""
    name, sep, value = item.partition("=")
    try:
        kind = FailureKind(name.strip())
        return kind, (MASKED if value.strip() == "mask" else Outcome(reward=float(value), mask=False))
    except ValueError:
        raise ValueError(
            f"{item!r}: expected KIND=mask or KIND=REWARD, KIND one of "
            f"{', '.join(k.value for k in FailureKind)}"
        ) from None


HarnessStatus = Literal["completed", "timeout", "error"]


class CallView(Protocol):
    """What the classifiers read of a recorded call (``trajectory.records.CallRecord`` has it): this
    module is a leaf the records import, so it names the fields instead of importing the record.
    Read-only, so a record whose fields are narrower (``origin``'s literals) is one."""

    @property
    def call_index(self) -> int: ...

    @property
    def created_at(self) -> float: ...

    @property
    def origin(self) -> str | None: ...

    @property
    def failure_kind(self) -> FailureKind | None: ...

    @property
    def finish_reason(self) -> str | None: ...

    @property
    def timings(self) -> dict[str, float]: ...

    @property
    def output(self) -> Any: ...  # the AssistantTurn (``.tool_calls``), None if the call failed

    @property
    def sampled_ids(self) -> Sequence[int]: ...


def classify_episode(
    status: HarnessStatus,
    calls: Sequence[CallView],
    *,
    deadline_at: float | None = None,
    min_backend_tokens_per_s: float = 5.0,
    killed_by: str | None = None,
) -> FailureKind:
    """What ended an episode whose harness ran (``status``) and made ``calls``, before grading.

    A failed backend or proxy call outranks everything (the rest of the episode is not the
    policy's); a harness killed by a signal other than the deadline's (``killed_by``) was stopped
    from outside; a deadline is classified by cause; a harness that never reached the model did
    not let the policy act.
    """
    failed = [c.failure_kind for c in calls if c.failure_kind is not None]
    for kind in (FailureKind.backend_failure, FailureKind.proxy_failure):
        if kind in failed:
            return kind
    if killed_by is not None and status != "timeout":
        return FailureKind.harness_killed
    if FailureKind.episode_budget in failed:  # the proxy ended the episode; whatever the harness did next
        return FailureKind.episode_budget
    if status == "timeout":
        return deadline_cause(
            calls, deadline_at if deadline_at is not None else time.time(), min_backend_tokens_per_s
        )
    if not any(c.output is not None for c in calls):
        return (
            FailureKind.context_overflow
            if FailureKind.context_overflow in failed
            else FailureKind.harness_start_failed
        )
    last = max(calls, key=lambda c: c.call_index)
    if last.failure_kind is FailureKind.context_overflow:
        return FailureKind.context_overflow
    if status == "error":
        return FailureKind.harness_crashed
    if last.finish_reason == "length" and last.output is not None and not last.output.tool_calls:
        return FailureKind.budget_exhausted
    return FailureKind.none


def is_harness(origin: str | None) -> bool:
    """Whether a call is provably the harness's: tagged ``harness`` by the sandbox's forwarder, or made in a
    session that expects no tags (None). ``tool``/``unknown`` are the agent's own calls (a process it ran
    with the session's key): they never pause the deadline, take run slots ahead of the harness's calls
    (proxy/run_slots.py) or count as evidence about the backend."""
    return origin not in ("tool", "unknown")


def _in_flight(calls: Sequence[CallView], deadline_at: float) -> list[CallView]:
    """The harness's calls still running at the deadline."""
    return [
        c
        for c in calls
        if is_harness(c.origin)
        and c.created_at <= deadline_at
        and (
            c.output is None
            and c.failure_kind is None
            or c.created_at + c.timings.get("total_ms", 0.0) / 1e3 >= deadline_at
        )
    ]


def _sampling_rate(calls: Sequence[CallView]) -> tuple[int, float]:
    """(tokens, seconds) the backend sampled over the harness's answered calls."""
    answered = [c for c in calls if c.output is not None and is_harness(c.origin)]
    return sum(len(c.sampled_ids) for c in answered), sum(
        c.timings.get("generate_ms", 0.0) for c in answered
    ) / 1e3


def deadline_cause(calls: Sequence[CallView], deadline_at: float, min_tokens_per_s: float) -> FailureKind:
    """Harness stuck (no harness call in flight at the deadline), backend slow (the harness's calls
    sampled below ``min_tokens_per_s``), or the policy still sampling (anything else). Only the harness's
    calls are evidence (`is_harness`): the agent's own calls (long prompts, ``max_tokens`` 1, kept in
    flight) would otherwise make a slow tool look like a slow backend, and a masked 0."""
    if not _in_flight(calls, deadline_at):
        return FailureKind.deadline_harness
    tokens, seconds = _sampling_rate(calls)
    if seconds <= 0 or tokens / seconds < min_tokens_per_s:
        return FailureKind.deadline_backend
    return FailureKind.deadline_sampling


DEADLINE_KINDS = frozenset(
    {FailureKind.deadline_harness, FailureKind.deadline_backend, FailureKind.deadline_sampling}
)


def explain_deadline(
    kind: FailureKind, calls: Sequence[CallView], deadline_at: float, min_tokens_per_s: float
) -> str:
    """One sentence on why a deadline was classified ``kind``: the call in flight and the backend's rate."""
    in_flight = _in_flight(calls, deadline_at)
    call = (
        f"model call #{in_flight[0].call_index} was in flight" if in_flight else "no model call was in flight"
    )
    if kind is FailureKind.deadline_harness:
        return f"{kind.value}: {call} at the deadline (the harness or its tools held the clock); graded"
    tokens, seconds = _sampling_rate(calls)
    rate = (
        f"the backend sampled {tokens} tokens in {seconds:.1f} s of generation ({tokens / seconds:.1f} "
        f"tokens/s)"
        if seconds > 0
        else "the backend had answered no call yet (e.g. still prefilling the first prompt)"
    )
    if kind is FailureKind.deadline_backend:
        return (
            f"{kind.value}: {call} at the deadline and {rate}, under the {min_tokens_per_s:g} tokens/s floor "
            "(--min-backend-tokens-per-s): a backend too slow for the deadline, not the policy's doing, so "
            "the sample is masked; on a slow machine raise --timeout (or lower --max-tokens)"
        )
    return f"{kind.value}: {call} at the deadline and {rate}: the policy was still sampling; graded"


def final_kind(episode: FailureKind, graded: FailureKind | None, resolved: bool) -> FailureKind:
    """The episode's kind once graded: a resolved patch earns its reward whatever ended the harness;
    a grading that could not run is not the policy's; otherwise the episode's cause comes first."""
    if graded is None:
        return episode
    if resolved:
        return FailureKind.none
    if graded.outside_policy or episode is FailureKind.none:
        return graded
    return episode
