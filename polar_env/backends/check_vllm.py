"""Check a running vLLM server end to end through the ``vllm`` backend: two contiguous turns.

Run on the machine that serves the model (scripts/check_vllm_gpu.sh does it all):

    python -m polar_env.backends.check_vllm --url http://127.0.0.1:8011 --model-dir Qwen/Qwen3-0.6B

Turn 2's prompt is turn 1's prompt + turn 1's sampled ids + the template glue of one new user
message, as the proxy builds it; the check asserts the server used both prompts unchanged, that
the turns stopped on a stop token, and that every logprob is finite. It also re-scores turn 1's
sampled tokens inside turn 2's prefill (``prompt_logprobs``) and reports how far that lands from
what sampling recorded: the inference/training mismatch a trainer would see.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from typing import Any

import aiohttp

from polar_env.backends.base import Generation, SamplingParams
from polar_env.backends.vllm import VllmBackend

FIRST = [
    {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
    {"role": "user", "content": "Name three prime numbers."},
]
SECOND = {"role": "user", "content": "Now name one even number."}
GROSS_MISMATCH = 0.5  # nats; bf16 kernels drift a few 1e-2, a wrong prompt or model drifts by far more


def _render(tokenizer: Any, messages: list[dict[str, str]], *, generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt, enable_thinking=False
    )


def glue_ids(tokenizer: Any, answer: Generation, next_user: dict[str, str]) -> list[int]:
    """Template tokens between turn 1's last sampled id and turn 2's generation: the new user turn.

    Only the text the template puts after the token that closes the assistant turn is tokenized;
    the sampled ids are never re-encoded. Templates that re-render earlier turns differently once a
    user message follows (Qwen3 drops the empty think block) do not matter: the cut is made at the
    last closing token before the new user message.
    """
    text = tokenizer.decode(answer.token_ids, skip_special_tokens=True)
    rendered = _render(
        tokenizer, [*FIRST, {"role": "assistant", "content": text}, next_user], generation_prompt=True
    )
    stopped = answer.finish_reason == "stop"
    closing = tokenizer.decode(answer.token_ids[-1:]) if stopped else tokenizer.eos_token
    at = rendered.rfind(closing, 0, rendered.rfind(next_user["content"]))
    if at < 0:
        raise AssertionError(f"the template does not close the assistant turn with {closing!r}")
    cut = at + len(closing) if stopped else at  # after a length cut the template's own stop token follows
    return tokenizer.encode(rendered[cut:], add_special_tokens=False)


async def _prefill_logprobs(url: str, model: str, prompt: list[int], start: int, count: int) -> list[float]:
    """vLLM's prompt logprobs of ``prompt[start:start+count]`` (one forward pass, no sampling)."""
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 0}
    if model:
        body["model"] = model
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{url.rstrip('/')}/v1/completions", json=body) as r,
    ):
        r.raise_for_status()
        rows = (await r.json())["choices"][0]["prompt_logprobs"]
    return [row[str(prompt[i])]["logprob"] for i, row in enumerate(rows) if start <= i < start + count]


async def run_check(url: str, model_dir: str, model: str = "", max_tokens: int = 128) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    stops = sorted(
        {
            i
            for i in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>"))
            if isinstance(i, int) and i != tokenizer.unk_token_id
        }
    )
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=max_tokens, stop_token_ids=stops, seed=7)
    backend = VllmBackend(url, model=model)
    try:
        prompt1 = tokenizer.encode(
            _render(tokenizer, FIRST, generation_prompt=True), add_special_tokens=False
        )
        turn1 = await backend.generate(prompt1, sampling, session_id="check")
        prompt2 = prompt1 + turn1.token_ids + glue_ids(tokenizer, turn1, SECOND)
        turn2 = await backend.generate(prompt2, sampling, session_id="check")
    finally:
        await backend.aclose()
    rescored = await _prefill_logprobs(url, model, prompt2, len(prompt1), len(turn1.token_ids))
    diffs = [abs(a - b) for a, b in zip(rescored, turn1.logprobs, strict=True)]
    report = {
        "prompt1_tokens": len(prompt1),
        "turn1_tokens": len(turn1.token_ids),
        "turn1_finish": turn1.finish_reason,
        "prompt2_tokens": len(prompt2),
        "turn2_tokens": len(turn2.token_ids),
        "turn2_finish": turn2.finish_reason,
        "turn1_ends_with_stop_token": bool(turn1.token_ids) and turn1.token_ids[-1] in stops,
        "logprobs_finite": all(math.isfinite(x) for g in (turn1, turn2) for x in g.logprobs),
        "rescore_max_abs_diff": max(diffs, default=0.0),
        "rescore_mean_abs_diff": sum(diffs) / len(diffs) if diffs else 0.0,
        "turn1_text": tokenizer.decode(turn1.token_ids),
        "turn2_text": tokenizer.decode(turn2.token_ids),
    }
    report["ok"] = (
        report["logprobs_finite"]
        and report["rescore_max_abs_diff"] < GROSS_MISMATCH
        and (turn1.finish_reason == "length" or report["turn1_ends_with_stop_token"])
    )
    return report


def main(url: str, model_dir: str, model: str = "") -> int:
    """Run the check, print a JSON report, return 0 when it passed (the server echoes prompts, so
    a prompt it changed already failed inside the backend)."""
    report = asyncio.run(run_check(url, model_dir, model))
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--url", required=True, help="base URL of the vLLM server")
    parser.add_argument("--model-dir", required=True, help="tokenizer/model directory or hub name")
    parser.add_argument("--model", default="", help="served model name, if the server wants one")
    args = parser.parse_args()
    sys.exit(main(args.url, args.model_dir, args.model))
