"""Shared fixtures; keep each small."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar_env.backends.embedded import embedded_model_dir


@pytest.fixture(scope="session")
def embedded_dir() -> Path:
    """The embedded SmolLM2 model as a float32 HF directory (converted from the GGUF on first use)."""
    return embedded_model_dir()


@pytest.fixture(scope="session")
def renderer(embedded_dir: Path):
    """The real SmolLM2 tokenizer with Polar's tools-aware Hermes template."""
    from polar_env.chat.template import ChatRenderer

    return ChatRenderer.from_pretrained(embedded_dir)


@pytest.fixture(scope="session")
def local_backend(embedded_dir: Path):
    """The real embedded model, in process (float32, CPU)."""
    from polar_env.backends.local import LocalBackend

    return LocalBackend.from_pretrained(embedded_dir)


@pytest.fixture
def scripted_backend_factory(local_backend):
    """``factory(policy)``: a backend whose text the policy picks and whose logprobs the real model scores."""
    from polar_env.backends.scripted import ScriptedBackend

    return lambda policy, **kw: ScriptedBackend(local_backend, policy, **kw)
