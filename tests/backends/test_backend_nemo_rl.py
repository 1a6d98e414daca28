"""The ``nemo-rl`` backend against a test double of NeMo-RL's vLLM HTTP server.

NeMo-RL's server runs inside its Ray GRPO job on GPUs, so it cannot run here. The double speaks
its wire shape as read from NeMo-RL's source (nemo_rl/models/generation/vllm/vllm_worker_async.py
and openai_server_utils.py): it renders ``messages`` with a real tokenizer's chat template, splices
``required_prefix_token_ids`` in by counting EOS tokens the way NeMo-RL does, refuses ``top_k`` and
off-recipe sampling, and answers with ``prompt_token_ids`` / ``generation_token_ids`` /
``generation_log_probs`` on ``choices[0].message``. Only its "engine" is scripted.
"""

from __future__ import annotations

import pytest
from aiohttp import web
from http_double import serve

from polar_env.backends.base import BackendError, SamplingParams
from polar_env.backends.nemo_rl import NemoRLBackend
from polar_env.backends.registry import make_backend

RECIPE = {"temperature": 1.0, "top_p": 1.0}
# ChatML whose turns end in <|endoftext|> (id 0): an EOS id equal to one of the tail probes' sentinels
ENDOFTEXT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|endoftext|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from polar_env.backends.embedded import embedded_model_dir

    return AutoTokenizer.from_pretrained(embedded_model_dir())


class NemoRLDouble:
    """State and handlers of one fake NeMo-RL server."""

    def __init__(
        self,
        tokenizer,
        *,
        template: str | None = None,
        eos: int = 2,
        honour_prefix: tuple[str, ...] = ("tokenize", "chat"),
    ):
        self.tokenizer, self.template, self.eos, self.honour_prefix = tokenizer, template, eos, honour_prefix
        self.tokenize_calls: list[dict] = []
        self.chat_calls: list[dict] = []
        self.engine_prompts: list[list[int]] = []

    def render(self, messages: list[dict], generation_prompt: bool, kwargs: dict | None) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=generation_prompt,
            chat_template=self.template,
            **(kwargs or {}),
        )
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt(self, body: dict, endpoint: str) -> list[int]:
        """Render, then splice the required prefix in at the N-th EOS (N = EOS count up to the last
        assistant)."""
        messages, kwargs = body["messages"], body.get("chat_template_kwargs")
        rendered = self.render(messages, body.get("add_generation_prompt", True), kwargs)
        prefix = body.get("required_prefix_token_ids")
        if not prefix or endpoint not in self.honour_prefix:
            return rendered
        assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        upto = messages[: assistants[-1] + 1] if assistants else messages
        needed = self.render(upto, False, kwargs).count(self.eos)
        positions = [i for i, t in enumerate(rendered) if t == self.eos]
        cut = positions[needed - 1]
        kept = prefix[:-1] if prefix[-1] == self.eos else prefix
        return kept + rendered[cut:]

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.tokenize_calls.append(body)
        tokens = self.prompt(body, "tokenize")
        return web.json_response(
            {"count": len(tokens), "max_model_len": 8192, "tokens": tokens, "token_strs": None}
        )

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.chat_calls.append(body)
        if (
            body.get("top_k") not in (None, -1)
            or body.get("top_p") is None
            or (body.get("temperature"), body["top_p"]) != (RECIPE["temperature"], RECIPE["top_p"])
        ):
            return web.Response(status=500, text="Internal Server Error")  # NeMo-RL's asserts fail
        if body.get("logprobs") and body.get("top_logprobs") is None:
            return web.json_response(
                {"error": {"message": "`top_logprobs` must be set", "code": 400}}, status=400
            )
        prompt = self.prompt(body, "chat")
        self.engine_prompts.append(prompt)
        script = self.tokenizer.encode(" Hi!", add_special_tokens=False) + [self.eos]
        stops = set(body.get("stop_token_ids") or []) | {self.eos}
        out: list[int] = []
        finish = "length"
        for token in script[: body["max_tokens"]]:
            out.append(token)
            if token in stops:
                finish = "stop"
                break
        message = {
            "role": "assistant",
            "content": "Hi!",
            "prompt_token_ids": prompt,
            "generation_token_ids": out,
            "generation_log_probs": [-0.5] * len(out),
        }
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": body.get("model", "policy"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            }
        )

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app


