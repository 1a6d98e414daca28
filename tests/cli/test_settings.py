"""One configuration: `polar rollout`, `polar proxy serve` and the Gym agent take the same settings file
fragment, under the same names, and build the same proxy from it (``ProxySettings``, ``build_proxy``) and
run their episodes with the same settings (``EpisodeSettings``)."""

from __future__ import annotations

import argparse
import inspect
import json
import re
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
from polar_env.episodes.settings import EpisodeSettings, GradingSettings, StageSettings, TaskSettings
from polar_env.outcomes import FailureKind, Outcome
from polar_env.proxy.settings import ProxySettings, admin_secret, build_proxy
from polar_env.resources_server.core import PolarResourcesConfig
from polar_env.rollout.config import RolloutConfig

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
EPISODE = {  # EpisodeSettings' keys (the Gym agent's too; `proxy serve` passes over them)
    "harness": "codex",
    "timeout": 1800,
    "temperature": 0.6,
    "top_p": 0.95,
    "max_tokens": 8192,
    "max_calls": 40,
    "max_sampled_tokens": 200000,
    "outcome": {"harness_crashed": "mask", "deadline_harness": 0},
    "min_backend_tokens_per_s": 2.0,
    "mask_single_call": True,
}


def fragment_file(tmp_path: Path, suffix: str) -> Path:
    path = tmp_path / f"settings{suffix}"
    both = {**FRAGMENT, **EPISODE}
    path.write_text(yaml.safe_dump(both) if suffix == ".yaml" else json.dumps(both))
    return path


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_rollout_proxy_serve_and_gym_agent_take_one_fragment(tmp_path, suffix):
    path = fragment_file(tmp_path, suffix)
    rollout = config_from_args(parse_args(["rollout", "--settings", str(path)]))
    serve = settings_from_args(ServeSettings, parse_args(["proxy", "serve", "--settings", str(path)]))
    gym = PolarAgentConfig.model_validate(yaml.safe_load(path.read_text()))
    want = ProxySettings.model_validate(FRAGMENT)
    assert want.url == ["http://a:8000", "http://b:8000"] and want.model_dir == Path("/models/policy")
    assert rollout.proxy_settings() == serve.proxy_settings() == gym.proxy_settings() == want
    assert want != ProxySettings()  # every key of the fragment changed a default
    episode = EpisodeSettings.model_validate(EPISODE)
    assert rollout.episode_settings() == gym.episode_settings() == episode
    assert all(getattr(episode, k) != v for k, v in EpisodeSettings().model_dump().items() if k in EPISODE)
    assert episode.sampling() == {"temperature": 0.6, "top_p": 0.95, "max_tokens": 8192}
    assert episode.budget().max_calls == 40 and episode.outcomes().min_backend_tokens_per_s == 2.0
    assert episode.outcomes().apply(FailureKind.harness_crashed) == (0.0, True)


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
    assert set(EpisodeSettings.model_fields) <= rollout_flags  # `--max-tokens` sets max_tokens
    flags = {a.dest: a.option_strings for a in _parser("rollout")._actions}
    assert all(f"--{name.replace('_', '-')}" in flags[name] for name in EpisodeSettings.model_fields)


CONFIGS = [
    ProxySettings,
    GradingSettings,
    EpisodeSettings,
    StageSettings,
    TaskSettings,
    RolloutConfig,
    PolarAgentConfig,
    ServeSettings,
    PolarResourcesConfig,
]


@pytest.mark.parametrize("name", sorted({name for c in CONFIGS for name in c.model_fields}))
def test_each_setting_is_declared_once(name):
    """Every setting of every command and Gym server (proxy, episode, stages, tasks, the jobs' own) has one
    declaration (its name, type and default) that the others inherit: no config class declares it again
    under its own default."""
    declared = [c.__name__ for c in CONFIGS if name in inspect.get_annotations(c)]
    assert len(declared) == 1, declared


def test_the_gym_recipe_values_are_set_in_its_yaml_not_as_second_defaults():
    agent = yaml.safe_load(GYM_AGENT_YAML.read_text())["polar_agent"]["responses_api_agents"]["polar_agent"]
    assert (agent["timeout"], agent["max_tokens"]) == (1800, 8192)
    assert PolarAgentConfig().timeout == EpisodeSettings().timeout == RolloutConfig().timeout == 600


def test_a_renamed_setting_is_refused_with_its_new_name():
    with pytest.raises(ValueError, match="timeout_s is now timeout"):
        PolarAgentConfig.model_validate({"timeout_s": 1800})
    with pytest.raises(ValueError, match="grading_timeout_s is now grading_timeout"):
        PolarResourcesConfig.model_validate({"grading_timeout_s": 60})


def test_outcome_rows_from_flags_merge_over_the_settings_file(tmp_path):
    path = fragment_file(tmp_path, ".yaml")
    config = config_from_args(
        parse_args(["rollout", "--settings", str(path), "--outcome", "harness_crashed=0.5"])
    )
    assert config.outcome == {
        FailureKind.harness_crashed: Outcome(reward=0.5),
        FailureKind.deadline_harness: Outcome(reward=0.0),
    }


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


def test_polar_environment_variables_are_read_in_one_typed_place():
    """``EnvSettings`` reads every ``POLAR_*`` variable; no other module reads one by name."""
    env = EnvSettings.read({"POLAR_PYTHON3_12": "/opt/py/bin/python3.12", "POLAR_PYTHON": "setup.sh's"})
    assert env.python == {"3.12": "/opt/py/bin/python3.12"}
    read = re.compile(r"""(?:environ(?:\.get|\.pop)?\s*[\[(]|getenv\s*\()\s*f?["']POLAR_""")
    package = Path(__file__).resolve().parents[1] / "polar_env"
    readers = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.name != "environment.py" and read.search(path.read_text())
    ]
    assert readers == []
