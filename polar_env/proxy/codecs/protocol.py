"""What a wire-API codec provides: the proxy's HTTP front (``proxy/app.py``) calls only these, so a
new API is one module that satisfies :class:`Codec` and one line in ``app.API_MODULES``
(``tests/wire/test_wire_codec_protocol.py`` checks every registered module against it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from polar_env.chat.messages import AssistantTurn
from polar_env.proxy.codecs.common import DecodedRequest
from polar_env.wire.shape import Shape

ErrorT = TypeVar("ErrorT", bound=Shape)  # each API's own error body


class Codec(Protocol[ErrorT]):
    """Met by a module: its constants are read-only properties here, and it is generic in its error
    body so that :meth:`encode_stream_error` takes what :meth:`encode_error` gave."""

    @property
    def API(self) -> str:  # a module constant: read only
        """The API's name in 400 messages."""
        ...

    @property
    def KEEPALIVE(self) -> bytes:  # a module constant: read only
        """Sent while a streamed answer is generating; the API's own heartbeat where it has one."""
        ...

    def decode(self, body: Any, *args: Any, **kwargs: Any) -> DecodedRequest:
        """A parsed request body as the canonical request; a :class:`WireError` (4xx) names its defect."""
        ...

    def encode_response(self, turn: AssistantTurn, req: DecodedRequest) -> Shape | Sequence[Shape]:
        """The non-streamed answer body."""
        ...

    def encode_stream(self, turn: AssistantTurn, req: DecodedRequest) -> list[bytes]:
        """The streamed answer: its frames, in order, ending as the API ends a stream."""
        ...

    def encode_stream_head(self, req: DecodedRequest, call_id: str, model: str, created: int) -> list[bytes]:
        """The frames a slow answer's stream opens with before the answer exists: exactly the
        first frames :meth:`encode_stream` gives for the call (``[]`` where the API has none)."""
        ...

    def encode_error(self, status: int, message: str) -> ErrorT:
        """The API's error body for an HTTP status."""
        ...

    def encode_stream_error(self, body: ErrorT) -> bytes:
        """An error body (from :meth:`encode_error`) told after the stream's status line was sent."""
        ...

    def encode_overflow(self, prompt_tokens: int, window: int | None) -> ErrorT:
        """The API's own context-length error, worded so the harness compacts or stops."""
        ...


class CountingCodec(Codec[ErrorT], Protocol):
    """A codec whose API also has a token-count route (Anthropic's ``count_tokens``, Gemini's
    ``:countTokens``): the front answers it with :meth:`encode_count`."""

    def encode_count(self, tokens: int) -> Shape:
        """The count route's answer: the prompt's length in the served model's tokens."""
        ...
