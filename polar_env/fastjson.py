"""JSON on the hot path: ``orjson`` (several times faster than ``json`` on token-id lists and long
histories), with the standard library as the fallback for what orjson refuses.

orjson rejects a few inputs ``json`` accepts (lone UTF-16 surrogate escapes, ``NaN``, integers past
64 bits); ``loads`` and ``dumps`` hand those to ``json`` so a request means exactly what it meant
before, and an answer holding such a value (a tool argument the model sampled) is still sent.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(raw: bytes | str) -> Any:
    """Parse JSON; whatever orjson refuses gets the standard library's verdict (and its error)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def dumps(value: Any, *, newline: bool = False) -> bytes:
    """Compact UTF-8 JSON (``separators=(",", ":")``, ``ensure_ascii=False``); numpy arrays (an
    export's token-id views) are written as lists. ``newline`` ends it with one (a JSONL line),
    appended by orjson rather than by copying a line of many MB once more."""
    try:
        option = orjson.OPT_SERIALIZE_NUMPY | (orjson.OPT_APPEND_NEWLINE if newline else 0)
        return orjson.dumps(value, option=option)
    except orjson.JSONEncodeError:  # ASCII escapes: valid even for lone surrogates
        return json.dumps(value, separators=(",", ":"), default=_tolist).encode() + (
            b"\n" if newline else b""
        )


def _tolist(value: Any) -> Any:
    if hasattr(value, "tolist"):  # a numpy array
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
