"""Polar's trajectory format: what one episode became after its calls were grouped into chains.

A trajectory line is self-contained training data (every chain's token ids, loss mask and
logprobs) plus enough of the calls to audit it. The schema is versioned because trajectory files
outlive the code that wrote them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer
from pydantic_core import PydanticSerializationError

from polar_env.chat.messages import AssistantTurn, Message
from polar_env.grades import GradeResult
from polar_env.outcomes import FailureKind
from polar_env.safe_text import json_safe

TRAJECTORY_SCHEMA_VERSION = 1

SpanKind = Literal["prompt", "sampled", "interstitial", "unscored"]
Status = Literal["completed", "timeout", "error"]


class Span(BaseModel):
    """``input_ids[start:end]`` came from ``call_index``: its prompt (first call of a chain), the
    tokens it sampled, the tokens appended before it (tool results, template glue), or sampled
    tokens whose logprobs are unusable (``unscored``: masked, never trained on)."""

    start: int
    end: int
    kind: SpanKind
    call_index: int


class Chain(BaseModel):
    """One linear token sequence: prompt, then alternating sampled and interstitial spans."""

    index: int
    call_indices: list[int]
    start_reason: str  # "start" for the episode's first chain, else why the previous one could not go on
    input_ids: list[int]
    loss_mask: list[int]  # 1 exactly on sampled tokens with real logprobs
    logprobs: list[float]  # the recorded logprob on sampled tokens, 0.0 elsewhere
    spans: list[Span]

    @property
    def sampled_tokens(self) -> int:
        return sum(s.end - s.start for s in self.spans if s.kind in ("sampled", "unscored"))

    @property
    def trainable_tokens(self) -> int:
        return sum(self.loss_mask)

    def first_prompt_ids(self) -> list[int]:
        """The tokens before the first sampled token: what GRPO groups are keyed on."""
        return self.input_ids[: self.spans[0].end] if self.spans else []


class ChainBreak(BaseModel):
    call_index: int
    chain: int
    reason: str


class CallSummary(BaseModel):
    """What the trajectory keeps of each call: enough to rebuild the conversation, not the full
    history again (``new_messages`` are the messages this call added after its parent's answer;
    a chain's first call keeps all of its messages)."""

    call_index: int
    call_id: str
    api: str
    created_at: float
    chain: int | None  # None for a failed call (no tokens)
    parent_call_index: int | None
    messages_offset: int  # index in the call's full message list where new_messages start
    new_messages: list[Message]
    output: AssistantTurn | None
    finish_reason: str | None
    prompt_tokens: int
    sampled_tokens: int
    flags: list[str] = Field(default_factory=list)
    error: str | None = None
    timings: dict[str, float] = Field(default_factory=dict)
    # what the harness asked for (temperature, top_p, top_k, max_tokens, stop): its narrowing knobs are
    # never applied (flag ``neutralised:...``); ``sampling`` is what the backend was sent
    requested_sampling: dict[str, Any] = Field(default_factory=dict)
    sampling: dict[str, Any] = Field(default_factory=dict)
    policy_version: int | None = None  # the weights' version that sampled it (None: unversioned)
    version_source: str | None = None  # server (its weight label) | trainer (set at the proxy) | None
    origin: str | None = None  # harness | tool | unknown (the forwarder's proof); None: not tagged


class TrajectoryStats(BaseModel):
    calls: int
    failed_calls: int
    chains: int
    sampled_tokens: int  # every token any call sampled
    trainable_tokens: int  # sampled tokens with loss mask 1 in Polar's format (all chains)
    trainable_fraction: float  # trainable_tokens / sampled_tokens (0.0 when nothing was sampled)
    main_chain_tokens: int  # trainable tokens of the main chain (what the NeMo-RL export trains)
    masked_tokens: int  # chain positions with loss mask 0 (prompts, interstitials, unscored)
    unscored_tokens: int  # sampled tokens masked because their logprobs were missing or not finite
    # answered calls whose logprobs were missing, misaligned or not finite: their turns are context (mask 0)
    context_only_turns: int = 0
    # answered calls no version is known for (the server reports none and no trainer set one)
    unversioned_calls: int = 0
    # the harness made one answered model call: a degenerate agentic rollout (OpenEnv RFC 006), flagged
    # by polar check and masked where the run asks (--mask-single-call)
    single_call: bool = False
    breaks: list[ChainBreak] = Field(default_factory=list)
    # distinct policy versions that sampled the episode's calls, ascending (two or more: it spans a weight
    # update)
    policy_versions: list[int] = Field(default_factory=list)


class EpisodeTimings(BaseModel):
    """Seconds per stage, in the order they happen, then the harness's run and the episode's total;
    ``model_dump()`` is a flat dict of floats (what a trajectory's metadata carries)."""

    # a trajectory written before a stage was timed loads (its keys only); one the schema dropped too
    model_config = ConfigDict(frozen=True, extra="ignore")

    # the driver took the episode -> its prepare began: waiting for a live slot, the staleness bound
    # and a prepare slot (episodes/admission.py)
    queued_s: float = 0.0
    prepare_s: float = 0.0  # the workspace opened (the Gym resources server's seed), the harness started
    harness_start_s: float = 0.0  # the harness started -> its first model call (its whole run if none)
    wait_s: float = 0.0  # its calls' waits for a run slot (the first call's and the later ones')
    model_s: float = 0.0  # in model calls after admission (overlapping calls counted once)
    tool_s: float = 0.0  # the rest of the run less the later waits: tools, the harness's own work
    drain_s: float = 0.0  # the harness ended -> the trajectory build began (patch, drain, classification)
    build_s: float = 0.0  # the trajectory build
    grade_s: float = 0.0  # grading (the Gym resources server's /verify)
    close_s: float = 0.0  # the workspace's close after grading (the Gym resources server's close)
    harness_s: float = 0.0  # the harness started -> it ended (its split: harness_start_s .. tool_s)
    total_s: float = 0.0  # the episode's proxy session opened -> its finish ended (after its queued_s)

    @model_serializer(mode="wrap")
    def _set_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The stages that were timed: every one for an episode of this version, an older line's as
        written."""
        return {k: v for k, v in handler(self).items() if k in self.model_fields_set}


class TrajectoryMetadata(BaseModel):
    """What Polar records about the episode beside its tokens, one typed field per key it writes. Keys of
    the caller's own (a proxy session's metadata) are kept as extra fields; a field Polar did not set
    is left out of the line, as it always was (older trajectories, without some of them, still load)."""

    model_config = ConfigDict(extra="allow")

    # who ran it (the proxy session's metadata at open: episodes/, rollout/)
    task_id: str | None = None
    group_id: str | None = None
    harness: str | None = None
    harness_version: str | None = None
    episode_key: str | None = None  # the run's key for the (task, sample) pair: what a resumed run skips
    sample: int | None = None
    admitted_at_version: int | None = None  # --max-staleness: the policy version it was admitted at
    origin_tagged: bool | None = None  # its calls came through a tagging forwarder (proxy.app)
    proxy_restarts: int | None = None  # restarts of the proxy its open session lived through
    stopped: str | None = None  # why its session refused further calls
    logprobs_mode: str | None = None  # which logprobs the backend returned (backends/logprobs_mode.py)
    # where it ran: the run's denominators of accepted work (trajectory/accepted.py), the Ray node
    run_slots: int | None = None
    gpus: int | None = None
    ray_node_id: str | None = None
    host: str | None = None
    workspace: str | None = None  # bubblewrap, or the container engine
    workspace_clone: str | None = None  # how its tree was cloned from the task's warm base
    image: str | None = None
    # how it went
    duration_s: float | None = None
    timings: EpisodeTimings | None = None  # seconds per stage (filled by episodes/timings.py)
    patch_bytes: int | None = None
    masked_because: str | None = None  # why masked beyond the outcome table ("single_call")
    mask_sample: bool | None = None  # the Gym agent: NeMo-RL's mask
    failure: dict[str, Any] | None = None  # the Gym agent: ``agent_server.failures.EpisodeFailure``
    # class -> a few examples of the exploits its tool calls attempted (trajectory/exploits.py)
    exploit_attempts: dict[str, list[dict[str, Any]]] | None = None

    @model_serializer(mode="wrap")
    def _set_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The keys that were set (``None`` too, where Polar set it), extra keys as given."""
        written = self.model_fields_set | set(self.model_extra or {})
        return {k: v for k, v in handler(self).items() if k in written}


