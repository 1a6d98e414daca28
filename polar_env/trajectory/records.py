"""The record of one model call, the unit the proxy appends to the ledger.

This is the contract between the proxy (writer) and the trajectory package (ledger, chain
builder, exporters). Session keys never appear here.
"""

from __future__ import annotations

import hashlib
import re
import sys
from array import array
from collections.abc import Sequence
from itertools import islice
from typing import Any, Literal, overload

from pydantic import AliasChoices, BaseModel, Field, field_serializer

from polar_env.backends.base import SamplingParams
from polar_env.chat.messages import AssistantTurn, Message, ToolSpec
from polar_env.outcomes import FailureKind

RECORD_SCHEMA_VERSION = 2  # ledger line format: 1 = the whole call, 2 = what it adds to its parent
SESSION_SCHEMA_VERSION = 1
Api = Literal["chat", "responses", "messages", "gemini"]  # the harness API a call came in on
CallOrigin = Literal["harness", "tool", "unknown"]  # who made a call, as the sandbox's forwarder proved it


def ids_digest(ids: list[int] | array, digest: Any = None) -> Any:
    """SHA-256 of token ids as little-endian int32s, continued from ``digest`` when given (a
    prompt's digest is its parent's continued with the ids appended since: no re-hashing)."""
    digest = hashlib.sha256() if digest is None else digest.copy()
    packed = ids if isinstance(ids, array) else array("i", ids)
    if sys.byteorder == "big":
        packed = array("i", packed)
        packed.byteswap()
    digest.update(packed.tobytes())
    return digest


class PromptIds(Sequence[int]):
    """A prompt read back from the ledger: the first ``len(self)`` ids of a list its chain shares.

    Each call's prompt is its parent's prompt + sampled ids + what was appended, so a chain's
    prompts are prefixes of one list: a list per call would copy calls x context ids (10M, ~80 MB,
    for a 200-call 100k-token episode) that the chain builder never reads. Read-only; a slice is a
    list, and it equals the list it stands for.
    """

    __slots__ = ("_ids", "_n")

    def __init__(self, ids: list[int], n: int):
        self._ids, self._n = ids, n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            if index.step not in (None, 1):
                return self.tolist()[index]
            start, stop, _ = index.indices(self._n)
            return self._ids[start:stop]
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError("prompt index out of range")
        return self._ids[index]

    def __iter__(self):  # noqa: ANN204 - an iterator of ints
        return islice(self._ids, self._n)

    def tolist(self) -> list[int]:
        return self._ids[: self._n]

    def extends(self, n: int) -> bool:
        """Whether this prompt ends its shared list, which can then grow in place for a child
        (a second child of the same ``n`` ids finds the list longer and copies instead)."""
        return len(self._ids) == self._n == n

    def grown(self, *parts: list[int]) -> PromptIds:
        """The next prompt of the chain: this one's list extended in place (see ``extends``)."""
        for part in parts:
            self._ids.extend(part)
        return PromptIds(self._ids, len(self._ids))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PromptIds):
            other = other.tolist()
        return isinstance(other, list) and len(other) == self._n and self.tolist() == other

    __hash__ = None  # type: ignore[assignment] - equal to a list, so unhashable like one

    def __add__(self, other: Sequence[int]) -> list[int]:
        return self.tolist() + list(other)

    def __radd__(self, other: Sequence[int]) -> list[int]:
        return list(other) + self.tolist()

    def __repr__(self) -> str:
        return repr(self.tolist())


# a call flag (``CallFields.flags``): the engine kept the history's thinking past a new user turn
# (docs/proxy.md); ``polar check`` counts it
HISTORY_THINKING_KEPT = "history_thinking_kept"
# a call flag: the inference server's weight label moved while the call generated (proxy/policy.py)
WEIGHTS_CHANGED = "weights_changed_during_call"
# a call flag: the backend's logprobs were missing, not one per sampled token, or not finite: the turn is
# context (loss mask 0), counted as stats.context_only_turns (OpenEnv RFC 006)
LOGPROBS_UNALIGNED = "logprobs_unaligned"
VERSION_LABEL = re.compile(r"[0-9]{1,18}")  # a server's weight label that is a version number


