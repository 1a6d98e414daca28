"""A separate verifier environment, as harbor 0.25 runs one (``[verifier] environment_mode = "separate"``,
or a ``[verifier.environment]`` table, which implies it).

The verifier does not run in the container the agent left but in a fresh one, so nothing the agent
did reaches it except its **artifacts**: the paths task.toml's ``artifacts`` lists (a path, or a table
with ``source`` and ``exclude``) and Harbor's convention directory ``/logs/artifacts``, copied out of
the agent's container once its processes are dead and put back at the same paths in the fresh one
(``[[verifier.collect]]`` hooks run in the agent's container first, as Harbor runs them).
As Harbor's tar ``data`` filter does, links, devices and fifos are dropped and setuid/setgid bits
cleared on the way; a listed path the agent did not leave is skipped (Harbor collects best-effort).
The image is Harbor's choice (tasks/harbor_image.py ``verifier_image``): ``[verifier.environment]
docker_image``, or ``tests/Dockerfile`` built, both holding the tests themselves, else a fresh
container of the task's own environment image, into which ``tests/`` is copied. The fresh container
has no network (``--network none``, no proxy socket, no harness), the limits of ``[verifier.environment]``
(else the task's), the agent's uid owning its workdir as in the agent's container, and is removed when
the verifier is done; the agent's container is left to its episode.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

from polar_env.sandbox.base import DEFAULT_ENV, SandboxSpec, run_process_tree
from polar_env.sandbox.container import ContainerError, ContainerSandbox, engine_run
from polar_env.tasks.harbor_config import TESTS_DIR
from polar_env.tasks.models import Task
from polar_env.tasks.runtime import harbor_env

log = logging.getLogger(__name__)
ARTIFACTS_DIR = "/logs/artifacts"  # Harbor's convention directory, always collected
HOOK_OUTPUT_BYTES = 1 << 20  # what a hook's log keeps, as a sandbox run's


def artifact_sources(task: Task) -> list[tuple[str, list[str]]]:
    """``(source, exclude patterns)`` of each artifact, the convention directory first; a source that
    is not an absolute path, has a ``..`` part, or names a compose service other than ``main`` is refused."""
    assert task.harbor is not None
    found: list[tuple[str, list[str]]] = [(ARTIFACTS_DIR, [])]
    for entry in task.harbor.config.artifacts:
        item = {"source": entry} if isinstance(entry, str) else entry
        source, service = str(item.get("source", "")), item.get("service")
        if not source.startswith("/") or ".." in Path(source).parts:
            raise ContainerError(
                f"{task.instance_id}: task.toml artifacts: {source!r} is not an absolute path without '..'"
            )
        if service not in (None, "main"):
            raise ContainerError(
                f"{task.instance_id}: task.toml artifacts: service {service!r}: compose services "
                f"other than main are not run here"
            )
        found.append((source.rstrip("/") or "/", [str(p) for p in item.get("exclude", [])]))
    return found


def collect_hooks(task: Task) -> list[tuple[str, str, float]]:
    """``[[verifier.collect]]``'s ``(command, user, timeout)``: what the task runs in the agent's
    container before its artifacts are copied (to snapshot state into files; a failing one is logged,
    as Harbor does); the user defaults to the agent's uid, as test.sh's does; a hook for another
    compose service is refused."""
    assert task.harbor is not None
    hooks = []
    for hook in (task.harbor.config.verifier.model_extra or {}).get("collect", []):
        if hook.get("service", "main") != "main":
            raise ContainerError(
                f"{task.instance_id}: task.toml [[verifier.collect]] service {hook['service']!r}: "
                f"compose services other than main are not run here"
            )
        user = hook.get("user")
        hooks.append(
            (str(hook["command"]), "" if user is None else str(user), float(hook.get("timeout_sec", 60.0)))
        )
    return hooks


def sanitise(root: Path, exclude: list[str]) -> None:
    """Keep only directories and regular files under ``root`` (a copied artifact), none matching an
    ``exclude`` pattern (by relative path or name), with setuid, setgid and sticky bits cleared."""
    paths = [root, *root.rglob("*")] if root.is_dir() and not root.is_symlink() else [root]
    for path in sorted(paths, key=lambda p: len(p.parts), reverse=True):
        rel = str(path.relative_to(root)) if path != root else path.name
        mode = path.lstat().st_mode
        if (
            any(fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(path.name, pat) for pat in exclude)
            and path != root
        ):
            shutil.rmtree(path) if stat.S_ISDIR(mode) else path.unlink()
        elif not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            path.unlink()
        else:
            os.chmod(path, stat.S_IMODE(mode) & ~(stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX))


def _collect(
    agent: ContainerSandbox, sources: list[tuple[str, list[str]]], into: Path
) -> list[tuple[str, Path]]:
    """Copy each source out of the agent's container (skipping what is not there), sanitised."""
    got: list[tuple[str, Path]] = []
    for i, (source, exclude) in enumerate(sources):
        there = agent.exec_argv(["sh", "-c", 'test -e "$1" || test -L "$1"', "sh", source], {}, user="0")
        try:
            engine_run(there)
        except ContainerError:
            continue  # not left by the agent
        dest = into / str(i)
        engine_run(agent.cp_out_argv(source, dest))
        if dest.exists() or dest.is_symlink():
            sanitise(dest, exclude)
            if dest.exists():
                got.append((source, dest))
    return got


