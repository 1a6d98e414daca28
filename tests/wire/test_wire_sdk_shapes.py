"""What the proxy sends out parses with the vendors' own SDK types (openai, anthropic, google-genai), and the
NeMo Gym result parses with NeMo Gym's own models: a field the SDKs would reject is a bug a harness or
the trainer meets later, and one these tests find first.

Every body kind the proxy sends is here: answers and their streams, errors and the context-overflow
errors, in-stream errors, keep-alives, the token counts and the ``/v1/models`` list. Bodies are read
through ``on_wire`` (the codecs return shapes); streams and errors go through each SDK's own client
over an ``httpx`` mock transport, so its own SSE decoder, stream reader and error mapping read them."""

from __future__ import annotations

import json
import re
import subprocess

import anthropic
import anthropic._streaming as anthropic_streaming
import anthropic.types as anthropic_types
import google.genai as genai
import google.genai.errors as genai_errors
import google.genai.types as genai_types
import httpx
import httpx2
import openai
import openai._streaming as openai_streaming
import openai.types as openai_types
import openai.types.chat as openai_chat_types
import openai.types.responses as openai_responses_types
import pytest
from anthropic.pagination import SyncPage as AnthropicPage
from openai.pagination import SyncPage
from openai.types.shared import ErrorObject
from proxy_client import running_proxy
from pydantic import TypeAdapter
from repo_paths import REPO
from trajectory_helpers import session, three_turn
from wire_helpers import fixture, on_wire, parse_sse, text_turn, tool_turn

from polar_env.backends.instant import InstantBackend
from polar_env.proxy.codecs import anthropic_messages, gemini_generate_content, openai_chat, openai_responses
from polar_env.trajectory.chains import build_trajectory
from polar_env.trajectory.export import to_nemo_gym_result
from polar_env.wire.shape import encode

GYM_PYTHON = REPO / ".venv-gym" / "bin" / "python"
TURNS = {"text": text_turn, "tools": tool_turn, "truncated": lambda: text_turn(finish_reason="length")}


def _events(frames: list[bytes]) -> list:
    return [data for _, data in parse_sse(frames) if data != "[DONE]"]


@pytest.mark.parametrize("turn", sorted(TURNS))
def test_responses_api_shapes_parse_as_openai_sdk_types(turn):
    req = openai_responses.decode(fixture("codex.req2")["body"])
    body = on_wire(openai_responses.encode_response(TURNS[turn](), req))
    parsed = openai_responses_types.Response.model_validate(body)
    assert [item.type for item in parsed.output] == [item["type"] for item in body["output"]]
    events = TypeAdapter(list[openai_responses_types.ResponseStreamEvent]).validate_python(
        _events(openai_responses.encode_stream(TURNS[turn](), req))
    )
    assert events[-1].type == "response.completed"
    assert (
        events[-1].response.model_dump(exclude_none=True)["output"]
        == parsed.model_dump(exclude_none=True)["output"]
    )


@pytest.mark.parametrize("turn", sorted(TURNS))
def test_chat_completions_shapes_parse_as_openai_sdk_types(turn):
    req = openai_chat.decode(fixture("pi-chat.req2")["body"])
    parsed = openai_chat_types.ChatCompletion.model_validate(
        on_wire(openai_chat.encode_response(TURNS[turn](), req))
    )
    assert (
        parsed.choices[0].finish_reason
        == {"text": "stop", "tools": "tool_calls", "truncated": "length"}[turn]
    )
    chunks = TypeAdapter(list[openai_chat_types.ChatCompletionChunk]).validate_python(
        _events(openai_chat.encode_stream(TURNS[turn](), req))
    )
    assert chunks and all(c.id == chunks[0].id for c in chunks)


