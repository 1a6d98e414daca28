"""Where a task can run on this machine: the image it runs in (named, checked here, a Harbor task's
built first) and the sandbox spec it asks for (its workdir, a Harbor task's limits, user and compose
environment). Facts about the task, below the workspaces that open it (``episodes/workspace.py``)
and the graders that run its tests in it (``rewards/``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from polar_env.sandbox.base import SandboxSpec
from polar_env.sandbox.history import HistoryTarget
from polar_env.tasks.models import Task
from polar_env.wire.gym_resources import WorkspaceKind


class WorkspaceUnavailable(RuntimeError):
    """No way to run this task here (no engine, no image, no base tree); the message says what to do."""


def instance_image(instance_id: str, namespace: str = "swebench") -> str:
    """The image SWE-bench's harness runs ``instance_id`` in (its own naming, `__` -> `_1776_`)."""
    from swebench.image_builder.image_spec import ImageSpec

    return ImageSpec(instance_id=instance_id, dockerfile="(published)", namespace=namespace).name


def history_target(task: Task) -> HistoryTarget:
    """What the git history of the task's image is reduced to (sandbox/history.py): its ``base_commit``
    (a commit id, or the branch a SWE-smith instance is), else the commit the image has checked out. A
    SWE-smith instance's ancestors hold its answer (the bug's injection, and the removed FAIL_TO_PASS
    files at ``HEAD~1``): its branch's tree alone. The repositories nested below the workdir are reduced
    too, but in a Harbor task (a Terminal-Bench puzzle's repository, reflog included, may be the task)."""
    base = task.base_commit or "HEAD"
    return HistoryTarget(
        f"{base}^{{tree}}" if task.log_parser.startswith("swesmith:") else base, nested=task.harbor is None
    )


def task_image(task: Task) -> str:
    """The image a task runs in: the one it names, else the one SWE-bench publishes for the instance."""
    return task.image or instance_image(task.instance_id)


def check_image(task: Task, kind: WorkspaceKind) -> None:
    """Refuse early when a container task's image is not on this machine (no registry to pull from);
    a Harbor task's image is built here from its ``environment/`` first (cached by content)."""
    from polar_env.sandbox.container import ContainerError, image_exists

    if task.harbor is not None and not task.image and kind in ("docker", "podman"):
        from polar_env.tasks.harbor_image import ensure_harbor_image

        try:
            task.image = ensure_harbor_image(task, kind)
        except ContainerError as exc:
            raise WorkspaceUnavailable(str(exc)) from exc
    image = task_image(task)
    if kind in ("docker", "podman"):
        if not image_exists(kind, image):
            raise WorkspaceUnavailable(
                f"{task.instance_id}: image {image!r} is not in {kind}: build it "
                f"(docs/tasks.md), {kind} pull it or polar tasks pull the task file"
            )
        from polar_env.sandbox.pulled_images import PulledImages

        PulledImages().touch(image)  # most recently used: the last a disk budget prunes
    if kind == "apptainer" and image.endswith(".sif") and not Path(image).is_file():
        raise WorkspaceUnavailable(f"{task.instance_id}: image {image} does not exist")
    check_hidden(task, kind)


def hidden_paths(task: Task) -> tuple[str, ...]:
    """The files of the task's image its dataset's harness keeps from the agent (`Procedure.hidden`):
    gone from every warm image of it, brought back by the grader only."""
    from polar_env.tasks.datasets import procedure_of

    return tuple(procedure_of(task).hidden_paths(task))


def check_hidden(task: Task, kind: WorkspaceKind) -> None:
    """Refuse a task with hidden files where Polar cannot take them out of the image: an apptainer image
    is mounted as it is (its files outside the tree, ``/r2e_tests``, stay readable)."""
    if kind == "apptainer" and (hidden := hidden_paths(task)):
        raise WorkspaceUnavailable(
            f"{task.instance_id}: {task.dataset}'s image keeps {', '.join(hidden[:2])} from the agent, and "
            "Polar removes such files from podman and docker images only: run it with --sandbox podman"
        )


def container_spec(task: Task, spec: SandboxSpec, kind: WorkspaceKind) -> SandboxSpec:
    """``spec`` for a container of ``task``: its image checked (a Harbor task's built first), and for a
    Harbor task, as Harbor runs it: the agent's user is ``[agent] user``, else the image's own (root
    where the image's user is root: then HOME is root's, the image's ``/root``), always in a user
    namespace of the container's own (its root is no host uid of note), with the verifier's paths as
    host directories (`VERIFIER_HOST_DIRS`); ``[environment]`` ``gpus`` (refused where this machine
    cannot give them) and ``storage_mb`` (where the engine can enforce it, sandbox/engine_caps.py)."""
    from polar_env.sandbox import engine_caps
    from polar_env.sandbox.container import ContainerError

    env = task.harbor.config.environment if task.harbor is not None else None
    if env is not None and env.gpus and (why := engine_caps.gpu_problem(env.gpus, kind)):
        raise WorkspaceUnavailable(
            f"{task.instance_id}: task.toml [environment] gpus = {env.gpus}, but {why}"
        )
    check_image(task, kind)
    if task.harbor is None or env is None:
        return spec
    from polar_env.tasks.harbor_config import VERIFIER_HOST_DIRS
    from polar_env.tasks.harbor_image import agent_user

    try:
        uid, name = agent_user(task, kind)
    except ContainerError as exc:
        raise WorkspaceUnavailable(str(exc)) from exc
    storage = (
        env.storage_mb << 20
        if env.storage_mb and engine_caps.storage_limit_supported(kind, task.image)
        else None
    )
    spec = replace(
        spec,
        gpus=env.gpus or None,
        storage_bytes=storage,
        userns=True,
        host_dirs=VERIFIER_HOST_DIRS,
        uid=uid,
        user=name or spec.user,
    )
    return replace(spec, home="/root") if uid == 0 else spec


def task_spec(task: Task, spec: SandboxSpec) -> SandboxSpec:
    """``spec`` in the task's workdir, with a Harbor task's ``[environment]`` limits (cpus, memory) and
    environment: its ``env`` resolved from the host (tasks/harbor_env.py), or, as Harbor does for a
    compose task, its compose ``main`` service's (into which that ``env`` is interpolated)."""
    spec = replace(spec, workdir=task.workdir)
    if task.harbor is None:
        return spec
    env = task.harbor.config.environment
    return replace(
        spec,
        cpus=env.cpus or spec.cpus,
        env={**spec.env, **harbor_env(task)},
        memory_bytes=env.memory_mb << 20 if env.memory_mb else spec.memory_bytes,
    )


def harbor_env(task: Task, section: str = "environment") -> dict[str, str]:
    """What a Harbor task adds to its container's environment: ``[environment] env`` resolved from the
    host and checked (tasks/harbor_env.py), or, as Harbor does for a compose task, its compose ``main``
    service's (into which that ``env`` is interpolated); ``section="verifier.environment"``: that
    table's ``env``, for a separate verifier's container."""
    from polar_env.tasks.harbor_compose import ComposeError, task_compose
    from polar_env.tasks.harbor_env import HarborEnvError, container_env

    assert task.harbor is not None
    config = task.harbor.config
    table = config.verifier.environment if section == "verifier.environment" else config.environment
    try:
        compose = task_compose(task.harbor, task.instance_id) if section == "environment" else None
        return (
            compose.env
            if compose
            else container_env(table.env if table else {}, f"{task.instance_id}: task.toml [{section}] env")
        )
    except (ComposeError, HarborEnvError) as exc:
        raise WorkspaceUnavailable(str(exc)) from exc
