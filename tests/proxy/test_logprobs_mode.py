"""The probe's decision rule on a real model: a token sampled at the probe temperature carries its
processed logprob (temperature applied) or its raw one, and ``classify`` tells which; a session's
enforced sampling matches raw logprobs only at temperature 1, top_p 1. The probe against a real
vLLM server is in tests/backends/test_backend_vllm.py."""

from __future__ import annotations

import pytest

from polar_env.backends.base import SamplingParams
from polar_env.backends.local import LocalBackend
from polar_env.backends.logprobs_mode import PROBE_TEMPERATURE, classify, sampling_mismatch
from polar_env.chat.messages import Message


@pytest.mark.parametrize("mode", ["raw", "processed"])
async def test_classify_tells_raw_from_processed_on_real_logprobs(mode, local_backend, renderer):
    backend = LocalBackend(local_backend.module, local_backend.tokenizer, logprobs_mode=mode)
    prompt = renderer.render_prompt([Message(role="user", content="Name a colour.")], [])
    verdicts = set()
    for seed in range(4):
        gen = await backend.generate(
            prompt, SamplingParams(temperature=PROBE_TEMPERATURE, max_tokens=1, seed=seed)
        )
        raw = local_backend.score(prompt + gen.token_ids, len(prompt))[0]
        verdicts.add(classify(gen.logprobs[0], raw))
    assert verdicts - {"unknown"} == {mode}


def test_sampling_matches_raw_logprobs_only_untempered():
    assert sampling_mismatch("raw", {"temperature": 1.0, "top_p": 1.0}) is None
    assert sampling_mismatch("raw", {}) is None
    assert "top_p 0.9" in sampling_mismatch("raw", {"temperature": 1.0, "top_p": 0.9})
    assert sampling_mismatch("processed", {"temperature": 0.7, "top_p": 0.9}) is None
    assert sampling_mismatch("unknown", {"temperature": 0.7}) is None


async def test_a_backend_that_never_answers_the_probe_does_not_hang_the_proxy_start(proxy_factory, tmp_path):
    """The probe has its own bound: a hanging server (a stand-in, since an overloaded vLLM cannot be
    provoked on demand) must not hold the proxy's start for the backend's generation timeout."""
    import asyncio
    import time

    from http_double import never_answering_completions

    from polar_env.backends.registry import make_backend

    async with never_answering_completions() as url:
        backend = make_backend("vllm", url=url, model="slow", timeout_s=3600)
        proxy = proxy_factory(
            backend, tmp_path / "data", admin_secret="s", max_context=8192, logprobs_probe_timeout_s=1.0
        )
        started = time.perf_counter()
        try:
            await asyncio.wait_for(proxy.start(), 30)
            assert proxy.logprobs_mode == "unknown" and time.perf_counter() - started < 30
        finally:
            await proxy.stop()
