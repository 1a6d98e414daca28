"""TRL's ``GRPOTrainer`` on Polar rollouts, its importance ratio taken against Polar's recorded logprobs.

Without vLLM, TRL computes the PPO ratio against a detached copy of its own forward pass, which is 1
by construction and says nothing about the sampler. Here the denominator is what the proxy recorded
when the token was sampled (``old_per_token_logps`` := Polar's logprobs on sampled tokens), so the
ratio is π_θ / π_sampler as the algorithm defines it, and on one machine it is 1 at step 0 only if
the trainer's forward pass reproduces the sampler's logprobs. Each step also logs
``polar/logprob_abs_diff/{max,mean}``, ``polar/ratio/{min,max}`` and ``polar/tis/truncated`` over the
batch's sampled tokens, and keeps them in ``trainer.polar_fidelity``; a drift over ``max_drift`` stops the
run before the update. With ``use_vllm`` TRL's own importance-sampling correction
(against the same recorded logprobs) is left as it is.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer  # pyright: ignore[reportPrivateImportUsage]  # trl's lazy exports

from polar_env.training.rollouts import PolarRollouts


def polar_reward(
    prompts: list[Any], completions: list[Any], polar_reward: list[float | None], **kwargs: Any
) -> list[float | None]:
    """The episode's reward (SWE-bench grading through the outcome table); None: unscorable."""
    return [None if r is None else float(r) for r in polar_reward]


def positions_from_mask(module: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """A forward pre-hook: a call with an attention mask and no ``position_ids`` gets them counted
    from the mask. TRL pads each batch's prompts on the left to the longest, and a model given no
    positions numbers the pads too: every token of a shorter prompt sits at a shifted RoPE position,
    which the sampler (unpadded) never saw. Equal in exact arithmetic, not in float32: it was the
    7.7e-4 step-0 drift of a four-task batch (docs/training.md, "The step-0 drift")."""
    mask = kwargs.get("attention_mask")
    if mask is not None and kwargs.get("position_ids") is None and mask.dim() == 2:
        kwargs["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)
    return args, kwargs


class LogprobDrift(RuntimeError):
    """The trainer's logprobs left the recorded ones by more than the run allows: the ratio is not the
    sampler's."""


class PolarGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer(rollout_func=rollouts, reward_funcs=[polar_reward, ...],
    train_dataset=rollouts.dataset())``.

    ``max_drift``: a step whose max |trainer logprob - recorded logprob| exceeds it raises
    :class:`LogprobDrift` before the update (None: never). The importance ratio against the recorded
    logprobs is truncated at TRL's own ``vllm_importance_sampling_clip_max`` (truncated importance
    sampling: the denominator is ``max(recorded, trainer - log C)``, so the ratio at the step's start
    is ``min(π_θ / π_sampler, C)``; PPO's clipping applies on top)."""

    def __init__(
        self,
        model: Any,
        rollouts: PolarRollouts,
        args: GRPOConfig,
        *,
        max_drift: float | None = None,
        **kwargs: Any,
    ):
        if args.bf16 or args.fp16:
            raise ValueError(
                "PolarGRPOTrainer: half-precision autocast moves the trainer's logprobs off the recorded "
                "ones (|Δ| ~0.17 with bf16), so the ratio would not start at 1: pass "
                "GRPOConfig(bf16=False, fp16=False) (TRL defaults bf16 to True)"
            )
        if args.top_p != 1.0 or args.top_k:
            raise ValueError(
                "TRL's forward pass scores the full distribution (temperature only): sample with "
                "top_p=1.0 and top_k=0, or the recorded logprobs are of another distribution"
            )
        kwargs.setdefault("processing_class", rollouts.model.tokenizer)
        kwargs.setdefault("train_dataset", rollouts.dataset())
        reward_funcs = [polar_reward, *kwargs.pop("reward_funcs", [])]
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, rollout_func=rollouts, **kwargs)
        # the trainer's forward passes number positions as the sampler did (the sampler passes no mask)
        self.accelerator.unwrap_model(self.model).register_forward_pre_hook(
            positions_from_mask, with_kwargs=True
        )
        self.max_drift = max_drift
        self.polar_fidelity: list[dict[str, Any]] = []

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        out = super()._generate_and_score_completions(inputs)
        if self.use_vllm:
            return out
        recorded = out["sampling_per_token_logps"]
        sampled = (out["completion_mask"] * out.get("tool_mask", 1)).bool()
        # the drift is the trainer's forward against the sampler's on the same weights: rows sampled (in
        # part) by an earlier version (episodes that ran across an update) are off-policy, not drift
        version = self.state.global_step
        current = torch.tensor(
            [inp.get("polar_policy_versions") in (None, [], [version]) for inp in inputs],
            device=sampled.device,
        )[:, None]
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        attention = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        with torch.no_grad():
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model,
                ids,
                attention,
                out["completion_ids"].size(1),
                batch_size=self.args.per_device_train_batch_size,
            )
        delta = (logps - recorded)[sampled & current]
        assert isinstance(self.args, GRPOConfig) and self.model is not None  # as the trainer was built
        cap = self.args.vllm_importance_sampling_clip_max
        ratio = (logps - recorded)[sampled].exp()
        stats = {
            "step": float(self.state.global_step),
            "tokens": float(delta.numel()),
            "off_policy_tokens": float((sampled & ~current).sum()),
            "logprob_abs_diff_max": float(delta.abs().max()) if delta.numel() else 0.0,
            "logprob_abs_diff_mean": float(delta.abs().mean()) if delta.numel() else 0.0,
            "ratio_min": float(ratio.min()) if ratio.numel() else 1.0,
            "ratio_max": float(ratio.max()) if ratio.numel() else 1.0,
            "tis_cap": float(cap) if cap is not None else None,
            "tis_truncated": float((ratio > cap).sum()) if cap is not None else 0.0,
        }
        self.polar_fidelity.append(stats)
        metrics = self._metrics["train" if self.model.training else "eval"]
        metrics["polar/logprob_abs_diff/max"].append(stats["logprob_abs_diff_max"])
        metrics["polar/logprob_abs_diff/mean"].append(stats["logprob_abs_diff_mean"])
        metrics["polar/ratio/min"].append(stats["ratio_min"])
        metrics["polar/ratio/max"].append(stats["ratio_max"])
        metrics["polar/tis/truncated"].append(stats["tis_truncated"])
        if self.max_drift is not None and stats["logprob_abs_diff_max"] > self.max_drift:
            raise LogprobDrift(
                f"GRPO step {self.state.global_step}: the trainer's logprobs differ from the recorded ones "
                f"by up to {stats['logprob_abs_diff_max']:.3g} (mean {stats['logprob_abs_diff_mean']:.3g} "
                f"over {int(stats['tokens'])} sampled tokens), over the allowed {self.max_drift:g}: the "
                "ratio is not π_θ / π_sampler. Stopped before the update "
                '(docs/training.md, "The step-0 drift")'
            )
        denominator = recorded if cap is None else torch.maximum(recorded, logps - math.log(cap))
        out["old_per_token_logps"] = torch.where(sampled, denominator, logps)
        return out
