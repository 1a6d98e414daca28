"""Settings on the command line: each flag is a settings field of the same name (``--model-dir`` sets
``model_dir``), and ``--settings FILE`` reads the same fields from YAML or JSON (the keys a Gym agent's
config takes too); a flag given on the command line wins over the file. One file serves every command:
a command takes the keys that are its settings and passes over the other Polar settings (``polar proxy
serve`` runs no episodes, so it leaves ``EpisodeSettings``' keys to `polar rollout` and the Gym agent)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from polar_env.episodes.settings import EpisodeSettings
from polar_env.proxy.engine import add_agent_calls_argument, add_thinking_arguments
from polar_env.proxy.settings import BACKENDS, ProxySettings

Settings = TypeVar("Settings", bound=BaseModel)


def add_settings_argument(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """``--settings FILE``: any of ``model``'s fields (main() applies the file before the flags)."""
    parser.add_argument(
        "--settings",
        type=Path,
        default=None,
        metavar="FILE",
        help="a YAML or JSON mapping of settings by field name (model_dir, url, max_context, timeout, "
        "max_tokens, ...: the keys the Gym agent's config takes); flags on the command line win",
    )
    parser.set_defaults(settings_model=model)


def add_proxy_arguments(parser: argparse.ArgumentParser, defaults: ProxySettings | None = None) -> None:
    """The flags of ``ProxySettings``, one per field, shared by `polar rollout`/`demo`/`train` and
    `proxy serve`."""
    d = defaults or ProxySettings()
    parser.add_argument(
        "--backend",
        default=d.backend,
        choices=BACKENDS,
        help="inference backend (default: local, the in-process transformers model)",
    )
    parser.add_argument(
        "--url",
        action="append",
        default=list(d.url),
        help="backend base URL (repeat to spread sessions over several servers)",
    )
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=d.model_dir,
        help="HF model/tokenizer dir used for chat templates (default: the embedded SmolLM2)",
    )
    parser.add_argument("--model-name", default=d.model_name, help="model name sent to the backend")
    parser.add_argument(
        "--tool-format",
        choices=["hermes", "qwen3_coder"],
        default=d.tool_format,
        help="tool-call format of the model's output (default: from the template)",
    )
    add_thinking_arguments(parser, d.enable_thinking, d.history_thinking)
    add_agent_calls_argument(parser, d.agent_calls)
    parser.add_argument(
        "--max-context",
        type=int,
        default=d.max_context,
        help="context window to enforce (default: the backend's own, e.g. vLLM's max_model_len)",
    )
    parser.add_argument(
        "--admin-secret",
        default=d.admin_secret,
        metavar="SECRET",
        help="the admin API's Bearer secret (default: $POLAR_ADMIN_SECRET, else generated)",
    )
    parser.add_argument("--max-body-mb", type=float, default=d.max_body_mb, help="the largest request body")
    parser.add_argument(
        "--fsync", action="store_true", default=d.fsync, help="fsync every ledger append (power-loss safe)"
    )
    parser.add_argument(
        "--verify-prompt-echo",
        action="store_true",
        default=d.verify_prompt_echo,
        help="vllm backend: have the server echo every prompt's ids and compare them id by id "
        "(debugging; by default its prompt token count is checked)",
    )


def settings_from_args(model: type[Settings], args: argparse.Namespace) -> Settings:
    """The parsed flags (and settings file) as ``model`` (flags that are not its fields are left out)."""
    return model.model_validate({k: v for k, v in vars(args).items() if k in model.model_fields})


class SettingsFileError(ValueError):
    """A settings file that cannot be read, or names a setting the command does not have."""


SHARED_FIELDS = set(ProxySettings.model_fields) | set(EpisodeSettings.model_fields)  # any command's file


def read_settings_file(path: Path, model: type[BaseModel]) -> dict[str, Any]:
    """The settings a YAML or JSON file sets for ``model`` (a mapping of field names, checked against its
    fields; the other Polar settings, ``SHARED_FIELDS``, are passed over)."""
    try:
        fragment = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SettingsFileError(f"cannot read settings file {path}: {exc}") from None
    if not isinstance(fragment, dict):
        raise SettingsFileError(f"settings file {path}: expected a mapping of setting names to values")
    if unknown := sorted(set(fragment) - set(model.model_fields) - SHARED_FIELDS):
        raise SettingsFileError(
            f"settings file {path}: unknown setting(s) {', '.join(unknown)} "
            f"(known: {', '.join(model.model_fields)})"
        )
    own = {k: v for k, v in fragment.items() if k in model.model_fields}
    try:
        model.model_validate(own)
    except ValidationError as exc:
        raise SettingsFileError(f"settings file {path}: {exc}") from None
    return own
