"""The NeMo-RL recipe and the NeMo Gym configs: they parse, name only real keys, and agree with each other."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from gym_helpers import GYM_ROOT, compose
from repo_paths import REPO

from polar_env.agent_server.core import PolarAgentConfig
from polar_env.harness_adapters.registry import adapter_names
from polar_env.resources_server.core import PolarResourcesConfig

RECIPES = sorted((REPO / "configs").glob("grpo_polar_*.yaml"))
KEYS = REPO / "configs" / "nemo_rl_grpo_keys.txt"
# one Gym config per registered harness: an override of the two servers' own configs
HARNESS_CONFIGS = {name: f"polar_{name.replace('-', '_')}.yaml" for name in adapter_names()}
BASES = [
    "resources_servers/polar/configs/polar.yaml",
    "responses_api_agents/polar_agent/configs/polar_agent.yaml",
]
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
    out[paths] = {k: v for k, v in OmegaConf.to_container(cfg, resolve=False).items() \
if k.startswith("polar")}
print(json.dumps(out))
"""


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def _resolve(node: object, root: dict) -> object:
    """The two interpolations the recipes use: ``${a.b}`` (a path from the root) and ``${mul:${x}, ${y}}``."""
    if isinstance(node, dict):
        return {k: _resolve(v, root) for k, v in node.items()}
    if not isinstance(node, str) or not node.startswith("${") or node.startswith("${oc.env:"):
        return node
    if node.startswith("${mul:"):
        left, right = node[len("${mul:") : -1].split(",")
        return _resolve(left.strip(), root) * _resolve(right.strip(), root)
    value: object = root
    for part in node[2:-1].split("."):
        value = value[part]  # type: ignore[index]
    return _resolve(value, root)


def effective(path: Path) -> dict:
    """A recipe as NeMo-RL's ``load_config`` merges it, as far as this repository holds the chain: its
    ``defaults`` when they are a recipe of configs/ (NeMo-RL's own base is not here, so a rule reads only
    what the recipes set: each rule asks for the values it needs to be written)."""
    raw = yaml.safe_load(path.read_text())
    parent = raw.pop("defaults", None)
    if isinstance(parent, str) and (path.parent / parent).is_file():
        raw = _merge(effective(path.parent / parent), raw)
    return _resolve(raw, raw)  # type: ignore[return-value]


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
    assert {
        "grpo.num_prompts_per_step",
        "loss_fn.ratio_clip_max",
        "env.should_use_nemo_gym",
        "policy.generation.vllm_cfg.expose_http_server",
    } <= exact
    assert "env.nemo_gym." in open_prefixes


@pytest.mark.parametrize("recipe_path", RECIPES, ids=lambda p: p.name)
def test_recipe_names_only_nemo_rl_grpo_keys(recipe_path):
    recipe = yaml.safe_load(recipe_path.read_text())
    exact, open_prefixes = known_keys()
    unknown = [
        k
        for k in dotted_keys(recipe)
        if k != "defaults" and k not in exact and not k.startswith(open_prefixes)
    ]
    assert unknown == []


def test_a_misspelt_key_would_be_caught():
    exact, open_prefixes = known_keys()
    for bad in (
        "grpo.num_prompt_per_step",
        "loss_fn.clip_ratio_high",
        "policy.generation.vllm_cfg.expose_http",
    ):
        assert bad not in exact and not bad.startswith(open_prefixes)


@pytest.mark.parametrize("recipe_path", RECIPES, ids=lambda p: p.name)
def test_recipe_enables_gym_async_rollouts_and_http_vllm(recipe_path):
    r = effective(recipe_path)
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
        assert all(
            set(block) <= {"_inherit_from", "responses_api_agents", "environment_servers"}
            for key, block in raw.items()
            if key != "config_paths"
        )


