"""check_vllm's turn-2 glue: the template text after the closing token, sampled ids untouched."""

from __future__ import annotations

import copy

import pytest

from polar_env.backends.base import Generation
from polar_env.backends.check_vllm import SECOND, glue_ids

# Qwen3-like: the last assistant turn gets an empty think block, earlier ones lose it on re-render
QWEN3_LIKE = (
    "{% set ns = namespace(last_user=-1) %}{% for m in messages %}{% if m.role == 'user' %}"
    "{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}{% if m.role == 'assistant' and loop.index0 > ns.last_user %}"
    "{{ '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + m.content + '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}{% endif %}"
)
TURN = "\n<|im_start|>user\n" + SECOND["content"] + "<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def smol():
    from transformers import AutoTokenizer

    from polar_env.backends.embedded import embedded_model_dir

    return AutoTokenizer.from_pretrained(embedded_model_dir())


@pytest.mark.parametrize(
    ("template", "expected"), [(None, TURN), (QWEN3_LIKE, TURN + "<think>\n\n</think>\n\n")]
)
def test_glue_after_a_stop(smol, template, expected):
    tokenizer = copy.deepcopy(smol)
    if template:
        tokenizer.chat_template = template
    answer = Generation(
        prompt_ids=[1],
        token_ids=tokenizer.encode("Two, three, five.") + [2],
        logprobs=[-1.0] * 6,
        finish_reason="stop",
        backend="vllm",
    )
    assert tokenizer.decode(glue_ids(tokenizer, answer, SECOND)) == expected


def test_glue_after_a_length_cut_starts_with_the_closing_token(smol):
    answer = Generation(
        prompt_ids=[1],
        token_ids=smol.encode("Two, thr"),
        logprobs=[-1.0] * 4,
        finish_reason="length",
        backend="vllm",
    )
    assert smol.decode(glue_ids(smol, answer, SECOND)) == "<|im_end|>" + TURN
