"""Which logprobs a backend returns, and whether they are the ones a trainer's ratio needs.

The policy-gradient ratio divides the trainer's probability of each sampled token by the
probability it was *sampled* with. vLLM's default (``--logprobs-mode raw_logprobs``) returns the
model's own log-softmax, before temperature and top-p; ``processed_logprobs`` returns the
distribution actually sampled from. The two agree only at temperature 1 and top-p 1, so a training
session that samples otherwise on a raw backend would record logprobs of a distribution nobody
sampled from. The proxy asks the backend once at start (``Backend.logprobs_mode``, a probe for the
HTTP servers) and refuses such sessions (docs/proxy.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

LogprobsMode = Literal["raw", "processed", "unknown"]


class LogprobsMismatch(ValueError):
    """A training session's sampling does not match the logprobs the backend returns."""


PROBE_TEMPERATURE = 2.0  # far from 1, so raw and processed logprobs of the sampled token differ


def classify(sampled: float, raw: float) -> LogprobsMode:
    """``sampled``: the logprob a backend returned for a token it sampled at ``PROBE_TEMPERATURE``;
    ``raw``: the model's own logprob of that token (a prompt logprob: never processed). Equal means
    raw; a token the model was certain of says nothing either way."""
    if raw > -0.05:
        return "unknown"
    return "raw" if abs(sampled - raw) <= 0.02 + 0.01 * abs(raw) else "processed"


def sampling_mismatch(mode: LogprobsMode, sampling: Mapping[str, Any]) -> str | None:
    """Why ``sampling`` (temperature, top_p as a session enforces them) does not match ``mode``'s
    logprobs, or None when it does."""
    if mode != "raw":
        return None
    off = {k: sampling.get(k) for k in ("temperature", "top_p") if sampling.get(k, 1.0) != 1.0}
    if not off:
        return None
    shown = ", ".join(f"{k} {v}" for k, v in off.items())
    return (
        f"the backend returns raw logprobs (the model's distribution at temperature 1, top_p 1) but this "
        f"training session samples at {shown}: the recorded logprobs would not be those of the distribution "
        "sampled from. Start vLLM with --logprobs-mode processed_logprobs, or sample at temperature 1.0, "
        "top_p 1.0"
    )
