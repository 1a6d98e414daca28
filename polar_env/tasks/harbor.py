"""Harbor task folders as a task source: ``task.toml`` + ``instruction.md`` + ``environment/`` + ``tests/``.

A Harbor task (Terminal-Bench 2.x, SWE-bench Pro, Nemotron terminal tasks) is a folder, graded by its
own ``tests/test.sh`` writing ``/logs/verifier/reward.{json,txt}`` (rewards/harbor_verifier.py), not by
SWE-bench tests. ``task.toml`` is read with ``tomllib`` into :class:`HarborConfig`, which mirrors the
fields of ``harbor.models.task.config.TaskConfig`` (harbor 0.25.0) that Polar acts on and keeps the
rest as they are (``extra="allow"``), so a newer task still loads. A folder becomes a Polar
:class:`~polar_env.tasks.models.Task` whose ``harbor`` field points back at it: the instruction is the
prompt, the image is ``docker_image`` or one built from ``environment/`` (tasks/harbor_image.py), the
workdir is ``[environment] workdir`` or the Dockerfile's last ``WORKDIR``.
"""

from __future__ import annotations

import base64
import io
import re
import shlex
import tarfile
import tomllib
from pathlib import Path

from pydantic import ValidationError

from polar_env.tasks.harbor_compose import ComposeError, task_compose
from polar_env.tasks.harbor_config import HarborConfig, HarborRef
from polar_env.tasks.harbor_env import HarborEnvError, container_env, resolve
from polar_env.tasks.models import INSTANCE_ID_RE, Task

CONFIG = "task.toml"
INSTRUCTION = "instruction.md"
WORKDIR_RE = re.compile(r"^\s*WORKDIR\s+(\S+)\s*$", re.I | re.M)


class HarborTaskError(ValueError):
    """A folder is not a Harbor task Polar can run; the message names the file and the field."""


def is_task_dir(path: Path) -> bool:
    return (path / CONFIG).is_file()


