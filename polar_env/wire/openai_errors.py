"""OpenAI's error body, which Chat Completions and Responses share; the SDKs' retry logic reads the
HTTP status and Codex and the SDKs key on ``code`` (``context_length_exceeded``)."""

from __future__ import annotations

from polar_env.wire.shape import Shape

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


class ErrorDetail(Shape):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(Shape):
    error: ErrorDetail


def openai_error(status: int, message: str) -> ErrorBody:
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return ErrorBody(error=ErrorDetail(message=message, type=kind))


def openai_overflow(message: str, param: str) -> ErrorBody:
    """The context-length error; Pi reads the message, Codex and the SDKs the code."""
    return ErrorBody(
        error=ErrorDetail(
            message=message, type="invalid_request_error", param=param, code="context_length_exceeded"
        )
    )
