"""Every codec the proxy routes to provides what ``proxy/codec.py``'s Codec Protocol names, with
parameters a caller of the Protocol can pass: a new API module that misses one fails here, not in
the first harness run that needs it."""

from __future__ import annotations

import inspect

import pytest

from polar_env.proxy.app import API_MODULES
from polar_env.proxy.codec import Codec

METHODS = sorted(name for name, value in vars(Codec).items()
                 if inspect.isfunction(value) and not name.startswith("__"))
ATTRIBUTES = sorted(Codec.__annotations__)


def test_the_protocol_names_what_the_front_calls():
    assert {"decode", "encode_response", "encode_stream", "encode_stream_error", "encode_error",
            "encode_overflow"} <= set(METHODS)
    assert {"API", "KEEPALIVE"} <= set(ATTRIBUTES)


@pytest.mark.parametrize("api", sorted(API_MODULES))
def test_each_codec_satisfies_the_protocol(api):
    module = API_MODULES[api]
    for name in ATTRIBUTES:
        assert isinstance(getattr(module, name), bytes if name == "KEEPALIVE" else str), (api, name)
    for name in METHODS:
        wanted = [p for p in inspect.signature(getattr(Codec, name)).parameters.values()
                  if p.name != "self" and p.kind is p.POSITIONAL_OR_KEYWORD]
        got = list(inspect.signature(getattr(module, name)).parameters.values())
        assert [p.name for p in got[:len(wanted)]] == [p.name for p in wanted], (api, name)
        assert all(p.default is not p.empty for p in got[len(wanted):]
                   if p.kind is p.POSITIONAL_OR_KEYWORD), (api, name, "extra parameters need defaults")
