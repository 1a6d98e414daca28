"""The NeMo-RL recipe and the NeMo Gym configs: they parse, name only real keys, and agree with each other."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from gym_helpers import GYM_ROOT, compose

from polar_env.agent_server.core import PolarAgentConfig
from polar_env.harness_adapters.registry import adapter_names
from polar_env.resources_server.core import PolarResourcesConfig

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "configs" / "grpo_polar_qwen3_5_4b.yaml"
KEYS = REPO / "configs" / "nemo_rl_grpo_keys.txt"
# one Gym config per registered harness: an override of the two servers' own configs
HARNESS_CONFIGS = {name: f"polar_{name.replace('-', '_')}.yaml" for name in adapter_names()}
BASES = ["resources_servers/polar/configs/polar.yaml", "responses_api_agents/polar_agent/configs/polar_agent.yaml"]
GYM_PYTHON = REPO / ".venv-gym" / "bin" / "python"
# NeMo Gym's own parser, offline (no ports, no servers): each argument's composed config as JSON
GYM_PARSE = """
import json, sys
from omegaconf import OmegaConf
from nemo_gym.global_config import GlobalConfigDictParser, GlobalConfigDictParserConfig
out = {}
for paths in sys.argv[1:]:
    cfg = GlobalConfigDictParser().parse(GlobalConfigDictParserConfig(
        initial_global_config_dict=OmegaConf.create({"config_paths": paths.split(","), "policy_base_url": "u",
                                                     "policy_model_name": "m"}),
        skip_load_from_cli=True, skip_load_from_dotenv=True, offline=True))
    out[paths] = {k: v for k, v in OmegaConf.to_container(cfg, resolve=False).items() if k.startswith("polar")}
