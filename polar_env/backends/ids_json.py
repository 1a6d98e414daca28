"""A prompt's token ids as JSON, each id of a chain encoded once instead of once per call.

A token-in backend (vLLM's ``/v1/completions``, SGLang's ``/generate``) takes the whole prompt as a
list of ids on every call: at turn 200 of an episode, tens of thousands of ids, whose ``orjson.dumps``
was the proxy's largest per-call cost that grew with the history. A chain's calls each extend the
previous call's prompt and sampled ids (``proxy/sessions.py``), so :class:`ChainJson` keeps, per
chain, the comma-separated encoding of the chain's ids so far, appended to as the chain grows. A
call's prompt is a :class:`ChainPrompt` (a list) that says how many of its leading ids are the
chain's, and :func:`dumps_body` writes the request from those bytes and the new ids' encoding: the
bytes ``orjson.dumps`` of the whole body gives (orjson writes an int list as decimals joined by
``,``), and that full encode wherever the prompt has no known prefix.
"""

from __future__ import annotations

from array import array
from typing import Any

import orjson

from polar_env import fastjson


class ChainJson:
    """The encoding of a chain's ids (``ids``: its buffer, appended to as the chain grows): ``data``
    holds the first ``count`` of them, comma-separated, no brackets; ``ends[n]``: the byte where the
    first ``n`` end, for each ``n`` a call asked for (a call's ids start with its parent's)."""

    __slots__ = ("count", "data", "ends", "ids")

    def __init__(self, ids: array) -> None:
        self.ids = ids
        self.data = bytearray()
        self.ends = {0: 0}
        self.count = 0

    def encode(self, known: int, tail: list[int]) -> bytes | None:
        """``orjson.dumps(ids[:known] + tail)`` from the stored bytes of the first ``known`` ids;
        None where those bytes are not at hand (``known`` inside a stretch encoded at once)."""
        end = self._end(known)
        if end is None:
            return None
        try:
            rest = orjson.dumps(tail)
        except orjson.JSONEncodeError:
            return None
        if end == 0:
            return rest
        head = self.data if end == len(self.data) else self.data[:end]
        if len(rest) == 2:  # b"[]": nothing after the known ids
            return b"".join((b"[", head, b"]"))
        return b"".join((b"[", head, b",", memoryview(rest)[1:]))

    def _end(self, n: int) -> int | None:
        if self.count < n <= len(self.ids):
            chunk = orjson.dumps(self.ids[self.count : n].tolist())
            if self.data:
                self.data += b","
            self.data += memoryview(chunk)[1:-1]
            self.count = n
            self.ends[n] = len(self.data)
        return self.ends.get(n)


class ChainPrompt(list[int]):
    """A prompt's ids whose first ``known`` are the first ``known`` ids of ``chain`` (the engine
    builds it from its parent call's ids and appends the new turn's)."""

    __slots__ = ("chain", "known")

    def __init__(self, ids: list[int], chain: ChainJson, known: int) -> None:
        super().__init__(ids)
        self.chain = chain
        self.known = known

    def encoded(self) -> bytes | None:
        """``orjson.dumps(self)`` from the chain's stored bytes; None: encode it whole."""
        known, chain = self.known, self.chain
        if (
            not known
            or len(self) < known
            or known > len(chain.ids)
            or self[known - 1] != chain.ids[known - 1]
        ):
            return None
        return chain.encode(known, self[known:])


def dumps_body(body: dict[str, Any], key: str | None) -> bytes:
    """``fastjson.dumps(body)``, with ``body[key]`` (the prompt ids) written from its chain's stored
    encoding where it is a :class:`ChainPrompt` that has one."""
    ids = body.get(key) if key is not None else None
    if isinstance(ids, ChainPrompt) and (encoded := ids.encoded()) is not None:
        try:
            return orjson.dumps({**body, key: orjson.Fragment(encoded)})
        except orjson.JSONEncodeError:  # a value orjson refuses elsewhere in the body: the full path
            pass
    return fastjson.dumps(body)
