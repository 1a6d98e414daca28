"""Text from the agent's tree (file names, patches, logs) that always serialises.

Paths and patches are read from the tree as bytes and carried as ``str`` with ``surrogateescape``
(so a patch round-trips to the exact bytes for ``git apply``). Such a ``str`` holds lone surrogates
wherever the bytes were not UTF-8, and JSON encoders refuse those. Records (grades, trajectories,
results) take the escaped form instead: each byte that was not UTF-8 written as ``\\xNN``, the rest
unchanged, so a non-UTF-8 file name can never make an episode's record unwritable.
"""

from __future__ import annotations

from typing import Any


def escape(text: str) -> str:
    """``text`` as valid Unicode: undecodable bytes (and any other lone surrogate) become ``\\xNN``."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that stood for no byte (e.g. a JSON "\ud800" escape)
        raw = text.encode("utf-8", "surrogatepass")
    return raw.decode("utf-8", "backslashreplace")


def json_safe(value: Any) -> Any:
    """``value`` with every string in it (dict keys too) passed through `escape`."""
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
