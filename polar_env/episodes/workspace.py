"""An episode's workspace: where the task tree lives and the harness runs, chosen per task.

Before a task's workspace is made, what it shows is checked for the task's answer (``tasks/answers.py``:
the sandbox root, a harness install the agent's tools can read, the grading environment, the image):
a hit refuses the task with one line naming the file.

``auto`` (the default) gives a bubblewrap tree for a task with a base archive (the bundled tasks,
tasks built with ``polar tasks build``) and a container from the task's image otherwise, on the
first engine found (podman, docker, apptainer). ``--sandbox ENGINE`` forces one: a container
engine then runs every task in its image, bubblewrap needs a base archive.

A workspace can be opened by one process and used by another on the same host (the NeMo Gym
resources server seeds it, the agent server runs the harness in it): a ``WorkspaceRef``
(``wire/gym_resources.py``) is what crosses over. Container mounts are fixed at creation, so whoever
opens a container workspace must pass the proxy socket dir and harness install of whoever will run
in it (``WorkspaceMounts``); bubblewrap binds them per command.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from polar_env.sandbox.base import Sandbox, SandboxSpec
from polar_env.tasks.answers import answer_free_image, check_bubblewrap_views
from polar_env.tasks.models import Task
from polar_env.tasks.runtime import (
    WorkspaceUnavailable,
    check_image,
    container_spec,
    hidden_paths,
    history_target,
    task_image,
    task_spec,
)
from polar_env.wire.gym_resources import WorkspaceKind, WorkspaceMounts, WorkspaceRef

SANDBOX_CHOICES = ("auto", "bubblewrap", "docker", "podman", "apptainer")
ENGINE_ORDER = ("podman", "docker", "apptainer")


def engine_available(engine: str) -> bool:
    """The engine's CLI is installed and answers (docker: its daemon too)."""
    exe = shutil.which(engine)
    if exe is None:
        return False
    argv = [exe, "version"] if engine == "apptainer" else [exe, "info", "--format", "{{json .}}"]
    try:
        return subprocess.run(argv, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def default_engine() -> str:
    for engine in ENGINE_ORDER:
        if engine_available(engine):
            return engine
    raise WorkspaceUnavailable(
        "no container engine found (podman, docker or apptainer): install one "
        "(scripts/setup_podman.sh; polar doctor shows what is missing) or use tasks "
        "with a base archive (--tasks bundled)"
    )


def workspace_kind(task: Task, sandbox: str = "auto") -> WorkspaceKind:
    """Where ``task`` runs under ``--sandbox``."""
    if sandbox not in SANDBOX_CHOICES:
        raise WorkspaceUnavailable(f"unknown sandbox {sandbox!r}; choose one of {', '.join(SANDBOX_CHOICES)}")
    if sandbox == "auto":
        return "bubblewrap" if task.base_archive else default_engine()  # type: ignore[return-value]
    if sandbox == "bubblewrap" and task.harbor is not None:
        raise WorkspaceUnavailable(
            f"{task.instance_id}: a Harbor task runs in its environment image: "
            f"use --sandbox podman|docker (or auto)"
        )
    if sandbox == "bubblewrap" and not task.base_archive:
        raise WorkspaceUnavailable(
            f"{task.instance_id}: bubblewrap needs a base archive and the task has none; "
            f"run it in its image with --sandbox podman|docker|apptainer"
        )
    return sandbox  # type: ignore[return-value]


def workspace_kinds(tasks: Iterable[Task], sandbox: str = "auto") -> dict[str, WorkspaceKind]:
    """`workspace_kind` of each task, by its instance id."""
    return {t.instance_id: workspace_kind(t, sandbox) for t in tasks}


def check_engine(kind: WorkspaceKind) -> None:
    """Refuse early, with what to do, when the chosen engine cannot run here."""
    if kind != "bubblewrap" and not engine_available(kind):
        raise WorkspaceUnavailable(
            f"{kind} is not installed or not running: install it (scripts/setup_podman.sh "
            f"for podman; polar doctor shows what is missing) or pick another --sandbox"
        )


@dataclass
class Workspace:
    """An opened workspace; ``close`` removes everything it made (idempotent)."""

    sandbox: Sandbox
    ref: WorkspaceRef
    scratch: Path | None = None

    async def close(self) -> None:
        await self.sandbox.destroy()
        if self.scratch is not None:
            await asyncio.to_thread(shutil.rmtree, self.scratch, True)
            self.scratch = None


def _spec_with(spec: SandboxSpec, mounts: WorkspaceMounts | None) -> SandboxSpec:
    if mounts is None:
        return spec
    return replace(
        spec,
        proxy_socket_dir=Path(mounts.proxy_socket_dir) if mounts.proxy_socket_dir else None,
        harness_dir=Path(mounts.harness_dir) if mounts.harness_dir else None,
    )


def _open(task: Task, spec: SandboxSpec, kind: WorkspaceKind) -> Workspace:
    if kind == "bubblewrap":
        from polar_env.sandbox.bubblewrap import BubblewrapSandbox
        from polar_env.tasks.base_trees import base_cache_dir, warm_base
        from polar_env.tasks.env import env_dir, env_ready

        base = warm_base(task, base_cache_dir())
        env = env_dir(task) if env_ready(task) else None  # its grading environment, when built
        check_bubblewrap_views(task, spec, base.tree, env)  # nothing it shows holds the task's answer
        if spec.scratch_root is not None:
            spec.scratch_root.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f"polar-ws-{task.instance_id}-", dir=spec.scratch_root))
        try:  # one dir to remove: the sandbox root and its snapshot live in scratch
            bw = BubblewrapSandbox.create(
                base.tree, spec=replace(spec, scratch_root=scratch), snapshot=base.git_dir
            )
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        ref = WorkspaceRef(kind=kind, root=str(bw.root), uid=bw.uid, gid=bw.gid, clone=bw.clone)
        return Workspace(bw, ref, scratch)
    if kind in ("docker", "podman"):
        from polar_env.sandbox.container import ContainerSandbox
        from polar_env.sandbox.warm_images import warm_image

        spec, image = container_spec(task, spec, kind), task_image(task)
        # nothing it shows holds the task's answer: copies outside its tree removed, else refused
        warm = answer_free_image(
            task, kind, warm_image(kind, image, spec, history_target(task), hidden_paths(task)), spec
        )
        cs = ContainerSandbox.create(None, spec=spec, image=warm, engine=kind, warm=True)
        ref = WorkspaceRef(
            kind=kind,
            container=cs.name,
            image=image,
            path=cs.path,
            workdir=spec.workdir,
            uid=spec.uid,
            gid=spec.uid,
            clone="overlay",
            userns_base=cs.userns_base,
            home=spec.home,
        )
        return Workspace(cs, ref)
    from polar_env.sandbox.apptainer import ApptainerSandbox, apptainer_image
    from polar_env.tasks.base_trees import apptainer_base

    check_image(task, kind)
    image = apptainer_image(task_image(task))
    base = apptainer_base(image, spec, history_target(task))
    ap = ApptainerSandbox.create(base.tree, spec=spec, image=image, snapshot=base.git_dir)
    return Workspace(
        ap,
        WorkspaceRef(
            kind=kind, root=str(ap.root), image=ap.image, uid=spec.uid, gid=spec.uid, clone=ap.clone
        ),
    )