def read_config(path: Path) -> HarborConfig:
    """``task.toml`` of the folder ``path``, as a typed model (a bad file is one error naming it)."""
    file = path / CONFIG
    try:
        data = tomllib.loads(file.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise HarborTaskError(f"{file}: not a readable TOML file: {exc}") from exc
    if "version" in data and "schema_version" not in data:  # harbor renamed it
        data["schema_version"] = data.pop("version")
    try:
        return HarborConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise HarborTaskError(f"{file}: field {field}: {err['msg']}") from None


def task_name(path: Path, config: HarborConfig) -> str:
    """The task's id: ``[task] name``'s short name, else the folder name, made a valid instance id."""
    name = str((config.task or {}).get("name", "")).rsplit("/", 1)[-1] or path.name
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", name).lstrip("-._") or "task"
    if not INSTANCE_ID_RE.match(name):
        raise HarborTaskError(f"{path}: cannot make a task id of {name!r}")
    return name


def dockerfile_workdir(dockerfile: Path) -> str | None:
    """The last ``WORKDIR`` of the environment's Dockerfile (the directory the agent starts in)."""
    if not dockerfile.is_file():
        return None
    found = WORKDIR_RE.findall(dockerfile.read_text())
    return found[-1] if found else None


def check_env(config: HarborConfig, name: str, compose: bool) -> None:
    """Refuse at load, not mid-run, a task whose envs cannot be applied (tasks/harbor_env.py): a host
    variable that is not set, a key Polar sets itself."""
    if not compose:  # a compose task's [environment] env was interpolated (and checked) already
        container_env(config.environment.env, f"{name}: task.toml [environment] env")
    resolve(config.verifier.env, f"{name}: task.toml [verifier] env")
    if config.verifier.environment is not None:
        container_env(config.verifier.environment.env, f"{name}: task.toml [verifier.environment] env")


def load_task_dir(path: Path) -> Task:
    """One Harbor folder as a Polar task."""
    path = path.resolve()
    config = read_config(path)
    if config.steps:
        raise HarborTaskError(f"{path / CONFIG}: multi-step tasks ([[steps]]) are not supported yet")
    instruction = path / INSTRUCTION
    if not instruction.is_file():
        raise HarborTaskError(f"{path}: {INSTRUCTION} is missing (it is the agent's prompt)")
    if not (path / "tests" / "test.sh").is_file():
        raise HarborTaskError(f"{path}: tests/test.sh is missing (the verifier runs `bash /tests/test.sh`)")
    env = config.environment
    ref = HarborRef(path=str(path), config=config)
    name = task_name(path, config)
    try:
        compose = task_compose(ref, name)
        check_env(config, name, compose is not None)
    except (ComposeError, HarborEnvError) as exc:
        raise HarborTaskError(str(exc)) from None
    dockerfile = (
        compose.context / compose.dockerfile
        if compose and compose.context
        else ref.environment_dir / "Dockerfile"
    )
    image = env.docker_image or (compose.image if compose and not dockerfile.is_file() else None)
    if not image and not dockerfile.is_file():
        raise HarborTaskError(
            f"{path}: environment/ has nothing to build: Polar builds environment/Dockerfile "
            f"(or docker-compose.yaml's main service) or runs [environment] docker_image"
        )
    workdir = (
        env.workdir or (compose.workdir if compose else None) or dockerfile_workdir(dockerfile) or "/app"
    )
    return Task(
        instance_id=name,
        repo=f"harbor/{path.name}",
        problem_statement=instruction.read_text(),
        test_patch="",
        FAIL_TO_PASS=[],
        image=image or "",
        workdir=workdir,
        harbor=ref,
    )


def load_harbor(path: Path) -> list[Task]:
    """A task folder, or a folder of task folders (sorted by name)."""
    if is_task_dir(path):
        return [load_task_dir(path)]
    dirs = sorted(p for p in path.iterdir() if p.is_dir() and is_task_dir(p))
    if not dirs:
        raise HarborTaskError(f"{path}: neither a Harbor task folder ({CONFIG}) nor a folder of them")
    tasks = [load_task_dir(d) for d in dirs]
    ids = [t.instance_id for t in tasks]
    if dup := next((i for i in ids if ids.count(i) > 1), None):
        raise HarborTaskError(f"{path}: two tasks named {dup!r}")
    return tasks


def gold_command(task: Task) -> str:
    """A shell command that runs the task's ``solution/solve.sh`` from the workdir, the way Harbor's
    oracle agent does, for the scripted gold policy to send through the harness's shell tool: a
    folder holding only ``solve.sh`` goes as a heredoc, one with helpers as a base64 tarball
    unpacked into ``/tmp/solution`` (the agent's uid cannot create ``/solution``)."""
    assert task.harbor is not None
    sol = task.harbor.solution_dir
    files = sorted(p for p in sol.rglob("*") if p.is_file()) if sol.is_dir() else []
    if not (sol / "solve.sh").is_file():
        raise HarborTaskError(f"{task.harbor.path}: solution/solve.sh is missing (no gold policy)")
    env = "".join(f"export {k}={shlex.quote(v)}; " for k, v in task.harbor.config.solution.env.items())
    if [p.name for p in files] == ["solve.sh"]:
        return (
            f"cd {shlex.quote(task.workdir)} && {env}bash <<'POLAR_SOLVE_EOF'\n"
            f"{(sol / 'solve.sh').read_text().rstrip()}\nPOLAR_SOLVE_EOF"
        )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for p in files:
            tar.add(p, arcname=str(p.relative_to(sol)))
    blob = base64.b64encode(buf.getvalue()).decode()
    return (
        f"mkdir -p /tmp/solution && echo {blob} | base64 -d | tar -xz -C /tmp/solution && "
        f"cd {shlex.quote(task.workdir)} && {env}bash /tmp/solution/solve.sh"
    )
