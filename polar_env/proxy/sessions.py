"""Sessions: who may call, with which forced sampling, and the per-session call index.

A session exists only once the admin API (or an in-process call) created it; its key is returned
once and kept only as a SHA-256 digest, so keys never reach logs or the ledger.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import threading
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from polar_env.backends.ids_json import ChainJson, ChainPrompt
from polar_env.backends.logprobs_mode import LogprobsMode
from polar_env.chat.messages import AssistantTurn, Message
from polar_env.outcomes import FailureKind
from polar_env.proxy.seen import Seen, hash_prefixes
from polar_env.trajectory.ledger import SESSION_ID_RE, Ledger
from polar_env.trajectory.records import CallRecord, EpisodeBudget, SessionInfo, ids_digest

SAMPLING_KEYS = ("temperature", "top_p", "max_tokens")  # what a session may force
RESTARTS_KEY = "proxy_restarts"  # session metadata: how many proxy restarts an open session lived through
STOPPED_KEY = "stopped"  # session metadata: why the session refuses further calls


class AuthError(Exception):
    """Unknown session or wrong key; both answer 401 with the same message (no enumeration)."""


class BudgetExceeded(Exception):
    """The session's episode budget (``SessionInfo.budget``) refuses this call; says which limit."""


def prefix_hashes(messages: list[Message]) -> list[str]:
    """``h[k]`` identifies ``messages[:k]``; two conversations share a k-prefix iff their h[k] agree."""
    return hash_prefixes(messages).hashes


@dataclass
class CallState:
    """What the token path needs of an earlier call to extend it, without rereading the ledger."""

    call_index: int
    call_id: str
    n_messages: int
    prefix_hash: str
    tools_fp: str
    # this call's prompt + sampled ids are ``buffer[:n_ids]``; a child that extends the buffer's last
    # call appends to it, so a chain holds one buffer: memory linear in the session's distinct tokens
    buffer: array
    # the buffer's ids as a list of shared int objects (8 bytes a token), extended as it is read:
    # a child's prompt list is a slice of it, not ``tolist()`` of the whole chain on every call
    mirror: list[int]
    ids_json: ChainJson  # the buffer's ids as the JSON a token-in backend is sent, encoded once each
    n_ids: int
    ended_with_eos: bool
    output: AssistantTurn
    system_fp: str | None
    digest: Any  # ``ids_digest`` of its prompt + sampled ids: a child's prompt hash continues it

    def token_ids(self) -> ChainPrompt:
        """This call's prompt ids followed by its sampled ids (a new list), the start of a child's
        prompt, whose JSON for the backend continues the chain's."""
        mirror = self.mirror
        with _MIRROR_LOCK:
            if len(mirror) < self.n_ids:
                new = self.buffer[len(mirror) : self.n_ids]
                mirror.extend(map(_INTS.setdefault, new, new))
            return ChainPrompt(
                mirror if len(mirror) == self.n_ids else mirror[: self.n_ids], self.ids_json, self.n_ids
            )


_INTS: dict[int, int] = {}  # one int object per token id, shared by every mirror
_MIRROR_LOCK = threading.Lock()


