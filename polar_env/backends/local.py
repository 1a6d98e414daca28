"""In-process ``transformers`` backend: the embedded default and the reference for fidelity tests.

It runs its own sampling loop instead of ``model.generate`` so that the logprob recorded for each
token is exactly one of two documented quantities (``generate`` silently adds ``top_k=50`` and
hides which distribution a token came from):

- ``raw``: log-softmax of the model's logits (what vLLM's default ``raw_logprobs`` returns; the
  same at any temperature, and what ``score`` reproduces);
- ``processed``: log-probability under the distribution actually sampled from, after temperature
  and top-p; greedy decoding (temperature 0) records 0.0.

top-k is never applied. Model use is serialised: ``generate`` runs in one worker thread, and a
lock guards the model against direct ``score`` calls from other threads.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from polar_env.backends.base import BackendError, ContextOverflow, Generation, SamplingParams


class LocalBackend:
    """Sample from a causal LM held in this process; ``self.module`` is the torch model."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str = "local",
        model_name: str | None = None,
        logprobs_mode: Literal["raw", "processed"] = "raw",
        device: str = "cpu",
    ):
        import torch

        self.name = name
        self.model = model_name or Path(str(model.config.name_or_path)).name or "local"
        self.device = torch.device(device)
        self.module = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.logprobs_mode: Literal["raw", "processed"] = logprobs_mode
        self.max_context: int = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        vocab = tokenizer.get_vocab()
        eos = [vocab.get("<|im_end|>"), tokenizer.eos_token_id]
        self.eos_token_ids: list[int] = list(dict.fromkeys(i for i in eos if i is not None))
        # transformers 5.x renamed ``past_key_values`` to ``cache``
        params = inspect.signature(type(model).forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"polar-{name}")

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, **kwargs: Any) -> LocalBackend:
        """Load a float32 model and its tokenizer from ``path`` (default: the embedded model)."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if path is None:
            from polar_env.backends.embedded import embedded_model_dir

            path = embedded_model_dir()
        stamp = Path(path) / "polar_embedded.json"  # written by embedded_model_dir
        if stamp.is_file():
            kwargs.setdefault("model_name", json.loads(stamp.read_text())["model"])
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        return cls(model, AutoTokenizer.from_pretrained(str(path)), **kwargs)

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session_id: str | None = None
    ) -> Generation:
        cancel = threading.Event()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                self._executor, self._generate, list(prompt_ids), sampling, cancel
            )
        except asyncio.CancelledError:
            cancel.set()  # the worker stops at its next token
            raise

    async def max_model_len(self) -> int:
        """The model config's ``max_position_embeddings`` (the embedded model's is RoPE-scaled)."""
        return self.max_context

    def score(self, ids: list[int], start: int) -> list[float]:
        """Raw logprobs of ``ids[start:]`` given what precedes each, in one forward pass."""
        import torch

        if not 1 <= start <= len(ids):
            raise ValueError(f"start must be in [1, {len(ids)}], got {start}")
        if start == len(ids):
            return []
        with self._lock, torch.inference_mode():
            x = torch.tensor([ids], device=self.device)
            logits = self.module(input_ids=x, logits_to_keep=len(ids) - start + 1).logits[0, :-1].float()
            lp = torch.log_softmax(logits, dim=-1)
            target = torch.tensor(ids[start:], device=self.device)
            return lp.gather(1, target[:, None])[:, 0].tolist()

    async def ascore(self, ids: list[int], start: int) -> list[float]:
        """``score`` in the backend's worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.score, list(ids), start)

    async def probe_logprobs_mode(self, prompt_ids: list[int]) -> Literal["raw", "processed"]:
        """What this backend was built to record (no probe needed: it is in process)."""
        return self.logprobs_mode

    async def aclose(self) -> None:
        """Stop the model's worker thread: queued work is cancelled, a running generation finishes."""
        await asyncio.to_thread(self._executor.shutdown, wait=True, cancel_futures=True)  # the loop runs on

    # ---- the sampling loop ------------------------------------------------------------------

    def _generate(
        self, prompt_ids: list[int], sampling: SamplingParams, cancel: threading.Event
    ) -> Generation:
        import torch
        from transformers import DynamicCache

        if not prompt_ids:
            raise BackendError("empty prompt", status=400)
        if len(prompt_ids) >= self.max_context:
            raise ContextOverflow(len(prompt_ids), self.max_context)
        budget = min(sampling.max_tokens, self.max_context - len(prompt_ids))
        stops = set(sampling.stop_token_ids) | set(self.eos_token_ids)
        rng = torch.Generator(device=self.device)
        rng.manual_seed(sampling.seed if sampling.seed is not None else secrets.randbits(63))
        tokens: list[int] = []
        logprobs: list[float] = []
        finish: Literal["stop", "length"] = "length"
        with self._lock, torch.inference_mode():
            try:
                cache = DynamicCache(config=self.module.config)
            except TypeError:  # transformers < 4.56
                cache = DynamicCache()
            x = torch.tensor([prompt_ids], device=self.device)
            for _ in range(budget):
                if cancel.is_set():
                    break
                out = self.module(input_ids=x, **{self._cache_kwarg: cache}, use_cache=True, logits_to_keep=1)
                token, logprob = self._pick(out.logits[0, -1].float(), sampling, rng)
                tokens.append(token)
                logprobs.append(logprob)
                if token in stops:
                    finish = "stop"
                    break
                x = torch.tensor([[token]], device=self.device)
        return Generation(
            prompt_ids=prompt_ids,
            token_ids=tokens,
            logprobs=logprobs,
            finish_reason=finish,
            backend=self.name,
            model=self.model,
        )

    def _pick(self, logits: Any, sampling: SamplingParams, rng: Any) -> tuple[int, float]:
        import torch

        raw = torch.log_softmax(logits, dim=-1)
        if sampling.temperature <= 0:
            token = int(torch.argmax(logits))
            return token, float(raw[token]) if self.logprobs_mode == "raw" else 0.0
        dist = torch.log_softmax(logits / sampling.temperature, dim=-1)
        if sampling.top_p < 1.0:
            sorted_lp, order = torch.sort(dist, descending=True)
            probs = sorted_lp.exp()
            inside = (probs.cumsum(0) - probs) < sampling.top_p  # smallest set with mass >= top_p
            inside[0] = True
            keep = order[inside]
            kept = torch.full_like(dist, float("-inf"))
            kept[keep] = dist[keep]
            dist = torch.log_softmax(kept, dim=-1)
        token = int(torch.multinomial(dist.exp(), 1, generator=rng))
        return token, float(raw[token] if self.logprobs_mode == "raw" else dist[token])
