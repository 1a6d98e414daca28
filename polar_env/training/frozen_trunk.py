"""Train only the top decoder layers of a causal LM, the trunk's output computed once per sequence.

On a shared 2-core CPU one forward + backward pass of the embedded 135M model over a 2k-token
harness chain takes minutes; a warm start needs tens of them. With the embeddings and the lower
layers frozen, their output for a given sequence never changes: it is computed once (no grad), and
each step runs only the top ``k`` layers, the final norm and the (frozen, tied) output head. The
forward pass is the model's own, exactly; the parameters that move are the top layers'.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any


@contextmanager
def _layers(model: Any, sl: slice):
    """The decoder runs only ``layers[sl]`` inside the block (the modules, hence weights, are shared)."""
    decoder = model.get_decoder()
    layers = decoder.layers
    decoder.layers = layers[sl]
    try:
        yield decoder
    finally:
        decoder.layers = layers


def freeze_all_but_top(model: Any, k: int) -> int:
    """``requires_grad`` only on the top ``k`` decoder layers; returns the first trained layer's index."""
    layers = model.get_decoder().layers
    if not 1 <= k <= len(layers):
        raise ValueError(f"top layers must be in [1, {len(layers)}], got {k}")
    model.requires_grad_(False)
    for layer in layers[len(layers) - k :]:
        layer.requires_grad_(True)
    return len(layers) - k


def trunk_hidden(model: Any, input_ids: list[int], first_trained: int) -> Any:
    """The input of layer ``first_trained`` for ``input_ids`` (batch of one), without grad."""
    import torch

    captured: list[Any] = []
    layer = model.get_decoder().layers[first_trained]
    handle = layer.register_forward_pre_hook(lambda module, args: captured.append(args[0].detach()))
    try:
        with torch.no_grad(), _layers(model, slice(0, first_trained + 1)) as decoder:
            decoder(input_ids=torch.tensor([input_ids]), use_cache=False)
    finally:
        handle.remove()
    return captured[0]


def top_logprobs(
    model: Any,
    hidden: Any,
    input_ids: list[int],
    positions: list[int],
    first_trained: int,
    *,
    temperature: float = 1.0,
) -> Any:
    """Log-probabilities of ``input_ids[p]`` for each ``p`` in ``positions`` (each > 0) at
    ``temperature``, through the top layers from ``hidden`` (``trunk_hidden``'s output), with grad
    to the trained layers."""
    import torch

    with _layers(model, slice(first_trained, None)) as decoder:
        out = decoder(inputs_embeds=hidden, use_cache=False).last_hidden_state[0]
    index = torch.tensor(positions)
    logits = model.get_output_embeddings()(out[index - 1]).float() / temperature
    target = torch.tensor([input_ids[p] for p in positions])
    return torch.log_softmax(logits, dim=-1).gather(1, target[:, None])[:, 0]
