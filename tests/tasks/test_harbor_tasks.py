"""Harbor task folders without an engine: task.toml's model, the loader, the gold command, the
image's FROM mapping and the verifier's reward rule (the container paths: test_harbor_e2e.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import repo_paths

from polar_env.episodes import episode_prompt
from polar_env.episodes.workspace import workspace_kind
from polar_env.outcomes import DEFAULT_OUTCOMES, FailureKind, OutcomeTable
from polar_env.rewards.harbor_verifier import RewardError, parse_rewards, scalar_reward
from polar_env.sandbox.base import SandboxSpec
from polar_env.sandbox.engine_caps import gpu_count
from polar_env.tasks.harbor import HarborTaskError, gold_command, load_harbor, load_task_dir
from polar_env.tasks.harbor_image import (
    HarborImageError,
    agent_user,
    ensure_harbor_image,
    image_map,
    rewrite_from,
)
from polar_env.tasks.loader import TERMINAL_DIR, TaskLoadError, load_tasks
from polar_env.tasks.models import Task
from polar_env.tasks.runtime import WorkspaceUnavailable, container_spec, task_spec

FIXTURES = repo_paths.FIXTURES / "harbor"


def _task(
    tmp_path: Path,
    toml: str = "",
    *,
    dockerfile: str = "FROM polar-base\nWORKDIR /work\n",
    solution: dict[str, str] | None = None,
) -> Path:
    d = tmp_path / "my-task"
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "task.toml").write_text(toml)
    (d / "instruction.md").write_text("Do the thing.\n")
    (d / "environment" / "Dockerfile").write_text(dockerfile)
    (d / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    for name, text in (solution or {"solve.sh": "echo solved > out.txt\n"}).items():
        (d / "solution" / name).parent.mkdir(parents=True, exist_ok=True)
        (d / "solution" / name).write_text(text)
    return d


def test_terminal_tasks_load_with_their_config():
    tasks = load_tasks("terminal")
    assert len(tasks) >= 6
    assert load_tasks(str(TERMINAL_DIR)) == tasks  # the folder of folders, by path
    for task in tasks:
        assert task.harbor is not None and task.workdir == "/app"
        assert episode_prompt(task) == (Path(task.harbor.path) / "instruction.md").read_text()
        cfg = task.harbor.config
        assert cfg.verifier.timeout_sec == 120.0 and cfg.agent.timeout_sec == 600.0
        assert cfg.environment.memory_mb == 1024 and not cfg.environment.wants_internet
        assert (Path(task.harbor.path) / "solution" / "solve.sh").is_file()
        assert (
            "FROM debian:bookworm-slim" in (task.harbor.environment_dir / "Dockerfile").read_text()
        )  # builds anywhere
    # a task crosses processes (Ray, the Gym servers) as JSON
    assert Task.model_validate_json(tasks[0].model_dump_json()) == tasks[0]


def test_one_folder_config_fields_limits_and_workdir(tmp_path):
    d = _task(
        tmp_path,
        '[task]\nname = "acme/Fancy Task"\n[environment]\ncpus = 2\nmemory_mb = 512\n'
        'network_mode = "public"\nfuture_field = 3\n[verifier]\nuser = "tester"\n',
    )
    (task,) = load_harbor(d)
    assert task.instance_id == "Fancy-Task" and task.workdir == "/work"
    env = task.harbor.config.environment
    assert env.wants_internet and env.model_extra == {"future_field": 3}  # unknown keys kept
    assert task.harbor.config.verifier.user == "tester"
    spec = task_spec(task, SandboxSpec())
    assert (spec.cpus, spec.memory_bytes, spec.workdir) == (2.0, 512 << 20, "/work")
    with pytest.raises(WorkspaceUnavailable, match="Harbor task runs in its environment image"):
        workspace_kind(task, "bubblewrap")


def test_broken_folders_are_one_clear_error(tmp_path):
    d = _task(tmp_path, "[verifier]\ntimeout_sec = 'soon'\n")
    with pytest.raises(HarborTaskError, match=r"task.toml: field verifier.timeout_sec"):
        load_task_dir(d)
    (d / "task.toml").write_text("[verifier\n")
    with pytest.raises(HarborTaskError, match="not a readable TOML file"):
        load_task_dir(d)
    (d / "task.toml").write_text("")
    (d / "tests" / "test.sh").unlink()
    with pytest.raises(HarborTaskError, match="tests/test.sh is missing"):
        load_task_dir(d)
    with pytest.raises(TaskLoadError, match="neither a Harbor task folder"):
        load_tasks(str(tmp_path / "my-task" / "environment"))


def test_gold_command_runs_solve_sh_from_the_workdir(tmp_path):
    (task,) = load_harbor(_task(tmp_path))
    work = tmp_path / "work"
    work.mkdir()
    cmd = gold_command(task).replace("cd /work", f"cd {work}")
    subprocess.run(["bash", "-c", cmd], check=True)
    assert (work / "out.txt").read_text() == "solved\n"
    # with helpers: a tarball unpacked into /tmp/solution, solve.sh run from there
    (task,) = load_harbor(
        _task(
            tmp_path / "b",
            solution={
                "solve.sh": "bash /tmp/solution/lib/helper.sh\n",
                "lib/helper.sh": "echo helped > out.txt\n",
            },
        )
    )
    cmd = gold_command(task).replace("cd /work", f"cd {work}")
    subprocess.run(["bash", "-c", cmd], check=True)
    assert (work / "out.txt").read_text() == "helped\n"
    shutil.rmtree("/tmp/solution", ignore_errors=True)


def test_from_lines_are_mapped_and_a_missing_base_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("POLAR_IMAGE_MAP", "ubuntu:24.04=localhost/mine:1")
    mapping = image_map()
    assert mapping["ubuntu:24.04"] == "localhost/mine:1" and mapping["polar-base"].startswith(
        "localhost/polar-base:"
    )
    text, bases = rewrite_from(
        "FROM --platform=linux/amd64 ubuntu:24.04 AS build\nRUN x\nFROM build\n", mapping
    )
    assert text.splitlines()[0] == "FROM --platform=linux/amd64 localhost/mine:1 AS build"
    assert bases == ["localhost/mine:1"]  # `FROM build` is a stage, not an image
    (task,) = load_harbor(_task(tmp_path, dockerfile="FROM python:3.12-slim\nWORKDIR /app\n"))
    with pytest.raises(
        HarborImageError, match=r"FROM python:3.12-slim, which is not in podman.*POLAR_IMAGE_MAP"
    ):
        ensure_harbor_image(task, "podman")
    monkeypatch.setenv("POLAR_IMAGE_MAP", "oops")
    with pytest.raises(HarborImageError, match="not NAME=LOCAL_IMAGE"):
        image_map()


def test_docker_image_is_used_as_is(tmp_path):
    (task,) = load_harbor(_task(tmp_path, '[environment]\ndocker_image = "registry.example/img:7"\n'))
    assert task.image == "registry.example/img:7" and ensure_harbor_image(task) == "registry.example/img:7"


@pytest.mark.parametrize(
    ("name", "text", "rewards"),
    [
        ("reward.txt", "1\n", {"reward": 1.0}),
        ("reward.txt", " 0.25 ", {"reward": 0.25}),
        ("reward.json", '{"reward": 1, "tests_passed": 7}', {"reward": 1.0, "tests_passed": 7.0}),
        ("reward.json", "0.5", {"reward": 0.5}),
    ],
)
def test_reward_files_parse_as_harbor_reads_them(name, text, rewards):
    assert parse_rewards(name, text) == rewards


@pytest.mark.parametrize(
    ("name", "text", "why"),
    [
        ("reward.txt", "", "empty"),
        ("reward.txt", "passed", "not one number"),
        ("reward.txt", "nan", "finite"),
        ("reward.json", "{", "not JSON"),
        ("reward.json", "{}", "empty object"),
        ("reward.json", '{"reward": "1"}', "not a finite number"),
        ("reward.json", '{"reward": true}', "finite"),
    ],
)
def test_unreadable_rewards_are_errors_not_zero(name, text, why):
    with pytest.raises(RewardError, match=why):
        parse_rewards(name, text)


def test_scalar_rule_for_multi_key_rewards():
    assert scalar_reward({"reward": 0.5, "other": 1.0}) == 0.5
    assert scalar_reward({"accuracy": 0.75}) == 0.75
    assert scalar_reward({"a": 0.1, "b": 0.9}, "b") == 0.9
    with pytest.raises(RewardError, match="--reward-key"):
        scalar_reward({"a": 0.1, "b": 0.9})
    with pytest.raises(RewardError, match="no key 'c'"):
        scalar_reward({"a": 0.1}, "c")


def test_no_reward_is_masked_by_default_never_zero():
    assert FailureKind.no_reward.outside_policy
    assert DEFAULT_OUTCOMES[FailureKind.no_reward].mask
    assert OutcomeTable().apply(FailureKind.no_reward, 0.0) == (0.0, True)
    assert FailureKind.from_wire("polar:no_reward") is FailureKind.no_reward


def test_fixture_without_reward_loads():
    (task,) = load_harbor(FIXTURES / "no-reward")
    assert task.instance_id == "no-reward" and task.workdir == "/app"


@pytest.mark.parametrize("user", ['"root"', "0", '"0:0"', '"root:root"'])
def test_an_agent_user_of_root_is_root_without_any_lookup(tmp_path, user):
    """Harbor runs the agent as root where the task (or its image) says so; Polar too, in a user
    namespace of the container's own (tasks/runtime.py)."""
    (task,) = load_harbor(_task(tmp_path, f"[agent]\nuser = {user}\n"))
    assert agent_user(task, "no-such-engine") == (0, "root")  # the engine is never asked


