"""Load every Polar GRPO recipe with NeMo-RL's own code and build its loss (run by hand, not in CI).

What ``examples/nemo_gym/run_grpo_nemo_gym.py`` does before training, on each ``configs/grpo_polar_*.yaml``
linked into a NeMo-RL checkout's ``examples/nemo_gym/``: ``register_omegaconf_resolvers``,
``load_config`` (the ``defaults:`` chain), ``OmegaConf.to_container(resolve=True)``, ``MasterConfig``
(pydantic: GRPOConfig, ClippedPGLossConfig, PolicyConfig, ...). Then ``ClippedPGLossFn`` built from
the recipe's ``loss_fn`` runs on a batch whose importance weights (trainer over sampler probability)
are 0.5, 1, 4 and 20, with the PPO ratio at 1 and every advantage 1, so the loss is minus the mean of
the weights it applied: the truncation shows as the weights above the configured ratio clamped to it.
Also printed: the parallelism that decides context parallel on dense Qwen3.5 (DTensor CP must be 1).

NeMo-RL is not on PyPI: check out its source (the revision in configs/nemo_rl_grpo_keys.txt) and run
this with an interpreter that can import it (torch, omegaconf, hydra-core, pydantic, transformers, ...)::

    PYTHONPATH=/path/to/NeMo-RL python scripts/check_nemo_rl_recipes.py /path/to/NeMo-RL [RECIPE.yaml ...]

It links the recipes into the checkout (``examples/nemo_gym/``) and leaves the links there.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WEIGHTS = (0.5, 1.0, 4.0, 20.0)  # importance weights pi_trainer / pi_sampler of four sampled tokens


def load(recipe: Path, nemo_rl: Path):
    """The recipe as run_grpo_nemo_gym.py loads it: NeMo-RL's MasterConfig."""
    from nemo_rl.algorithms.grpo import MasterConfig
    from nemo_rl.utils.config import load_config, register_omegaconf_resolvers
    from omegaconf import OmegaConf

    link = nemo_rl / "examples" / "nemo_gym" / recipe.name
    if link.is_symlink() or not link.exists():
        link.unlink(missing_ok=True)
        link.symlink_to(recipe)
    register_omegaconf_resolvers()
    config = OmegaConf.to_container(load_config(str(link)), resolve=True)
    return MasterConfig(**config)


def applied_weights(loss_cfg) -> list[float]:
    """The importance weights ``ClippedPGLossFn`` applied to WEIGHTS' tokens (read back from its loss)."""
    import torch
    from nemo_rl.algorithms.loss.loss_functions import ClippedPGLossFn
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    loss_fn = ClippedPGLossFn(loss_cfg)
    out = []
    for weight in WEIGHTS:  # one token per call: the loss is -(applied weight) x advantage 1
        trainer = torch.tensor([[0.0, -1.0]])  # position 0 is the prompt (the loss drops it)
        data = BatchedDataDict(
            {
                "token_mask": torch.tensor([[0, 1]]),
                "sample_mask": torch.tensor([1.0]),
                "advantages": torch.ones(1, 2),
                "prev_logprobs": trainer,
                "generation_logprobs": trainer - torch.tensor([[0.0, math.log(weight)]]),
                "reference_policy_logprobs": trainer,
                "input_ids": torch.zeros(1, 2, dtype=torch.long),
            }
        )
        loss, _ = loss_fn(trainer[:, 1:].clone().requires_grad_(), data, torch.tensor(1), torch.tensor(1))
        out.append(round(-float(loss), 6))
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    nemo_rl = Path(argv[0]).resolve()
    recipes = [Path(p).resolve() for p in argv[1:]] or sorted((REPO / "configs").glob("grpo_polar_*.yaml"))
    os.environ.setdefault("POLAR_ROOT", str(REPO))
    os.environ.setdefault("POLAR_TRAIN_JSONL", "/data/train.jsonl")
    os.environ.setdefault("POLAR_VAL_JSONL", "/data/val.jsonl")
    failed = 0
    for recipe in recipes:
        print(f"== {recipe.name}")
        try:
            master = load(recipe, nemo_rl)
        except Exception as exc:  # noqa: BLE001 - report every recipe
            print(f"   NeMo-RL's loader refused it: {type(exc).__name__}: {exc}")
            failed += 1
            continue
        p, lf, g = master.policy, master.loss_fn, master.grpo
        dt, mg = p.get("dtensor_cfg") or {}, p.get("megatron_cfg") or {}
        print(
            f"   MasterConfig ok: model {p['model_name']}, max_total_sequence_length "
            f"{p['max_total_sequence_length']}"
        )
        print(
            f"   dtensor enabled {dt.get('enabled')} (cp {dt.get('context_parallel_size')}), megatron "
            f"enabled {mg.get('enabled')} (tp {mg.get('tensor_model_parallel_size')}, cp "
            f"{mg.get('context_parallel_size')}, sp {mg.get('sequence_parallel')})"
        )
        print(f"   async_grpo {g.async_grpo.model_dump() if g.async_grpo else None}")
        print(
            f"   loss_fn: IS correction {lf.use_importance_sampling_correction}, truncated IS "
            f"{lf.truncated_importance_sampling_type} at {lf.truncated_importance_sampling_ratio} "
            f"(min {lf.truncated_importance_sampling_ratio_min}), sequence-level "
            f"{lf.sequence_level_importance_ratios}, clip [{lf.ratio_clip_min}, {lf.ratio_clip_max}], KL "
            f"{lf.reference_policy_kl_penalty}, force_on_policy_ratio {lf.force_on_policy_ratio}"
        )
        try:
            applied = applied_weights(lf)
        except Exception as exc:  # noqa: BLE001
            print(f"   ClippedPGLossFn failed: {type(exc).__name__}: {exc}")
            failed += 1
            continue
        print(f"   ClippedPGLossFn: importance weights {list(WEIGHTS)} applied as {applied}")
        cap = lf.truncated_importance_sampling_ratio
        if cap is not None and applied != [min(w, cap) for w in WEIGHTS]:
            print(f"   NOT truncated at {cap}")
            failed += 1
        dense_qwen35 = "qwen3.5" in p["model_name"].lower() and "a3b" not in p["model_name"].lower()
        if dense_qwen35 and dt.get("enabled") and (dt.get("context_parallel_size") or 1) > 1:
            print("   dense Qwen3.5 with DTensor context parallel > 1 (NeMo-RL: not supported)")
            failed += 1
    print(f"{len(recipes) - failed} of {len(recipes)} recipe(s) loaded and truncate at their ratio")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