print(json.dumps(out))
"""


def dotted_keys(node: object, prefix: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            out.append(prefix + str(key))
            out += dotted_keys(value, f"{prefix}{key}.")
    return out


def known_keys() -> tuple[set[str], tuple[str, ...]]:
    lines = [ln.strip() for ln in KEYS.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return {ln for ln in lines if not ln.endswith(".*")}, tuple(ln[:-1] for ln in lines if ln.endswith(".*"))


def test_key_list_names_its_source_revision():
    header = KEYS.read_text().splitlines()[0]
    assert "NVIDIA-NeMo/RL@" in header and len(header.split("@")[1].split()[0]) == 40
    exact, open_prefixes = known_keys()
    assert {"grpo.num_prompts_per_step", "loss_fn.ratio_clip_max", "env.should_use_nemo_gym",
            "policy.generation.vllm_cfg.expose_http_server"} <= exact
    assert "env.nemo_gym." in open_prefixes


def test_recipe_names_only_nemo_rl_grpo_keys():
    recipe = yaml.safe_load(RECIPE.read_text())
    exact, open_prefixes = known_keys()
    unknown = [k for k in dotted_keys(recipe)
               if k != "defaults" and k not in exact and not k.startswith(open_prefixes)]
    assert unknown == []


def test_a_misspelt_key_would_be_caught():
    exact, open_prefixes = known_keys()
    for bad in ("grpo.num_prompt_per_step", "loss_fn.clip_ratio_high", "policy.generation.vllm_cfg.expose_http"):
        assert bad not in exact and not bad.startswith(open_prefixes)


def test_recipe_enables_gym_async_rollouts_and_http_vllm():
    r = yaml.safe_load(RECIPE.read_text())
    gen = r["policy"]["generation"]
    assert r["env"]["should_use_nemo_gym"] is True
    assert gen["vllm_cfg"]["async_engine"] is True and gen["vllm_cfg"]["expose_http_server"] is True
    assert r["grpo"]["async_grpo"]["enabled"] is True
    assert r["loss_fn"]["use_importance_sampling_correction"] is True
    # sampling the proxy can enforce: temperature and top_p only (NeMo-RL's server must not see top_k)
    assert gen["top_k"] is None and 0 < gen["top_p"] <= 1 and gen["temperature"] > 0
    paths = r["env"]["nemo_gym"]["config_paths"]
    assert "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml" in paths
    polar = [p for p in paths if "POLAR_ROOT" in p]
    assert len(polar) == 1
    config = REPO / polar[0].replace("${oc.env:POLAR_ROOT}/", "")
    assert config.exists()
    gym = compose(config)
    # the recipe's per-server overrides address instances the Gym config really declares
    for instance, block in r["env"]["nemo_gym"].items():
        if isinstance(block, dict) and any(k in block for k in ("responses_api_agents", "resources_servers")):
            assert instance in gym, instance
            for group, servers in block.items():
                assert set(servers) <= set(gym[instance][group]), (instance, group)


def test_every_harness_has_its_override_and_no_other_copies_exist():
    assert sorted(p.name for p in (REPO / "configs").glob("polar_*.yaml")) == sorted(HARNESS_CONFIGS.values())
    for name in HARNESS_CONFIGS.values():
        raw = yaml.safe_load((REPO / "configs" / name).read_text())
        assert raw["config_paths"] == BASES  # the servers' settings live in their bases only
        assert all(set(block) <= {"_inherit_from", "responses_api_agents", "environment_servers"}
                   for key, block in raw.items() if key != "config_paths")


@pytest.mark.parametrize("harness, name", sorted(HARNESS_CONFIGS.items()))
def test_base_and_override_compose_to_the_pi_config_renamed(harness, name):
    """What each of the 11 copies was: the Pi config with the harness and the instance names changed;
    and the same whichever way round a Gym merges a file with what it pulls in."""
    stem, pi = name[len("polar_"):-len(".yaml")], compose(REPO / "configs" / "polar_pi.yaml")
    want = {key.replace("polar_pi_", f"polar_{stem}_"): value for key, value in pi.items()}
    text = yaml.safe_dump(want).replace("name: polar_pi_agent", f"name: polar_{stem}_agent")
    want = yaml.safe_load(text.replace("harness: pi\n", f"harness: {harness}\n"))
    got = compose(REPO / "configs" / name)
    assert got == want == compose(REPO / "configs" / name, inner_first=False)
    assert set(got) == {"polar_resources_server", f"polar_{stem}_agent", f"polar_{stem}_environment"}


@pytest.mark.parametrize("harness, name", sorted(HARNESS_CONFIGS.items()))
def test_composed_servers_validate_as_polar_configs(harness, name):
    cfg = compose(REPO / "configs" / name)
    stem = name[len("polar_"):-len(".yaml")]
    agent = {k: v for k, v in cfg[f"polar_{stem}_agent"]["responses_api_agents"]["polar_agent"].items()
             if k in PolarAgentConfig.model_fields and not str(v).startswith("${")}
    agent["budget"] = {}  # its fields are interpolations of optional globals (null when unset)
    assert PolarAgentConfig.model_validate(agent).harness == harness
    resources = cfg["polar_resources_server"]["resources_servers"]["polar"]
    PolarResourcesConfig.model_validate({k: v for k, v in resources.items() if k in PolarResourcesConfig.model_fields
                                         and not str(v).startswith("${")})


@pytest.mark.parametrize("harness, name", sorted(HARNESS_CONFIGS.items()))
def test_gym_configs_declare_servers_dataset_and_environment(harness, name):
    cfg = compose(REPO / "configs" / name)
    agent_instance = f"polar_{name[len('polar_'):-len('.yaml')]}_agent"
    resources = cfg["polar_resources_server"]["resources_servers"]["polar"]
    assert resources["entrypoint"] == "app.py" and resources["domain"] == "coding"
    agent = cfg[agent_instance]["responses_api_agents"]["polar_agent"]
    assert agent["harness"] == harness
    assert agent["resources_server"] == {"type": "resources_servers", "name": "polar_resources_server"}
    assert agent["policy_base_url"] == "${policy_base_url}"
    assert all(d["license"] for d in agent["datasets"])
    env_servers = [v for v in cfg.values() if "environment_servers" in v]
    assert env_servers == [{"environment_servers": {"legacy_agent": {
        "entrypoint": "app.py", "agent_server": {"type": "responses_api_agents", "name": agent_instance}}}}]


def test_each_base_declares_its_own_server_only():
    resources, agent = (yaml.safe_load((GYM_ROOT / path).read_text()) for path in BASES)
    assert set(resources) == {"polar_resources_server"}
    assert set(agent) == {"polar_agent", "polar_environment"}
    assert agent["polar_environment"]["environment_servers"]["legacy_agent"]["agent_server"]["name"] == "polar_agent"


@pytest.mark.skipif(not GYM_PYTHON.exists(), reason="needs the NeMo Gym venv: run scripts/setup_nemo_gym.sh")
def test_nemo_gym_composes_every_harness_config_as_the_test_does():
    """Gym's own parser agrees with ``compose`` on every harness's config (host and port aside), and two
    harnesses in one ``config_paths`` share the one resources server."""
    files = [str(REPO / "configs" / name) for name in sorted(HARNESS_CONFIGS.values())]
    pair = ",".join(files[:2])
    proc = subprocess.run([str(GYM_PYTHON), "-c", GYM_PARSE, *files, pair], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "NEMO_GYM_EXTRA_ROOTS": str(GYM_ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    parsed = json.loads(proc.stdout)
    for path in files:
        got = parsed[path]
        for instance in got.values():
            for server in next(iter(instance.values())).values():
                assert server.pop("host") == "127.0.0.1" and server.pop("port") == -1
        assert got == compose(Path(path)), path
    assert len(parsed[pair]) == 5 and "polar_resources_server" in parsed[pair]
