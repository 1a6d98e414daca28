"""Property-based fuzzing of the three wire decoders and of the proxy's HTTP router.

Whatever a harness (or anything else that reaches the socket) sends, the proxy answers 2xx or a
4xx that carries a message: never a 500, never a hang. Bodies start from real harness requests
(the shared fixtures) with random subtrees replaced, deleted or duplicated, so the fuzzer gets
deep into each decoder instead of bouncing off the first type check.
"""

from __future__ import annotations

import http.client
import json
import os
import string

import pytest
from fuzz_helpers import JSON, ThreadedProxy, mutated_body, seed_bodies
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from proxy_client import make_proxy

from polar_env.backends.instant import InstantBackend
from polar_env.proxy.codecs import anthropic_messages, gemini_generate_content, openai_chat, openai_responses
from polar_env.proxy.codecs.common import DecodedRequest, WireError

SEEDS = seed_bodies()
MODULES = {
    "chat": openai_chat,
    "responses": openai_responses,
    "messages": anthropic_messages,
    "gemini": gemini_generate_content,
}
PATHS = {
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
    "gemini": "/v1beta/models/m:streamGenerateContent?alt=sse",
}
FUZZ = settings(
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
    derandomize=not os.environ.get("POLAR_FUZZ_RANDOM"),
)  # CI: reproducible; set it to explore
LIMIT = 256 * 1024


@pytest.mark.parametrize("api", list(MODULES))
@settings(FUZZ, max_examples=400)
@given(data=st.data())
def test_decoder_accepts_or_refuses_with_a_4xx(api, data):
    body = data.draw(mutated_body(SEEDS[api]) | JSON, label="body")
    try:
        decoded = MODULES[api].decode(body)
    except WireError as exc:
        assert 400 <= exc.status < 500 and exc.message
    else:
        assert isinstance(decoded, DecodedRequest)


@pytest.fixture(scope="module")
def served(renderer, tmp_path_factory):
    backend = InstantBackend(
        renderer.tokenizer.encode("Hi", add_special_tokens=False) + renderer.eos_token_ids[:1]
    )
    proxy = make_proxy(
        renderer,
        backend,
        tmp_path_factory.mktemp("fuzz"),
        admin_secret="fuzz-admin",
        max_context=4096,
        default_max_tokens=8,
        max_body_mb=LIMIT / 2**20,
    )
    sid, key = proxy.create_session("fz")
    with ThreadedProxy(proxy) as threaded:
        yield threaded, sid, key


def _send(
    port: int, method: str, path: str, body: bytes | None, headers: dict[str, str]
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)  # a hang fails the example
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


ROUTES = [
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/responses",
    "/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1beta/models/m:generateContent",
    "/v1/models",
    "",
    "/",
    "/v1",
    "/v1beta/models/m:streamGenerateContent?alt=sse",
    "/v1beta/models/m:countTokens?key=pk-wrong",
    "/v1beta/models/m",
    "/v1beta/models/m:sparkle",
]
SAFE = string.ascii_letters + string.digits + "-._~%:@!$&'()*+,;=?#"
WEIRD_PATHS = [
    "/s/../admin/sessions",
    "/s/%2e%2e/v1/chat/completions",
    "/s/fz%2F..%2F/v1/responses",
    "/admin/sessions/..%2F..%2Fetc/calls",
    "//admin/sessions",
    "/s//v1/messages",
    "/s/fz/v1/../../admin",
    "/health",
    "/admin/sessions/fz/close",
    "/admin/sessions/fz/calls",
    "/s/%00/v1/messages",
]


@st.composite
def requests_(draw, sid: str, key: str):
    api = draw(st.sampled_from(list(MODULES)))
    path = draw(
        st.one_of(
            st.sampled_from(ROUTES).map(lambda r: f"/s/{sid}{r}"),
            st.sampled_from(WEIRD_PATHS),
            st.lists(st.text(SAFE, max_size=12), max_size=5).map(lambda segs: "/" + "/".join(segs)),
        )
    )
    method = draw(st.sampled_from(["POST"] * 6 + ["GET", "HEAD", "PUT", "DELETE", "OPTIONS"]))
    body = draw(
        st.one_of(
            mutated_body(SEEDS[api]).map(lambda b: json.dumps(b).encode()),
            JSON.map(lambda b: json.dumps(b).encode()),
            st.binary(max_size=300),
            st.none(),
        )
    )
    auth = draw(
        st.sampled_from(
            [
                {"Authorization": f"Bearer {key}"},
                {"x-api-key": key},
                {"x-goog-api-key": key},
                {},
                {"Authorization": "Bearer pk-wrong"},
                {"Authorization": "Bearer fuzz-admin"},
            ]
        )
    )
    return method, path, body, {"Content-Type": "application/json", **auth}