@pytest.mark.parametrize("turn", sorted(TURNS))
def test_anthropic_messages_shapes_parse_as_anthropic_sdk_types(turn):
    req = anthropic_messages.decode(fixture("claude-bare.req2")["body"])
    parsed = anthropic_types.Message.model_validate(
        on_wire(anthropic_messages.encode_response(TURNS[turn](), req))
    )
    assert parsed.stop_reason == {"text": "end_turn", "tools": "tool_use", "truncated": "max_tokens"}[turn]
    events = _events(anthropic_messages.encode_stream(TURNS[turn](), req))
    assert {"type": "ping"} in events  # keep-alives: the SDK's stream reader drops them before parsing
    events = TypeAdapter(list[anthropic_types.RawMessageStreamEvent]).validate_python(
        [e for e in events if e["type"] != "ping"]
    )
    assert events[0].type == "message_start" and events[-1].type == "message_stop"


@pytest.mark.parametrize("turn", sorted(TURNS))
def test_gemini_shapes_parse_as_genai_sdk_types(turn):
    gemini = gemini_generate_content
    req = gemini.decode(fixture("gemini.req1")["body"], "polar-model", stream=True)
    parsed = genai_types.GenerateContentResponse.model_validate(
        on_wire(gemini.encode_response(TURNS[turn](), req))
    )
    candidate = parsed.candidates[0]
    assert candidate.finish_reason == {"text": "STOP", "tools": "STOP", "truncated": "MAX_TOKENS"}[turn]
    assert [c.id for c in parsed.function_calls or []] == [c.id for c in TURNS[turn]().tool_calls]
    chunks = [
        genai_types.GenerateContentResponse.model_validate(on_wire(c))
        for c in gemini.stream_chunks(TURNS[turn](), req)
    ]
    assert chunks[-1].usage_metadata.candidates_token_count == TURNS[turn]().completion_tokens
    assert [p.text for c in chunks for p in c.candidates[0].content.parts if p.text] == [
        p.text for p in candidate.content.parts if p.text
    ]


def test_error_shapes_parse_as_sdk_error_objects():
    for codec in (openai_chat, openai_responses):
        error = ErrorObject.model_validate(on_wire(codec.encode_error(400, "bad"))["error"])
        assert (error.type, error.message) == ("invalid_request_error", "bad")
    error = anthropic_types.ErrorResponse.model_validate(on_wire(anthropic_messages.encode_error(400, "bad")))
    assert error.error.type == "invalid_request_error"
    google = genai_errors.APIError(400, on_wire(gemini_generate_content.encode_error(400, "bad")))
    assert (google.code, google.status, google.message) == (400, "INVALID_ARGUMENT", "bad")


# -- the SDKs' own clients, reading what the proxy sends ---------------------------------------------

SSE, JSON = "text/event-stream", "application/json"
BASE = "http://proxy.test"
PROMPT, WINDOW = 5000, 4096
CALL_MESSAGES = [{"role": "user", "content": "hi"}]
REQUESTS = {
    openai_chat: "pi-chat.req2",
    openai_responses: "codex.req2",
    anthropic_messages: "claude-bare.req2",
}


def _http(module, body: bytes, status: int, content_type: str):
    """An ``httpx`` (or ``httpx2``) client that answers every request with ``body``, as the proxy sent it."""

    def reply(request):
        return module.Response(status, content=body, headers={"content-type": content_type})

    return module.Client(transport=module.MockTransport(reply))


def _openai(body: bytes, status: int = 200, content_type: str = SSE) -> openai.OpenAI:
    return openai.OpenAI(
        api_key="k",
        base_url=f"{BASE}/v1",
        max_retries=0,
        http_client=_http(httpx, body, status, content_type),
    )


def _anthropic(body: bytes, status: int = 200, content_type: str = SSE) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key="k",
        base_url=BASE,
        max_retries=0,  # this SDK is built on httpx2
        http_client=_http(httpx2, body, status, content_type),
    )


def _genai(body: bytes, status: int = 200, content_type: str = SSE) -> genai.Client:
    return genai.Client(
        api_key="k",
        http_options=genai_types.HttpOptions(
            base_url=BASE,
            httpx_client=_http(httpx, body, status, content_type),
            retry_options=genai_types.HttpRetryOptions(attempts=1),
        ),
    )


