"""Normalise prompt text that changes between rollouts of one task (docs/architecture.md, "The token path").

GRPO groups are formed by the exact token ids of the first prompt: a line that differs per request
(Claude Code's billing header carries a per-request hash), per day (the date) or per machine (the
host's kernel, time zone) splits one task's samples into groups of one, with zero advantage and
no error. Each rule is one known volatile line, declared by the adapter of the harness that writes
it; the names of the rules that fired are recorded as ``stripped:<name>`` flags on the call.
"""

from __future__ import annotations

from typing import TypeVar

from polar_env.chat.messages import Message
from polar_env.harness_adapters.base import VolatileRule
from polar_env.harness_adapters.registry import ADAPTERS
from polar_env.proxy.codecs.common import DecodedRequest, dedupe
from polar_env.proxy.seen import Seen, Stripped, common_prefix, extends

# Each adapter declares its harness's own lines (harness_adapters/<harness>.py); the proxy does not
# know which harness a session runs, so it applies all of them (a fork's inherited rules once).
Decoded = TypeVar("Decoded", bound=DecodedRequest)  # each API's request comes back as its own type
DROPPABLE = frozenset({"system", "user"})  # roles whose message goes when nothing of it is left
RULES: tuple[VolatileRule, ...] = tuple(
    dict.fromkeys(rule for adapter in ADAPTERS.values() for rule in adapter.volatile_rules)
)


def strip_message(message: Message, rules: tuple[VolatileRule, ...] = RULES) -> tuple[Message, list[str]]:
    """The message with volatile text normalised, and the names of the rules that changed something."""
    content, fired = message.content, []
    for rule in rules:
        if message.role in rule.roles:
            new = rule.pattern.sub(rule.replacement, content)
            if new != content:
                content = new
                fired.append(rule.name)
    return (message.model_copy(update={"content": content}) if fired else message), fired


def apply(req: Decoded, rules: tuple[VolatileRule, ...] = RULES, seen: Seen | None = None) -> Decoded:
    """Strip every message; a system or user message the rules left empty is dropped (with its ref,
    keeping alignment): a message that is all per-call context (OpenClaw's runtime-context tail, moved
    to the end of every request) would otherwise keep each call from extending the one before.

    With ``seen`` (the session's last request), the leading messages equal to that request's keep
    their stripped form: the rules run on the messages new since; and a request that extends the
    last one (same messages and refs, then more) continues its output instead of rebuilding it.
    """
    before = req.conversation.messages
    refs_in = req.assistant_refs or [None] * len(before)
    last = seen.stripped if seen is not None else None
    k = common_prefix(before, last.before) if last is not None else 0
    after: list[Message | None] = last.after[:k] if last is not None else []
    fired_all: list[tuple[str, ...]] = last.fired[:k] if last is not None else []
    for message in before[k:]:
        stripped, fired = strip_message(message, rules)
        dropped = fired and stripped.role in DROPPABLE and not stripped.content.strip()
        after.append(None if dropped else stripped)
        fired_all.append(tuple(fired))
    if last is not None and k == len(last.before) and extends(refs_in, last.refs):
        start, messages, refs, stripped_flags = k, list(last.messages), list(last.out_refs), dict(last.flags)
    else:
        start, messages, refs, stripped_flags = 0, [], [], {}
    if len(refs_in) != len(before):
        raise ValueError(f"{len(refs_in)} assistant refs for {len(before)} messages")
    for i in range(start, len(before)):
        for name in fired_all[i]:
            stripped_flags[f"stripped:{name}"] = None
        if (message := after[i]) is not None:
            messages.append(message)
            refs.append(refs_in[i])
    if seen is not None:
        seen.stripped = Stripped(
            list(before), list(refs_in), after, fired_all, list(messages), list(refs), dict(stripped_flags)
        )
    conversation = req.conversation.model_copy(update={"messages": messages})
    return req.model_copy(
        update={
            "conversation": conversation,
            "assistant_refs": refs,
            "flags": dedupe([*req.flags, *stripped_flags]),
        }
    )