@pytest.mark.slow
@settings(FUZZ, max_examples=300)
@given(data=st.data())
def test_router_answers_2xx_or_4xx_with_a_message(served, data):
    threaded, sid, key = served
    method, path, body, headers = data.draw(requests_(sid, key), label="request")
    status, raw = _send(threaded.proxy.port, method, path, body, headers)
    assert status < 500, (status, raw[:500])
    if status >= 400 and method != "HEAD":
        assert "message" in json.loads(raw)["error"], raw[:500]


@pytest.mark.parametrize("api", list(MODULES))
def test_oversized_body_gets_413(served, api):
    threaded = served[0]
    sid, key = threaded.proxy.create_session()  # the router fuzz may have closed "fz"
    path = PATHS[api]
    body = json.dumps(
        {
            "model": "m",
            "input": "x" * (LIMIT + 1),
            "messages": [{"role": "user", "content": "x" * (LIMIT + 1)}],
        }
    ).encode()
    status, raw = _send(
        threaded.proxy.port, "POST", f"/s/{sid}{path}", body, {"Authorization": f"Bearer {key}"}
    )
    assert status == 413 and str(LIMIT) in json.loads(raw)["error"]["message"]
    status, _ = _send(
        threaded.proxy.port,
        "POST",
        f"/s/{sid}{path}",
        json.dumps(SEEDS[api][0]).encode(),
        {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    assert status == 200  # just under the limit still works: the limit is the configured one


NASTY_BODIES = {
    "not json": b"\x00\xff garbage {",
    "invalid utf-8": b'{"model": "m\xff\xfe"}',
    "too many digits": b'{"model": "m", "max_tokens": ' + b"9" * 5000 + b"}",
    "deep nesting": b"[" * 100_000 + b"]" * 100_000,
    "deep object": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    "empty": b"",
    "json null": b"null",
    "huge float": b'{"model": "m", "temperature": 1e999, "messages": [], "input": "x"}',
    "nan": b'{"model": "m", "temperature": NaN, "top_p": Infinity, "messages": [{"role": "user", "content": '
    b'"x"}]}',
}
ADMIN_ROUTES = ["/admin/sessions", "/admin/sessions/{sid}/close"]


@pytest.mark.parametrize("name", list(NASTY_BODIES))
def test_nasty_bodies_on_every_route_are_4xx(served, name):
    threaded = served[0]
    sid, key = threaded.proxy.create_session()
    for route in ROUTES[:7]:
        status, raw = _send(
            threaded.proxy.port,
            "POST",
            f"/s/{sid}{route}",
            NASTY_BODIES[name],
            {"Authorization": f"Bearer {key}"},
        )
        assert status < 500, (route, status, raw[:300])
    for route in ADMIN_ROUTES:
        status, raw = _send(
            threaded.proxy.port,
            "POST",
            route.format(sid=sid),
            NASTY_BODIES[name],
            {"Authorization": "Bearer fuzz-admin"},
        )
        assert status < 500, (route, status, raw[:300])


@pytest.mark.parametrize("api", list(MODULES))
@pytest.mark.parametrize(
    "knob,value",
    [
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("temperature", -1.0),
        ("top_p", 0.0),
        ("top_p", 1.5),
    ],
)
def test_sampling_no_backend_accepts_is_a_400(api, knob, value):
    """Forwarded, these would make the backend answer 400 and the harness see a 502."""
    body = {**SEEDS[api][0], knob: value}
    if api == "gemini":  # sampling lives in generationConfig, in camelCase
        body = {**SEEDS[api][0], "generationConfig": {{"top_p": "topP"}.get(knob, knob): value}}
    with pytest.raises(WireError) as err:
        MODULES[api].decode(body)
    assert err.value.status == 400 and knob in err.value.message