class Trajectory(BaseModel):
    schema_version: int = TRAJECTORY_SCHEMA_VERSION
    session_id: str
    task_id: str | None = None
    group_id: str | None = None
    harness: str | None = None
    model: str = ""
    backend: str = ""
    created_at: float
    ended_at: float | None = None
    metadata: TrajectoryMetadata = Field(default_factory=TrajectoryMetadata)
    status: Status
    error: str | None = None
    chains: list[Chain] = Field(default_factory=list)
    main_chain: int | None = None  # index into chains; see chains.main_chain_index
    calls: list[CallSummary] = Field(default_factory=list)
    stats: TrajectoryStats
    reward: float | None = None
    grading: GradeResult | None = None  # the grader's record (polar_env.grades), whoever graded
    failure_kind: FailureKind = FailureKind.none  # what ended the episode (polar_env.outcomes)
    masked: bool = False  # the outcome table's verdict: keep in the GRPO group, train on nothing

    def model_dump_json(self, **kwargs: Any) -> str:
        """As pydantic's, but never refuses: text that is not valid Unicode (a lone surrogate from a
        non-UTF-8 file name, anywhere in the record) is written escaped (`polar_env.safe_text`)."""
        try:
            return super().model_dump_json(**kwargs)
        except PydanticSerializationError:
            return type(self).model_validate(json_safe(self.model_dump())).model_dump_json(**kwargs)
