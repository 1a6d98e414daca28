"""A Harbor task's ``environment/docker-compose.yaml``: Polar runs its ``main`` service, alone.

Harbor lays the file over its own base (``main`` built from ``environment/``, kept alive with
``sleep infinity``) and starts every service with docker compose. Polar has no compose: the episode's
one container is ``main``, built from its ``build`` (``context``, ``dockerfile``), else from
``environment/Dockerfile`` as Harbor's base does, else its ``image`` used as is, with its
``environment`` and ``working_dir``. Refused, with one error naming the task: another service (a
database the agent's program talks to cannot run here), a ``main`` key that would change what runs
(``volumes``, ``depends_on``, network settings, privileges, ...), a build context outside
``environment/`` (it could hold ``tests/`` or ``solution/``), and a variable that is neither Harbor's
(``${CONTEXT_DIR}``, ``${MAIN_IMAGE_NAME}``, ``${TEST_DIR}``, ``${CPUS}``, ``${MEMORY}``, ...) nor one of
task.toml's ``[environment] env`` (resolved as Harbor does, tasks/harbor_env.py; Harbor's own win on a
clash) nor has a ``${VAR:-default}``: no other host variable leaks into a task. As in Harbor, a compose
task's ``[environment] env`` reaches the container only through this interpolation, and ``main``'s
``environment`` may not set what Polar pins (tasks/harbor_env.py ``reserved``). Keys that only shape how
compose runs the service (``command``, the ``deploy`` limits Harbor fills from task.toml, ``container_name``,
...) are ignored: task.toml's ``[environment]`` limits apply as for any task.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from polar_env.tasks.harbor_config import HarborRef
from polar_env.tasks.harbor_env import HarborEnvError, check_keys, resolve

COMPOSE_FILE = "docker-compose.yaml"
MAIN = "main"
APPLIED = {"build", "image", "environment", "working_dir"}
IGNORED = {
    "command",
    "container_name",
    "deploy",
    "pull_policy",
    "tty",
    "stdin_open",
    "init",
    "expose",
    "ports",
    "platform",
    "healthcheck",
    "restart",
    "labels",
    "hostname",
    "entrypoint",
}
TOP_LEVEL = {"services", "version", "name"}
VAR_RE = re.compile(r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


class ComposeError(ValueError):
    """The compose file cannot run here; the message names the task and what is refused."""


@dataclass(frozen=True)
class ComposeMain:
    """What Polar takes of the ``main`` service."""

    context: Path | None = None  # a build context inside environment/ (None: no build key)
    dockerfile: str = "Dockerfile"  # relative to the context
    image: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None


def harbor_vars(
    env_dir: Path, cpus: float | None, memory_mb: int | None, docker_image: str | None
) -> dict[str, str]:
    """The variables Harbor sets for its compose files, as they mean here."""
    return {
        "CONTEXT_DIR": str(env_dir),
        "MAIN_IMAGE_NAME": "",
        "PREBUILT_IMAGE_NAME": docker_image or "",
        "TEST_DIR": "/tests",
        "CPUS": f"{cpus:g}" if cpus else "",
        "MEMORY": f"{memory_mb}M" if memory_mb else "",
    }


def _interpolate(value: Any, known: dict[str, str], where: str) -> Any:
    if isinstance(value, dict):
        return {k: _interpolate(v, known, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, known, where) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        if name in known and (known[name] or m.group(2) != ":-"):
            return known[name]
        if m.group(2) is not None:
            return m.group(3)
        raise ComposeError(
            f"{where}: ${{{name}}} is neither Harbor's nor in task.toml's [environment] env "
            f"nor given a default (${{{name}:-...}})"
        )

    return VAR_RE.sub(sub, value)


def _env(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v) for k, v in value.items()}
    if isinstance(value, list):
        return {key: val for key, _, val in (str(item).partition("=") for item in value)}
    raise ComposeError(f"{where}: services.main.environment is neither a mapping nor a list")


def compose_main(env_dir: Path, task_id: str, known: dict[str, str]) -> ComposeMain:
    """``env_dir/docker-compose.yaml``'s ``main`` service, checked (``known``: the task's
    ``[environment] env`` under `harbor_vars`)."""
    file = env_dir / COMPOSE_FILE
    where = f"{task_id}: environment/{COMPOSE_FILE}"
    try:
        data = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ComposeError(f"{where}: not a readable YAML file: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("services"), dict):
        raise ComposeError(f"{where}: no services mapping")
    if extra := sorted(k for k in data if k not in TOP_LEVEL and not str(k).startswith("x-")):
        raise ComposeError(
            f"{where}: top-level {', '.join(map(str, extra))} not supported (only {MAIN} runs here)"
        )
    services = data["services"]
    if others := sorted(str(k) for k in services if k != MAIN):
        raise ComposeError(
            f"{where}: services {', '.join(others)} beside {MAIN} would have to run too, and Polar "
            f"runs only the {MAIN} container (no compose here)"
        )
    main = services.get(MAIN)
    if not isinstance(main, dict):
        raise ComposeError(f"{where}: no services.{MAIN} (Harbor's primary service)")
    if refused := sorted(str(k) for k in main if k not in APPLIED | IGNORED):
        raise ComposeError(f"{where}: services.{MAIN}.{', '.join(refused)} cannot be honoured here")
    main = _interpolate(main, known, where)
    build = main.get("build")
    context: Path | None = None
    dockerfile = "Dockerfile"
    if build is not None:
        spec = {"context": build} if isinstance(build, str) else build
        if not isinstance(spec, dict) or not isinstance(spec.get("context", "."), str):
            raise ComposeError(
                f"{where}: services.{MAIN}.build is neither a path nor a mapping with a context"
            )
        if refused := sorted(k for k in spec if k not in ("context", "dockerfile")):
            raise ComposeError(f"{where}: services.{MAIN}.build.{', '.join(refused)} cannot be honoured here")
        context = (env_dir / spec.get("context", ".")).resolve()
        dockerfile = str(spec.get("dockerfile", "Dockerfile"))
        if not context.is_relative_to(env_dir.resolve()) or ".." in Path(dockerfile).parts:
            raise ComposeError(
                f"{where}: the build context {spec.get('context')!r} (and its dockerfile) must be "
                f"inside environment/ (the agent never sees tests/ or solution/)"
            )
        if not (context / dockerfile).is_file():
            raise ComposeError(f"{where}: services.{MAIN}.build: {dockerfile} is not in its context")
    image = main.get("image") or None
    if context is None and image is None and not (env_dir / "Dockerfile").is_file():
        raise ComposeError(
            f"{where}: services.{MAIN} has neither build nor image, and environment/ has no Dockerfile"
        )
    env = _env(main.get("environment"), where)
    try:
        check_keys(env, f"{where}: services.{MAIN}.environment")
    except HarborEnvError as exc:
        raise ComposeError(str(exc)) from None
    return ComposeMain(
        context=context,
        dockerfile=dockerfile,
        image=str(image) if image else None,
        env=env,
        workdir=main.get("working_dir") or None,
    )


def task_compose(ref: HarborRef, task_id: str) -> ComposeMain | None:
    """The task's compose ``main`` service, or None where ``environment/`` has no compose file."""
    env_dir = ref.environment_dir
    if not (env_dir / COMPOSE_FILE).is_file():
        return None
    env = ref.config.environment
    try:
        task_env = resolve(env.env, f"{task_id}: task.toml [environment] env")
    except HarborEnvError as exc:
        raise ComposeError(str(exc)) from None
    return compose_main(
        env_dir, task_id, {**task_env, **harbor_vars(env_dir, env.cpus, env.memory_mb, env.docker_image)}
    )
