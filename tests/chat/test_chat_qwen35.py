"""The bundled Qwen3.5 template against the checkpoints' own, byte for byte, and the message
normalisation that lets the official template take every harness request.

The official template is not shipped in this repository: the comparison renders the copy TRL
installs (``trl/chat_templates/qwen3_5_think.jinja``, "Original Qwen3.5 chat template, shipped by
Qwen3.5-4B and larger"; TRL is the ``train`` extra), and golden strings written from the by-hand
comparison (docs/proxy.md) hold the same cases where TRL is absent. Tokenizer: the real SmolLM2
one (ChatML special tokens), rendering Qwen-format text.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest
from wire_helpers import fixture

from polar_env.chat.messages import Message, ToolCall, ToolSpec
from polar_env.chat.normalise import conversation_messages
from polar_env.chat.template import ChatRenderer, bundled_template
from polar_env.proxy.codecs import openai_responses

SHELL = ToolSpec(
    name="shell",
    description="Run a shell command",
    parameters={"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
)
READ = ToolSpec(
    name="read",
    description="Read a file",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
)


def official_template() -> str | None:
    spec = importlib.util.find_spec("trl")  # located, not imported (TRL imports torch)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "chat_templates" / "qwen3_5_think.jinja"
    return path.read_text() if path.is_file() else None


OFFICIAL = official_template()
needs_official = pytest.mark.skipif(OFFICIAL is None, reason="TRL (the train extra) is not installed")


@pytest.fixture(scope="module")
def ours(embedded_dir) -> ChatRenderer:
    return ChatRenderer.from_pretrained(embedded_dir, chat_template="qwen3_coder_tools")


@pytest.fixture(scope="module")
def official(ours) -> ChatRenderer:
    if OFFICIAL is None:
        pytest.skip("TRL (the train extra) is not installed")
    return ChatRenderer(ours.tokenizer, chat_template=OFFICIAL, tool_format="qwen3_coder")


def call(name: str, arguments: dict, id_: str = "c1") -> ToolCall:
    return ToolCall(id=id_, name=name, arguments=json.dumps(arguments))


SYSTEM = Message(role="system", content="  You are a coding agent.\n")
USER = Message(role="user", content="Fix the bug.\n")

CASES: dict[str, tuple[list[Message], list[ToolSpec]]] = {
    "system-with-tools": ([SYSTEM, USER], [SHELL, READ]),
    "tools-without-system": ([USER], [SHELL]),
    "system-without-tools": ([SYSTEM, USER], []),
    "trimmed-content-and-reasoning": (
        [
            SYSTEM,
            USER,
            Message(
                role="assistant",
                content="\n Looking. \n",
                reasoning="\n\n I should run ls.\n\n",
                tool_calls=[call("shell", {"cmd": "ls"})],
            ),
            Message(role="tool", content="a.py\nb.py\n", tool_call_id="c1"),
        ],
        [SHELL],
    ),
    "non-string-arguments": (
        [
            USER,
            Message(
                role="assistant",
                tool_calls=[
                    call(
                        "shell",
                        {
                            "cmd": "ls",
                            "recursive": True,
                            "hidden": False,
                            "limit": None,
                            "depth": 2,
                            "ratio": 0.5,
                            "paths": ["a", "b"],
                            "env": {"A": True},
                            "empty": "",
                        },
                    )
                ],
            ),
        ],
        [SHELL],
    ),
    "whitespace-only-content-before-call": (
        [USER, Message(role="assistant", content=" \n\n ", tool_calls=[call("shell", {"cmd": "ls"})])],
        [SHELL],
    ),
    "think-in-content-without-reasoning": (
        [USER, Message(role="assistant", content="<think>\nplan it\n</think>\n\nDone it.")],
        [],
    ),
    "empty-reasoning-field-keeps-content": (
        [USER, Message(role="assistant", content="<think>x</think>kept", reasoning="")],
        [],
    ),
    "parallel-calls-and-merged-responses": (
        [
            SYSTEM,
            USER,
            Message(
                role="assistant",
                content="Two at once.",
                reasoning="both",
                tool_calls=[call("shell", {"cmd": "ls"}), call("read", {"path": "a.py"}, "c2")],
            ),
            Message(role="tool", content="a.py\n", tool_call_id="c1"),
            Message(role="tool", content="print(1)\n", tool_call_id="c2"),
        ],
        [SHELL, READ],
    ),
    "second-user-turn-drops-earlier-think": (
        [
            USER,
            Message(role="assistant", content="a1", reasoning="r1"),
            Message(role="user", content="Again."),
            Message(role="assistant", content="a2", reasoning="r2"),
        ],
        [],
    ),
    "tool-response-only-user-is-no-query": (
        [
            USER,
            Message(role="assistant", content="a1", reasoning="r1"),
            Message(role="user", content="<tool_response>\nx\n</tool_response>"),
            Message(role="assistant", content="a2"),
        ],
        [],
    ),
}


@needs_official
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("enable_thinking", [None, False])
def test_bundled_template_renders_as_the_official_one(ours, official, case, enable_thinking):
    messages, tools = CASES[case]
    for gen in (True, False):
        mine = ours.render_text(messages, tools, add_generation_prompt=gen, enable_thinking=enable_thinking)
        theirs = official.render_text(
            messages, tools, add_generation_prompt=gen, enable_thinking=enable_thinking
        )
        assert mine == theirs


@needs_official
@pytest.mark.parametrize(
    "appended",
    [
        [Message(role="tool", content="out\n", tool_call_id="c1")],
        [
            Message(role="tool", content="1", tool_call_id="c1"),
            Message(role="tool", content=" 2 ", tool_call_id="c2"),
        ],
        [
            Message(role="tool", content="done", tool_call_id="c1"),
            Message(role="system", content="Mode changed."),
            Message(role="user", content="Now test it."),
        ],
    ],
    ids=["one", "merged", "late-system-then-user"],
)
def test_continuations_match_the_official_template(ours, official, appended):
    for flag in (None, False):
        assert ours.render_continuation(
            appended, previous_ended_with_eos=True, enable_thinking=flag
        ) == official.render_continuation(appended, previous_ended_with_eos=True, enable_thinking=flag)


# ---- golden strings: the same cases, held without TRL ------------------------------------------

TOOLS_HEAD = "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
TOOLS_TAIL = (
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\n"
    "multiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be "
    "nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function "
    "call, but NOT after\n- If there is no function call available, answer the question like normal with "
    "your current knowledge and do not tell the user about function calls\n</IMPORTANT>"
)


def golden(ours: ChatRenderer, case: str, gen: bool = True, **kw) -> str:
    messages, tools = CASES[case]
    return ours.render_text(messages, tools, add_generation_prompt=gen, **kw)


def test_golden_system_turn_with_tools(ours):
    text = golden(ours, "system-with-tools")
    shell = json.dumps(ours._tool_dict(SHELL), ensure_ascii=False)
    read = json.dumps(ours._tool_dict(READ), ensure_ascii=False)
    assert text == (
        TOOLS_HEAD + shell + "\n" + read + TOOLS_TAIL + "\n\nYou are a coding agent.<|im_end|>\n"
        "<|im_start|>user\nFix the bug.<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    assert golden(ours, "tools-without-system").startswith(TOOLS_HEAD + shell + TOOLS_TAIL + "<|im_end|>\n")
    assert golden(ours, "system-without-tools") == (
        "<|im_start|>system\nYou are a coding agent.<|im_end|>\n<|im_start|>user\nFix the bug.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )


def test_golden_trimming(ours):
    assert golden(ours, "trimmed-content-and-reasoning").endswith(
        "<|im_start|>assistant\n<think>\nI should run ls.\n</think>\n\nLooking.\n\n<tool_call>\n"
        "<function=shell>\n<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\na.py\nb.py\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n"
    )


def test_golden_non_string_arguments_render_as_python_strings(ours):
    text = golden(ours, "non-string-arguments", gen=False)
    for key, value in [
        ("recursive", "True"),
        ("hidden", "False"),
        ("limit", "None"),
        ("depth", "2"),
        ("ratio", "0.5"),
        ("paths", '["a", "b"]'),
        ("env", '{"A": true}'),
        ("empty", ""),
    ]:
        assert f"<parameter={key}>\n{value}\n</parameter>\n" in text


def test_golden_whitespace_only_content_and_think_in_content(ours):
    text = golden(ours, "whitespace-only-content-before-call", gen=False)
    assert "<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n<function=shell>\n" in text
    assert golden(ours, "think-in-content-without-reasoning", gen=False).endswith(
        "<|im_start|>assistant\n<think>\nplan it\n</think>\n\nDone it.<|im_end|>\n"
    )
    # a reasoning field (even empty) wins: the content is left as it is
    assert golden(ours, "empty-reasoning-field-keeps-content", gen=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n<think>x</think>kept<|im_end|>\n"
    )


def test_golden_parallel_calls_merged_responses_and_assistant_header(ours):
    assert golden(ours, "parallel-calls-and-merged-responses").endswith(
        "<|im_start|>assistant\n<think>\nboth\n</think>\n\nTwo at once.\n\n<tool_call>\n<function=shell>\n"
        "<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=read>\n"
        "<parameter=path>\na.py\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\na.py\n</tool_response>\n<tool_response>\nprint(1)\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )


def test_golden_history_thinking_and_enable_thinking(ours):
    assert golden(ours, "second-user-turn-drops-earlier-think", gen=False) == (
        "<|im_start|>user\nFix the bug.<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n"
        "<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>\n"
    )
    assert "<think>\nr1\n</think>" in golden(ours, "tool-response-only-user-is-no-query", gen=False)
    assert golden(ours, "system-without-tools", enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert ours.opens_think() and not ours.opens_think(False)
    # the run's setting is the default of every call
    off = ChatRenderer(
        ours.tokenizer, chat_template=ours.chat_template, tool_format="qwen3_coder", enable_thinking=False
    )
    assert off.render_text(*CASES["system-without-tools"], add_generation_prompt=True).endswith(
        "</think>\n\n"
    )
    assert off.parse_output(off.encode_text("Hello.")).content == "Hello."


# ---- normalisation -------------------------------------------------------------------------

# the official template's refusals, as it raises them, in a template of our own
REFUSING = """{%- for m in messages -%}
{%- if m.role == "system" and not loop.first -%}{{ \
raise_exception("System message must be at the beginning.") }}{%- endif -%}
{{- "<|im_start|>" + m.role + "\\n" + m.content + "<|im_end|>\\n" -}}
{%- endfor -%}
{%- if not (messages | selectattr("role", "equalto", "user") | list) -%}{{ \
raise_exception("No user query found in messages.") }}{%- endif -%}
{%- if add_generation_prompt -%}{{- "<|im_start|>assistant\\n" -}}{%- endif -%}"""


def codex_with_late_developer() -> dict:
    body = copy.deepcopy(fixture("codex.req2")["body"])
    note = {
        "type": "message",
        "role": "developer",
        "content": [{"type": "input_text", "text": "<permissions instructions>\nApprovals: never\n"}],
    }
    body["input"].append(note)
    body["input"].append(
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go on."}]}
    )
    return body


@pytest.mark.parametrize("template", ["refusing", "official"])
def test_codex_request_with_a_mid_conversation_developer_item_renders(ours, template):
    text = REFUSING if template == "refusing" else OFFICIAL
    if text is None:
        pytest.skip("TRL (the train extra) is not installed")
    renderer = ChatRenderer(ours.tokenizer, chat_template=text, tool_format="qwen3_coder")
    conv = openai_responses.decode(codex_with_late_developer()).conversation
    roles = [m.role for m in conv.messages]
    assert roles[:3] == ["system", "system", "user"] and "system" in roles[3:]  # what Codex sent
    with pytest.raises(Exception, match="System message must be at the beginning"):
        renderer._render([renderer._message_dict(m) for m in conv.messages], [], add_generation_prompt=True)
    prompt = renderer.render_text(conv.messages, conv.tools, add_generation_prompt=True)
    assert prompt.count("<|im_start|>system") == 1
    assert "<|im_start|>user\n<permissions instructions>\nApprovals: never" in prompt
    assert prompt.index("Approvals: never") < prompt.index("Go on.")
    # the leading run (instructions, the first developer items) is one system turn, in order
    lead = conv.messages[0].content.strip()[:40]
    assert prompt.index(lead) < prompt.index("<skills_instructions>") < prompt.index("<|im_start|>user")


def test_a_conversation_without_a_user_query_gets_an_empty_one(ours):
    renderer = ChatRenderer(ours.tokenizer, chat_template=REFUSING, tool_format="qwen3_coder")
    only_system = [Message(role="system", content="Summarise the session.")]
    assert renderer.render_text(only_system, [], add_generation_prompt=True) == (
        "<|im_start|>system\nSummarise the session.<|im_end|>\n<|im_start|>user\n<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    history = [
        Message(role="system", content="s"),
        Message(role="assistant", content="a"),
        Message(role="user", content="u"),
    ]
    assert [m.role for m in conversation_messages(history)] == ["system", "user", "assistant", "user"]


def test_normalising_appended_messages_agrees_with_the_whole(ours):
    """The proxy normalises only what a call appends: that must be what a whole render gets."""
    whole = [
        Message(role="system", content="a"),
        Message(role="system", content="b"),
        USER,
        Message(role="assistant", content="x"),
        Message(role="system", content="late"),
        Message(role="user", content="more"),
    ]
    normal = conversation_messages(whole)
    assert [m.role for m in normal] == ["system", "user", "assistant", "user", "user"]
    assert normal[0].content == "a\n\nb" and normal[3].content == "late"
    assert conversation_messages(whole[:4]) == normal[:3]


def test_qwen_model_dir_without_a_template_warns_and_uses_the_bundled_one(embedded_dir, tmp_path, caplog):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(embedded_dir))
    tok.chat_template = None
    tok.save_pretrained(str(tmp_path))
    for name in ("chat_template.jinja", "chat_template.json"):
        (tmp_path / name).unlink(missing_ok=True)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5"}))
    with caplog.at_level("WARNING", logger="polar_env.chat.template"):
        r = ChatRenderer.from_pretrained(tmp_path)
    assert r.chat_template == bundled_template("qwen3_coder_tools") and r.tool_format == "qwen3_coder"
    assert "no chat template" in caplog.text and "qwen3_coder_tools.jinja" in caplog.text
    # a directory with its own template keeps it, silently
    caplog.clear()
    assert ChatRenderer.from_pretrained(embedded_dir).chat_template != bundled_template("qwen3_coder_tools")
    assert "no chat template" not in caplog.text


def test_enable_thinking_comes_from_chat_template_kwargs():
    from polar_env.proxy.codecs import openai_chat
    from polar_env.proxy.codecs.common import WireError

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert openai_chat.decode(body).enable_thinking is None
    assert (
        openai_chat.decode({**body, "chat_template_kwargs": {"enable_thinking": False}}).enable_thinking
        is False
    )
    with pytest.raises(WireError, match="enable_thinking"):
        openai_chat.decode({**body, "chat_template_kwargs": {"enable_thinking": "no"}})


@pytest.mark.parametrize("template", ["qwen3_coder_tools", "chatml_hermes_tools"])
def test_drops_thinking_only_when_a_query_follows_thinking_turns(embedded_dir, ours, template):
    r = ChatRenderer(ours.tokenizer, chat_template=bundled_template(template))
    plain = [USER, Message(role="assistant", content="a1")]
    thought = [USER, Message(role="assistant", content="a1", reasoning="r1")]
    tool = Message(role="tool", content="out", tool_call_id="c1")
    again = Message(role="user", content="Again.")
    late_system = Message(role="system", content="Mode changed.")
    assert r.drops_thinking(thought + [again], 2) and r.drops_thinking(thought + [late_system], 2)
    assert not r.drops_thinking(thought + [tool], 2)  # a tool result is no new query
    assert not r.drops_thinking([*thought, again, Message(role="assistant", content="a2"), tool], 4)
    # Qwen3.5 writes (and then drops) an empty think block for every turn after the query
    assert r.drops_thinking(plain + [again], 2) == (template == "qwen3_coder_tools")