def test_an_agent_user_by_number_needs_no_lookup(tmp_path):
    (task,) = load_harbor(_task(tmp_path, "[agent]\nuser = 1234\n"))
    assert agent_user(task, "no-such-engine") == (1234, "")


def test_separate_verifier_rule_and_artifacts(tmp_path):
    from polar_env.rewards.harbor_separate import artifact_sources, sanitise
    from polar_env.sandbox.container import ContainerError

    (task,) = load_harbor(FIXTURES / "separate-verifier")
    assert task.harbor.config.verifier.separate
    assert artifact_sources(task) == [("/logs/artifacts", []), ("/app/out", ["*.tmp"])]
    # Harbor's rule: a [verifier.environment] table implies separate, unless the mode says otherwise
    (task,) = load_harbor(_task(tmp_path, '[verifier.environment]\ndocker_image = "img:1"\n'))
    assert task.harbor.config.verifier.separate
    (task,) = load_harbor(_task(tmp_path / "b", 'artifacts = ["../x"]\n'))
    assert not task.harbor.config.verifier.separate
    with pytest.raises(ContainerError, match="not an absolute path"):
        artifact_sources(task)
    with pytest.raises(HarborTaskError, match="incompatible"):
        load_harbor(
            _task(
                tmp_path / "c", '[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\ncpus = 1\n'
            )
        )
    # a copied artifact keeps only directories and regular files, none excluded, no setuid bit
    art = tmp_path / "art"
    (art / "sub").mkdir(parents=True)
    (art / "keep.txt").write_text("k")
    (art / "sub" / "drop.tmp").write_text("d")
    (art / "tool").write_text("t")
    (art / "tool").chmod(0o4755)
    (art / "link").symlink_to("/etc/passwd")
    import os

    os.mkfifo(art / "fifo")
    sanitise(art, ["*.tmp"])
    assert sorted(str(p.relative_to(art)) for p in art.rglob("*")) == ["keep.txt", "sub", "tool"]
    assert (art / "tool").stat().st_mode & 0o7777 == 0o755


