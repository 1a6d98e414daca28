"""What building and encoding an answer costs, three ways side by side in one run: the proxy's own
typed shapes (``polar_env/wire``, msgspec structs: what is shipped), the dict literals they replaced
(the Chat Completions encoder as it was, kept here only as the yardstick), and pydantic v2 models of
the same body (the ``openai`` SDK's own ``ChatCompletion`` / ``ChatCompletionChunk`` types, built by
validation as a pydantic design would).

One answer = a tool-calling turn with reasoning, text, two tool calls and 60 sampled tokens'
logprobs, as a non-streamed body and as its SSE chunks; the figure is µs per answer (median of
runs), the ratio is against the dict literals.
"""

from __future__ import annotations

import time
from typing import Any

import openai.types.chat as openai_chat_types

from bench.common import median
from polar_env import fastjson
from polar_env.chat.messages import AssistantTurn, TokenLogprob, ToolCall
from polar_env.proxy.codecs import openai_chat
from polar_env.proxy.codecs.common import DecodedRequest, sse_frame
from polar_env.wire.shape import encode


def answer() -> tuple[AssistantTurn, DecodedRequest]:
    calls = [
        ToolCall(id="call_bench_0", name="bash", arguments='{"command": "ls -la src/"}'),
        ToolCall(id="call_bench_1", name="read", arguments='{"path": "README.md"}'),
    ]
    logprobs = [TokenLogprob(token=f"tok{i}", logprob=-0.01 * i, bytes=[116, 111, 107]) for i in range(60)]
    turn = AssistantTurn(
        call_id="bench0001",
        content="Let me look at the source tree first.",
        reasoning="I should list the files.",
        tool_calls=calls,
        finish_reason="tool_calls",
        prompt_tokens=2000,
        completion_tokens=60,
        model="served",
        logprobs=logprobs,
    )
    req = DecodedRequest(
        conversation={"messages": [{"role": "user", "content": "hi"}]},
        model="served",
        raw_model="served",
        stream=True,
        include_usage=True,
    )
    return turn, req


def _dict_call(tc: ToolCall, index: int | None = None) -> dict[str, Any]:
    head: dict[str, Any] = {} if index is None else {"index": index}
    return {**head, "id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments}}


def _dict_logprobs(turn: AssistantTurn) -> dict[str, Any]:
    return {"content": [t.model_dump() for t in turn.logprobs or []], "refusal": None}


def dict_literals(turn: AssistantTurn, req: DecodedRequest) -> list[bytes]:
    """The encoder before the shapes (68acda8's ``proxy/openai_chat.py``), body and stream."""
    message = {
        "role": "assistant",
        "content": turn.content,
        "reasoning_content": turn.reasoning,
        "tool_calls": [_dict_call(tc) for tc in turn.tool_calls],
    }
    usage = {
        "prompt_tokens": turn.prompt_tokens,
        "completion_tokens": turn.completion_tokens,
        "total_tokens": turn.prompt_tokens + turn.completion_tokens,
    }
    body = fastjson.dumps(
        {
            "id": f"chatcmpl-{turn.call_id}",
            "object": "chat.completion",
            "created": 0,
            "model": req.raw_model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": _dict_logprobs(turn),
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": usage,
        }
    )
    head = {
        "id": f"chatcmpl-{turn.call_id}",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": req.raw_model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: dict | None = None) -> bytes:
        return (
            b"data: "
            + fastjson.dumps(
                {
                    **head,
                    "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
                }
            )
            + b"\n\n"
        )

    frames = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": turn.reasoning}),
        chunk({"content": turn.content}, logprobs=_dict_logprobs(turn)),
    ]
    frames += [chunk({"tool_calls": [_dict_call(tc, i)]}) for i, tc in enumerate(turn.tool_calls)]
    frames += [
        chunk({}, "tool_calls"),
        b"data: " + fastjson.dumps({**head, "choices": [], "usage": usage}) + b"\n\n",
    ]
    return [body, *frames]


def pydantic_models(turn: AssistantTurn, req: DecodedRequest) -> list[bytes]:
    """The same body and chunks as pydantic v2 models (the ``openai`` SDK's), validated and dumped."""
    calls = [
        {"id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments}}
        for tc in turn.tool_calls
    ]
    logprobs = {"content": [t.model_dump() for t in turn.logprobs or []], "refusal": None}
    usage = {
        "prompt_tokens": turn.prompt_tokens,
        "completion_tokens": turn.completion_tokens,
        "total_tokens": turn.prompt_tokens + turn.completion_tokens,
    }
    body = openai_chat_types.ChatCompletion(
        id=f"chatcmpl-{turn.call_id}",
        object="chat.completion",
        created=0,
        model=req.raw_model,
        usage=usage,
        choices=[
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "logprobs": logprobs,
                "message": {"role": "assistant", "content": turn.content, "tool_calls": calls},
            }
        ],
    )
    head = {
        "id": f"chatcmpl-{turn.call_id}",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": req.raw_model,
    }
    Chunk = openai_chat_types.ChatCompletionChunk
    deltas = [({"role": "assistant", "content": ""}, None, None), ({"content": turn.content}, None, logprobs)]
    deltas += [({"tool_calls": [{**c, "index": i}]}, None, None) for i, c in enumerate(calls)]
    deltas.append(({}, "tool_calls", None))
    frames = [
        b"data: "
        + Chunk(**head, choices=[{"index": 0, "delta": d, "finish_reason": f, "logprobs": lp}])
        .model_dump_json()
        .encode()
        + b"\n\n"
        for d, f, lp in deltas
    ]
    frames.append(b"data: " + Chunk(**head, choices=[], usage=usage).model_dump_json().encode() + b"\n\n")
    return [body.model_dump_json().encode(), *frames]


def typed_shapes(turn: AssistantTurn, req: DecodedRequest) -> list[bytes]:
    """What the proxy runs: ``openai_chat.encode_response`` and ``encode_stream`` (msgspec structs)."""
    return [encode(openai_chat.encode_response(turn, req)), *openai_chat.encode_stream(turn, req)]


WAYS = {"dict_literals": dict_literals, "typed_shapes": typed_shapes, "pydantic_models": pydantic_models}


def _per_answer_us(fn: Any, turn: AssistantTurn, req: DecodedRequest, answers: int) -> float:
    fn(turn, req)
    started = time.perf_counter()
    for _ in range(answers):
        fn(turn, req)
    return (time.perf_counter() - started) / answers * 1e6


def measure(answers: int = 2000, runs: int = 5) -> dict[str, Any]:
    turn, req = answer()
    assert sse_frame("[DONE]") == typed_shapes(turn, req)[-1]
    us: dict[str, list[float]] = {way: [] for way in WAYS}
    for _ in range(runs):  # interleaved, so a change in the machine's load hits every way alike
        for way, fn in WAYS.items():
            us[way].append(_per_answer_us(fn, turn, req, answers))
    result: dict[str, Any] = {"answers_per_run": answers, "runs": runs}
    for way, values in us.items():
        result[f"{way}_us_per_answer"] = round(median(values), 1)
    for way in ("typed_shapes", "pydantic_models"):
        result[f"{way}_vs_dicts"] = round(median(us[way]) / median(us["dict_literals"]), 2)
    return result