@dataclass
class Session:
    info: SessionInfo
    calls: list[CallState] = field(default_factory=list)
    by_index: dict[int, CallState] = field(default_factory=dict)
    by_prefix: dict[str, list[CallState]] = field(default_factory=dict)
    next_index: int = 0
    failures: Counter[str] = field(default_factory=Counter)  # request fingerprint -> failed calls
    admitted: int = 0  # calls let through the budget (answered or still running)
    sampled_tokens: int = 0  # sampled by the answered calls
    reserved_tokens: int = 0  # ``max_tokens`` of the calls still generating (until counted)
    # set when a reservation is released: a parallel call waits on it rather than being refused
    released: asyncio.Event = field(default_factory=asyncio.Event)
    seen: Seen = field(default_factory=Seen)  # the last request, reused where the next one repeats it

    @property
    def id(self) -> str:
        return self.info.session_id

    @property
    def stopped(self) -> str | None:
        """Why the session refuses further calls (None while it accepts them)."""
        return self.info.metadata.get(STOPPED_KEY)

    def count_failure(self, fingerprint: str, limit: int, why: str) -> bool:
        """Count a failed call of this request; at ``limit`` identical failures the session stops
        (returns True once, when it does)."""
        self.failures[fingerprint] += 1
        if self.failures[fingerprint] < limit or self.stopped is not None:
            return False
        reason = f"the harness sent the same failing request {limit} times (last: {why})"[:500]
        self.info = self.info.model_copy(update={"metadata": {**self.info.metadata, STOPPED_KEY: reason}})
        return True

    def admit(self) -> None:
        """Let one more call through, or raise :class:`BudgetExceeded` when the calls budget is spent."""
        limit = self.info.budget.max_calls
        if limit is not None and self.admitted >= limit:
            raise BudgetExceeded(f"the episode's budget of {limit} model calls is spent")
        self.admitted += 1

    def token_room(self) -> int | None:
        """Tokens the budget still lets the next call sample (None: no limit); 0 raises BudgetExceeded."""
        limit = self.info.budget.max_sampled_tokens
        if limit is None:
            return None
        room = limit - self.sampled_tokens - self.reserved_tokens
        if room < 1:
            raise BudgetExceeded(f"the episode's budget of {limit} sampled tokens is spent")
        return room

    async def wait_for_token_room(self) -> int | None:
        """``token_room``, waiting while calls in parallel hold what is left: only tokens actually
        sampled spend the budget, so a side call is not refused for another call's reservation."""
        while True:
            try:
                return self.token_room()
            except BudgetExceeded:
                if self.reserved_tokens <= 0:
                    raise
                await self.released.wait()

    def reserve_tokens(self, n: int) -> None:
        self.reserved_tokens += n

    def release_tokens(self, n: int) -> None:
        self.reserved_tokens -= n
        self.released.set()  # wake the waiters, then arm a fresh event for the next release
        self.released = asyncio.Event()

    def reserve_index(self) -> int:
        index = self.next_index
        self.next_index += 1
        return index

    def remember(
        self, record: CallRecord, eos_ids: set[int], prefix_hash: str | None = None, digest: Any = None
    ) -> None:
        """Index a finished call so later requests can extend it (``prefix_hash``: that of
        ``record.messages``, ``digest``: ``ids_digest`` of its prompt + sampled ids, when the
        caller already has them)."""
        self.next_index = max(self.next_index, record.call_index + 1)
        if record.output is None or record.error:
            return
        self.sampled_tokens += len(record.sampled_ids)
        parent = self.by_index.get(record.parent_call_index) if record.parent_call_index is not None else None
        reused = record.reused_prefix_len
        # the parent is the tip of its buffer and this prompt starts with it: go on in the same buffer
        tip = (
            parent
            if parent is not None and reused == parent.n_ids == len(parent.buffer) <= len(record.prompt_ids)
            else None
        )
        added = array("i", record.prompt_ids[reused:] if tip else record.prompt_ids)
        added.extend(record.sampled_ids)
        if digest is None:  # a recovered record
            digest = ids_digest(added, tip.digest) if tip else ids_digest(added)
        if tip:
            buffer, mirror, ids_json = tip.buffer, tip.mirror, tip.ids_json
        else:
            buffer, mirror = array("i"), []
            ids_json = ChainJson(buffer)
        buffer.extend(added)
        state = CallState(
            call_index=record.call_index,
            call_id=record.call_id,
            n_messages=len(record.messages),
            prefix_hash=prefix_hash or prefix_hashes(record.messages)[-1],
            # a call that reuses its parent's tools and messages has the parent's fingerprints: not
            # hashed again per call (a harness's tools and system prompt run to tens of kilobytes)
            tools_fp=parent.tools_fp if parent is not None and record.reused_tools else _tools_fp(record),
            buffer=buffer,
            mirror=mirror,
            ids_json=ids_json,
            n_ids=len(buffer),
            ended_with_eos=bool(record.sampled_ids) and record.sampled_ids[-1] in eos_ids,
            output=record.output,
            system_fp=(
                parent.system_fp
                if parent is not None and record.reused_messages
                else record.messages[0].fingerprint()
                if record.messages
                else None
            ),
            digest=digest,
        )
        self.calls.append(state)
        self.by_index[state.call_index] = state
        self.by_prefix.setdefault(state.prefix_hash, []).append(state)


