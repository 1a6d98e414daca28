"""One configuration: `polar rollout`, `polar proxy serve` and the Gym agent take the same settings file
fragment, under the same names, and build the same proxy from it (``ProxySettings``, ``build_proxy``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import yaml
from repo_paths import REPO

from polar_env.agent_server.core import PolarAgentConfig
from polar_env.cli import build_parser, parse_args
from polar_env.cli.proxy_serve import ServeSettings
from polar_env.cli.rollout import config_from_args
from polar_env.cli.settings import settings_from_args
from polar_env.environment import EnvSettings
from polar_env.proxy.settings import ProxySettings, admin_secret, build_proxy

GYM_AGENT_YAML = REPO / "nemo_gym_env/responses_api_agents/polar_agent/configs/polar_agent.yaml"

FRAGMENT = {
    "backend": "vllm",
    "url": ["http://a:8000/v1", "http://b:8000"],
    "model_dir": "/models/policy",
    "model_name": "policy",
    "tool_format": "qwen3_coder",
    "enable_thinking": False,
    "history_thinking": "drop",
    "agent_calls": "refuse",
    "max_context": 32768,
    "backend_options": {"timeout_s": 900},
    "max_body_mb": 8.0,
}


def fragment_file(tmp_path: Path, suffix: str) -> Path:
    path = tmp_path / f"settings{suffix}"
    path.write_text(yaml.safe_dump(FRAGMENT) if suffix == ".yaml" else json.dumps(FRAGMENT))
    return path


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_rollout_proxy_serve_and_gym_agent_take_one_fragment(tmp_path, suffix):
    path = fragment_file(tmp_path, suffix)
    rollout = config_from_args(parse_args(["rollout", "--settings", str(path)]))
    serve = settings_from_args(ServeSettings, parse_args(["proxy", "serve", "--settings", str(path)]))
    gym = PolarAgentConfig.model_validate({**yaml.safe_load(path.read_text()), "harness": "codex"})
    want = ProxySettings.model_validate(FRAGMENT)
    assert want.url == ["http://a:8000", "http://b:8000"] and want.model_dir == Path("/models/policy")
    assert rollout.proxy_settings() == serve.proxy_settings() == gym.proxy_settings() == want
    assert want != ProxySettings()  # every key of the fragment changed a default


def test_the_gym_agent_config_names_its_settings_as_the_cli_does():
    """The Gym YAML's keys are settings fields, and each proxy setting a `polar rollout` flag (one name)."""
    agent = yaml.safe_load(GYM_AGENT_YAML.read_text())["polar_agent"]["responses_api_agents"]["polar_agent"]
    gym_only = {"entrypoint", "resources_server", "datasets"}  # Gym's own server keys
    assert set(agent) - gym_only <= set(PolarAgentConfig.model_fields)
    assert {"url", "model_name", "model_dir", "backend"} <= set(agent)
    rollout_flags = {a.dest for a in _parser("rollout")._actions}
    serve_flags = {a.dest for a in _parser("proxy", "serve")._actions}
    file_only = {
        "backend_options",
        "policy_version",
        "keepalive_s",
        "backend_retries",
        "retry_backoff_s",
        "logprobs_probe_timeout_s",
    }  # dicts, a trainer's version and the proxy's timing knobs: a settings file sets them
    assert set(ProxySettings.model_fields) - file_only <= rollout_flags & serve_flags


def _parser(*command: str) -> argparse.ArgumentParser:
    parser = build_parser(list(command))
    for name in command:  # down the subcommand tree to the command's own parser
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def test_a_flag_wins_over_the_settings_file(tmp_path):
    path = fragment_file(tmp_path, ".yaml")
    config = config_from_args(
        parse_args(["rollout", "--settings", str(path), "--max-context", "4096", "--model-name", "other"])
    )
    assert (config.max_context, config.model_name, config.tool_format) == (4096, "other", "qwen3_coder")


@pytest.mark.parametrize(
    "text, error",
    [
        ("max_contxt: 4096\n", "unknown setting(s) max_contxt"),
        ("backend: nope\n", "backend"),
        ("- just a list\n", "expected a mapping"),
    ],
)
def test_a_bad_settings_file_is_refused_by_name(tmp_path, capsys, text, error):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exc:
        parse_args(["proxy", "serve", "--settings", str(path)])
    assert exc.value.code == 2
    assert error in capsys.readouterr().err


def test_the_admin_secret_is_the_setting_then_the_environment_then_the_file(tmp_path, monkeypatch):
    file = tmp_path / "admin_secret"
    monkeypatch.delenv("POLAR_ADMIN_SECRET", raising=False)
    generated = admin_secret(ProxySettings(), file)
    assert file.read_text() == generated and file.stat().st_mode & 0o077 == 0
    assert admin_secret(ProxySettings(), file) == generated  # a restart keeps it
    monkeypatch.setenv("POLAR_ADMIN_SECRET", "from-env")
    assert EnvSettings.read().admin_secret == "from-env" == admin_secret(ProxySettings(), file)
    assert admin_secret(ProxySettings(admin_secret="given"), file) == "given"


def test_build_proxy_applies_the_settings(tmp_path):
    settings = ProxySettings(
        backend="instant",
        max_context=2048,
        agent_calls="refuse",
        history_thinking="drop",
        policy_version=3,
        max_body_mb=2.0,
    )
    proxy = build_proxy(settings, data_dir=tmp_path / "ledger", admin_secret="s")
    config = proxy.engine.config
    assert (config.max_context, config.agent_calls, config.history_thinking, config.policy_version) == (
        2048,
        "refuse",
        "drop",
        3,
    )
    assert proxy.max_body_bytes == 2 * 2**20 and proxy.engine.backend.name == "instant"
    proxy.registry.ledger.close()
