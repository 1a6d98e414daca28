"""Model-output fuzzing: whatever the model samples (broken tool-call JSON, unterminated tags,
huge arguments, token ids that decode to invalid UTF-8), the parser never raises and the proxy
answers the harness in every API, streamed or not, and records the call."""

from __future__ import annotations

import json
import os
import time

import aiohttp
import pytest
from fuzz_helpers import ThreadedProxy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proxy_client import make_proxy

from polar_env.backends.instant import InstantBackend
from polar_env.chat.parsers import parse_text

FUZZ = settings(
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
    derandomize=not os.environ.get("POLAR_FUZZ_RANDOM"),
)
FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<function=",
    "<function=run>",
    "</function>",
    "<parameter=cmd>",
    "<parameter=",
    "</parameter>",
    '{"name": "run", "arguments": {',
    '{"name": ',
    '"arguments": "',
    "}",
    "]",
    "[",
    '"',
    "\n",
    "\\",
    "null",
    '{"name": ""}',
    '[{"name": "a"}, 3]',
    "<|im_end|>",
    "<|im_start|>",
    "\x00",
    "\ufffd",
    "é",
    "🙂",
    "9" * 5000,
    "[" * 5000,
    '{"a":' * 2000,
]
TEXT = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=20), max_size=25).map("".join)


def _check(parsed) -> None:
    assert isinstance(parsed.content, str)
    for call in parsed.tool_calls:
        assert isinstance(call.name, str) and call.name and isinstance(call.arguments, str)


@settings(FUZZ, max_examples=1500)
@given(text=TEXT, fmt=st.sampled_from(["hermes", "qwen3_coder"]), in_think=st.booleans())
def test_parse_text_never_raises(text, fmt, in_think):
    _check(parse_text(text, fmt, started_in_think=in_think))


HUGE = "x" * (4 << 20)


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "run", "arguments": {"cmd": "' + HUGE + '"}}\n</tool_call>',
        "<tool_call>\n<function=run>\n<parameter=cmd>\n" + HUGE + "\n</parameter>\n</function>\n</tool_call>",
        '<tool_call>\n{"name": "run", "arguments": {"n": ' + "9" * 5000 + "}}\n</tool_call>",
        '<tool_call>\n{"name": "run", "arguments": ' + "[" * 100_000 + "]" * 100_000 + "}\n</tool_call>",
        "<tool_call>\n<function=run>\n<parameter=n>\n"
        + "9" * 5000
        + "\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=run>\n<parameter=n>\n"
        + "[" * 100_000
        + "\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>" * 10_000,
        "<think>" * 10_000 + "</tool_call>",
        "<tool_call>" * 5_000 + "</tool_call>" + "<tool_call>" * 5_000,
        "<tool_call>\n<function=run>\n" + "<parameter=a>" * 10_000 + "</function>\n</tool_call>",
        "<tool_call>\n" + "<function=run>" * 10_000 + "\n</tool_call>",
    ],
)
@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder"])
def test_adversarial_outputs_parse_without_raising(text, fmt):
    started = time.perf_counter()
    _check(parse_text(text, fmt))
    assert time.perf_counter() - started < 2  # parsing runs on the proxy's event loop: no quadratic blowup


def _byte_token_ids(tokenizer) -> list[int]:
    """Ids of single-byte tokens for 0x80..0xFF: alone or shuffled they are invalid UTF-8."""
    # byte-level BPE (GPT-2 family, SmolLM2) spells byte b as chr(b) if printable Latin-1, else chr(256 + n)
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table, n = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b], n = chr(256 + n), n + 1
    ids = tokenizer.convert_tokens_to_ids([table[b] for b in range(0x80, 0x100)])
    return [i for i in ids if i is not None and i != tokenizer.unk_token_id]


@pytest.fixture(scope="module")
def vocab(renderer):
    tok = renderer.tokenizer
    return {
        "size": len(tok),
        "bytes": _byte_token_ids(tok),
        "tags": [i for f in FRAGMENTS[:12] for i in tok.encode(f, add_special_tokens=False)],
    }


def test_byte_tokens_really_are_invalid_utf8(renderer, vocab):
    assert len(vocab["bytes"]) >= 100
    assert "\ufffd" in renderer.tokenizer.decode(vocab["bytes"][:1])


@st.composite
def sampled_ids(draw, vocab) -> list[int]:
    pick = st.one_of(
        st.integers(0, vocab["size"] - 1), st.sampled_from(vocab["bytes"]), st.sampled_from(vocab["tags"])
    )
    return draw(st.lists(pick, min_size=1, max_size=60))


@settings(FUZZ, max_examples=400)
@given(data=st.data())
def test_parse_output_of_random_ids_never_raises(renderer, vocab, data):
    _check(renderer.parse_output(data.draw(sampled_ids(vocab))))


TOOLS = {  # one function tool and, where the API has them, a free-text tool
    "chat": [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}],
    "responses": [
        {"type": "function", "name": "run", "parameters": {"type": "object"}},
        {"type": "custom", "name": "apply_patch", "description": "patch"},
    ],
    "messages": [{"name": "run", "input_schema": {"type": "object"}}],
}
BODIES = {
    "chat": ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "go"}]}),
    "responses": ("/v1/responses", {"model": "m", "input": "go"}),
    "messages": (
        "/v1/messages",
        {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "go"}]},
    ),
}


@pytest.fixture(scope="module")
def served(renderer, tmp_path_factory):
    backend = InstantBackend([0])
    proxy = make_proxy(
        renderer,
        backend,
        tmp_path_factory.mktemp("out-fuzz"),
        admin_secret="a",
        max_context=4096,
        default_max_tokens=256,
    )
    sid, key = proxy.create_session("out")
    with ThreadedProxy(proxy) as threaded:
        yield threaded, backend, sid, key


async def _ask(base: str, path: str, body: dict, key: str) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
        http.post(
            base + path, json=body, headers={"Authorization": f"Bearer {key}", "x-api-key": key}
        ) as resp,
    ):
        return resp.status, await resp.read()


@pytest.mark.slow
@settings(FUZZ, max_examples=150)
@given(data=st.data())
def test_proxy_answers_any_sampled_ids_in_every_api(served, vocab, renderer, data):
    threaded, backend, sid, key = served
    ids = data.draw(
        st.one_of(
            sampled_ids(vocab),
            TEXT.map(lambda t: renderer.tokenizer.encode(t, add_special_tokens=False)[:200] or [0]),
        )
    )
    api = data.draw(st.sampled_from(list(BODIES)))
    stream = data.draw(st.booleans())
    backend.token_ids = ids + renderer.eos_token_ids[:1]
    path, body = BODIES[api]
    before = len(threaded.proxy.registry.ledger.calls(sid))
    status, raw = threaded.call(
        _ask(threaded.proxy.base_url, f"/s/{sid}{path}", {**body, "stream": stream, "tools": TOOLS[api]}, key)
    )
    assert status == 200, raw[:500]
    if not stream:
        json.loads(raw)
    calls = threaded.proxy.registry.ledger.calls(sid)
    sampled = calls[-1].sampled_ids  # cut at the request's max_tokens
    assert len(calls) == before + 1 and sampled and sampled == backend.token_ids[: len(sampled)]
