"""A backend without a model that answers at once, for measuring the proxy's own overhead."""

from __future__ import annotations

from polar_env.backends.base import Generation, SamplingParams


class InstantBackend:
    """Always returns ``token_ids`` (cut to ``max_tokens``) with a constant logprob per token."""

    def __init__(
        self, token_ids: list[int], *, name: str = "instant", model: str = "instant", logprob: float = -0.5
    ):
        if not token_ids:
            raise ValueError("InstantBackend needs at least one token id")
        self.name = name
        self.model = model
        self.token_ids = list(token_ids)
        self.logprob = logprob

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Generation:
        ids = self.token_ids[: sampling.max_tokens]
        return Generation(
            prompt_ids=prompt_ids,
            token_ids=ids,
            logprobs=[self.logprob] * len(ids),
            finish_reason="stop" if len(ids) == len(self.token_ids) else "length",
            backend=self.name,
            model=self.model,
        )

    async def aclose(self) -> None:
        """Nothing to release."""
