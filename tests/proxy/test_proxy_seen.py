"""Decoding with the session's last request (proxy/seen.py) gives exactly what decoding whole gives.

The captured requests of every real harness are replayed in order through one ``Seen``, then
edited the ways a harness edits its history (an earlier item changed, one dropped, the same body
again), and each decode is compared with a decode from scratch: the same conversation, flags,
refs and prefix hashes.
"""

from __future__ import annotations

import copy
import json
import pickle
import sys

import pytest
from wire_helpers import FIXTURES

from polar_env.proxy.app import _decode, _decode_fresh
from polar_env.proxy.codecs import anthropic_messages, gemini_generate_content, openai_chat, openai_responses
from polar_env.proxy.codecs.common import WireError
from polar_env.proxy.seen import Seen
from polar_env.proxy.sessions import prefix_hashes

DECODERS = {
    "/v1/responses": openai_responses,
    "/v1/messages": anthropic_messages,
    "/v1/chat/completions": openai_chat,
}
HARNESSES = sorted({p.name.split(".")[0] for p in FIXTURES.glob("*.req*.json")})


def _module(path: str):
    """The codec of the API a captured request was sent to (its path, as the proxy routes it)."""
    path = path.split("?")[0]
    return gemini_generate_content if path.startswith("/v1beta/models/") else DECODERS[path]


def _bodies(harness: str) -> list[tuple[str, dict]]:
    captured = [json.loads(p.read_text()) for p in sorted(FIXTURES.glob(f"{harness}.req*.json"))]
    return [(c["path"], c["body"]) for c in captured if c["method"] == "POST"]


def _items_key(body: dict) -> str:
    return next(k for k in ("messages", "input", "contents") if k in body)


def _edits(body: dict) -> list[dict]:
    """The body as a harness may resend it: unchanged, with an earlier item edited, with one dropped."""
    key = _items_key(body)
    out = [copy.deepcopy(body)]
    items = body.get(key)
    if isinstance(items, list) and len(items) >= 2:
        edited = copy.deepcopy(body)
        first = json.dumps(edited[key][0])
        edited[key][0] = json.loads(first.replace("e", "E", 1)) if "e" in first else edited[key][0]
        out.append(edited)
        dropped = copy.deepcopy(body)
        del dropped[key][len(items) // 2]
        out.append(dropped)
    return out


def _same(a, b) -> None:
    assert a.conversation == b.conversation
    assert a.flags == b.flags and a.assistant_refs == b.assistant_refs
    assert a.prefix_hashes == prefix_hashes(b.conversation.messages)


@pytest.mark.parametrize("harness", HARNESSES)
def test_replayed_sessions_decode_as_from_scratch(harness):
    seen, sequence = Seen(), []
    for path, body in _bodies(harness):  # and back to the plain request after the edits
        sequence += [(_module(path), b) for b in (body, *_edits(body), body)]
    assert len(sequence) >= 3
    for module, body in sequence:
        raw = json.dumps(body).encode()
        try:
            whole = _decode(module.decode, raw)
        except WireError as exc:  # an edit may make a request invalid: then both refuse it alike
            with pytest.raises(WireError) as again:
                _decode(module.decode, raw, seen)
            assert again.value.message == exc.message
            continue
        _same(_decode(module.decode, raw, seen), whole)


def test_chat_reuses_decoded_messages_and_names_errors_by_their_index():
    seen = Seen()
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    first = openai_chat.decode({"model": "m", "messages": history}, seen)
    history = history + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "go on"}]
    second = openai_chat.decode({"model": "m", "messages": history}, seen)
    # the earlier messages are the very objects decoded before: not validated or stripped again
    assert all(
        a is b for a, b in zip(first.conversation.messages, second.conversation.messages, strict=False)
    )
    bad = history + [{"role": "tool", "content": "x"}]  # a tool message without tool_call_id
    with pytest.raises(WireError, match="messages.4: a tool message needs tool_call_id"):
        openai_chat.decode({"model": "m", "messages": bad}, seen)
    bad = history + [{"role": "robot", "content": "x"}]
    with pytest.raises(WireError, match=r"messages\.4\.role"):
        openai_chat.decode({"model": "m", "messages": bad}, seen)


def test_a_large_body_decoded_in_a_worker_leaves_its_snapshot():
    history = [{"role": "user", "content": f"line {i} " + "x" * 1000} for i in range(300)]
    raw = json.dumps({"model": "m", "messages": history}).encode()
    decoded, seen = pickle.loads(pickle.dumps(_decode_fresh(openai_chat.decode, raw)))  # as from a process
    assert (
        seen.decoded is not None and seen.body_bytes == len(raw) and len(decoded.conversation.messages) == 300
    )
    grown = json.dumps({"model": "m", "messages": history + [{"role": "user", "content": "more"}]}).encode()
    _same(_decode(openai_chat.decode, grown, seen), _decode(openai_chat.decode, grown))


def _calls_to_decode_next(module, turns: int) -> int:
    """Function calls (Python and C) made to decode the next request of a ``turns``-turn session."""
    seen, history = Seen(), []
    for i in range(turns):
        history += [{"role": "user", "content": f"step {i}"}, {"role": "assistant", "content": f"done {i}"}]
    _decode(
        module.decode, json.dumps({"model": "m", "system": "Be brief.", "messages": history}).encode(), seen
    )
    history += [{"role": "user", "content": "next step"}]
    raw = json.dumps({"model": "m", "system": "Be brief.", "messages": history}).encode()
    calls = 0

    def count(frame, event, arg) -> None:
        nonlocal calls
        calls += event in ("call", "c_call")

    sys.setprofile(count)
    try:
        _decode(module.decode, raw, seen)
    finally:
        sys.setprofile(None)
    return calls


@pytest.mark.parametrize("module", [openai_chat, anthropic_messages])
def test_decoding_the_next_request_does_not_walk_the_history(module):
    """Validation, the split-turn merge, the volatile rules and the prefix hashes run on the appended
    messages only: a request at turn 200 makes no more calls than one at turn 20 (the JSON parse and
    the prefix compare are single C calls whatever the length)."""
    assert _calls_to_decode_next(module, 200) <= _calls_to_decode_next(module, 20)
