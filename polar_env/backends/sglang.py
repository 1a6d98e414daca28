"""SGLang's native ``/generate``: token ids in (``input_ids``), ids and logprobs out.

With ``return_logprob: true`` the reply's ``meta_info.output_token_logprobs`` holds one
``[logprob, token_id, text-or-null]`` entry per sampled token, the stop token included (SGLang
appends a token before checking whether it finishes the request), and ``meta_info.finish_reason``
is ``{"type": "stop", "matched": id}``, ``{"type": "length", "length": n}`` or
``{"type": "abort", "message": ...}``. Knobs left unset may take the model's generation-config
defaults (``--sampling-defaults model``), so top_k, min_p and the repetition penalty are sent.
Which logprobs SGLang reports (temperature-scaled or raw) is its server's choice; at temperature 1
they agree. ``meta_info.weight_version`` labels the weights that served the request (``--weight-version``,
``/update_weight_version``, ``update_weights_*(weight_version=...)``): ``Generation.weight_versions``.
"""

from __future__ import annotations

from typing import Any

from polar_env.backends.base import BackendError, Generation, SamplingParams
from polar_env.backends.remote import RemoteBackend, aligned_logprobs, as_logprobs, as_token_ids, malformed


class SGLangBackend(RemoteBackend):
    name = "sglang"
    prompt_key = "input_ids"

    def request_body(self, prompt_ids: list[int], sampling: SamplingParams) -> dict[str, Any]:
        params: dict[str, Any] = {
            "max_new_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": -1,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if sampling.stop_token_ids:
            params["stop_token_ids"] = list(sampling.stop_token_ids)
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed
        return {"input_ids": prompt_ids, "sampling_params": params, "return_logprob": True, "stream": False}

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Generation:
        payload = await self.post_json(
            self.pick_url(session_id), "/generate", self.request_body(prompt_ids, sampling)
        )
        meta = payload.get("meta_info")
        if not isinstance(meta, dict):
            raise malformed(self.name, "no meta_info", payload)
        finish = meta.get("finish_reason") or {}
        kind = finish.get("type") if isinstance(finish, dict) else None
        if kind == "abort":
            raise BackendError(
                f"{self.name}: generation aborted: {finish.get('message', '')}", retryable=True
            )
        if kind not in ("stop", "length"):
            raise malformed(self.name, f"finish_reason {finish!r}", payload)
        entries = meta.get("output_token_logprobs")
        if not isinstance(entries, list) or not all(isinstance(e, list) and len(e) >= 2 for e in entries):
            raise malformed(
                self.name, "meta_info.output_token_logprobs (was return_logprob honoured?)", payload
            )
        token_ids = as_token_ids([e[1] for e in entries])
        if token_ids is None:
            raise malformed(self.name, "output_token_logprobs entries", payload)
        logprobs = aligned_logprobs(as_logprobs([e[0] for e in entries]), token_ids)
        matched = finish.get("matched")
        if kind == "stop" and isinstance(matched, int) and token_ids[-1:] != [matched]:
            raise malformed(
                self.name, f"stopped on token {matched} but it is not the last sampled id", payload
            )
        label = meta.get("weight_version")
        return Generation(
            prompt_ids=prompt_ids,
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=kind,
            backend=self.name,
            model=self.model,
            weight_versions=[str(label)] if isinstance(label, str | int) else [],
        )
