"""Strip prompt text that changes between rollouts of one task (docs/architecture.md, "The token path").

GRPO groups are formed by the exact token ids of the first prompt: a line that differs per request
(Claude Code's billing header carries a per-request hash) makes every sample a group of one, with
zero advantage and no error. Each rule below is one known volatile line; the names of the rules
that fired are recorded as ``stripped:<name>`` flags on the call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from polar_env.chat.messages import Message
from polar_env.proxy.wire import DecodedRequest, dedupe


@dataclass(frozen=True)
class VolatileRule:
    name: str
    roles: frozenset[str]  # the canonical roles the rule applies to
    pattern: re.Pattern[str]  # removed wherever it matches


RULES: tuple[VolatileRule, ...] = (
    # Claude Code: "x-anthropic-billing-header: cc_version=2.1.197.66a; cc_entrypoint=sdk-cli;" as the
    # first system block; the version suffix changes per request.
    VolatileRule("x-anthropic-billing-header", frozenset({"system"}),
                 re.compile(r"^x-anthropic-billing-header:[^\n]*(?:\n+|$)", re.MULTILINE)),
    # Today's date, which every harness writes into its first request: rollouts of one task on
    # either side of midnight would otherwise land in different GRPO groups. (faketime cannot
    # help: Codex is a static musl binary that ignores LD_PRELOAD.)
    VolatileRule("codex-current-date", frozenset({"user"}),
                 re.compile(r"^[ \t]*<current_date>\d{4}-\d{2}-\d{2}</current_date>\n", re.MULTILINE)),
    VolatileRule("claude-todays-date", frozenset({"system", "user"}),
                 re.compile(r"\n*Today's date is \d{4}-\d{2}-\d{2}\.", re.MULTILINE)),
    VolatileRule("claude-date-line", frozenset({"system"}), re.compile(r"^Date: \d{4}-\d{2}-\d{2}\n?", re.MULTILINE)),
    VolatileRule("pi-current-date", frozenset({"system"}),
                 re.compile(r"^Current date: \d{4}-\d{2}-\d{2}\n?", re.MULTILINE)),
)


def strip_message(message: Message, rules: tuple[VolatileRule, ...] = RULES) -> tuple[Message, list[str]]:
    """The message without volatile text, and the names of the rules that removed something."""
    content, fired = message.content, []
    for rule in rules:
        if message.role in rule.roles:
            content, n = rule.pattern.subn("", content)
            if n:
                fired.append(rule.name)
    return (message.model_copy(update={"content": content}) if fired else message), fired


def apply(req: DecodedRequest, rules: tuple[VolatileRule, ...] = RULES) -> DecodedRequest:
    """Strip every message; a system message left empty is dropped (with its ref, keeping alignment)."""
    messages, refs, flags = [], [], list(req.flags)
    refs_in = req.assistant_refs or [None] * len(req.conversation.messages)
    for message, ref in zip(req.conversation.messages, refs_in, strict=True):
        stripped, fired = strip_message(message, rules)
        flags += [f"stripped:{name}" for name in fired]
        if fired and stripped.role == "system" and not stripped.content.strip():
            continue
        messages.append(stripped)
        refs.append(ref)
    conversation = req.conversation.model_copy(update={"messages": messages})
    return req.model_copy(update={"conversation": conversation, "assistant_refs": refs, "flags": dedupe(flags)})