def test_storage_and_gpus_become_container_flags():
    from polar_env.sandbox.container import ContainerSandbox

    spec = SandboxSpec(gpus=2, storage_bytes=2 << 30)
    podman = ContainerSandbox(spec, "img", "polar-x", engine="podman").create_argv()
    assert " --device nvidia.com/gpu=0 --device nvidia.com/gpu=1 " in f" {' '.join(podman)} "
    assert " --storage-opt size=2147483648 " in f" {' '.join(podman)} "
    docker = ContainerSandbox(spec, "img", "polar-x", engine="docker").create_argv()
    assert " --gpus 2 " in f" {' '.join(docker)} " and "nvidia.com/gpu=0" not in docker
    plain = ContainerSandbox(SandboxSpec(), "img", "polar-x", engine="podman").create_argv()
    assert "--storage-opt" not in plain and "--device" not in plain and "--gpus" not in plain


@pytest.mark.skipif(gpu_count() > 0, reason="this machine has GPUs: the refusal is for one without")
def test_a_task_asking_for_gpus_is_refused_where_there_are_none(tmp_path):
    (task,) = load_harbor(_task(tmp_path, "[environment]\ngpus = 1\n"))
    with pytest.raises(
        WorkspaceUnavailable,
        match=r"my-task: task.toml \[environment\] gpus = 1, but it asks "
        r"for 1 GPU\(s\) and this machine has 0",
    ):
        container_spec(task, SandboxSpec(), "podman")  # before any image is built


