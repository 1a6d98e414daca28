"""Rollouts on different days must share their first prompt: every harness's date line is stripped."""

from __future__ import annotations

import json
import re

import pytest
from wire_helpers import FIXTURES, wire_api_of

from polar_env.proxy.app import API_MODULES

# each way a harness writes today's date (ISO; Cline's 11/30/2026; Qwen Code's and Gemini CLI's Monday,
# November 30, 2026; OpenCode's Mon Nov 30 2026), and another day written the same way
# (an ISO date followed by a time is a fixed example: Hermes Agent's cronjob tool shows '2026-06-01T09:00:00')
DATES = [
    (re.compile(r"\d{4}-\d{2}-\d{2}(?!T)"), "2031-02-03"),
    (re.compile(r"\b\d{2}/\d{2}/\d{4}\b"), "02/03/2031"),
    (re.compile(r"\b[A-Z][a-z]+day, [A-Z][a-z]+ \d{1,2}, \d{4}"), "Monday, February 3, 2031"),
    (re.compile(r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} \d{2} \d{4}"), "Mon Feb 03 2031"),
]


def _first_dated_model_calls() -> list[str]:
    """Each capture's first model call (Claude Code opens with a HEAD probe) whose prompt has a date."""
    first: dict[str, str] = {}
    for path in sorted(FIXTURES.glob("*.req*.json")):
        captured = json.loads(path.read_text())
        if captured["method"] == "POST" and any(
            date.search(json.dumps(captured["body"])) for date, _ in DATES
        ):
            first.setdefault(path.name.split(".")[0], path.name)
    return sorted(first.values())


@pytest.mark.parametrize("path", _first_dated_model_calls())
def test_a_different_date_decodes_to_the_same_conversation(path):
    captured = json.loads((FIXTURES / path).read_text())
    decode = API_MODULES[wire_api_of(captured["path"])].decode
    # another day in everything but the tool declarations, which are fixed per version (examples in them
    # look like dates: Nanocoder's git_log takes since="2024-01-01")
    text = json.dumps({k: v for k, v in captured["body"].items() if k != "tools"})
    for date, other_day in DATES:
        text = date.sub(other_day, text)
    shifted = {**captured["body"], **json.loads(text)}
    a, b = decode(captured["body"]), decode(shifted)
    assert any(f.startswith("stripped:") for f in a.flags)
    assert a.conversation == b.conversation
