"""How a proxy is built, typed once: ``ProxySettings`` (the backend, the model's chat template, what the
proxy enforces) and ``build_proxy`` (the one place a proxy is assembled). ``polar rollout``, ``demo``,
``train``, ``proxy serve`` and the Gym agent's configuration all inherit these fields, under these
names, so one settings file fragment (``--settings FILE``, or the Gym agent's YAML) sets any of them."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from polar_env.environment import EnvSettings
from polar_env.proxy.app import DEFAULT_KEEPALIVE_S, DEFAULT_MAX_BODY, ProxyServer
from polar_env.proxy.engine import EngineConfig

if TYPE_CHECKING:
    from polar_env.backends.base import Backend
    from polar_env.chat.template import ChatRenderer

BACKENDS = ("local", "vllm", "nemo-rl", "sglang", "instant")


class ProxySettings(BaseModel):
    """The proxy's settings; each field is a flag of the same name (``--model-dir``) and a settings
    file key."""

    backend: Literal["local", "vllm", "nemo-rl", "sglang", "instant"] = (
        "local"  # instant: a fixed "OK" (load tests)
    )
    # the inference servers' base URLs (several spread sessions over them); one, a list or comma-separated,
    # with or without /v1 (NeMo-RL passes one per vLLM server)
    url: list[str] = []
    model_dir: Path | None = (
        None  # HF model/tokenizer dir of the policy; None (or "embedded"): the CI SmolLM2
    )
    model_name: str | None = None  # the model name sent to the backend (default: the model dir's name)
    tool_format: Literal["hermes", "qwen3_coder"] | None = (
        None  # the model's tool-call format; None: from the template
    )
    enable_thinking: bool | None = None  # the template's flag; None: its own default (docs/proxy.md)
    history_thinking: Literal["keep", "drop"] = "keep"  # a new user turn after thinking turns (docs/proxy.md)
    agent_calls: Literal["serve", "refuse"] = (
        "serve"  # calls an episode's tools make with its key (docs/training.md)
    )
    max_context: int | None = None  # the context window to enforce; None: the backend's own (max_model_len)
    backend_options: dict[
        str, Any
    ] = {}  # the backend constructor's own options, e.g. timeout_s, chat_template_kwargs
    policy_version: int | None = None  # the serving weights' version at start (the trainer moves it)
    verify_prompt_echo: bool = (
        False  # vllm: the server echoes every prompt's ids, compared id by id (debugging)
    )
    fsync: bool = False  # fsync every ledger append (power-loss safe)
    max_body_mb: float = DEFAULT_MAX_BODY / 2**20  # the largest request body
    admin_secret: str | None = Field(default=None, repr=False)  # None: $POLAR_ADMIN_SECRET, else generated
    # set in a settings file only (no flag): the defaults suit every harness and backend shipped
    keepalive_s: float = DEFAULT_KEEPALIVE_S  # SSE keep-alive interval while a call waits (proxy/app.py)
    backend_retries: int = EngineConfig.backend_retries  # extra attempts on retryable backend errors
    retry_backoff_s: float = EngineConfig.retry_backoff_s
    logprobs_probe_timeout_s: float = EngineConfig.logprobs_probe_timeout_s  # a hung backend's bound at start

    @field_validator("url", mode="before")
    @classmethod
    def _server_roots(cls, value: Any) -> Any:
        return base_urls(value) if isinstance(value, str | list | tuple) else value

    @field_validator("model_dir", mode="before")
    @classmethod
    def _embedded(cls, value: Any) -> Any:
        return None if value in ("embedded", "") else value

    @model_validator(mode="after")
    def _echo_on_vllm(self) -> ProxySettings:
        if self.verify_prompt_echo and self.backend != "vllm":
            raise ValueError("verify_prompt_echo (--verify-prompt-echo) applies to the vllm backend only")
        return self

    def proxy_settings(self) -> ProxySettings:
        """These settings alone (a subclass's config, e.g. ``RolloutConfig``, reduced to them)."""
        return ProxySettings.model_validate(self.model_dump(include=set(ProxySettings.model_fields)))


def base_urls(value: str | list[str] | tuple[str, ...]) -> list[str]:
    """Server roots from one URL, a list (NeMo-RL's, one per vLLM server) or a comma-separated string,
    ``/v1`` dropped because the backends add their own paths."""
    items = value.split(",") if isinstance(value, str) else list(value)
    roots = [str(u).strip().rstrip("/") for u in items if u and str(u).strip()]
    return [u[:-3] if u.endswith("/v1") else u for u in roots]


def admin_secret(settings: ProxySettings, file: Path | None = None) -> str:
    """The admin API's Bearer secret: the setting, else ``$POLAR_ADMIN_SECRET``, else the one in
    ``file`` (generated there, readable by the owner only, when missing or empty), else one generated
    for this process."""
    if secret := settings.admin_secret or EnvSettings.read().admin_secret:
        return secret
    if file is None:
        if not _GENERATED_SECRET:
            _GENERATED_SECRET.append(secrets.token_urlsafe(24))
        return _GENERATED_SECRET[0]  # one per process: `polar train`'s rounds keep the secret they printed
    secret = file.read_text().strip() if file.exists() else ""
    if not secret:  # missing, or left empty by a crash between create and write
        file.parent.mkdir(parents=True, exist_ok=True)
        secret = secrets.token_urlsafe(32)
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # never readable by others
        with os.fdopen(fd, "w") as handle:
            handle.write(secret)
    return secret


_GENERATED_SECRET: list[str] = []


def proxy_model(settings: ProxySettings, backend: Backend | None = None) -> tuple[ChatRenderer, Backend]:
    """The chat renderer and the backend ``settings`` name (``backend``: one already made, e.g. a trainer's
    live model or a scripted policy). The slow part of a proxy (a local model loads here): made once,
    off the event loop where it matters, and shared by the proxies a job builds."""
    from polar_env.backends.embedded import embedded_model_dir
    from polar_env.backends.registry import make_backend
    from polar_env.chat.template import ChatRenderer

    model_dir = settings.model_dir or embedded_model_dir()
    renderer = ChatRenderer.from_pretrained(
        model_dir, tool_format=settings.tool_format, enable_thinking=settings.enable_thinking
    )
    if backend is None:
        opts: dict[str, Any] = dict(settings.backend_options)
        if settings.verify_prompt_echo:
            opts["verify_prompt_echo"] = True
        if (
            settings.backend == "instant"
        ):  # a fixed short answer: measures the proxy alone (load, crash tests)
            opts.setdefault(
                "token_ids",
                renderer.tokenizer.encode("OK", add_special_tokens=False) + renderer.eos_token_ids[:1],
            )
        backend = make_backend(
            settings.backend,
            url=settings.url or None,
            model=settings.model_name or model_dir.name,
            model_dir=model_dir,
            **opts,
        )
    return renderer, backend


def build_proxy(
    settings: ProxySettings,
    *,
    data_dir: Path,
    admin_secret: str,
    model: tuple[ChatRenderer, Backend] | None = None,
    default_max_tokens: int = EngineConfig.default_max_tokens,
    owns_backend: bool = True,
) -> ProxyServer:
    """The one place a proxy is assembled: over ``data_dir`` (its sessions recovered), as ``settings`` say,
    with ``model`` (``proxy_model``'s renderer and backend) made here unless given; ``owns_backend``
    False leaves a backend shared with other proxies open when this one stops."""
    renderer, backend = model or proxy_model(settings)
    config = EngineConfig(
        max_context=settings.max_context,
        default_max_tokens=default_max_tokens,
        backend_retries=settings.backend_retries,
        retry_backoff_s=settings.retry_backoff_s,
        logprobs_probe_timeout_s=settings.logprobs_probe_timeout_s,
        history_thinking=settings.history_thinking,
        agent_calls=settings.agent_calls,
        policy_version=settings.policy_version,
    )
    return ProxyServer.create(
        renderer=renderer,
        backend=backend,
        data_dir=data_dir,
        admin_secret=admin_secret,
        config=config,
        fsync=settings.fsync,
        max_body_bytes=int(settings.max_body_mb * 2**20),
        owns_backend=owns_backend,
        keepalive_s=settings.keepalive_s,
    )