def test_a_compose_main_service_loads_and_others_are_refused(tmp_path):
    (task,) = load_harbor(FIXTURES / "compose-main")
    assert task.workdir == "/srv" and task.image == ""  # built from the main service's context
    spec = task_spec(task, SandboxSpec())
    assert spec.env["GREETING"] == "hello" and spec.env["TEST_DIR"] == "/tests" and spec.env["TZ"] == "UTC"

    def refused(compose: str, match: str) -> None:
        d = _task(tmp_path / str(len(list(tmp_path.iterdir()))))
        (d / "environment" / "docker-compose.yaml").write_text(compose)
        with pytest.raises(HarborTaskError, match=match):
            load_task_dir(d)

    refused(
        "services:\n  main: {}\n  db:\n    image: postgres:16\n",
        r"my-task: environment/docker-compose.yaml: services db beside main would have to run too",
    )
    refused("services:\n  main:\n    volumes: [/data:/data]\n", r"services.main.volumes cannot be honoured")
    refused("services:\n  main:\n    build: {context: ..}\n", r"must be\s+inside environment/")
    refused("services:\n  main:\n    image: ${REGISTRY}/x\n", r"\$\{REGISTRY\} is neither Harbor's")
    refused("services:\n  sidecar: {}\n", r"services sidecar beside main")
    # an image-only main service, and no Dockerfile: the image, used as is
    d = _task(tmp_path / "img")
    (d / "environment" / "Dockerfile").unlink()
    (d / "environment" / "docker-compose.yaml").write_text(
        "services:\n  main:\n    image: ${IMG:-local/img:1}\n"
    )
    assert load_task_dir(d).image == "local/img:1"


ENV_TOML = (
    '[environment.env]\nGREETING = "hello"\nTOKEN = "${POLAR_TEST_HOST_VAR}"\n'
    'MODE = "${POLAR_TEST_UNSET:-fast}"\nEMPTY = "${POLAR_TEST_UNSET:-}"\n'
    'LITERAL = "a${POLAR_TEST_HOST_VAR}b"\n'
)


def test_environment_env_reaches_every_command_of_the_container(tmp_path, monkeypatch):
    """Harbor's persistent env: the container's own, and every exec's (the harness's, root's setup,
    a shared verifier's), with ``${VAR}`` / ``${VAR:-default}`` read from the host as Harbor reads them."""
    from polar_env.sandbox.container import ROOT_PATH, ContainerSandbox

    monkeypatch.setenv("POLAR_TEST_HOST_VAR", "from-host")
    monkeypatch.delenv("POLAR_TEST_UNSET", raising=False)
    (task,) = load_harbor(_task(tmp_path, ENV_TOML))
    spec = task_spec(task, SandboxSpec())
    want = {
        "GREETING": "hello",
        "TOKEN": "from-host",
        "MODE": "fast",
        "EMPTY": "",
        "LITERAL": "a${POLAR_TEST_HOST_VAR}b",
    }
    assert {k: spec.env[k] for k in want} == want and spec.env["TZ"] == "UTC"
    box = ContainerSandbox(spec, "img", "polar-x", engine="podman")
    create = box.create_argv()
    for argv in (create, box.exec_argv(["true"], {}), box.exec_argv(["true"], {}, user="0")):
        assert all(f"{k}={v}" in argv for k, v in want.items()), argv
    assert f"PATH={ROOT_PATH}" in box.exec_argv(["true"], {}, user="0")  # root's PATH still pinned
    assert "-e" in create and create.index("TOKEN=from-host") < create.index("img")  # before the image
    # no [environment] env: the spec's environment as it was
    (plain,) = load_harbor(_task(tmp_path / "plain"))
    assert task_spec(plain, SandboxSpec()).env == SandboxSpec().env


