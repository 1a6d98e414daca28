"""make_backend: kind names to ready backends."""

from __future__ import annotations

import subprocess
import sys

import pytest

from polar_env.backends.base import Backend, SamplingParams
from polar_env.backends.nemo_rl import NemoRLBackend
from polar_env.backends.registry import BACKEND_KINDS, make_backend
from polar_env.backends.sglang import SGLangBackend
from polar_env.backends.vllm import VllmBackend


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        ("vllm", VllmBackend),
        ("nemo-rl", NemoRLBackend),
        ("nemo_rl", NemoRLBackend),
        ("SGLang", SGLangBackend),
    ],
)
async def test_http_kinds(kind, cls):
    b = make_backend(kind, url="http://a:1/v1, http://b:2", model="m", timeout_s=5)
    assert isinstance(b, cls) and isinstance(b, Backend)
    assert b.urls == ["http://a:1", "http://b:2"] and b.model == "m" and b.name in BACKEND_KINDS
    await b.aclose()


def test_errors():
    with pytest.raises(ValueError, match="needs url"):
        make_backend("vllm", url=None)
    with pytest.raises(ValueError, match="unknown backend kind 'tgi'"):
        make_backend("tgi", url="http://a")
    with pytest.raises(ValueError, match="policy"):
        make_backend("scripted")
    with pytest.raises(ValueError, match="token_ids"):
        make_backend("instant")
    with pytest.raises(TypeError):
        make_backend("vllm", url="http://a", no_such_option=1)


async def test_instant():
    b = make_backend("instant", token_ids=[5, 6, 2], model="fixed")
    gen = await b.generate([1], SamplingParams(max_tokens=2))
    assert gen.token_ids == [5, 6] and gen.finish_reason == "length" and gen.model == "fixed"


async def test_local_and_scripted_share_the_embedded_model():
    local = make_backend("local", model="smol")
    try:
        assert local.name == "local" and local.model == "smol"
        prompt = local.tokenizer.encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
        gen = await local.generate(prompt, SamplingParams(max_tokens=2, seed=0))
        assert len(gen.token_ids) == len(gen.logprobs) == 2
        scripted = make_backend("scripted", local=local, policy=lambda session, n, text: "Hello")
        answer = await scripted.generate(prompt, SamplingParams(max_tokens=16))
        assert answer.finish_reason == "stop" and local.tokenizer.decode(answer.token_ids[:-1]) == "Hello"
    finally:
        await local.aclose()


def test_http_kinds_do_not_import_torch():
    code = (
        "import sys; from polar_env.backends.registry import make_backend; "
        "make_backend('vllm', url='http://a'); make_backend('sglang', url='http://a'); "
        "make_backend('nemo-rl', url='http://a'); "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
