"""The ids the proxy issues and the harness echoes back: each names the call (the sampled turn) it came
from, which is how the engine matches a resent turn to its record. Exports write the same ids."""

from __future__ import annotations

# Opaque refs the proxy hands out (Responses reasoning ``encrypted_content``, Anthropic thinking
# ``signature``); each contains the call id.
REF_PREFIX = "polar:v1:"


def issued_ref(call_id: str) -> str:
    return REF_PREFIX + call_id


def call_id_from_ref(ref: str | None) -> str | None:
    """The call id inside a ref the proxy issued (``polar:v1:ID``, ``msg_ID``, ``rs_ID``, ``fc_ID_N``)."""
    if not ref:
        return None
    if ref.startswith(REF_PREFIX):
        return ref[len(REF_PREFIX) :] or None
    for prefix in ("msg_", "rs_"):
        if ref.startswith(prefix):
            return ref[len(prefix) :] or None
    if ref.startswith(("fc_", "ctc_")) and ref.count("_") >= 2:
        return ref.split("_", 1)[1].rsplit("_", 1)[0] or None
    return None


def issued_tool_call_id(call_id: str, index: int) -> str:
    """The id of the ``index``-th tool call of model call ``call_id``: it names the sampled turn."""
    return f"call_{call_id[:12]}_{index}"


def turn_of(tool_call_id: str) -> str | None:
    """Which sampled turn a proxy-issued tool-call id belongs to (the call id's first 12 characters)."""
    head, _, index = tool_call_id.rpartition("_")
    if not head.startswith("call_") or not index.isdigit() or len(head) != len("call_") + 12:
        return None
    return head[len("call_") :]