def _chat(client: openai.OpenAI, **kw):
    return client.chat.completions.create(model="m", messages=CALL_MESSAGES, **kw)


def _responses(client: openai.OpenAI, **kw):
    return client.responses.create(model="m", input="hi", **kw)


def _messages(client: anthropic.Anthropic, **kw):
    return client.messages.create(model="m", max_tokens=16, messages=CALL_MESSAGES, **kw)


def _generate_stream(client: genai.Client) -> list[genai_types.GenerateContentResponse]:
    return list(client.models.generate_content_stream(model="polar-model", contents="hi"))


def _request(codec):
    if codec is gemini_generate_content:
        return codec.decode(fixture("gemini.req1")["body"], "polar-model", stream=True)
    return codec.decode(fixture(REQUESTS[codec])["body"])


def _frames(codec, turn=tool_turn) -> list[bytes]:
    return codec.encode_stream(turn(), _request(codec))


def _sse_events(decoder, wire: bytes) -> list:
    """The events the SDK's own SSE decoder reads out of ``wire``."""
    return list(decoder.iter_bytes(iter([wire])))


# -- context overflow: the error each harness reads to compact or stop ---------------------------


@pytest.mark.parametrize("window", [WINDOW, None])
def test_openai_overflow_bodies_are_the_context_length_error_the_sdk_raises(window):
    for codec, param, call in ((openai_chat, "messages", _chat), (openai_responses, "input", _responses)):
        error = ErrorObject.model_validate(on_wire(codec.encode_overflow(PROMPT, window))["error"])
        assert (error.type, error.code, error.param) == (
            "invalid_request_error",
            "context_length_exceeded",
            param,
        )
        with pytest.raises(openai.BadRequestError) as raised:
            call(_openai(encode(codec.encode_overflow(PROMPT, window)), 400, JSON))
        assert (raised.value.code, raised.value.param, raised.value.body["message"]) == (
            "context_length_exceeded",
            param,
            error.message,
        )
    message = on_wire(openai_chat.encode_overflow(PROMPT, window))["error"]["message"]
    assert f"maximum context length is {window or PROMPT - 1} tokens" in message  # what Pi reads
    assert f"resulted in {PROMPT} tokens" in message


@pytest.mark.parametrize("window", [WINDOW, None])
def test_anthropic_overflow_is_the_error_claude_code_parses(window):
    body = anthropic_types.ErrorResponse.model_validate(
        on_wire(anthropic_messages.encode_overflow(PROMPT, window))
    )
    assert body.error.type == "invalid_request_error"
    match = re.fullmatch(r"prompt is too long: (\d+) tokens > (\d+) maximum", body.error.message)
    assert match and match.groups() == (str(PROMPT), str((window or PROMPT) - 1))
    with pytest.raises(anthropic.BadRequestError) as raised:
        _messages(_anthropic(encode(anthropic_messages.encode_overflow(PROMPT, window)), 400, JSON))
    assert anthropic_types.ErrorResponse.model_validate(raised.value.body) == body


@pytest.mark.parametrize("window", [WINDOW, None])
def test_gemini_overflow_is_the_error_the_genai_sdk_raises(window):
    gemini = gemini_generate_content
    error = genai_errors.APIError(400, on_wire(gemini.encode_overflow(PROMPT, window)))
    assert (error.code, error.status) == (400, "INVALID_ARGUMENT")
    match = re.fullmatch(
        r"The input token count \((\d+)\) exceeds the maximum number of tokens allowed \((\d+)\)\.",
        error.message,
    )
    assert match and match.groups() == (str(PROMPT), str((window or PROMPT) - 1))
    with pytest.raises(genai_errors.ClientError) as raised:
        _genai(encode(gemini.encode_overflow(PROMPT, window)), 400, JSON).models.generate_content(
            model="polar-model", contents="hi"
        )
    assert (raised.value.code, raised.value.status, raised.value.message) == (
        400,
        "INVALID_ARGUMENT",
        error.message,
    )


