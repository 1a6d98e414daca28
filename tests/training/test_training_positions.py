"""The trainer numbers positions as the sampler did: a left-padded row (TRL pads a batch's prompts to
the longest) scored through ``positions_from_mask`` gives the unpadded row's logprobs; without it the
pads shift every RoPE position (the cause of the 7.7e-4 step-0 drift, docs/training.md)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def test_left_padding_keeps_the_samplers_positions(embedded_dir):
    from transformers import AutoModelForCausalLM

    from polar_env.training.grpo import positions_from_mask

    model = AutoModelForCausalLM.from_pretrained(str(embedded_dir), dtype=torch.float32).eval()
    ids = torch.arange(100, 400)[None]
    pad = 256
    padded = torch.cat([torch.zeros(1, pad, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(1, pad, dtype=torch.long), torch.ones_like(ids)], dim=1)
    with torch.inference_mode():
        alone = torch.log_softmax(model(input_ids=ids).logits[0], -1)
        shifted = torch.log_softmax(model(input_ids=padded, attention_mask=mask).logits[0, pad:], -1)
        handle = model.register_forward_pre_hook(positions_from_mask, with_kwargs=True)
        try:
            fixed = torch.log_softmax(model(input_ids=padded, attention_mask=mask).logits[0, pad:], -1)
            again = torch.log_softmax(model(input_ids=ids).logits[0], -1)  # no mask (the sampler): untouched
        finally:
            handle.remove()
    target = ids[0, 1:, None]
    err = lambda lp: float((lp[:-1].gather(1, target) - alone[:-1].gather(1, target)).abs().max())  # noqa: E731
    assert err(fixed) < err(shifted) / 3 and err(fixed) < 5e-5, (err(fixed), err(shifted))
    assert err(again) == 0.0
