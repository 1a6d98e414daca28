"""The messages a chat template is given: canonical ones, put in the order Qwen-family templates accept.

The checkpoints' own templates refuse a system message that is not first ("System message must be
at the beginning.") and a conversation without a user query; harnesses send both (Codex's
``developer`` items mid-conversation, Claude Code's mid-conversation system notes, side calls made
of instructions only). The rule, applied before every render with any template:

- the leading run of system messages (Codex: ``instructions`` and its first ``developer`` items)
  becomes one system message, texts joined by a blank line;
- a system message after any other message becomes a user message with the same text (where it
  stood: merging it into the first system turn would rewrite the chain's first prompt);
- when no user message comes before the first assistant turn (or at all), an empty user message is
  inserted there.

Each rule looks only at the message and what precedes it, so normalising appended messages alone
gives what normalising the whole conversation gives for them: the proxy renders only what was
appended (``ChatRenderer.render_continuation``), never the whole conversation again.
"""

from __future__ import annotations

from polar_env.chat.messages import Message

SYSTEM_JOIN = "\n\n"


def conversation_messages(messages: list[Message]) -> list[Message]:
    """A whole conversation (a chain's first prompt, or a full render), normalised."""
    lead = 0
    while lead < len(messages) and messages[lead].role == "system":
        lead += 1
    head = (
        []
        if lead == 0
        else [
            messages[0]
            if lead == 1
            else Message(role="system", content=SYSTEM_JOIN.join(m.content for m in messages[:lead]))
        ]
    )
    rest = appended_messages(messages[lead:])
    first_assistant = next((i for i, m in enumerate(rest) if m.role == "assistant"), len(rest))
    if not any(m.role == "user" for m in rest[:first_assistant]):
        rest.insert(first_assistant, Message(role="user"))
    return head + rest


def appended_messages(messages: list[Message]) -> list[Message]:
    """Messages that follow at least one other message, normalised (a system message becomes a user one)."""
    return [Message(role="user", content=m.content) if m.role == "system" else m for m in messages]
