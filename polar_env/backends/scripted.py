"""A backend whose answers a test script chooses, scored by the real model.

Driving a real harness through the proxy with the 135M model rarely produces useful tool calls;
a policy picks the text instead (it sees the decoded prompt, so it can read the tool names the
harness offers), and the real model scores that text by teacher forcing, so the recorded ids and
logprobs are as real as the token path needs. Scoring looks at the last ``context_window`` prompt
tokens only, which bounds the cost of a call for harness prompts longer than the model's context.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Literal

from polar_env.backends.base import BackendError, Generation, SamplingParams
from polar_env.backends.local import LocalBackend

Policy = Callable[[str | None, int, str], str]
"""``policy(session_id, call_number, prompt_text) -> assistant text``; call_number counts from 0 per
session."""


class PolicyAnswers:
    """The token ids of a policy's answer to a prompt: the policy sees the decoded prompt and its
    call number in the session; its text is encoded, ended by the end-of-turn token, cut to max_tokens."""

    def __init__(self, tokenizer: Any, policy: Policy, end_of_turn_id: int):
        self.tokenizer = tokenizer
        self.policy = policy
        self.end_of_turn_id = end_of_turn_id
        self.calls: defaultdict[str | None, int] = defaultdict(int)

    def answer(
        self, prompt_ids: list[int], sampling: SamplingParams, session_id: str | None
    ) -> tuple[list[int], Literal["stop", "length"]]:
        if not prompt_ids:
            raise BackendError("empty prompt", status=400)
        call_number = self.calls[session_id]
        self.calls[session_id] += 1
        prompt_text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        text = self.policy(session_id, call_number, prompt_text)
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.end_of_turn_id]
        if len(ids) > sampling.max_tokens:
            return ids[: sampling.max_tokens], "length"
        return ids, "stop"


class ScriptedBackend:
    def __init__(
        self, local: LocalBackend, policy: Policy, *, name: str = "scripted", context_window: int = 1024
    ):
        self.name = name
        self.model = local.model
        self.local = local
        self.answers = PolicyAnswers(local.tokenizer, policy, local.eos_token_ids[0])
        self.context_window = context_window

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Generation:
        ids, finish = self.answers.answer(prompt_ids, sampling, session_id)
        context = prompt_ids[-self.context_window :]
        logprobs = await self.local.ascore(context + ids, len(context))
        if not all(math.isfinite(lp) for lp in logprobs):
            raise BackendError("non-finite logprob while scoring a scripted answer")
        return Generation(
            prompt_ids=prompt_ids,
            token_ids=ids,
            logprobs=logprobs,
            finish_reason=finish,
            backend=self.name,
            model=self.model,
        )

    async def max_model_len(self) -> None:
        """No limit of its own: only the last ``context_window`` prompt tokens are scored."""
        return None

    async def probe_logprobs_mode(self, prompt_ids: list[int]) -> Literal["raw"]:
        """Scripted answers are scored by the model's own log-softmax (``LocalBackend.ascore``)."""
        return "raw"

    async def aclose(self) -> None:
        """The wrapped LocalBackend belongs to the caller, who closes it."""
