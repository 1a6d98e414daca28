"""Sandboxes: bubblewrap (local default), docker and apptainer (SWE-bench images)."""

from __future__ import annotations

from polar_env.sandbox.base import NOISE_EXCLUDES, RunResult, Sandbox, SandboxSpec


def sandbox_class(kind: str) -> type[Sandbox]:
    """``bubblewrap`` | ``docker`` | ``apptainer`` -> the class (imported lazily)."""
    if kind in ("bubblewrap", "bwrap"):
        from polar_env.sandbox.bubblewrap import BubblewrapSandbox
        return BubblewrapSandbox
    if kind == "docker":
        from polar_env.sandbox.docker import DockerSandbox
        return DockerSandbox
    if kind == "apptainer":
        from polar_env.sandbox.apptainer import ApptainerSandbox
        return ApptainerSandbox
    raise KeyError(f"unknown sandbox {kind!r}; known: bubblewrap, docker, apptainer")


__all__ = ["NOISE_EXCLUDES", "RunResult", "Sandbox", "SandboxSpec", "sandbox_class"]
