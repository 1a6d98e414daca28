"""SFT datasets from trajectories (rejection-sampling fine-tuning: keep what resolved, train on it).

One row per chain with a trainable token, the chains ``--train-paths`` selects (all by default,
trajectory/paths.py) of every kept episode, in the shape each trainer reads without tokenising
anything again:

- ``trl-sft``: TRL's pre-tokenised rows, ``input_ids`` + ``assistant_masks`` (SFTTrainer builds
  its labels from that mask: -100 wherever it is 0).
- ``nemo-rl-sft``: an OpenAI-format ``messages`` list (what NeMo-RL's ``openai_format`` dataset
  loads) whose messages are the chain's spans, each carrying its ``token_ids``; the model's sampled
  spans are the ``assistant`` messages, the only role NeMo-RL's SFT trains on. NeMo-RL's own
  ``sft_processor`` would re-render the text with a chat template, so ``nemo_rl_sft_processor``
  (registered under a name in the NeMo-RL launch script) hands the recorded ids through instead.

The loss mask of both is the chain's own ``loss_mask``: 1 exactly on the tokens the policy sampled
with real logprobs; prompts, tool results, template glue and unscored tokens get no loss.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from polar_env.trajectory.models import Chain, Trajectory
from polar_env.trajectory.paths import Selector, policy_versions, train_chains

SFT_FORMATS = ("trl-sft", "nemo-rl-sft")
NEMO_RL_PROCESSOR_NAME = "polar_token_sft"
_ROLE = {"sampled": "assistant", "prompt": "user"}  # interstitial and unscored spans: "environment"


def is_resolved(trajectory: Trajectory) -> bool:
    """The grader said the task is resolved (not just a positive reward from a shaped reward)."""
    return bool(trajectory.grading and trajectory.grading.resolved)


def sft_chains(
    trajectories: Iterable[Trajectory], *, only_resolved: bool, train_paths: str | Selector = "all"
) -> Iterator[tuple[Trajectory, Chain]]:
    """The chains ``train_paths`` selects with a trainable token; a masked episode (a failure
    outside the policy) gives none."""
    for traj in trajectories:
        if only_resolved and not is_resolved(traj):
            continue
        for chain in train_chains(traj, train_paths):
            yield traj, chain


def _meta(traj: Trajectory, chain: Chain) -> dict[str, Any]:
    return {
        "session_id": traj.session_id,
        "task_id": traj.task_id,
        "chain": chain.index,
        "main": chain.index == traj.main_chain,
        "reward": traj.reward,
        "policy_versions": policy_versions(traj, chain),
    }


def trl_sft_row(traj: Trajectory, chain: Chain) -> dict[str, Any]:
    return {
        "input_ids": list(chain.input_ids),
        "assistant_masks": list(chain.loss_mask),
        **_meta(traj, chain),
    }


def nemo_rl_sft_row(traj: Trajectory, chain: Chain) -> dict[str, Any]:
    """Consecutive spans of one kind become one message. A chain always ends with a sampled span,
    so the last message is the assistant's, as NeMo-RL's ``openai_format`` loader asserts."""
    messages: list[dict[str, Any]] = []
    for span in chain.spans:
        role = _ROLE.get(span.kind, "environment")
        ids = chain.input_ids[span.start : span.end]
        if messages and messages[-1]["polar_span"] == span.kind:
            messages[-1]["token_ids"].extend(ids)
        else:
            messages.append({"role": role, "content": "", "token_ids": list(ids), "polar_span": span.kind})
    return {"messages": messages, **_meta(traj, chain)}


def sft_rows(
    trajectories: Iterable[Trajectory],
    fmt: str,
    *,
    only_resolved: bool = True,
    train_paths: str | Selector = "all",
) -> list[dict[str, Any]]:
    """The rows of ``fmt`` (one of ``SFT_FORMATS``) for the kept trajectories' selected chains."""
    if fmt not in SFT_FORMATS:
        raise ValueError(f"unknown SFT format {fmt!r}; expected one of {', '.join(SFT_FORMATS)}")
    row = trl_sft_row if fmt == "trl-sft" else nemo_rl_sft_row
    return [
        row(traj, chain)
        for traj, chain in sft_chains(trajectories, only_resolved=only_resolved, train_paths=train_paths)
    ]


def nemo_rl_sft_processor(
    datum_dict: dict[str, Any],
    task_data_spec: Any,
    tokenizer: Any,
    max_seq_length: int | None,
    idx: int,
    **_: Any,
) -> dict[str, Any]:
    """A NeMo-RL data processor (``TaskDataProcessFnCallable``) for ``nemo-rl-sft`` rows: the
    recorded ``token_ids`` become the message log's tensors as they are (no chat template, no added
    BOS/EOS: the chain already holds what the model saw). Register it in the launch script with
    ``register_processor("polar_token_sft", nemo_rl_sft_processor)``.

    A row longer than ``max_seq_length`` is cut and gets ``loss_multiplier`` 0, as NeMo-RL's own
    ``sft_processor`` does: a truncated sequence is not trained on.
    """
    import torch

    message_log = [
        {
            "role": m["role"],
            "content": m.get("content", ""),
            "token_ids": torch.tensor(m["token_ids"], dtype=torch.long),
        }
        for m in datum_dict["messages"]
    ]
    length = sum(len(m["token_ids"]) for m in message_log)
    loss_multiplier = 1.0
    if max_seq_length is not None and length >= max_seq_length:
        for message in message_log:
            message["token_ids"] = message["token_ids"][: min(4, max_seq_length // len(message_log))]
        loss_multiplier = 0.0
    return {
        "message_log": message_log,
        "length": length,
        "extra_env_info": None,
        "loss_multiplier": loss_multiplier,
        "idx": idx,
        **({"task_name": datum_dict["task_name"]} if "task_name" in datum_dict else {}),
    }