def test_an_unset_host_variable_and_a_key_polar_sets_are_refused_at_load(tmp_path, monkeypatch):
    monkeypatch.delenv("POLAR_TEST_UNSET", raising=False)
    cases = [
        (
            '[environment.env]\nTOKEN = "${POLAR_TEST_UNSET}"\n',
            r"my-task: task.toml \[environment\] env: TOKEN = '\$\{POLAR_TEST_UNSET\}', but "
            r"\$\{POLAR_TEST_UNSET\} is not set in the host's environment",
        ),
        ('[verifier.env]\nJUDGE = "${POLAR_TEST_UNSET}"\n', r"my-task: task.toml \[verifier\] env: JUDGE"),
        ('[verifier.environment.env]\nX = "${POLAR_TEST_UNSET}"\n', r"\[verifier.environment\] env: X"),
        (
            '[environment.env]\nPATH = "/opt/x/bin:/usr/bin"\nOPENAI_BASE_URL = "http://evil"\n'
            'LD_PRELOAD = "/testbed/x.so"\npolar_session_key = "k"\nOK = "1"\n',
            r"my-task: task.toml \[environment\] env: LD_PRELOAD, OPENAI_BASE_URL, PATH, polar_session_key "
            r"cannot be set by a task: Polar sets them",
        ),
        (
            '[verifier.environment.env]\nHTTPS_PROXY = "http://x"\n',
            r"\[verifier.environment\] env: HTTPS_PROXY",
        ),
    ]
    for i, (toml, match) in enumerate(cases):
        with pytest.raises(HarborTaskError, match=match):
            load_task_dir(_task(tmp_path / str(i), toml))


def test_every_key_polar_sets_in_a_sandbox_is_reserved():
    """What pins every command (HOME, PATH, ...) and what every harness adapter points at the proxy
    with (a value holding the session's key or the proxy's address) is refused to a task."""
    from polar_env.harness_adapters.base import HarnessContext
    from polar_env.harness_adapters.registry import ADAPTERS
    from polar_env.sandbox.base import DEFAULT_ENV
    from polar_env.tasks.harbor_env import reserved

    assert all(reserved(k) for k in set(SandboxSpec().base_env()) - set(DEFAULT_ENV))
    ctx = HarnessContext(session_id="sess-1", session_key="sk-polar-secret", model_name="policy", port=18080)
    proxy_keys = {
        k
        for adapter in ADAPTERS.values()
        for k, v in adapter().env(ctx).items()
        if ctx.session_key in v or ctx.server_root in v or k.endswith("_KEY")
    }
    assert proxy_keys and {k for k in proxy_keys if not reserved(k)} == set()
    assert not any(reserved(k) for k in ("GREETING", "PYTHONPATH", "TZ", "LANG", "DEBIAN_FRONTEND"))


def test_a_compose_task_gets_its_env_through_interpolation_only(tmp_path, monkeypatch):
    """Harbor passes a compose task's [environment] env to compose (its own variables win), not to the
    container: only what main's environment names of it arrives."""
    monkeypatch.setenv("POLAR_TEST_HOST_VAR", "from-host")
    d = _task(
        tmp_path, '[environment.env]\nNAME = "${POLAR_TEST_HOST_VAR}"\nTEST_DIR = "/mine"\nUNUSED = "u"\n'
    )
    (d / "environment" / "docker-compose.yaml").write_text(
        "services:\n  main:\n    environment:\n      WHO: ${NAME}\n      TESTS: ${TEST_DIR}\n"
    )
    (task,) = load_harbor(d)
    env = task_spec(task, SandboxSpec()).env
    assert (
        env["WHO"] == "from-host" and env["TESTS"] == "/tests" and "UNUSED" not in env and "NAME" not in env
    )
    (d / "environment" / "docker-compose.yaml").write_text("services:\n  main:\n    environment: [PATH=/x]\n")
    with pytest.raises(HarborTaskError, match=r"services.main.environment: PATH cannot be set by a task"):
        load_task_dir(d)


def test_a_separate_verifier_gets_its_own_environment_env(tmp_path):
    """Harbor's separate verifier runs in [verifier.environment] (its env, not [environment]'s), else in
    a copy of [environment] (its env too)."""
    from polar_env.rewards.harbor_separate import verifier_spec
    from polar_env.sandbox.container import ContainerSandbox

    def spec_of(toml: str, where: Path) -> dict[str, str]:
        (task,) = load_harbor(_task(where, toml))
        agent = ContainerSandbox(task_spec(task, SandboxSpec()), "img", "polar-x", engine="podman")
        return verifier_spec(task, agent).env

    own = spec_of(
        '[environment.env]\nA = "1"\nTZ = "Europe/Paris"\n[verifier.environment]\ncpus = 1\n'
        '[verifier.environment.env]\nB = "2"\n',
        tmp_path / "own",
    )
    assert own["B"] == "2" and "A" not in own and own["TZ"] == "UTC"
    copy = spec_of(
        '[environment.env]\nA = "1"\n[verifier]\nenvironment_mode = "separate"\n', tmp_path / "copy"
    )
    assert copy["A"] == "1"
