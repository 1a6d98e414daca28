"""NeMo-RL's vLLM HTTP server (the one its GRPO loop starts for NeMo Gym environments).

That server only offers non-streaming ``/v1/chat/completions`` and ``/tokenize``: it renders
``messages`` with the chat template itself. To keep earlier turns exact it accepts
``required_prefix_token_ids`` and splices them in (nemo_rl/models/generation/openai_server_utils.py,
``replace_prefix_tokens``): it renders the messages, counts the EOS tokens in the messages up to the
last assistant one rendered without a generation prompt (N), and sends
``required_prefix[:-1 if it ends in EOS] + rendered[position of the N-th EOS:]`` to the engine.

We already hold the exact prompt ids, so we make that splice reproduce them:

* a probe learns the server's *tail*: what the template puts from the EOS closing the last message
  to the end of the generation prompt (``<|im_end|>\\n<|im_start|>assistant\\n`` for ChatML). It is
  rendering ``PROBE_MESSAGES`` through ``/tokenize`` with ``required_prefix_token_ids=[s]``, which
  yields ``[s] + tail`` (or just ``tail`` when ``s`` happens to be the EOS id, hence two probes);
* every call sends the same one-message conversation with
  ``required_prefix_token_ids = prompt[:-len(tail)] + [EOS]`` (``EOS == tail[0]``); the server drops
  that final EOS and appends the tail, giving back ``prompt`` exactly.

So a prompt must end with the server's tail (it does whenever it ends in a generation prompt
rendered by the same template), and the prompt the server reports back must equal ours: both are
checked, and a mismatch is a non-retryable ``BackendError``, never a silently different prompt.

Sampling: the server asserts that ``temperature``/``top_p`` equal the recipe's and that ``top_k``
is unset, so ``top_p`` is always sent and ``top_k`` never. Token ids and logprobs come back on
``choices[0].message`` (``prompt_token_ids``, ``generation_token_ids``, ``generation_log_probs``)
when asked with ``logprobs: true, top_logprobs: 0``; the generated ids end with the stop token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from polar_env.backends.base import BackendError, Generation, SamplingParams
from polar_env.backends.remote import RemoteBackend, aligned_logprobs, as_logprobs, as_token_ids, malformed

PROBE_MESSAGES: list[dict[str, str]] = [{"role": "user", "content": "."}]


class NemoRLBackend(RemoteBackend):
    name = "nemo-rl"

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        model: str = "",
        timeout_s: float = 600.0,
        api_key: str | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ):
        super().__init__(url, model=model, timeout_s=timeout_s, api_key=api_key)
        self.chat_template_kwargs = chat_template_kwargs
        self._tails: dict[str, list[int]] = {}
        self._tail_locks: dict[str, asyncio.Lock] = {}

    def _common(self) -> dict[str, Any]:
        body: dict[str, Any] = {"messages": PROBE_MESSAGES}
        if self.model:
            body["model"] = self.model
        if self.chat_template_kwargs:
            body["chat_template_kwargs"] = self.chat_template_kwargs
        return body

    async def tail(self, base_url: str) -> list[int]:
        """The server's template tail (EOS of the last message through the generation prompt)."""
        if base_url in self._tails:
            return self._tails[base_url]
        async with self._tail_locks.setdefault(base_url, asyncio.Lock()):
            if base_url not in self._tails:
                probes = []
                for sentinel in (0, 1):
                    body = {
                        **self._common(),
                        "add_generation_prompt": True,
                        "required_prefix_token_ids": [sentinel],
                    }
                    payload = await self.post_json(base_url, "/tokenize", body)
                    tokens = as_token_ids(payload.get("tokens"))
                    if not tokens or len(tokens) < 2:
                        raise malformed(self.name, "/tokenize gave no tokens", payload)
                    probes.append(tokens)
                if probes[0] == probes[1]:
                    raise BackendError(
                        f"{self.name}: {base_url}/tokenize ignores required_prefix_token_ids; "
                        "is this NeMo-RL's vLLM server?"
                    )
                longer = max(probes, key=len)  # the probe whose sentinel was not the EOS id
                self._tails[base_url] = longer[1:]
        return self._tails[base_url]

    def request_body(
        self, prompt_ids: list[int], tail: list[int], sampling: SamplingParams
    ) -> dict[str, Any]:
        if len(prompt_ids) <= len(tail) or prompt_ids[-len(tail) :] != tail:
            raise BackendError(
                f"{self.name}: the prompt does not end with the server's generation prompt {tail}; "
                "NeMo-RL's server always appends it, so this prompt cannot be sent exactly"
            )
        body: dict[str, Any] = {
            **self._common(),
            "required_prefix_token_ids": list(prompt_ids[: -len(tail)]) + [tail[0]],
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "logprobs": True,
            "top_logprobs": 0,
            "stop_token_ids": list(sampling.stop_token_ids),
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
            "n": 1,
            "stream": False,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        return body

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Generation:
        base_url = self.pick_url(session_id)
        body = self.request_body(prompt_ids, await self.tail(base_url), sampling)
        payload = await self.post_json(base_url, "/v1/chat/completions", body)
        choices = payload.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise malformed(self.name, "no choices", payload)
        choice = choices[0]
        message = choice.get("message") or {}
        token_ids = as_token_ids(message.get("generation_token_ids"))
        if token_ids is None:
            raise malformed(self.name, "message.generation_token_ids", payload)
        logprobs = aligned_logprobs(as_logprobs(message.get("generation_log_probs")), token_ids)
        if message.get("prompt_token_ids") != list(prompt_ids):
            raise BackendError(
                f"{self.name}: the server built a different prompt than the one sent "
                f"({len(prompt_ids)} ids sent, {len(message.get('prompt_token_ids') or [])} used); "
                "its chat template or chat_template_kwargs differ from the proxy's"
            )
        finish = choice.get("finish_reason")
        if finish == "abort":
            raise BackendError(f"{self.name}: generation aborted by the server", retryable=True)
        if finish not in ("stop", "length"):
            raise malformed(self.name, f"finish_reason {finish!r}", payload)
        return Generation(
            prompt_ids=prompt_ids,
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish,
            backend=self.name,
            model=self.model or str(payload.get("model") or ""),
        )