def _place(box: ContainerSandbox, artifacts: list[tuple[str, Path]]) -> None:
    """Each artifact at its own path in the fresh container, root's and readable."""
    for source, copy in artifacts:
        parent = str(Path(source).parent)
        engine_run(
            box.exec_argv(["sh", "-c", 'rm -rf "$1" && mkdir -p "$2"', "sh", source, parent], {}, user="0")
        )
        engine_run(box.cp_in_argv(copy, source))
        engine_run(
            box.exec_argv(["sh", "-c", 'chown -R 0:0 "$1" && chmod -R a+rX "$1"', "sh", source], {}, user="0")
        )


def verifier_spec(task: Task, agent: ContainerSandbox, bundled: bool = False) -> SandboxSpec:
    """The fresh container's spec: the agent's uid and workdir, no proxy and no harness, the verifier's
    host directories (less /tests where the image holds the tests: ``bundled``), the limits and ``env``
    of ``[verifier.environment]`` where it is given (in place of ``[environment]``'s), else the agent's
    container's (Harbor: a copy of ``[environment]``)."""
    assert task.harbor is not None
    venv = task.harbor.config.verifier.environment
    spec = replace(
        agent.spec,
        proxy_socket_dir=None,
        harness_dir=None,
        host_dirs=tuple(d for d in agent.spec.host_dirs if not (bundled and d == TESTS_DIR)),
    )
    if venv is None:
        return spec
    agent_env = harbor_env(task)
    env = {
        **{k: DEFAULT_ENV[k] for k in agent_env if k in DEFAULT_ENV},
        **{k: v for k, v in spec.env.items() if k not in agent_env},
        **harbor_env(task, "verifier.environment"),
    }
    return replace(
        spec,
        workdir=venv.workdir or spec.workdir,
        cpus=venv.cpus or spec.cpus,
        env=env,
        memory_bytes=venv.memory_mb << 20 if venv.memory_mb else spec.memory_bytes,
    )


@asynccontextmanager
async def separate_box(task: Task, agent: ContainerSandbox) -> AsyncIterator[tuple[ContainerSandbox, bool]]:
    """A fresh verifier container holding the agent's artifacts, and whether its image holds the
    tests; removed on exit. The agent's processes must be dead already (``agent.kill_all``)."""
    from polar_env.tasks.harbor_image import verifier_image

    image, bundled = await asyncio.to_thread(verifier_image, task, agent.engine)
    sources = artifact_sources(task)
    for command, user, timeout in collect_hooks(task):
        ran = (
            await agent.run(["bash", "-c", command], timeout_s=timeout)
            if not user
            else await run_process_tree(
                agent.exec_argv(["bash", "-c", command], {}, user=user, timeout_s=timeout),
                timeout_s=timeout,
                stdin=None,
                max_output_bytes=HOOK_OUTPUT_BYTES,
            )
        )
        agent.kill_all()  # nothing a hook started outlives it
        if ran.exit_code != 0:  # best-effort, as in Harbor: the verifier judges what is there
            log.warning(
                "%s: [[verifier.collect]] %r exited %s: %s",
                task.instance_id,
                command,
                ran.exit_code,
                (ran.stdout_tail + ran.stderr_tail)[-500:],
            )
    with tempfile.TemporaryDirectory(prefix="polar-harbor-artifacts-") as tmp:
        artifacts = await asyncio.to_thread(_collect, agent, sources, Path(tmp))
        box = await asyncio.to_thread(
            ContainerSandbox.create,
            None,
            spec=verifier_spec(task, agent, bundled),
            image=image,
            engine=agent.engine,
            snapshot=False,
        )
        try:
            await asyncio.to_thread(_place, box, artifacts)
            yield box, bundled
        finally:
            await box.destroy()
