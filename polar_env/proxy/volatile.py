"""Normalise prompt text that changes between rollouts of one task (docs/architecture.md, "The token path").

GRPO groups are formed by the exact token ids of the first prompt: a line that differs per request
(Claude Code's billing header carries a per-request hash), per day (the date) or per machine (the
host's kernel, time zone) splits one task's samples into groups of one, with zero advantage and
no error. Each rule is one known volatile line, declared by the adapter of the harness that writes
it; the names of the rules that fired are recorded as ``stripped:<name>`` flags on the call.
"""

from __future__ import annotations

from polar_env.chat.messages import Message
from polar_env.harness_adapters.base import VolatileRule
from polar_env.harness_adapters.registry import ADAPTERS
from polar_env.proxy.seen import Seen, Stripped, common_prefix
from polar_env.proxy.wire import DecodedRequest, dedupe

# Each adapter declares its harness's own lines (harness_adapters/<harness>.py); the proxy does not
# know which harness a session runs, so it applies all of them.
RULES: tuple[VolatileRule, ...] = tuple(rule for adapter in ADAPTERS.values() for rule in adapter.volatile_rules)


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


def apply(req: DecodedRequest, rules: tuple[VolatileRule, ...] = RULES, seen: Seen | None = None) -> DecodedRequest:
    """Strip every message; a system message left empty is dropped (with its ref, keeping alignment).

    With ``seen`` (the session's last request), the leading messages equal to that request's keep
    their stripped form: the rules run on the messages new since.
    """
    before = req.conversation.messages
    last = seen.stripped if seen is not None else None
    k = common_prefix(before, last.before) if last is not None else 0
    after: list[Message | None] = list(last.after[:k]) if last is not None else []
    fired_all: list[tuple[str, ...]] = list(last.fired[:k]) if last is not None else []
    for message in before[k:]:
        stripped, fired = strip_message(message, rules)
        dropped = fired and stripped.role == "system" and not stripped.content.strip()
        after.append(None if dropped else stripped)
        fired_all.append(tuple(fired))
    if seen is not None:
        seen.stripped = Stripped(list(before), after, fired_all)
    messages, refs, flags = [], [], list(req.flags)
    refs_in = req.assistant_refs or [None] * len(before)
    for stripped, fired, ref in zip(after, fired_all, refs_in, strict=True):
        flags += [f"stripped:{name}" for name in fired]
        if stripped is not None:
            messages.append(stripped)
            refs.append(ref)
    conversation = req.conversation.model_copy(update={"messages": messages})
    return req.model_copy(update={"conversation": conversation, "assistant_refs": refs, "flags": dedupe(flags)})
