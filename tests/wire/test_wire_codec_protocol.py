"""Every codec the proxy routes to provides what ``proxy/codecs/protocol.py``'s Codec Protocol names, with
parameters a caller of the Protocol can pass: a new API module that misses one fails here, not in
the first harness run that needs it."""

from __future__ import annotations

import inspect
import json

import pytest
from wire_helpers import fixture, tool_turn

from polar_env.proxy.app import API_MODULES
from polar_env.proxy.codecs import anthropic_messages, gemini_generate_content
from polar_env.proxy.codecs.protocol import Codec, CountingCodec
from polar_env.wire.shape import encode

REQUESTS = {
    "chat": "pi-chat.req2",
    "responses": "codex.req2",
    "messages": "claude-bare.req2",
    "gemini": "gemini.req1",
}
COUNTING = {"messages": anthropic_messages, "gemini": gemini_generate_content}  # the APIs with a count route


def methods(protocol: type) -> list[str]:
    return sorted(
        name
        for name, value in vars(protocol).items()
        if inspect.isfunction(value) and not name.startswith("__")
    )


METHODS = methods(Codec)
ATTRIBUTES = sorted(name for name, value in vars(Codec).items() if isinstance(value, property))  # constants


def test_the_protocol_names_what_the_front_calls():
    assert {
        "decode",
        "encode_response",
        "encode_stream",
        "encode_stream_error",
        "encode_error",
        "encode_overflow",
    } <= set(METHODS)
    assert {"API", "KEEPALIVE"} <= set(ATTRIBUTES)


def test_the_counting_protocol_names_the_count_route():
    assert methods(CountingCodec) == ["encode_count"]  # what the front's count route calls beyond Codec


@pytest.mark.parametrize("api", sorted(API_MODULES))
def test_each_codec_satisfies_the_protocol(api):
    module = API_MODULES[api]
    for name in ATTRIBUTES:
        assert isinstance(getattr(module, name), bytes if name == "KEEPALIVE" else str), (api, name)
    assert_has_methods(module, Codec, METHODS)


@pytest.mark.parametrize("api", sorted(COUNTING))
def test_each_counting_codec_satisfies_its_protocol(api):
    assert COUNTING[api] is API_MODULES[api]
    assert_has_methods(COUNTING[api], CountingCodec, methods(CountingCodec))
    assert list(json.loads(encode(COUNTING[api].encode_count(7))).values()) == [7]


def assert_has_methods(module, protocol: type, names: list[str]) -> None:
    api = module.API
    for name in names:
        wanted = [
            p
            for p in inspect.signature(getattr(protocol, name)).parameters.values()
            if p.name != "self" and p.kind is p.POSITIONAL_OR_KEYWORD
        ]
        got = list(inspect.signature(getattr(module, name)).parameters.values())
        assert [p.name for p in got[: len(wanted)]] == [p.name for p in wanted], (api, name)
        assert all(
            p.default is not p.empty for p in got[len(wanted) :] if p.kind is p.POSITIONAL_OR_KEYWORD
        ), (api, name, "extra parameters need defaults")


@pytest.mark.parametrize("api", sorted(API_MODULES))
def test_a_streams_head_is_the_start_of_its_stream(api):
    """The front sends a slow answer's head before the answer exists and later drops that many
    frames of ``encode_stream``: the two must agree frame for frame."""
    module = API_MODULES[api]
    request = fixture(REQUESTS[api])["body"]
    req = module.decode(request, "served", stream=True) if api == "gemini" else module.decode(request)
    turn = tool_turn()
    head = module.encode_stream_head(req, turn.call_id, turn.model, turn.created_at)
    assert head == module.encode_stream(turn, req)[: len(head)]
    assert (len(head) > 0) is (api == "responses")  # the API that opens with events of its own
