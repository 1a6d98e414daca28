"""What the proxy sends out parses with the vendors' own SDK types (openai, anthropic, google-genai), and the NeMo
Gym result parses with NeMo Gym's own models: a field the SDKs would reject is a bug a harness or
the trainer meets later, and one these tests find first."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import anthropic.types as anthropic_types
import google.genai.errors as genai_errors
import google.genai.types as genai_types
import openai.types.chat as openai_chat_types
import openai.types.responses as openai_responses_types
import pytest
from pydantic import TypeAdapter
from trajectory_helpers import session, three_turn
from wire_helpers import fixture, parse_sse, text_turn, tool_turn

from polar_env.proxy import anthropic_messages, gemini_generate_content, openai_chat, openai_responses
from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.export import to_nemo_gym_result

GYM_PYTHON = Path(__file__).resolve().parents[1] / ".venv-gym" / "bin" / "python"
TURNS = {"text": text_turn, "tools": tool_turn, "truncated": lambda: text_turn(finish_reason="length")}


def _events(frames: list[bytes]) -> list:
    return [data for _, data in parse_sse(frames) if data != "[DONE]"]


@pytest.mark.parametrize("turn", sorted(TURNS))
def test_responses_api_shapes_parse_as_openai_sdk_types(turn):
    req = openai_responses.decode(fixture("codex.req2")["body"])
    body = openai_responses.encode_response(TURNS[turn](), req)
    parsed = openai_responses_types.Response.model_validate(body)
    assert [item.type for item in parsed.output] == [item["type"] for item in body["output"]]
    events = TypeAdapter(list[openai_responses_types.ResponseStreamEvent]).validate_python(
        _events(openai_responses.encode_stream(TURNS[turn](), req)))
    assert events[-1].type == "response.completed"
    assert events[-1].response.model_dump(exclude_none=True)["output"] == parsed.model_dump(exclude_none=True)["output"]


@pytest.mark.parametrize("turn", sorted(TURNS))
def test_chat_completions_shapes_parse_as_openai_sdk_types(turn):
    req = openai_chat.decode(fixture("pi-chat.req2")["body"])
    parsed = openai_chat_types.ChatCompletion.model_validate(openai_chat.encode_response(TURNS[turn](), req))
    assert parsed.choices[0].finish_reason == {"text": "stop", "tools": "tool_calls", "truncated": "length"}[turn]
    chunks = TypeAdapter(list[openai_chat_types.ChatCompletionChunk]).validate_python(
        _events(openai_chat.encode_stream(TURNS[turn](), req)))
    assert chunks and all(c.id == chunks[0].id for c in chunks)


@pytest.mark.parametrize("turn", sorted(TURNS))
def test_anthropic_messages_shapes_parse_as_anthropic_sdk_types(turn):
    req = anthropic_messages.decode(fixture("claude-bare.req2")["body"])
    parsed = anthropic_types.Message.model_validate(anthropic_messages.encode_response(TURNS[turn](), req))
    assert parsed.stop_reason == {"text": "end_turn", "tools": "tool_use", "truncated": "max_tokens"}[turn]
    events = _events(anthropic_messages.encode_stream(TURNS[turn](), req))
    assert {"type": "ping"} in events  # keep-alives: the SDK's stream reader drops them before parsing
    events = TypeAdapter(list[anthropic_types.RawMessageStreamEvent]).validate_python(
        [e for e in events if e["type"] != "ping"])
    assert events[0].type == "message_start" and events[-1].type == "message_stop"


@pytest.mark.parametrize("turn", sorted(TURNS))
def test_gemini_shapes_parse_as_genai_sdk_types(turn):
    gemini = gemini_generate_content
    req = gemini.decode(fixture("gemini.req1")["body"], "polar-model", stream=True)
    parsed = genai_types.GenerateContentResponse.model_validate(gemini.encode_response(TURNS[turn](), req))
    candidate = parsed.candidates[0]
    assert candidate.finish_reason == {"text": "STOP", "tools": "STOP", "truncated": "MAX_TOKENS"}[turn]
    assert [c.id for c in parsed.function_calls or []] == [c.id for c in TURNS[turn]().tool_calls]
    chunks = [genai_types.GenerateContentResponse.model_validate(c) for c in gemini.stream_chunks(TURNS[turn](), req)]
    assert chunks[-1].usage_metadata.candidates_token_count == TURNS[turn]().completion_tokens
    assert [p.text for c in chunks for p in c.candidates[0].content.parts if p.text] == [
        p.text for p in candidate.content.parts if p.text]


def test_error_shapes_parse_as_sdk_error_objects():
    from openai.types.shared import ErrorObject

    for codec in (openai_chat, openai_responses):
        ErrorObject.model_validate(codec.encode_error(400, "bad")["error"])
    error = anthropic_types.ErrorResponse.model_validate(anthropic_messages.encode_error(400, "bad"))
    assert error.error.type == "invalid_request_error"
    google = genai_errors.APIError(400, gemini_generate_content.encode_error(400, "bad"))
    assert (google.code, google.status, google.message) == (400, "INVALID_ARGUMENT", "bad")


def _nemo_result() -> dict:
    return to_nemo_gym_result(build_trajectory(session("s1"), three_turn(), status="completed", reward=1.0))


@pytest.mark.skipif(not GYM_PYTHON.exists(), reason="needs the NeMo Gym venv (.venv-gym): scripts/setup_nemo_gym.sh")
def test_nemo_result_parses_with_nemo_gyms_own_models():
    """In .venv-gym (nemo-gym needs Python 3.13): the result as Gym's verify response, items as training items."""
    check = ("import json, sys\n"
             "from nemo_gym.base_resources_server import BaseVerifyResponse\n"
             "result = json.load(sys.stdin)\n"
             "parsed = BaseVerifyResponse.model_validate(result)\n"
             "names = [type(item).__name__ for item in parsed.response.output]\n"
             "print(json.dumps({'reward': parsed.reward, 'items': names}))\n")
    result = _nemo_result()
    run = subprocess.run([str(GYM_PYTHON), "-I", "-c", check], input=json.dumps(result), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    parsed = json.loads(run.stdout)
    assert parsed["reward"] == 1.0
    trainable = [i for i, item in enumerate(result["response"]["output"]) if item.get("generation_token_ids")]
    assert trainable and all(parsed["items"][i].endswith("ForTraining") for i in trainable), parsed["items"]
