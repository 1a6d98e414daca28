"""Episodes: the one lifecycle (``lifecycle``) and the workspace it runs in (``workspace``)."""

from __future__ import annotations

from polar_env.episodes.lifecycle import EpisodeConfig, EpisodeResult, episode_prompt, run_episode

__all__ = ["EpisodeConfig", "EpisodeResult", "episode_prompt", "run_episode"]