def _tools_fp(record: CallRecord) -> str:
    from polar_env.chat.messages import Conversation

    return Conversation(messages=[], tools=record.tools).tools_fingerprint()


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class SessionRegistry:
    """Creates, authenticates and recovers sessions; the ledger is the source of truth on disk."""

    def __init__(self, ledger: Ledger, eos_ids: set[int]):
        self.ledger = ledger
        self.eos_ids = eos_ids
        self._sessions: dict[str, Session] = {}

    def create(
        self,
        session_id: str | None = None,
        *,
        sampling: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        training: bool = False,
        logprobs_mode: LogprobsMode = "unknown",
        budget: EpisodeBudget | dict[str, Any] | None = None,
    ) -> tuple[Session, str]:
        session_id = session_id or secrets.token_hex(8)
        if not SESSION_ID_RE.match(session_id):
            raise ValueError(
                f"invalid session id {session_id!r}: use letters, digits, '_', '.', '-' (max 128)"
            )
        if session_id in self._sessions or self.ledger.session(session_id) is not None:
            raise ValueError(f"session {session_id!r} already exists")
        sampling = dict(sampling or {})
        unknown = set(sampling) - set(SAMPLING_KEYS)
        if unknown:
            raise ValueError(f"unknown sampling keys {sorted(unknown)}; allowed: {list(SAMPLING_KEYS)}")
        for name, value in sampling.items():
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or value != value or value < 0
            ):
                raise ValueError(f"sampling {name} must be a non-negative number, got {value!r}")
        key = "pk-" + secrets.token_urlsafe(24)
        info = SessionInfo(
            session_id=session_id,
            key_sha256=hash_key(key),
            created_at=time.time(),
            sampling=sampling,
            metadata=dict(metadata or {}),
            training=training,
            logprobs_mode=logprobs_mode,
            budget=EpisodeBudget.model_validate(budget or {}),
        )
        self.ledger.create_session(info)
        session = Session(info=info)
        self._sessions[session_id] = session
        return session, key

    def authenticate(self, session_id: str, key: str | None) -> Session:
        session = self._sessions.get(session_id)
        if session is None or not key or not hmac.compare_digest(session.info.key_sha256, hash_key(key)):
            raise AuthError("unknown session or wrong API key for this session")
        if session.info.closed_at is not None:
            raise AuthError("session is closed")
        return session

    def get(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def all(self) -> list[Session]:
        return list(self._sessions.values())

    def close(self, session_id: str, status: str = "completed") -> SessionInfo:
        session = self._sessions[session_id]
        if session.info.closed_at is not None:  # closing twice must not rewrite how it ended
            return session.info
        session.info = session.info.model_copy(update={"closed_at": time.time(), "status": status})
        session.seen = Seen()  # the last request's bodies: nothing extends a closed session
        self.ledger.update_session(session.info)
        self.ledger.close_session(session_id)
        return session.info

    def discard(self, session_id: str) -> None:
        """Forget a closed session, in memory and on disk (a long-lived proxy keeps only open ones)."""
        session = self._sessions.get(session_id)
        if session is not None and session.info.closed_at is None:
            raise ValueError(f"session {session_id!r} is still open")
        self._sessions.pop(session_id, None)
        self.ledger.remove_session(session_id)

    def recover(self) -> Any:
        """Reload every session and its finished calls from the ledger after a restart.

        A session still open lived through the restart: a call in flight then got no answer and
        was not recorded. Its metadata counts this (``proxy_restarts``), so the trajectory says so.
        """
        report = self.ledger.recover()
        for info in self.ledger.sessions():
            if info.status == "open":
                restarts = int(info.metadata.get(RESTARTS_KEY, 0)) + 1
                info = info.model_copy(update={"metadata": {**info.metadata, RESTARTS_KEY: restarts}})
                self.ledger.update_session(info)
            session = Session(info=info)
            records = sorted(self.ledger.calls(info.session_id), key=lambda r: r.call_index)
            for record in records:
                session.remember(record, self.eos_ids)
            # failed calls spent the calls budget too; only a refusal by the budget itself did not
            session.admitted = sum(
                1 for record in records if record.failure_kind != FailureKind.episode_budget
            )
            self._sessions[info.session_id] = session
        return report
