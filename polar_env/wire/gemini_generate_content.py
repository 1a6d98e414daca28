"""The Gemini API's outgoing shapes: the ``GenerateContentResponse`` (one body, or one stream chunk),
Google's error body and countTokens' answer (``proxy/codecs/gemini_generate_content.py`` fills them).

Wire names are camelCase, as the API's JSON is (``rename="camel"`` on the base, which msgspec
passes on to every subclass).
"""

from __future__ import annotations

from typing import Any, Literal

from polar_env.wire.shape import UNSET, Shape, UnsetType

# the genai SDKs raise these as ApiError; Gemini CLI retries 429 and 5xx
_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "INVALID_ARGUMENT",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


class GeminiShape(Shape, rename="camel"):
    """A Gemini body: fields are declared snake_case and sent camelCase."""


class FunctionCallOut(GeminiShape):
    id: str  # issued by the proxy; Gemini CLI sends it back on the functionResponse
    name: str
    args: dict[str, Any]


class PartOut(GeminiShape):
    """One part, as the API's ``Part`` is: text (``thought`` for reasoning) or a function call."""

    text: str | UnsetType = UNSET
    thought: bool | UnsetType = UNSET
    function_call: FunctionCallOut | UnsetType = UNSET
    thought_signature: str | UnsetType = UNSET  # the turn's ref, on its first answer part


class ContentOut(GeminiShape):
    role: Literal["model"] = "model"
    parts: list[PartOut]


class LogprobCandidate(GeminiShape):
    token: str
    log_probability: float


class LogprobsResult(GeminiShape):
    chosen_candidates: list[LogprobCandidate]
    top_candidates: list[Any] = []  # always empty: no alternatives are reported


class Candidate(GeminiShape):
    content: ContentOut
    index: int = 0
    finish_reason: str | UnsetType = UNSET  # on the last chunk only
    avg_logprobs: float | UnsetType = UNSET
    logprobs_result: LogprobsResult | UnsetType = UNSET


class UsageMetadata(GeminiShape):
    prompt_token_count: int
    candidates_token_count: int
    total_token_count: int


class GenerateContentResponse(GeminiShape):
    candidates: list[Candidate]
    usage_metadata: UsageMetadata | UnsetType = UNSET  # on the last chunk only
    model_version: str
    response_id: str


class CountTokensResponse(GeminiShape):
    total_tokens: int


class ErrorDetail(GeminiShape):
    code: int
    message: str
    status: str


class ErrorBody(GeminiShape):
    error: ErrorDetail


def google_error(status: int, message: str) -> ErrorBody:
    """Google's error body for an HTTP status, with the canonical status name the SDKs key on."""
    kind = _STATUSES.get(status, "FAILED_PRECONDITION" if status < 500 else "INTERNAL")
    return ErrorBody(error=ErrorDetail(code=status, message=message, status=kind))
