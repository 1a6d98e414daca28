"""One interface for every inference backend: token ids in, token ids + logprobs out.

The proxy never sends text to a backend and never re-tokenizes what a backend sampled; this is
the whole defence against retokenization drift (docs/architecture.md, "The token path").
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field, SkipValidation


class SamplingParams(BaseModel):
    """Sampling actually used for a call (after the session's forced sampling overrode the harness)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 1024
    stop_token_ids: list[int] = Field(default_factory=list)
    seed: int | None = None


class Generation(BaseModel):
    # the prompt the backend ran: the caller's own list, not validated or copied (tens of thousands
    # of ids per call, already checked by whoever built them)
    prompt_ids: SkipValidation[list[int]]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    backend: str
    model: str = ""
    # the labels the server gave the weights that sampled it (vLLM's /weight_info, SGLang's
    # meta_info.weight_version): one, or two when they changed during the call; [] where it reports none
    weight_versions: list[str] = Field(default_factory=list)


class BackendError(RuntimeError):
    """A backend failed (HTTP error, bad payload, timeout); ``retryable`` says whether a retry is safe."""

    def __init__(self, message: str, *, retryable: bool = False, status: int | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.status = status


class ContextOverflow(Exception):
    """The prompt leaves no room to generate within the model's context window.

    Raised by the proxy's own check and by a backend whose server refused the prompt as too long;
    either way the harness gets its API's own context-length error, never a backend failure.
    """

    def __init__(self, prompt_tokens: int, window: int | None, detail: str = ""):
        self.prompt_tokens = prompt_tokens
        self.window = window
        super().__init__(
            detail
            or f"prompt is {prompt_tokens} tokens; the model's context window is "
            f"{window if window is not None else 'smaller'} tokens"
        )


@runtime_checkable
class Backend(Protocol):
    name: str
    model: str

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Generation:
        """Sample a continuation of ``prompt_ids``; logprobs are one per sampled token."""
        ...

    async def aclose(self) -> None: ...
