"""SSE framing, proxy-issued refs and volatile-line stripping shared by the three wire codecs."""

from __future__ import annotations

import json
import re

from wire_helpers import fixture, parse_sse

from polar_env.chat.messages import Conversation, Message
from polar_env.harness_adapters.base import VolatileRule
from polar_env.proxy import volatile
from polar_env.proxy.codecs import anthropic_messages
from polar_env.proxy.codecs.common import DecodedRequest, sse_frame
from polar_env.wire.ids import call_id_from_ref, issued_ref


def test_sse_frame_shapes():
    assert sse_frame("[DONE]") == b"data: [DONE]\n\n"
    frame = sse_frame({"type": "ping", "text": "é\nx"}, event="ping")
    assert frame.startswith(b"event: ping\ndata: {") and frame.endswith(b"\n\n")
    [(name, data)] = parse_sse([frame])
    assert name == "ping" and data == {"type": "ping", "text": "é\nx"}
    # a multi-line string payload becomes several data lines of one event
    assert sse_frame("a\nb") == b"data: a\ndata: b\n\n"


def test_issued_refs_carry_the_call_id():
    assert call_id_from_ref(issued_ref("abc123")) == "abc123"
    assert call_id_from_ref("msg_abc123") == "abc123"
    assert call_id_from_ref("rs_abc123") == "abc123"
    assert call_id_from_ref("fc_abc123_4") == "abc123"
    assert call_id_from_ref("ctc_abc123_0") == "abc123"
    assert call_id_from_ref("something-else") is None
    assert call_id_from_ref(None) is None


def _req(*messages: Message, refs=None) -> DecodedRequest:
    return DecodedRequest(
        conversation=Conversation(messages=list(messages)),
        model="m",
        raw_model="m",
        assistant_refs=refs if refs is not None else [None] * len(messages),
    )


def test_billing_header_is_stripped_only_from_system_messages():
    header = "x-anthropic-billing-header: cc_version=2.1.197.66a; cc_entrypoint=sdk-cli;"
    req = _req(
        Message(role="system", content=f"{header}\nYou are an agent."),
        Message(role="user", content=f"{header}\nquoted by the user"),
    )
    out = volatile.apply(req)
    assert out.conversation.messages[0].content == "You are an agent."
    assert out.conversation.messages[1].content.startswith(header)  # user text is never touched
    assert out.flags == ["stripped:x-anthropic-billing-header"]


def test_system_message_left_empty_is_dropped_and_refs_stay_aligned():
    header = "x-anthropic-billing-header: cc_version=2.1.197.f66; cc_entrypoint=sdk-cli;"
    req = _req(
        Message(role="system", content=header),
        Message(role="user", content="hi"),
        Message(role="assistant", content="hello"),
        refs=[None, None, "polar:v1:abc"],
    )
    out = volatile.apply(req)
    assert [m.role for m in out.conversation.messages] == ["user", "assistant"]
    assert out.assistant_refs == [None, "polar:v1:abc"]


def test_a_user_message_that_is_all_per_call_context_is_dropped_so_the_next_call_extends_this_one():
    """A harness that moves a context message to the end of every request (OpenClaw): with the message
    gone, call 2's conversation starts with call 1's, as the chain builder needs."""
    rule = VolatileRule("tail", frozenset({"user"}), re.compile(r"<ctx>.*?</ctx>\s*", re.DOTALL))
    first = volatile.apply(
        _req(Message(role="user", content="fix it"), Message(role="user", content="<ctx>a\n</ctx>")), (rule,)
    )
    second = volatile.apply(
        _req(
            Message(role="user", content="fix it"),
            Message(role="assistant", content="ok"),
            Message(role="user", content="<ctx>b</ctx>\nand the test"),
            Message(role="user", content="<ctx>c</ctx>"),
            refs=[None, "polar:v1:x", None, None],
        ),
        (rule,),
    )
    assert [m.content for m in first.conversation.messages] == ["fix it"] and first.flags == ["stripped:tail"]
    assert [m.content for m in second.conversation.messages] == [
        "fix it",
        "ok",
        "and the test",
    ]  # text left: kept
    assert second.assistant_refs == [None, "polar:v1:x", None]


def test_nothing_volatile_means_no_flag_and_same_messages():
    req = _req(Message(role="system", content="You are an agent."), Message(role="user", content="hi"))
    out = volatile.apply(req)
    assert out.flags == [] and out.conversation == req.conversation


def test_claude_requests_differing_only_in_billing_header_decode_identically():
    """GRPO groups by first-prompt ids: two Claude Code captures must give the same system prompt."""
    body = fixture("claude-bare.req2")["body"]
    other = json.loads(json.dumps(body))
    other["system"][0]["text"] = "x-anthropic-billing-header: cc_version=2.1.197.f66; cc_entrypoint=sdk-cli;"
    a, b = anthropic_messages.decode(body), anthropic_messages.decode(other)
    assert body["system"][0]["text"] != other["system"][0]["text"]
    assert a.conversation == b.conversation
    assert "x-anthropic-billing-header" not in a.conversation.messages[0].content


def test_pi_decodes_to_the_same_canonical_conversation_over_all_three_apis():
    """One engine serves all wires: the same Pi session must reduce to the same messages and tools."""
    from polar_env.proxy.codecs import openai_chat, openai_responses

    chat = openai_chat.decode(fixture("pi-chat.req2")["body"]).conversation
    responses = openai_responses.decode(fixture("pi-responses.req2")["body"]).conversation
    messages = anthropic_messages.decode(fixture("pi-anthropic.req2")["body"]).conversation

    def shape(conv):  # tool-call ids differ per capture (each fake server issued its own)
        return [
            (m.role, m.content, m.reasoning, [(c.name, json.loads(c.arguments)) for c in m.tool_calls])
            for m in conv.messages
        ]

    assert shape(chat) == shape(responses) == shape(messages)
    assert [m.fingerprint() for m in chat.messages[:2]] == [m.fingerprint() for m in messages.messages[:2]]
    assert chat.tools == responses.tools
    # Pi's Anthropic provider itself drops the top-level additionalProperties; names and text still agree
    assert [(t.name, t.description) for t in messages.tools] == [(t.name, t.description) for t in chat.tools]