def proxy_prompt(tokenizer, template: str | None, eos: int) -> tuple[list[int], list[int]]:
    """A turn-2 prompt built the proxy's way: turn 1's prompt, its sampled ids (deliberately *not*
    the canonical tokenization of their text), then the rendered glue of a new user turn."""
    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Greet me."}]
    text = tokenizer.apply_chat_template(
        first, tokenize=False, add_generation_prompt=True, chat_template=template
    )
    prompt1 = tokenizer.encode(text, add_special_tokens=False)
    sampled = tokenizer.convert_tokens_to_ids(list("Hello")) + [eos]  # one id per letter
    glue = (
        tokenizer.encode("\n<|im_start|>user\nAgain.", add_special_tokens=False)
        + [eos]
        + tokenizer.encode("\n<|im_start|>assistant\n", add_special_tokens=False)
    )
    return prompt1, prompt1 + sampled + glue


@pytest.mark.parametrize(("template", "eos"), [(None, 2), (ENDOFTEXT_TEMPLATE, 0)])
async def test_prompt_ids_reach_the_engine_exactly(tokenizer, template, eos):
    double = NemoRLDouble(tokenizer, template=template, eos=eos)
    prompt1, prompt2 = proxy_prompt(tokenizer, template, eos)
    assert (
        tokenizer.encode(tokenizer.decode(prompt2), add_special_tokens=False) != prompt2
    )  # re-tokenizing drifts
    async with serve(double.app()) as url:
        backend = make_backend("nemo-rl", url=url + "/v1", model="policy")
        try:
            gens = [
                await backend.generate(p, SamplingParams(max_tokens=32, stop_token_ids=[eos]), session_id="s")
                for p in (prompt1, prompt2)
            ]
        finally:
            await backend.aclose()
    assert double.engine_prompts == [prompt1, prompt2]
    assert len(double.tokenize_calls) == 2  # the tail is probed once per server, then cached
    for gen, prompt in zip(gens, (prompt1, prompt2), strict=True):
        assert gen.prompt_ids == prompt and gen.finish_reason == "stop" and gen.token_ids[-1] == eos
        assert (
            gen.logprobs == [-0.5] * len(gen.token_ids) and gen.backend == "nemo-rl" and gen.model == "policy"
        )
    body = double.chat_calls[-1]
    assert (
        "top_k" not in body
        and body["top_p"] == 1.0
        and body["logprobs"] is True
        and body["top_logprobs"] == 0
    )
    assert body["required_prefix_token_ids"][-1] == eos and body["stream"] is False


async def test_length_and_template_kwargs(tokenizer):
    double = NemoRLDouble(tokenizer)
    _, prompt = proxy_prompt(tokenizer, None, 2)
    async with serve(double.app()) as url:
        backend = NemoRLBackend(url, chat_template_kwargs={"enable_thinking": False})
        try:
            gen = await backend.generate(prompt, SamplingParams(max_tokens=1))
        finally:
            await backend.aclose()
    assert gen.finish_reason == "length" and len(gen.token_ids) == 1
    assert all(
        c["chat_template_kwargs"] == {"enable_thinking": False}
        for c in double.tokenize_calls + double.chat_calls
    )
    assert "model" not in double.chat_calls[0]


async def test_prompt_without_generation_prompt_is_refused_before_sending(tokenizer):
    double = NemoRLDouble(tokenizer)
    _, prompt = proxy_prompt(tokenizer, None, 2)
    async with serve(double.app()) as url:
        backend = NemoRLBackend(url)
        try:
            with pytest.raises(BackendError, match="generation prompt") as err:
                await backend.generate(prompt[:-1], SamplingParams(max_tokens=4))
        finally:
            await backend.aclose()
    assert not err.value.retryable and double.chat_calls == []


@pytest.mark.parametrize(
    ("honour", "error"), [((), "ignores required_prefix_token_ids"), (("tokenize",), "different prompt")]
)
async def test_server_ignoring_the_prefix_is_detected(tokenizer, honour, error):
    """A server that renders the messages itself (stock vLLM chat) would sample after another prompt."""
    double = NemoRLDouble(tokenizer, honour_prefix=honour)
    _, prompt = proxy_prompt(tokenizer, None, 2)
    async with serve(double.app()) as url:
        backend = NemoRLBackend(url)
        try:
            with pytest.raises(BackendError, match=error) as err:
                await backend.generate(prompt, SamplingParams(max_tokens=4))
        finally:
            await backend.aclose()
    assert not err.value.retryable


async def test_off_recipe_sampling_is_rejected_by_the_server(tokenizer):
    double = NemoRLDouble(tokenizer)
    _, prompt = proxy_prompt(tokenizer, None, 2)
    async with serve(double.app()) as url:
        backend = NemoRLBackend(url)
        try:
            with pytest.raises(BackendError) as err:
                await backend.generate(prompt, SamplingParams(temperature=0.6, max_tokens=4))
        finally:
            await backend.aclose()
    assert err.value.status == 500
