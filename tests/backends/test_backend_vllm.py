"""The ``vllm`` backend against a real vLLM server on CPU (scripts/setup_vllm_cpu.sh)."""

from __future__ import annotations

import asyncio
import math
import sys

import pytest
from vllm_server import group_rss_mb

from polar_env.backends.base import BackendError, ContextOverflow, SamplingParams
from polar_env.backends.embedded import EMBEDDED_CONTEXT
from polar_env.backends.registry import make_backend

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

EOS = 2  # <|im_end|> of SmolLM2-Instruct: its generation_config's eos_token_id


@pytest.fixture(scope="module")
def tokenizer(vllm_server):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(vllm_server.model_dir)


@pytest.fixture(scope="module")
def local(vllm_server):
    from polar_env.backends.local import LocalBackend

    return LocalBackend.from_pretrained(vllm_server.model_dir)


def chat_prompt(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(rendered, add_special_tokens=False)


@pytest.fixture
async def backend(vllm_server):
    b = make_backend("vllm", url=vllm_server.url + "/v1", model=vllm_server.model)
    yield b
    await b.aclose()


async def test_ids_and_logprobs_match_local_model(backend, tokenizer, local, vllm_server):
    prompt = chat_prompt(tokenizer, "Write a haiku about the sea.")
    gen = await backend.generate(prompt, SamplingParams(temperature=1.0, top_p=1.0, max_tokens=24, seed=3))
    assert gen.backend == "vllm" and gen.model == vllm_server.model and gen.prompt_ids == prompt
    assert len(gen.token_ids) == len(gen.logprobs) > 0
    assert all(math.isfinite(x) and x <= 0 for x in gen.logprobs)
    scored = local.score(prompt + gen.token_ids, len(prompt))
    diff = max(abs(a - b) for a, b in zip(scored, gen.logprobs, strict=True))
    print(
        f"\nvLLM fp32 vs transformers fp32 logprobs over {len(gen.token_ids)} tokens: max |diff| = "
        f"{diff:.2e}; server RSS {group_rss_mb(vllm_server.pid):.0f} MB, startup "
        f"{vllm_server.startup_s:.0f} s",
        file=sys.stderr,
    )
    assert diff < 1e-3


async def test_stop_on_eos_is_the_last_sampled_id(backend, tokenizer, local):
    prompt = chat_prompt(tokenizer, "Say hello in one word.")
    gen = await backend.generate(prompt, SamplingParams(temperature=0.0, max_tokens=96, stop_token_ids=[EOS]))
    assert gen.finish_reason == "stop"
    assert gen.token_ids[-1] == EOS and EOS not in gen.token_ids[:-1]
    # the EOS logprob is a real one: the local model agrees on it
    assert abs(local.score(prompt + gen.token_ids, len(prompt))[-1] - gen.logprobs[-1]) < 1e-3


async def test_stop_token_id_other_than_eos(backend, tokenizer):
    period = tokenizer.convert_tokens_to_ids(".")
    prompt = chat_prompt(tokenizer, "Say hello in one word.")
    gen = await backend.generate(
        prompt, SamplingParams(temperature=0.0, max_tokens=96, stop_token_ids=[period])
    )
    assert gen.finish_reason == "stop" and gen.token_ids[-1] == period
    assert len(gen.logprobs) == len(gen.token_ids)


async def test_max_tokens_gives_length(backend, tokenizer):
    gen = await backend.generate(
        chat_prompt(tokenizer, "Count from one to fifty."),
        SamplingParams(temperature=1.0, max_tokens=3, seed=1),
    )
    assert gen.finish_reason == "length" and len(gen.token_ids) == len(gen.logprobs) == 3


async def test_seeded_sampling_is_reproducible_and_concurrent(backend, tokenizer):
    prompt = chat_prompt(tokenizer, "Tell me a fact about owls.")
    sampling = SamplingParams(temperature=1.0, max_tokens=12, seed=11)
    gens = await asyncio.gather(*(backend.generate(prompt, sampling, session_id=f"s{i}") for i in range(4)))
    assert all(g.token_ids == gens[0].token_ids for g in gens)


async def test_the_window_is_the_rope_scaled_one_and_a_longer_prompt_is_an_overflow(backend):
    assert await backend.max_model_len() == EMBEDDED_CONTEXT  # vLLM read the YaRN config as transformers does
    with pytest.raises(ContextOverflow) as err:
        await backend.generate([42] * (EMBEDDED_CONTEXT + 10), SamplingParams(max_tokens=4))
    assert err.value.window == EMBEDDED_CONTEXT and "maximum context length" in str(err.value)


async def test_unknown_model_name_is_not_retryable(vllm_server):
    b = make_backend("vllm", url=vllm_server.url, model="no-such-model")
    try:
        with pytest.raises(BackendError) as err:
            await b.generate([1, 2, 3], SamplingParams(max_tokens=2))
        assert err.value.status == 404 and not err.value.retryable
    finally:
        await b.aclose()


def test_two_turn_check_script(vllm_server):
    from polar_env.backends.check_vllm import run_check

    report = asyncio.run(
        run_check(vllm_server.url, str(vllm_server.model_dir), vllm_server.model, max_tokens=48)
    )
    print(f"\ncheck_vllm: {report}", file=sys.stderr)
    assert report["ok"], report
    assert report["prompt2_tokens"] > report["prompt1_tokens"] + report["turn1_tokens"]
    assert report["rescore_max_abs_diff"] < 1e-3


async def test_logprobs_mode_is_probed_and_a_mismatched_training_session_refused(
    backend, tokenizer, tmp_path
):
    """This server runs vLLM's default --logprobs-mode raw_logprobs: the proxy finds that out at start,
    records it on every session, and refuses a training session that samples at temperature 0.7
    (its recorded logprobs would not be those of the distribution sampled from)."""
    from proxy_client import make_proxy

    from polar_env.backends.logprobs_mode import LogprobsMismatch
    from polar_env.chat.template import ChatRenderer

    assert await backend.probe_logprobs_mode(chat_prompt(tokenizer, "Say something.")) == "raw"
    proxy = make_proxy(ChatRenderer(tokenizer), backend, tmp_path, admin_secret="admin", owns_backend=False)
    await proxy.start(port=0)
    try:
        assert proxy.logprobs_mode == "raw"
        with pytest.raises(LogprobsMismatch, match="temperature 0.7.*--logprobs-mode processed_logprobs"):
            proxy.create_session("trained-hot", sampling={"temperature": 0.7, "top_p": 1.0}, training=True)
        sid, _ = proxy.create_session("trained", sampling={"temperature": 1.0, "top_p": 1.0}, training=True)
        assert proxy.registry.get(sid).info.logprobs_mode == "raw"
        proxy.create_session("eval-hot", sampling={"temperature": 0.7})  # not trained on: allowed
    finally:
        await proxy.stop()


async def test_the_weights_label_comes_from_the_server(backend, tokenizer, vllm_server):
    """vLLM labels the weights it serves (its RL API, on with VLLM_SERVER_DEV_MODE=1, which its weight
    sync needs too): ``default`` until a trainer sets one, then that label on every generation after."""
    import aiohttp

    prompt = chat_prompt(tokenizer, "Say something.")
    sampling = SamplingParams(max_tokens=2, seed=1)
    assert (await backend.generate(prompt, sampling)).weight_versions == ["default"]
    async with aiohttp.ClientSession() as http:

        async def label(version: str) -> None:
            async with http.post(
                f"{vllm_server.url}/update_weight_version", json={"new_version": version}
            ) as r:
                assert r.status == 200, await r.text()

        await label("12")
        try:
            assert (await backend.generate(prompt, sampling)).weight_versions == ["12"]
        finally:
            await label("default")  # the shared server's other tests see no version
