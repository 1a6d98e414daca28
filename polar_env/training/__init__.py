"""Training on Polar's episodes with Hugging Face TRL (the ``train`` extra): one machine, the live model.

``rollouts.PolarRollouts`` is a TRL ``rollout_func``: each rollout is a real harness episode through
the proxy, sampled by the trainer's own model object, and TRL receives the token ids, loss mask and
logprobs Polar recorded (never re-tokenised). ``grpo.PolarGRPOTrainer`` is TRL's ``GRPOTrainer``
with those logprobs as the importance ratio's denominator; ``fidelity`` holds the checks that prove
the trainer's forward pass reproduces them and that only sampled tokens get a gradient
(docs/training.md). `polar train` (``polar_env.cli.train``, docs/learning.md) uses them: an SFT warm
start on gold replays (``warm_start``, top layers over a frozen trunk, ``frozen_trunk``), then GRPO steps.
"""
