"""What a session's previous request already held, so each request is worked on only where it is new.

A harness resends its whole history on every call; at turn 200 that is hundreds of messages the
proxy validated, merged, stripped of volatile lines and hashed on the turns before. :class:`Seen`
keeps, per session, the last request's raw wire items, the canonical messages they decoded to, the
state the split-turn merge ended in, their stripped form and the running prefix hashes. The next
request reuses all of that for its leading items equal to the previous request's (an ``==`` of
parsed JSON or of the same message objects: a C-level compare, not a decode), and works only on
the rest, so a call's cost does not grow with the history. The result is the same as decoding
everything: any item that differs, and all after it, go through the full path.

Each snapshot (a frozen dataclass) is replaced whole, never edited, and only on the event loop; a
large body decoded in a worker process works on a copy and its snapshot replaces the session's when
it comes back, so two requests of one session decoding at once each see a consistent one and the
later simply wins.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from polar_env.chat.messages import Message


def message_digest(message: Message) -> bytes:
    """The digest a prefix hash chains: of pydantic's own JSON (fixed field order), ~3x cheaper
    than ``fingerprint()``'s model_dump + sorted json.dumps."""
    return hashlib.sha256(message.model_dump_json().encode()).digest()


@dataclass(frozen=True)
class Decoded:
    """The raw wire items of one request and what they decoded to: the canonical messages and their
    refs in order, where each item's messages end (``ends[i]``) and the flags each item raised."""

    raw: list[Any]
    messages: list[Message]
    refs: list[str | None]
    ends: list[int]
    flags: list[tuple[str, ...]]

    def upto(self, k: int) -> tuple[list[Message], list[str | None], list[int], list[tuple[str, ...]]]:
        """What the first ``k`` items decoded to, as new lists the next request appends to."""
        n = self.ends[k - 1] if k else 0
        return self.messages[:n], self.refs[:n], self.ends[:k], self.flags[:k]


@dataclass(frozen=True)
class Merged:
    """``merge_split_turns`` of one request: its input and the state the merge ended in (the output
    so far and the output index of the latest assistant message), which a longer input continues."""

    messages: list[Message]
    refs: list[str | None]
    out: list[Message]
    out_refs: list[str | None]
    last: int | None


@dataclass(frozen=True)
class Stripped:
    """Canonical messages and refs before the volatile rules, each message after them (None: a
    system message left empty) with the rules that fired, and the request's output: the messages
    kept, their refs and the ``stripped:`` flags raised, in order."""

    before: list[Message]
    refs: list[str | None]
    after: list[Message | None]
    fired: list[tuple[str, ...]]
    messages: list[Message]
    out_refs: list[str | None]
    flags: dict[str, None]


@dataclass(frozen=True)
class Hashed:
    """Messages and their running prefix hashes: ``hashes[k]`` identifies ``messages[:k]``."""

    messages: list[Message]
    hashes: list[str]
    states: list[Any]  # the running sha256 after each prefix, to continue from any of them


def common_prefix(new: list[Any], old: list[Any]) -> int:
    """How many leading items of ``new`` equal those of ``old`` (one C-level list compare in the
    usual case, where ``new`` extends ``old``; equal messages hash alike, so equality is enough)."""
    n = min(len(new), len(old))
    if new[:n] == old[:n]:
        return n
    k = 0
    while new[k] is old[k] or new[k] == old[k]:
        k += 1
    return k


def extends(new: list[Any], old: list[Any]) -> bool:
    """Whether ``new`` starts with all of ``old`` (one C-level compare; the same objects compare by
    identity first)."""
    return len(new) >= len(old) and new[: len(old)] == old


def hash_prefixes(messages: list[Message], known: Hashed | None = None) -> Hashed:
    """Prefix hashes of ``messages``, continuing from ``known`` over the leading messages it shares."""
    k = common_prefix(messages, known.messages) if known else 0
    hashes = known.hashes[: k + 1] if known else [""]
    states = known.states[: k + 1] if known else [hashlib.sha256()]
    running = states[-1].copy()
    for message in messages[k:]:
        running.update(message_digest(message))
        states.append(running.copy())
        hashes.append(running.hexdigest()[:32])
    return Hashed(list(messages), hashes, states)


@dataclass
class Seen:
    """The last request of one session, in its four stages (each None until a request filled it)."""

    decoded: Decoded | None = None
    merged: Merged | None = None
    stripped: Stripped | None = None
    hashed: Hashed | None = field(default=None, repr=False)
    body_bytes: int = 0  # the size of the last request's body

    def reusable_items(self, raw: list[Any], redo_last: bool = False) -> int:
        """How many leading raw items equal the previous request's (at most all but one, so the
        request still validates as a whole; ``redo_last``: and never the previous request's last,
        for an API where the last item decodes differently)."""
        if self.decoded is None or not raw:
            return 0
        k = min(common_prefix(raw, self.decoded.raw), len(raw) - 1)
        return min(k, len(self.decoded.raw) - 1) if redo_last else k

    def hashes(self, messages: list[Message]) -> list[str]:
        self.hashed = hashed = hash_prefixes(messages, self.hashed)
        return hashed.hashes
