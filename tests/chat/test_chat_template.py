"""Rendering with the shipped templates on the real SmolLM2 tokenizer, and the continuation rule
the proxy relies on: prompt + sampled ids + continuation == full render, token for token."""

from __future__ import annotations

import json

import pytest

from polar_env.chat.messages import Message, ToolCall, ToolSpec
from polar_env.chat.template import ChatRenderer, apply_tool_kinds, bundled_template

SHELL = ToolSpec(
    name="shell",
    description="Run a shell command",
    parameters={"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
)


@pytest.fixture(scope="module", params=["chatml_hermes_tools", "qwen3_coder_tools"])
def renderer(request, embedded_dir) -> ChatRenderer:
    return ChatRenderer.from_pretrained(embedded_dir, chat_template=request.param)


def call(name: str, arguments: dict, id_: str = "c1") -> ToolCall:
    return ToolCall(id=id_, name=name, arguments=json.dumps(arguments))


def conversation() -> list[Message]:
    return [
        Message(role="system", content="You are a coding agent."),
        Message(role="user", content="List the files."),
        Message(role="assistant", content="Listing.", tool_calls=[call("shell", {"cmd": "ls"})]),
        Message(role="tool", content="a.py\nb.py", tool_call_id="c1"),
        Message(role="assistant", content="There are two files."),
    ]


def test_hermes_two_turn_tool_conversation_renders_exactly(embedded_dir):
    r = ChatRenderer.from_pretrained(embedded_dir)
    assert r.tool_format == "hermes" and r.chat_template == bundled_template("chatml_hermes_tools")
    text = r.tokenizer.decode(r.render_prompt(conversation(), [SHELL]))
    assert text.startswith("<|im_start|>system\nYou are a coding agent.\n\n# Tools\n")
    assert '\n{"type": "function", "function": {"name": "shell", "description": "Run a shell command"' in text
    assert text.endswith(
        "<|im_start|>user\nList the files.<|im_end|>\n"
        '<|im_start|>assistant\nListing.\n<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls"}}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\na.py\nb.py\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nThere are two files.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_xml_render_and_parse_agree(embedded_dir):
    r = ChatRenderer.from_pretrained(embedded_dir, chat_template="qwen3_coder_tools")
    args = {"cmd": "grep -n 'x' a.py", "timeout": 30, "env": {"A": "1"}}
    msgs = [
        Message(role="user", content="go"),
        Message(role="assistant", content="", reasoning="check a.py", tool_calls=[call("shell", args)]),
    ]
    prompt = r.tokenizer.decode(r.render_prompt(msgs[:1], [SHELL]))
    full = r._render([r._message_dict(m) for m in msgs], [r._tool_dict(SHELL)], add_generation_prompt=False)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n") and full.startswith(prompt)
    assert "<parameter=timeout>\n30\n</parameter>" in full
    sampled = full[len(prompt) :].removesuffix("<|im_end|>\n")
    out = r.parse_output(r.tokenizer.encode(sampled, add_special_tokens=False))
    assert not out.malformed and out.reasoning == "check a.py"
    assert [(c.name, json.loads(c.arguments)) for c in out.tool_calls] == [("shell", args)]


def test_reasoning_before_last_user_message_is_dropped(renderer):
    msgs = [
        Message(role="user", content="q1"),
        Message(role="assistant", content="a1", reasoning="SECRET1"),
        Message(role="user", content="q2"),
        Message(role="assistant", content="a2", reasoning="KEPT2"),
    ]
    text = renderer.tokenizer.decode(renderer.render_prompt(msgs, []))
    assert "SECRET1" not in text and "<think>\nKEPT2\n</think>\n\na2<|im_end|>" in text


@pytest.mark.parametrize(
    "appended",
    [
        [Message(role="tool", content="a.py\nb.py", tool_call_id="c1")],
        [
            Message(role="tool", content="out 1", tool_call_id="c1"),
            Message(role="tool", content="out 2", tool_call_id="c2"),
        ],
        [
            Message(role="tool", content="done", tool_call_id="c1"),
            Message(role="user", content="Now fix it."),
        ],
    ],
    ids=["one-tool", "two-tools", "tool-then-user"],
)
def test_prompt_plus_sampled_plus_continuation_equals_full_render(renderer, appended):
    continuation = renderer.render_continuation(appended, previous_ended_with_eos=True)
    if renderer.tool_format == "qwen3_coder" and any(m.role == "user" for m in appended):
        # Qwen3.5 drops the think block of turns before a new user message, so the full render of
        # the assistant turn changes; the continuation itself is still exactly the appended turns.
        assert renderer.tokenizer.decode(continuation) == (
            "\n<|im_start|>user\n<tool_response>\ndone\n</tool_response><|im_end|>\n"
            "<|im_start|>user\nNow fix it.<|im_end|>\n<|im_start|>assistant\n<think>\n"
        )
        return
    history = conversation()[:2]
    assistant = Message(
        role="assistant",
        content="Listing.",
        tool_calls=[call("shell", {"cmd": "ls"}), call("shell", {"cmd": "pwd"}, "c2")],
    )
    prompt = renderer.render_prompt(history, [SHELL])
    # what the model would have sampled: the assistant turn exactly as the template writes it
    prompt_text = renderer._render(
        [renderer._message_dict(m) for m in history], [renderer._tool_dict(SHELL)], add_generation_prompt=True
    )
    with_turn = renderer._render(
        [renderer._message_dict(m) for m in history + [assistant]],
        [renderer._tool_dict(SHELL)],
        add_generation_prompt=False,
    )
    body = with_turn[len(prompt_text) :].removesuffix("<|im_end|>\n")
    sampled = renderer.tokenizer.encode(body, add_special_tokens=False) + [renderer.eos_token_ids[0]]

    full = renderer.render_prompt(history + [assistant] + appended, [SHELL])
    assert prompt + sampled + continuation == full

    # a turn cut by length: the continuation supplies the end token itself
    cut = renderer.render_continuation(appended, previous_ended_with_eos=False)
    assert cut == [renderer.eos_token_ids[0]] + continuation


def test_continuation_cost_depends_on_appended_messages_only(renderer, monkeypatch):
    encoded: list[str] = []
    real_encode = renderer._encode

    def recording_encode(text: str) -> list[int]:
        encoded.append(text)
        return real_encode(text)

    monkeypatch.setattr(renderer, "_encode", recording_encode)
    tool = Message(role="tool", content="x" * 50, tool_call_id="c1")
    ids = renderer.render_continuation([tool], previous_ended_with_eos=True)
    assert len(encoded) == 1 and len(encoded[0]) < 160, encoded  # 50 chars of result + glue
    assert encoded[0].startswith("\n<|im_start|>user\n<tool_response>\n" + "x" * 50)
    assert renderer.tokenizer.decode(ids) == encoded[0]


def test_eos_ids_and_count_tokens(renderer):
    assert renderer.eos_token_ids == [renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    msgs = conversation()
    assert renderer.count_tokens(msgs, [SHELL]) == len(renderer.render_prompt(msgs, [SHELL]))
    assert renderer.count_tokens(msgs, [SHELL]) > renderer.count_tokens(msgs, [])


def test_custom_tools_are_offered_and_rendered_with_an_input_parameter(renderer):
    patch_tool = ToolSpec(name="apply_patch", description="Apply a patch", kind="custom")
    raw = "*** Begin Patch\n*** End Patch"
    msgs = [
        Message(role="user", content="patch it"),
        Message(
            role="assistant", tool_calls=[ToolCall(id="p", name="apply_patch", arguments=raw, kind="custom")]
        ),
    ]
    text = renderer.tokenizer.decode(renderer.render_prompt(msgs, [patch_tool]))
    assert '"properties": {"input": {"type": "string"' in text
    expected = (
        '{"name": "apply_patch", "arguments": {"input": "*** Begin Patch\\n*** End Patch"}}'
        if renderer.tool_format == "hermes"
        else f"<parameter=input>\n{raw}\n</parameter>"
    )
    assert expected in text

    # and the parsed call of a custom tool gets its kind and raw text back
    body = text.split("<|im_start|>assistant\n")[-2].removesuffix("<|im_end|>\n")
    parsed = renderer.parse_output(renderer.tokenizer.encode(body, add_special_tokens=False))
    assert not parsed.malformed
    (restored,) = apply_tool_kinds(parsed.tool_calls, [patch_tool, SHELL])
    assert (restored.name, restored.kind, restored.arguments) == ("apply_patch", "custom", raw)
    assert apply_tool_kinds([call("shell", {"cmd": "ls"})], [patch_tool, SHELL])[0].kind == "function"
