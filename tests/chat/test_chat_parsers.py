"""Tool-call and reasoning parsing, on text and on real SmolLM2 token ids."""

from __future__ import annotations

import json

import pytest

from polar_env.chat.parsers import parse_text, split_reasoning
from polar_env.chat.template import ChatRenderer


def args(call) -> dict:
    return json.loads(call.arguments)


def test_hermes_single_call_with_content_before():
    out = parse_text(
        'I will list files.\n<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls", "n": 2}}\n'
        "</tool_call>",
        "hermes",
    )
    assert not out.malformed
    assert out.content == "I will list files."
    assert [(c.id, c.name, args(c)) for c in out.tool_calls] == [("call_0", "shell", {"cmd": "ls", "n": 2})]


def test_hermes_two_calls_and_string_arguments():
    out = parse_text(
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": "{\\"x\\": 1}"}\n</tool_call>',
        "hermes",
    )
    assert [c.id for c in out.tool_calls] == ["call_0", "call_1"]
    assert [c.name for c in out.tool_calls] == ["a", "b"]
    assert args(out.tool_calls[1]) == {"x": 1}
    assert out.content == ""


def test_hermes_reasoning_then_call():
    out = parse_text(
        '<think>\nneed ls\n</think>\n\n<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls"}}'
        "\n</tool_call>",
        "hermes",
    )
    assert out.reasoning == "need ls"
    assert out.tool_calls[0].name == "shell"


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls"</tool_call>',  # bad JSON
        'ok <tool_call>\n{"name": "shell", "arguments": {}}',  # unterminated
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
        '<tool_call>\n{"name": "x", "arguments": 3}\n</tool_call>',  # unknown shape
        "<tool_call>\n[1, 2]\n</tool_call>",  # unknown shape
        "text </tool_call>",  # stray close tag
        (
            '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call><tool_call>\n{"name": '
        ),  # one good, one cut
    ],
)
def test_hermes_malformed_becomes_content(text):
    out = parse_text(text, "hermes")
    assert out.malformed
    assert out.tool_calls == []
    assert out.content == text.strip()


def test_xml_call_values_are_json_decoded_when_they_parse():
    text = (
        "Looking.\n\n<tool_call>\n<function=edit>\n<parameter=path>\n/testbed/a.py\n</parameter>\n"
        "<parameter=line>\n12\n</parameter>\n<parameter=dry>\ntrue\n</parameter>\n"
        '<parameter=opts>\n{"k": [1, 2]}\n</parameter>\n<parameter=body>\ndef f():\n    return 1\n\n'
        "</parameter>\n</function>\n</tool_call>"
    )
    out = parse_text(text, "qwen3_coder")
    assert not out.malformed and out.content == "Looking."
    (call,) = out.tool_calls
    assert call.name == "edit"
    assert args(call) == {
        "path": "/testbed/a.py",
        "line": 12,
        "dry": True,
        "opts": {"k": [1, 2]},
        "body": "def f():\n    return 1\n",
    }


def test_xml_two_calls_without_parameters():
    out = parse_text(
        "<tool_call>\n<function=a>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=b>\n<parameter=q>\nx y\n</parameter>\n</function>\n</tool_call>",
        "qwen3_coder",
    )
    assert [(c.name, args(c)) for c in out.tool_calls] == [("a", {}), ("b", {"q": "x y"})]


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n<function=a>\n<parameter=q>\nx\n</parameter>\n</tool_call>",  # no </function>
        "<tool_call>\n<function=a>\n<parameter=q>\nx\n</parameter>\n</function>\n",  # unterminated
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>',  # JSON in XML mode
        "<tool_call>\n<function=a>\nstray\n<parameter=q>\nx\n</parameter>\n</function>\n</tool_call>",  # junk
    ],
)
def test_xml_malformed_becomes_content(text):
    out = parse_text(text, "qwen3_coder")
    assert out.malformed and out.tool_calls == [] and out.content == text.strip()


def test_reasoning_only_close_tag_when_prompt_opened_think():
    assert split_reasoning("plan it\n</think>\n\nanswer", started_in_think=True) == ("plan it", "\n\nanswer")
    assert split_reasoning("still thinking", started_in_think=True) == ("still thinking", "")
    assert split_reasoning("plain answer") == (None, "plain answer")
    assert split_reasoning("<think>\nunfinished") == ("unfinished", "")
    assert split_reasoning("\n</think>\n\nx", started_in_think=True) == (None, "\n\nx")


def test_parse_output_on_real_token_ids(embedded_dir):
    renderer = ChatRenderer.from_pretrained(embedded_dir)
    text = 'Sure.\n<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls -la"}}\n</tool_call>'
    ids = renderer.tokenizer.encode(text, add_special_tokens=False) + [renderer.eos_token_ids[0]]
    out = renderer.parse_output(ids)
    assert out.text == text  # end token dropped, nothing else
    assert out.content == "Sure." and args(out.tool_calls[0]) == {"cmd": "ls -la"}

    xml = ChatRenderer.from_pretrained(embedded_dir, chat_template="qwen3_coder_tools")
    assert xml.tool_format == "qwen3_coder"
    text = (
        "look first\n</think>\n\n<tool_call>\n<function=shell>\n<parameter=cmd>\nls\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    out = xml.parse_output(xml.tokenizer.encode(text, add_special_tokens=False))
    assert out.reasoning == "look first" and out.content == ""
    assert [(c.name, args(c)) for c in out.tool_calls] == [("shell", {"cmd": "ls"})]
