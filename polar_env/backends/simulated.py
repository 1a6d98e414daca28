"""A backend that takes a model's generation time without a model, for measuring rollout pipelines.

How busy a driver keeps an inference server depends on how long answers take, which the instant
and scripted backends do not model (one answers at once, the other costs CPU to score). Here a
scripted policy picks the text (``PolicyAnswers``, as for ``ScriptedBackend``) and the call then
sleeps ``per_token_s`` per answer token: ``asyncio.sleep``, so a hundred concurrent calls cost no
CPU, as calls to a GPU server cost the rollout machine none. Each call's start and end are kept
(``trace``), so a benchmark can say how many calls the server had at every moment. Logprobs are a
constant: nothing trains on these episodes.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from polar_env.backends.base import Generation, SamplingParams
from polar_env.backends.scripted import PolicyAnswers


@dataclass(frozen=True)
class CallSpan:
    """One backend call: when it started and ended (``time.monotonic``), for which session."""

    session_id: str | None
    start: float
    end: float
    tokens: int


class SimulatedBackend:
    """Answers ``answers``' ids after ``per_token_s`` per id; ``trace`` holds every call's span,
    a call cancelled mid-generation included (ended where it was cancelled)."""

    def __init__(
        self,
        answers: PolicyAnswers,
        *,
        per_token_s: float = 0.02,
        name: str = "simulated",
        model: str = "simulated",
        logprob: float = -0.5,
    ):
        self.name = name
        self.model = model
        self.answers = answers
        self.per_token_s = per_token_s
        self.logprob = logprob
        self.trace: list[CallSpan] = []

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Generation:
        start = time.monotonic()
        ids, finish = self.answers.answer(prompt_ids, sampling, session_id)
        try:
            await asyncio.sleep(len(ids) * self.per_token_s)
        finally:
            self.trace.append(CallSpan(session_id, start, time.monotonic(), len(ids)))
        return Generation(
            prompt_ids=prompt_ids,
            token_ids=ids,
            logprobs=[self.logprob] * len(ids),
            finish_reason=finish,
            backend=self.name,
            model=self.model,
        )

    async def aclose(self) -> None:
        """Nothing to release."""
