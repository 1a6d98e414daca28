"""The in-process backends on the real embedded SmolLM2: sampling, logprobs, scripted and instant."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from polar_env.backends.base import Backend, ContextOverflow, SamplingParams
from polar_env.backends.instant import InstantBackend
from polar_env.backends.local import LocalBackend
from polar_env.backends.scripted import ScriptedBackend
from polar_env.chat.messages import Message
from polar_env.chat.template import ChatRenderer


@pytest.fixture(scope="module")
def local(embedded_dir) -> LocalBackend:
    return LocalBackend.from_pretrained(embedded_dir)


@pytest.fixture(scope="module")
def prompt(embedded_dir) -> list[int]:
    renderer = ChatRenderer.from_pretrained(embedded_dir)
    return renderer.render_prompt([Message(role="user", content="Name three colours.")], [])


def test_backends_satisfy_the_protocol(local):
    assert isinstance(local, Backend) and local.model == "SmolLM2-135M-Instruct"
    assert isinstance(ScriptedBackend(local, lambda *a: "hi"), Backend)
    assert isinstance(InstantBackend([1, 2]), Backend)


async def test_sampled_logprobs_equal_a_fresh_scoring_pass(local, prompt):
    gen = await local.generate(prompt, SamplingParams(temperature=1.0, top_p=1.0, max_tokens=24, seed=7))
    assert len(gen.token_ids) == len(gen.logprobs) > 0 and gen.prompt_ids == prompt
    rescored = local.score(prompt + gen.token_ids, len(prompt))
    diff = max(abs(a - b) for a, b in zip(gen.logprobs, rescored, strict=True))
    print(f"max |sampled - rescored| logprob = {diff:.2e}")
    assert diff < 1e-3
    assert all(lp <= 0 and math.isfinite(lp) for lp in gen.logprobs)


async def test_seed_reproduces_and_tiny_top_p_is_greedy(local, prompt):
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8, seed=3)
    a, b = await local.generate(prompt, params), await local.generate(prompt, params)
    assert a.token_ids == b.token_ids
    greedy = await local.generate(prompt, SamplingParams(temperature=0.0, max_tokens=8))
    tiny_top_p = await local.generate(
        prompt, SamplingParams(temperature=1.5, top_p=1e-6, max_tokens=8, seed=11)
    )
    assert tiny_top_p.token_ids == greedy.token_ids
    assert greedy.logprobs == pytest.approx(tiny_top_p.logprobs, abs=1e-4)  # raw mode: same raw logprobs


async def test_max_tokens_gives_length_and_stop_ids_give_stop(local, prompt):
    gen = await local.generate(prompt, SamplingParams(temperature=0.0, max_tokens=5))
    assert gen.finish_reason == "length" and len(gen.token_ids) == 5
    first = gen.token_ids[0]
    stopped = await local.generate(
        prompt, SamplingParams(temperature=0.0, max_tokens=5, stop_token_ids=[first])
    )
    assert stopped.finish_reason == "stop" and stopped.token_ids == [first]


async def test_eos_ends_a_greedy_answer(local, embedded_dir):
    renderer = ChatRenderer.from_pretrained(embedded_dir)
    short = renderer.render_prompt(
        [Message(role="user", content="What is 2+2? Answer with a number only.")], []
    )
    gen = await local.generate(short, SamplingParams(temperature=0.0, max_tokens=30))
    assert gen.finish_reason == "stop" and gen.token_ids[-1] in local.eos_token_ids


async def test_processed_logprobs_are_those_of_the_sampling_distribution(embedded_dir, local, prompt):
    processed = LocalBackend(local.module, local.tokenizer, logprobs_mode="processed")
    plain = await processed.generate(prompt, SamplingParams(temperature=1.0, top_p=1.0, max_tokens=6, seed=5))
    raw = await local.generate(prompt, SamplingParams(temperature=1.0, top_p=1.0, max_tokens=6, seed=5))
    assert plain.token_ids == raw.token_ids
    assert plain.logprobs == pytest.approx(raw.logprobs, abs=1e-4)  # T=1, top_p=1: the same distribution
    greedy = await processed.generate(prompt, SamplingParams(temperature=0.0, max_tokens=4))
    assert greedy.logprobs == [0.0] * 4
    narrow = await processed.generate(
        prompt, SamplingParams(temperature=0.5, top_p=0.5, max_tokens=6, seed=5)
    )
    wide = local.score(prompt + narrow.token_ids, len(prompt))
    assert all(p >= r - 1e-5 for p, r in zip(narrow.logprobs, wide, strict=True))  # sharper than raw
    await processed.aclose()


async def test_prompt_longer_than_the_context_is_refused(local):
    assert await local.max_model_len() == local.max_context == 32768  # the embedded model, RoPE-scaled
    with pytest.raises(ContextOverflow) as err:
        await local.generate([1] * local.max_context, SamplingParams(max_tokens=1))
    assert (err.value.prompt_tokens, err.value.window) == (32768, 32768)


async def test_scripted_backend_scores_the_policy_text_with_the_model(local, prompt):
    seen = []

    def policy(session_id, call_number, prompt_text):
        seen.append((session_id, call_number, "Name three colours." in prompt_text))
        return '<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls"}}\n</tool_call>'

    scripted = ScriptedBackend(local, policy)
    gen = await scripted.generate(prompt, SamplingParams(max_tokens=100), session_id="s1")
    await scripted.generate(prompt, SamplingParams(max_tokens=100), session_id="s1")
    await scripted.generate(prompt, SamplingParams(max_tokens=100), session_id="s2")
    assert seen == [("s1", 0, True), ("s1", 1, True), ("s2", 0, True)]
    expected = local.tokenizer.encode(policy(None, 0, ""), add_special_tokens=False) + [
        local.eos_token_ids[0]
    ]
    assert gen.token_ids == expected and gen.finish_reason == "stop"
    assert gen.logprobs == pytest.approx(local.score(prompt + expected, len(prompt)), abs=1e-5)
    assert all(math.isfinite(lp) for lp in gen.logprobs)

    cut = await scripted.generate(prompt, SamplingParams(max_tokens=3), session_id="s3")
    assert cut.finish_reason == "length" and cut.token_ids == expected[:3] and len(cut.logprobs) == 3

    windowed = ScriptedBackend(local, policy, context_window=4)
    short = await windowed.generate(prompt, SamplingParams(max_tokens=100))
    assert short.token_ids == expected and short.prompt_ids == prompt
    assert short.logprobs == pytest.approx(local.score(prompt[-4:] + expected, 4), abs=1e-5)


async def test_instant_backend_answers_fixed_ids():
    backend = InstantBackend([5, 6, 2], logprob=-0.25)
    gen = await backend.generate([1, 2, 3], SamplingParams(max_tokens=10))
    assert (gen.token_ids, gen.logprobs, gen.finish_reason) == ([5, 6, 2], [-0.25] * 3, "stop")
    cut = await backend.generate([1], SamplingParams(max_tokens=2))
    assert (cut.token_ids, cut.finish_reason) == ([5, 6], "length")


async def test_cancelled_generation_frees_the_worker(local, prompt):
    task = asyncio.create_task(
        local.generate(prompt, SamplingParams(temperature=1.0, max_tokens=2000, seed=1))
    )
    await asyncio.sleep(0.3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    started = time.perf_counter()
    gen = await local.generate(prompt, SamplingParams(temperature=0.0, max_tokens=2))
    assert len(gen.token_ids) == 2 and time.perf_counter() - started < 10  # 2000 tokens would take ~100 s
