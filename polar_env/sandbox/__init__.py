"""Sandboxes: bubblewrap (local default), docker/podman and apptainer (task images).

Which one an episode uses is decided per task by ``polar_env.episodes.workspace``.
"""

from __future__ import annotations

from polar_env.sandbox.base import BUILD_EXCLUDES, RunResult, Sandbox, SandboxSpec

__all__ = ["BUILD_EXCLUDES", "RunResult", "Sandbox", "SandboxSpec"]