async def open_workspace(
    task: Task, spec: SandboxSpec, *, sandbox: str = "auto", mounts: WorkspaceMounts | None = None
) -> Workspace:
    """A fresh workspace holding ``task``'s base tree at ``spec.workdir`` (made off the event loop, the
    engine probe ``auto`` may run included)."""
    spec = task_spec(task, _spec_with(spec, mounts))
    return await asyncio.to_thread(lambda: _open(task, spec, workspace_kind(task, sandbox)))


def attach_workspace(ref: WorkspaceRef, spec: SandboxSpec) -> Sandbox:
    """The using side: run commands in a workspace another process opened on this host, with this
    process's own mounts in ``spec``. The opener still owns it: never ``destroy`` an attached sandbox."""
    if ref.kind == "bubblewrap":
        from polar_env.sandbox.bubblewrap import BubblewrapSandbox

        root = Path(ref.root)
        if not (root / "testbed").is_dir():
            raise FileNotFoundError(f"no sandbox workspace at {root} (is the resources server on this host?)")
        return BubblewrapSandbox.attach(replace(spec), root, ref.uid, ref.gid)
    if ref.kind in ("docker", "podman"):
        from polar_env.sandbox.container import ContainerSandbox

        attached = replace(
            spec,
            uid=ref.uid,
            workdir=ref.workdir,
            userns=ref.userns_base is not None,
            home=ref.home or spec.home,
        )
        return ContainerSandbox(
            attached, ref.image, ref.container, engine=ref.kind, path=ref.path, userns_base=ref.userns_base
        )
    from polar_env.sandbox.apptainer import ApptainerSandbox

    return ApptainerSandbox(replace(spec), ref.image, Path(ref.root))
