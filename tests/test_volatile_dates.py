"""Rollouts on different days must share their first prompt: every harness's date line is stripped."""

from __future__ import annotations

import json
import re

import pytest
from test_proxy_fixtures import FIXTURES

from polar_env.proxy import anthropic_messages, openai_chat, openai_responses

DECODERS = {"codex": openai_responses, "claude": anthropic_messages, "pi-chat": openai_chat,
            "pi-anthropic": anthropic_messages, "pi-responses": openai_responses}
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _decoder(name: str):
    return DECODERS.get(name) or DECODERS[name.split("-")[0]]


@pytest.mark.parametrize("path", sorted(p.name for p in FIXTURES.glob("*.req1.json")))
def test_a_different_date_decodes_to_the_same_conversation(path):
    captured = json.loads((FIXTURES / path).read_text())
    if captured["method"] != "POST":
        pytest.skip("not a model call")
    decode = _decoder(path.split(".")[0]).decode
    text = json.dumps(captured["body"])
    if not DATE.search(text):
        pytest.skip("no date in this capture")
    shifted = json.loads(DATE.sub("2031-02-03", text))
    a, b = decode(captured["body"]), decode(shifted)
    assert any(f.startswith("stripped:") for f in a.flags)
    assert a.conversation == b.conversation
