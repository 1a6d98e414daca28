"""Episodes: one episode's stages (``stages``), its state (``episode``), what it runs with
(``settings``), its proxy session (``session``), where it runs (``sites``, ``workspace``), the grading
pool (``grading``) and where its time went (``timings``)."""

from __future__ import annotations

from polar_env.episodes.episode import EpisodeResult
from polar_env.episodes.settings import EpisodeConfig
from polar_env.episodes.stages import run_episode
from polar_env.episodes.task import episode_prompt

__all__ = ["EpisodeConfig", "EpisodeResult", "episode_prompt", "run_episode"]