# -- in-stream errors: a failure after the status line was sent (keep-alives came first) ---------


def test_chat_stream_error_is_an_error_chunk_then_done():
    wire = openai_chat.encode_stream_error(openai_chat.encode_error(500, "backend went away"))
    events = _sse_events(openai_streaming.SSEDecoder(), wire)
    assert [e.data for e in events[1:]] == ["[DONE]"]
    error = ErrorObject.model_validate(events[0].json()["error"])
    assert (error.type, error.message) == ("server_error", "backend went away")
    with pytest.raises(openai.APIError) as raised:
        list(_chat(_openai(openai_chat.KEEPALIVE * 2 + wire), stream=True))
    assert (raised.value.message, raised.value.type) == ("backend went away", "server_error")


def test_responses_stream_error_is_the_error_stream_event():
    wire = openai_responses.encode_stream_error(openai_responses.encode_error(500, "backend went away"))
    (event,) = _sse_events(openai_streaming.SSEDecoder(), wire)
    assert event.event == "error"
    parsed = TypeAdapter(openai_responses_types.ResponseStreamEvent).validate_python(event.json())
    assert isinstance(parsed, openai_responses_types.ResponseErrorEvent)
    assert (parsed.type, parsed.message) == ("error", "backend went away")
    events = list(_responses(_openai(openai_responses.KEEPALIVE * 2 + wire), stream=True))
    assert isinstance(events[-1], openai_responses_types.ResponseErrorEvent)
    assert (events[-1].type, events[-1].message) == ("error", "backend went away")


def test_anthropic_stream_error_is_the_error_event_the_sdk_raises():
    wire = anthropic_messages.encode_stream_error(anthropic_messages.encode_error(529, "overloaded"))
    (event,) = _sse_events(anthropic_streaming.SSEDecoder(), wire)
    assert event.event == "error"
    body = anthropic_types.ErrorResponse.model_validate(event.json())
    assert (body.error.type, body.error.message) == (
        "overloaded_error",
        "overloaded",
    )  # Claude Code retries it
    with pytest.raises(anthropic.APIStatusError) as raised:
        list(_messages(_anthropic(anthropic_messages.KEEPALIVE * 2 + wire), stream=True))
    assert anthropic_types.ErrorResponse.model_validate(raised.value.body) == body


def test_gemini_stream_error_is_the_bare_error_object_the_sdk_raises():
    gemini = gemini_generate_content
    wire = gemini.encode_stream_error(gemini.encode_error(503, "backend went away"))
    assert json.loads(wire) == on_wire(gemini.encode_error(503, "backend went away"))  # one bare JSON line
    with pytest.raises(genai_errors.ServerError) as raised:
        _generate_stream(_genai(gemini.KEEPALIVE * 2 + wire))
    assert (raised.value.code, raised.value.status, raised.value.message) == (
        503,
        "UNAVAILABLE",
        "backend went away",
    )


# -- count_tokens -------------------------------------------------------------------------------


def test_count_tokens_answers_parse_as_sdk_types():
    count = anthropic_types.MessageTokensCount.model_validate(on_wire(anthropic_messages.encode_count(17)))
    assert count.input_tokens == 17
    count = _anthropic(encode(anthropic_messages.encode_count(17)), 200, JSON).messages.count_tokens(
        model="m", messages=CALL_MESSAGES
    )
    assert isinstance(count, anthropic_types.MessageTokensCount) and count.input_tokens == 17
    gemini = gemini_generate_content
    count = genai_types.CountTokensResponse.model_validate(on_wire(gemini.encode_count(17)))
    assert count.total_tokens == 17
    count = _genai(encode(gemini.encode_count(17)), 200, JSON).models.count_tokens(
        model="polar-model", contents="hi"
    )
    assert isinstance(count, genai_types.CountTokensResponse) and count.total_tokens == 17


