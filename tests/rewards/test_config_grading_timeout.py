"""The grading deadline: declared once (`GradingLimits.timeout_s`), ``POLAR_GRADING_TIMEOUT_S`` mapped onto
it in one place (`GradingLimits.from_env`), and read by every entry point's config: `polar rollout`,
`polar demo`, `polar train`, `polar eval`, the rollout's episodes and the Gym resources server."""

from __future__ import annotations

import re

import pytest
import yaml
from repo_paths import REPO

from polar_env.cli import build_parser
from polar_env.cli.rollout import config_from_args
from polar_env.cli.tasks_export import task_toml
from polar_env.episodes.settings import EpisodeSettings
from polar_env.resources_server.core import PolarResourcesConfig
from polar_env.rewards.sandbox_exec import GradingLimits, grading_timeout_s
from polar_env.rollout.plan import plan_from_config
from polar_env.tasks.loader import load_tasks

DEFAULT = GradingLimits.timeout_s
SET = 1234.5  # what the environment asks for in these tests


@pytest.fixture
def env_timeout(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setenv("POLAR_GRADING_TIMEOUT_S", str(SET))
    return SET


def test_the_default_is_declared_once():
    """A number next to 'timeout' or 'grading' equal to the default appears in one source line only."""
    number = re.compile(rf"(?<![\w.]){int(DEFAULT)}(\.0)?(?![\w.])")
    hits = [
        f"{path.relative_to(REPO)}:{i}"
        for root in ("polar_env", "nemo_gym_env", "configs")
        for path in sorted((REPO / root).rglob("*"))
        if path.suffix in (".py", ".yaml", ".toml")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if number.search(line) and re.search("timeout|grading", line, re.IGNORECASE)
    ]
    assert hits == [f"polar_env/rewards/sandbox_exec.py:{_declaration_line()}"]


def _declaration_line() -> int:
    lines = (REPO / "polar_env/rewards/sandbox_exec.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.strip().startswith("timeout_s: float ="))


def test_unset_means_the_default_and_explicit_values_win(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("POLAR_GRADING_TIMEOUT_S", raising=False)
    assert grading_timeout_s() == DEFAULT == EpisodeSettings().grading_timeout
    monkeypatch.setenv("POLAR_GRADING_TIMEOUT_S", "60")
    assert grading_timeout_s() == 60.0 and grading_timeout_s(5.0) == 5.0


# the demo's presets fill these in its run (they default to None); the grading deadline is no preset
DEMO_PRESET = ["--samples", "1", "--concurrency", "1", "--timeout", "60", "--max-tokens", "8"]


@pytest.mark.parametrize("argv", [["rollout"], ["demo", *DEMO_PRESET], ["train"]])
def test_job_commands_read_the_environment(env_timeout: float, argv: list[str]):
    args = build_parser(argv[:1]).parse_args(argv)
    config = config_from_args(args)
    assert config.grading_timeout == env_timeout
    plan = plan_from_config(config.model_copy(update={"limit": 1}))
    assert plan.episode.grading_timeout == env_timeout  # what each episode grades with
    flag = build_parser(argv[:1]).parse_args([*argv, "--grading-timeout", "7"])
    assert config_from_args(flag).grading_timeout == 7.0  # the flag wins


def test_eval_reads_the_environment(env_timeout: float):
    args = build_parser(["eval"]).parse_args(["eval", "--predictions", "p.jsonl"])
    assert args.grading_timeout == env_timeout
    old = build_parser(["eval"]).parse_args(["eval", "--predictions", "p.jsonl", "--timeout", "7"])
    assert old.grading_timeout == 7.0  # the flag's old name, as docs showed it


def test_gym_resources_server_reads_the_environment(env_timeout: float):
    """The Gym config leaves the deadline to the server's own model (an explicit key would win)."""
    block = yaml.safe_load((REPO / "nemo_gym_env/resources_servers/polar/configs/polar.yaml").read_text())
    polar = block["polar_resources_server"]["resources_servers"]["polar"]
    assert "grading_timeout" not in polar
    assert PolarResourcesConfig.model_validate({"tasks": "bundled"}).grading_timeout == env_timeout
    assert PolarResourcesConfig(grading_timeout=30).grading_timeout == 30


def test_exported_harbor_tasks_carry_the_deadline(env_timeout: float):
    task = load_tasks("bundled")[0]
    assert f"[verifier]\ntimeout_sec = {env_timeout:.1f}" in task_toml(task)