@pytest.mark.parametrize("harness, name", sorted(HARNESS_CONFIGS.items()))
def test_base_and_override_compose_to_the_pi_config_renamed(harness, name):
    """What each of the 11 copies was: the Pi config with the harness and the instance names changed;
    and the same whichever way round a Gym merges a file with what it pulls in."""
    stem, pi = name[len("polar_") : -len(".yaml")], compose(REPO / "configs" / "polar_pi.yaml")
    want = {key.replace("polar_pi_", f"polar_{stem}_"): value for key, value in pi.items()}
    text = yaml.safe_dump(want).replace("name: polar_pi_agent", f"name: polar_{stem}_agent")
    want = yaml.safe_load(text.replace("harness: pi\n", f"harness: {harness}\n"))
    got = compose(REPO / "configs" / name)
    assert got == want == compose(REPO / "configs" / name, inner_first=False)
    assert set(got) == {"polar_resources_server", f"polar_{stem}_agent", f"polar_{stem}_environment"}


@pytest.mark.parametrize("harness, name", sorted(HARNESS_CONFIGS.items()))
def test_composed_servers_validate_as_polar_configs(harness, name):
    cfg = compose(REPO / "configs" / name)
    stem = name[len("polar_") : -len(".yaml")]
    agent = {
        k: v
        for k, v in cfg[f"polar_{stem}_agent"]["responses_api_agents"]["polar_agent"].items()
        if k in PolarAgentConfig.model_fields and not str(v).startswith("${")
    }
    config = PolarAgentConfig.model_validate(agent)
    assert config.harness == harness
    assert (config.timeout, config.max_tokens) == (1800, 8192)  # the training recipe's, set in the base
    resources = cfg["polar_resources_server"]["resources_servers"]["polar"]
    PolarResourcesConfig.model_validate(
        {
            k: v
            for k, v in resources.items()
            if k in PolarResourcesConfig.model_fields and not str(v).startswith("${")
        }
    )


@pytest.mark.parametrize("harness, name", sorted(HARNESS_CONFIGS.items()))
def test_gym_configs_declare_servers_dataset_and_environment(harness, name):
    cfg = compose(REPO / "configs" / name)
    agent_instance = f"polar_{name[len('polar_') : -len('.yaml')]}_agent"
    resources = cfg["polar_resources_server"]["resources_servers"]["polar"]
    assert resources["entrypoint"] == "app.py" and resources["domain"] == "coding"
    agent = cfg[agent_instance]["responses_api_agents"]["polar_agent"]
    assert agent["harness"] == harness
    assert agent["resources_server"] == {"type": "resources_servers", "name": "polar_resources_server"}
    assert agent["url"] == "${policy_base_url}"
    assert all(d["license"] for d in agent["datasets"])
    env_servers = [v for v in cfg.values() if "environment_servers" in v]
    assert env_servers == [
        {
            "environment_servers": {
                "legacy_agent": {
                    "entrypoint": "app.py",
                    "agent_server": {"type": "responses_api_agents", "name": agent_instance},
                }
            }
        }
    ]


def test_each_base_declares_its_own_server_only():
    resources, agent = (yaml.safe_load((GYM_ROOT / path).read_text()) for path in BASES)
    assert set(resources) == {"polar_resources_server"}
    assert set(agent) == {"polar_agent", "polar_environment"}
    assert (
        agent["polar_environment"]["environment_servers"]["legacy_agent"]["agent_server"]["name"]
        == "polar_agent"
    )