class CallFields(BaseModel):
    """What a call's record and its ledger line share: everything but the prompt's ids, messages and tools."""

    session_id: str
    call_index: int  # 0-based order of arrival within the session
    call_id: str  # id the proxy issued (response id, message id, completion id)
    api: Api
    created_at: float
    sampled_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    output: AssistantTurn | None = None  # None when the backend failed
    finish_reason: str | None = None
    stop_sequence: str | None = (
        None  # the requested stop string the reply was cut at (sampled ids end with it)
    )
    # text written after the generation prompt, whose ids end prompt_ids: an Anthropic prefill, or the
    # start of a tool call that tool_choice required
    prefill: str = ""
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    requested_sampling: dict[str, Any] = Field(default_factory=dict)  # what the harness asked for
    overridden: list[str] = Field(default_factory=list)  # params the session's forced sampling overrode
    backend: str = ""
    model: str = ""
    timings: dict[str, float] = Field(default_factory=dict)  # render_ms, generate_ms, total_ms
    flags: list[str] = Field(default_factory=list)  # malformed_tool_call, stripped:<rule>, ...
    parent_call_index: int | None = None  # the call whose prompt+sampled ids this prompt extends
    reused_prefix_len: int = 0  # prompt ids taken verbatim from the parent (its prompt + sampled)
    break_reason: str | None = None  # why this call starts a new chain (None when it extends one)
    error: str | None = None  # why the call failed, if it did
    failure_kind: FailureKind | None = (
        None  # backend_failure, proxy_failure, context_overflow, episode_budget
    )
    # hex SHA-256 (``ids_digest``) of the whole prompt the backend was sent; "" where not known (a
    # record read from a format-1 line, or built by hand): readers then compare the ids themselves
    prompt_sha256: str = ""
    # leading messages equal to the parent's first ones (the writer's claim, from its prefix match)
    reused_messages: int = 0
    # the version of the weights that sampled this call: the inference server's numeric label when it
    # gives one, else the trainer's (proxy/policy.py); None: unversioned (docs/nemo.md says where no source
    # exists)
    policy_version: int | None = None
    version_source: Literal["server", "trainer"] | None = None
    # the labels the server gave the weights that sampled it (two when they changed during the call)
    weight_versions: list[str] = Field(default_factory=list)
    # who made the call, as the sandbox's forwarder proved it (sandbox/forwarder.py): the harness, a tool
    # process, or unknown (untagged in a session that expects tags); None: the session is not tagged
    origin: CallOrigin | None = None


class CallRecord(CallFields):
    """One call as a whole: what the proxy builds, what ``Ledger.calls`` returns, the chain
    builder's input. On disk it is a ``CallLine`` (format 2) or, in old ledgers, itself (format 1)."""

    schema_version: int = RECORD_SCHEMA_VERSION  # 1: read from an old ledger's line (the whole call)
    messages: list[Message]  # canonical request messages after volatile stripping
    tools: list[ToolSpec] = Field(default_factory=list)
    prompt_ids: list[int] = Field(default_factory=list)  # a PromptIds when read back from a format-2 ledger
    reused_tools: bool = False  # the tools are the parent's (the writer's claim): the line omits them

    @field_serializer("prompt_ids")
    def _prompt_list(self, ids: Sequence[int]) -> list[int]:
        return ids if isinstance(ids, list) else list(ids)


class CallLine(CallFields):
    """A ledger line (format 2): the call as what it adds to its parent, so a session's bytes on
    disk grow with its distinct tokens, not with calls x context. ``Ledger.calls`` rebuilds the
    whole prompt from the parent chain and checks it against ``prompt_sha256`` and ``prompt_len``."""

    schema_version: Literal[2] = RECORD_SCHEMA_VERSION
    appended_ids: list[int] = Field(default_factory=list)  # prompt ids after the reused prefix
    prompt_len: int = 0
    new_messages: list[Message] = Field(default_factory=list)  # messages after the reused ones
    tools: list[ToolSpec] | None = None  # None: the parent's


class EpisodeBudget(BaseModel):
    """Per-episode limits the proxy enforces whatever the harness's own step caps say (None: no limit):
    past one, each call is refused in its API's error shape and the episode ends ``episode_budget``."""

    max_calls: int | None = Field(default=None, ge=1)  # model calls let through (failed ones count too)
    max_sampled_tokens: int | None = Field(default=None, ge=1)  # tokens sampled over all calls


class SessionInfo(BaseModel):
    """What is persisted about a session; the key is stored only as a salted hash."""

    schema_version: int = SESSION_SCHEMA_VERSION
    session_id: str
    key_sha256: str
    created_at: float
    # forced sampling (temperature, top_p, max_tokens); ledgers written before the rename call it "policy"
    sampling: dict[str, Any] = Field(
        default_factory=dict, validation_alias=AliasChoices("sampling", "policy")
    )
    metadata: dict[str, Any] = Field(default_factory=dict)  # task_id, group_id, harness, ...
    training: bool = False  # its samples are trained on: sampling must match the backend's logprobs
    logprobs_mode: Literal["raw", "processed", "unknown"] = "unknown"  # what the backend returned at start
    budget: EpisodeBudget = Field(default_factory=EpisodeBudget)
    closed_at: float | None = None
    status: Literal["open", "completed", "timeout", "error"] = "open"
