"""Polar: token-exact RL trajectories from unmodified coding-agent harnesses."""

__version__ = "0.1.0"