@pytest.mark.skipif(not GYM_PYTHON.exists(), reason="needs the NeMo Gym venv: run scripts/setup_nemo_gym.sh")
def test_nemo_gym_composes_every_harness_config_as_the_test_does():
    """Gym's own parser agrees with ``compose`` on every harness's config (host and port aside), and two
    harnesses in one ``config_paths`` share the one resources server."""
    files = [str(REPO / "configs" / name) for name in sorted(HARNESS_CONFIGS.values())]
    pair = ",".join(files[:2])
    proc = subprocess.run(
        [str(GYM_PYTHON), "-c", GYM_PARSE, *files, pair],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NEMO_GYM_EXTRA_ROOTS": str(GYM_ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    parsed = json.loads(proc.stdout)
    for path in files:
        got = parsed[path]
        for instance in got.values():
            for server in next(iter(instance.values())).values():
                assert server.pop("host") == "127.0.0.1" and server.pop("port") == -1
        assert got == compose(Path(path)), path
    assert len(parsed[pair]) == 5 and "polar_resources_server" in parsed[pair]


# -- what the recipe means to NeMo-RL ----------------------------------------------------------------
# Each rule: what NeMo-RL (at the revision in configs/nemo_rl_grpo_keys.txt) states, where, and the check.
# scripts/check_nemo_rl_recipes.py runs NeMo-RL's own loader and ClippedPGLossFn on the recipes by hand.
TIS_TYPES = ("tis", "icepop", "seq-mask-tis")


def _get(r: dict, dotted: str) -> object:
    node: object = r
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return "<unset>"
        node = node[part]
    return node


def _dense_qwen35(r: dict) -> bool:
    name = str(_get(r, "policy.model_name")).lower().replace("_", ".")
    return "qwen3.5" in name and not re.search(r"-a\d+b", name)


def rule_tis_needs_a_type(r: dict) -> str | None:
    """nemo_rl/algorithms/loss/loss_functions.py, ClippedPGLossFn: the ratio is read only under
    ``truncated_importance_sampling_type`` (tis | icepop | seq-mask-tis); a ratio without a type raises
    "Invalid truncated importance sampling type: None" at the first loss call; a type needs the IS
    correction on and a positive ratio; icepop and seq-mask-tis need ``..._ratio_min``, at most the ratio."""
    lf = r["loss_fn"]
    kind, ratio = lf.get("truncated_importance_sampling_type"), lf.get("truncated_importance_sampling_ratio")
    low = lf.get("truncated_importance_sampling_ratio_min")
    if ratio is not None and kind is None:
        return "truncated_importance_sampling_ratio set without truncated_importance_sampling_type"
    if kind is None:
        return None
    if kind not in TIS_TYPES:
        return f"truncated_importance_sampling_type {kind!r} is none of {TIS_TYPES}"
    if not lf.get("use_importance_sampling_correction"):
        return "truncated importance sampling needs use_importance_sampling_correction"
    if not (isinstance(ratio, int | float) and ratio > 0):
        return "truncated_importance_sampling_ratio must be positive"
    if kind != "tis" and low is None:
        return f"{kind} needs truncated_importance_sampling_ratio_min"
    if low is not None and low > ratio:
        return "truncated_importance_sampling_ratio_min exceeds the ratio"
    return None


def rule_async_needs_is_correction(r: dict) -> str | None:
    """nemo_rl/algorithms/grpo.py, async_grpo_train: asserts ``loss_fn.use_importance_sampling_correction``
    ("must be enabled for async GRPO ... due to off-policy samples") and an async engine
    (``policy.generation.vllm_cfg.async_engine``, also what NeMo Gym needs)."""
    if _get(r, "grpo.async_grpo.enabled") is not True:
        return None
    if r["loss_fn"].get("use_importance_sampling_correction") is not True:
        return "async GRPO without use_importance_sampling_correction"
    if _get(r, "policy.generation.vllm_cfg.async_engine") is not True:
        return "async GRPO without vllm_cfg.async_engine"
    return None


def rule_no_cp_on_dense_qwen35(r: dict) -> str | None:
    """NeMo-RL's docs/guides/models/qwen/qwen3-5.md: "Dense Qwen3.5 and the VLM do not support Context
    Parallel on AutoModel (set cp_size = 1)"; its dense row lists Megatron with TP only, and the validated
    dense recipe (grpo-qwen3.5-9b-1n8g-megatron.yaml) runs Megatron TP4, no CP."""
    if not _dense_qwen35(r):
        return None
    for backend, key in (("dtensor_cfg", "context_parallel_size"), ("megatron_cfg", "context_parallel_size")):
        block = r["policy"].get(backend) or {}
        if block.get("enabled") is not False and block.get(key, 1) not in (1, "<unset>"):
            return f"dense Qwen3.5 with policy.{backend}.{key} = {block.get(key)}"
        if backend == "dtensor_cfg" and block.get("enabled") is not False:
            return (
                "dense Qwen3.5 on DTensor: NeMo-RL validates it on Megatron (set dtensor_cfg.enabled: false)"
            )
    return None


def rule_token_level_importance_weights(r: dict) -> str | None:
    """NeMo-RL issue 2269: sequence-level importance weights (``exp`` of a sum over the sequence) shrank
    40-60-turn episodes' weight to 0.06; ClippedPGLossFn also asserts sequence-level ratios only with
    ``token_level_loss: false``. Agentic episodes keep token-level weights."""
    if r["loss_fn"].get("sequence_level_importance_ratios") is not False:
        return "sequence_level_importance_ratios must be written, and false, for multi-turn episodes"
    return None


def rule_force_on_policy_one_update(r: dict) -> str | None:
    """nemo_rl/algorithms/grpo.py (setup): ``force_on_policy_ratio`` requires ``train_global_batch_size ==
    num_prompts_per_step * num_generations_per_prompt`` (one update per rollout batch)."""
    if r["loss_fn"].get("force_on_policy_ratio") is not True:
        return None
    batch = _get(r, "grpo.num_prompts_per_step") * _get(r, "grpo.num_generations_per_prompt")  # type: ignore[operator]
    if _get(r, "policy.train_global_batch_size") != batch:
        return "force_on_policy_ratio with more than one update per rollout batch"
    return None


def rule_chunked_logprobs_defer_fp32(r: dict) -> str | None:
    """nemo_rl/models/megatron/setup.py: asserts "defer_fp32_logits must be True if logprob_chunk_size
    is set" (Megatron)."""
    mg = r["policy"].get("megatron_cfg") or {}
    if (
        r["policy"].get("logprob_chunk_size")
        and mg.get("enabled")
        and mg.get("defer_fp32_logits") is not True
    ):
        return "logprob_chunk_size without megatron_cfg.defer_fp32_logits"
    return None


def rule_sampling_whole_distribution(r: dict) -> str | None:
    """NeMo-RL's vLLM HTTP server (nemo_rl/models/generation/vllm/vllm_worker_async.py) asserts ``top_k``
    unset or -1 and ``top_p`` given and equal to the recipe's; OpenEnv RFC 006 (capture): narrowing
    knobs are neutralised, since processed logprobs over a truncated distribution are "plausible,
    aligned and wrong" next to the trainer's. So top_k null, top_p 1.0, and the sampler's logprobs
    processed (what vLLM sampled from)."""
    gen = r["policy"]["generation"]
    if gen.get("top_k") is not None or gen.get("top_p") != 1.0:
        return f"narrowed sampling: top_p {gen.get('top_p')}, top_k {gen.get('top_k')}"
    if _get(r, "policy.generation.vllm_cfg.logprobs_mode") != "processed_logprobs":
        return "vllm_cfg.logprobs_mode must be processed_logprobs"
    return None


def rule_staleness_needs_in_flight_updates(r: dict) -> str | None:
    """nemo_rl/algorithms/grpo.py, async_grpo_train: warns that max_trajectory_age_steps > 1 without
    ``in_flight_weight_updates`` gives no benefit."""
    age, in_flight = (
        _get(r, "grpo.async_grpo.max_trajectory_age_steps"),
        _get(r, "grpo.async_grpo.in_flight_weight_updates"),
    )
    if isinstance(age, int) and age > 1 and in_flight is not True:
        return "max_trajectory_age_steps > 1 without in_flight_weight_updates"
    return None


RULES = [
    rule_tis_needs_a_type,
    rule_async_needs_is_correction,
    rule_no_cp_on_dense_qwen35,
    rule_token_level_importance_weights,
    rule_force_on_policy_one_update,
    rule_chunked_logprobs_defer_fp32,
    rule_sampling_whole_distribution,
    rule_staleness_needs_in_flight_updates,
]


@pytest.mark.parametrize("rule", RULES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("recipe_path", RECIPES, ids=lambda p: p.name)
def test_recipe_keeps_nemo_rl_rule(recipe_path, rule):
    assert rule.__doc__ and "nemo" in rule.__doc__.lower()  # each rule says where NeMo-RL states it
    assert rule(effective(recipe_path)) is None


# the recipe before issue 46, as far as these rules read it: both defects a key-name check could not see
BEFORE = {"truncated_importance_sampling_type": None, "truncated_importance_sampling_ratio": 2.0}
BREAKS = {
    rule_tis_needs_a_type: [
        ("loss_fn", BEFORE),
        ("loss_fn", {"truncated_importance_sampling_type": "icepop"}),
        ("loss_fn", {"use_importance_sampling_correction": False}),
    ],
    rule_async_needs_is_correction: [
        (
            "loss_fn",
            {
                "use_importance_sampling_correction": False,
                "truncated_importance_sampling_type": None,
                "truncated_importance_sampling_ratio": None,
            },
        )
    ],
    rule_no_cp_on_dense_qwen35: [
        (
            "policy",
            {
                "dtensor_cfg": {"enabled": True, "context_parallel_size": 2},
                "megatron_cfg": {"enabled": False},
            },
        ),
        ("policy", {"megatron_cfg": {"context_parallel_size": 2}}),
    ],
    rule_token_level_importance_weights: [("loss_fn", {"sequence_level_importance_ratios": True})],
    rule_force_on_policy_one_update: [("policy", {"train_global_batch_size": 64})],
    rule_chunked_logprobs_defer_fp32: [("policy", {"megatron_cfg": {"defer_fp32_logits": False}})],
    rule_sampling_whole_distribution: [
        ("policy", {"generation": {"top_p": 0.95}}),
        ("policy", {"generation": {"top_k": 20}}),
        ("policy", {"generation": {"vllm_cfg": {"logprobs_mode": "raw_logprobs"}}}),
    ],
    rule_staleness_needs_in_flight_updates: [("grpo", {"async_grpo": {"max_trajectory_age_steps": 2}})],
}


@pytest.mark.parametrize("rule", RULES, ids=lambda f: f.__name__)
def test_each_rule_catches_its_defect(rule):
    """Every rule fires on a recipe that breaks it (the pre-46 recipe's two defects among them)."""
    for section, change in BREAKS[rule]:
        broken = effective(RECIPES[0])
        broken[section] = _merge(broken[section], change)
        assert rule(broken) is not None, (rule.__name__, change)


SOURCE_WORDS = (
    "NeMo-RL",
    "SWE example",
    "guide",
    "validated",
    "issue",
    "RFC",
    "Polar's production",
    "GRPOConfig",
    "grpo.py",
    "ClippedPG",
    "DAPO",
)


@pytest.mark.parametrize("recipe_path", RECIPES, ids=lambda p: p.name)
def test_every_loss_and_async_value_names_its_source(recipe_path):
    """Each key under ``loss_fn`` and ``grpo.async_grpo`` sits under (or on) a comment naming a source."""
    uncommented, comment, section, in_async = [], "", None, False
    for line in recipe_path.read_text().splitlines():
        stripped = line.strip()
        if not line.startswith(" ") and stripped and not stripped.startswith("#"):
            section = stripped.rstrip(":")  # a top-level key
            comment = ""
        if not stripped:
            comment = ""
        elif stripped.startswith("#"):
            comment = comment + " " + stripped if comment else stripped
        elif (section == "loss_fn" and line.startswith("  ") and not line.startswith("   ")) or (
            section == "grpo" and line.startswith("    ") and not line.startswith("     ") and in_async
        ):
            text = comment + " " + stripped.partition("#")[2]
            if not any(word in text for word in SOURCE_WORDS):
                uncommented.append(stripped.split(":")[0])
        if (
            section == "grpo"
            and line.startswith("  ")
            and not line.startswith("   ")
            and not stripped.startswith("#")
        ):
            in_async = stripped.startswith("async_grpo:")
    assert uncommented == []