# -- /v1/models, from a running proxy -------------------------------------------------------------

MODEL = "polar-served"


@pytest.fixture
async def live_proxy(renderer, tmp_path):
    async with running_proxy(
        renderer, InstantBackend(renderer.eos_token_ids[:1], model=MODEL), tmp_path
    ) as proxy:
        sid, key = proxy.create_session("models")
        yield f"{proxy.base_url}/s/{sid}", key


async def test_models_list_reads_with_the_sdk_clients(live_proxy):
    base, key = live_proxy
    async with openai.AsyncOpenAI(api_key=key, base_url=f"{base}/v1", max_retries=0) as client:
        page = await client.models.list()
        assert [(m.id, m.object, m.owned_by) for m in page.data] == [(MODEL, "model", "polar")]
    async with openai.AsyncOpenAI(api_key="not-the-key", base_url=f"{base}/v1", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            await client.models.list()
    async with anthropic.AsyncAnthropic(api_key=key, base_url=base, max_retries=0) as client:
        page = await client.models.list()
        assert [(m.id, m.type, m.display_name) for m in page.data] == [(MODEL, "model", MODEL)]


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
async def test_models_list_validates_as_the_sdks_model_types(live_proxy, sdk):
    """The SDK clients above build the page without validating it; the types say which fields they require."""
    base, key = live_proxy
    async with httpx.AsyncClient() as http:
        resp = await http.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert resp.status_code == 200
    page_type = SyncPage[openai_types.Model] if sdk == "openai" else AnthropicPage[anthropic_types.ModelInfo]
    page = page_type.model_validate(resp.json())
    assert [m.id for m in page.data] == [MODEL]


# -- keep-alives: sent every few seconds before a slow answer's first event ----------------------


def test_chat_keepalive_is_an_sse_comment_the_sdk_skips():
    assert openai_chat.KEEPALIVE.startswith(b":")
    assert _sse_events(openai_streaming.SSEDecoder(), openai_chat.KEEPALIVE) == []
    frames = _frames(openai_chat)
    plain = list(_chat(_openai(b"".join(frames)), stream=True))
    kept = list(_chat(_openai(openai_chat.KEEPALIVE * 2 + b"".join(frames)), stream=True))
    assert len(plain) == len(frames) - 1  # every chunk but [DONE]
    assert [c.model_dump() for c in kept] == [c.model_dump() for c in plain]


def test_responses_keepalive_is_a_keepalive_event_the_sdk_stream_passes_through():
    """openai-python has no keep-alive type and does not drop the event: its stream yields it (built
    loosely, ``type`` ``keepalive``) and every other event unchanged. Codex skips it by type."""
    (event,) = _sse_events(openai_streaming.SSEDecoder(), openai_responses.KEEPALIVE)
    assert event.event == "keepalive" and event.json()["type"] == "keepalive"
    frames = b"".join(_frames(openai_responses))
    plain = list(_responses(_openai(frames), stream=True))
    kept = list(_responses(_openai(openai_responses.KEEPALIVE * 2 + frames), stream=True))
    assert [e.type for e in kept[:2]] == ["keepalive", "keepalive"]
    assert [e.model_dump() for e in kept[2:]] == [e.model_dump() for e in plain]
    assert (plain[0].type, plain[-1].type) == ("response.created", "response.completed")


def test_a_slow_responses_stream_reads_with_the_sdk_stream_helper():
    """A slow answer's stream as the proxy sends it (``ProxyServer._stream_while_generating``): its
    head (``response.created``, ``response.in_progress``) at once, keep-alives while it generates,
    then the rest. openai-python's ``responses.stream()`` refuses any event before
    ``response.created``, so keep-alives first would break it."""
    turn, req = tool_turn(), _request(openai_responses)
    frames = openai_responses.encode_stream(turn, req)
    head = openai_responses.encode_stream_head(req, turn.call_id, turn.model, turn.created_at)
    wire = b"".join(head) + openai_responses.KEEPALIVE * 2 + b"".join(frames[len(head) :])
    with _openai(wire).responses.stream(model="m", input="hi") as stream:
        final = stream.get_final_response()
    assert [item.type for item in final.output] == [
        item["type"] for item in on_wire(openai_responses.encode_response(turn, req))["output"]
    ]


def test_anthropic_keepalive_is_a_ping_event_the_sdk_skips():
    """anthropic._streaming.Stream drops ``event: ping`` before parsing (ping is not a
    RawMessageStreamEvent)."""
    (event,) = _sse_events(anthropic_streaming.SSEDecoder(), anthropic_messages.KEEPALIVE)
    assert (event.event, event.json()) == ("ping", {"type": "ping"})
    frames = b"".join(_frames(anthropic_messages))
    plain = list(_messages(_anthropic(frames), stream=True))
    kept = list(_messages(_anthropic(anthropic_messages.KEEPALIVE * 2 + frames), stream=True))
    assert "ping" not in [e.type for e in kept]
    assert [e.model_dump() for e in kept] == [e.model_dump() for e in plain]
    assert (kept[0].type, kept[-1].type) == ("message_start", "message_stop")
    with _anthropic(anthropic_messages.KEEPALIVE * 2 + frames).messages.stream(
        model="m", max_tokens=16, messages=CALL_MESSAGES
    ) as stream:
        final = stream.get_final_message()
    expected = anthropic_types.Message.model_validate(
        on_wire(anthropic_messages.encode_response(tool_turn(), _request(anthropic_messages)))
    )
    assert [b.type for b in final.content] == [b.type for b in expected.content]
    assert [b.input for b in final.content if b.type == "tool_use"] == [
        b.input for b in expected.content if b.type == "tool_use"
    ]
    assert final.stop_reason == expected.stop_reason == "tool_use"


def test_gemini_keepalive_is_an_empty_line_the_sdk_stream_reader_skips():
    gemini = gemini_generate_content
    assert gemini.KEEPALIVE.strip() == b""
    frames = _frames(gemini)
    plain = _generate_stream(_genai(b"".join(frames)))
    kept = _generate_stream(_genai(gemini.KEEPALIVE * 2 + b"".join(frames)))
    assert len(kept) == len(plain) == len(frames)
    assert [c.model_dump(exclude={"sdk_http_response"}) for c in kept] == [
        c.model_dump(exclude={"sdk_http_response"}) for c in plain
    ]
    assert [call.name for c in kept for call in c.function_calls or []] == [
        c.name for c in tool_turn().tool_calls
    ]


def _nemo_result() -> dict:
    return to_nemo_gym_result(
        build_trajectory(session("s1"), three_turn(), status="completed", reward=1.0)
    ).row()


@pytest.mark.skipif(
    not GYM_PYTHON.exists(), reason="needs the NeMo Gym venv (.venv-gym): scripts/setup_nemo_gym.sh"
)
def test_nemo_result_parses_with_nemo_gyms_own_models():
    """In .venv-gym (nemo-gym needs Python 3.13): the result as Gym's verify response, items as training
    items."""
    check = (
        "import json, sys\n"
        "from nemo_gym.base_resources_server import BaseVerifyResponse\n"
        "result = json.load(sys.stdin)\n"
        "parsed = BaseVerifyResponse.model_validate(result)\n"
        "names = [type(item).__name__ for item in parsed.response.output]\n"
        "print(json.dumps({'reward': parsed.reward, 'items': names}))\n"
    )
    result = _nemo_result()
    run = subprocess.run(
        [str(GYM_PYTHON), "-I", "-c", check],
        input=json.dumps(result),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    parsed = json.loads(run.stdout)
    assert parsed["reward"] == 1.0
    trainable = [i for i, item in enumerate(result["response"]["output"]) if item.get("generation_token_ids")]
    assert trainable and all(parsed["items"][i].endswith("ForTraining") for i in trainable), parsed["items"]
