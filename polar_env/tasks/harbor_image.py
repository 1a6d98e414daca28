"""The image a Harbor task runs in: ``[environment] docker_image`` as is, else ``environment/`` built
with the local engine and cached by content hash.

No registry is reachable on Polar's machines, so every ``FROM`` must name an image the engine
already has. These names are mapped before that check: ``debian:bookworm-slim`` (the public image
Polar's base is made from: the shipped terminal tasks and every export start FROM it) and
``polar-base`` (its old local name) to the project's Debian base (tasks/images.py), and whatever
``POLAR_IMAGE_MAP`` maps (``NAME=LOCAL[,NAME=LOCAL...]``, e.g. ``ubuntu:24.04=localhost/polar-base:<key>``). A
``FROM`` still missing is one error naming it and both ways to map it (that variable, or ``podman tag``).

The tag ``localhost/polar-harbor/<id>:<key>`` hashes every file of ``environment/`` (names and
bytes), the rewritten Dockerfile and the id of each base image, so an unchanged task reuses its
image and any change rebuilds it.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import shutil
import tempfile
from pathlib import Path

from polar_env.environment import EnvSettings
from polar_env.sandbox.container import ContainerError, engine_run, image_exists, label_args
from polar_env.tasks.harbor_compose import task_compose
from polar_env.tasks.models import Task

POLAR_BASE_ALIAS = "polar-base"
MAP_ENV = "POLAR_IMAGE_MAP"
USER_RE = re.compile(r"^\s*USER\s+(\S+)\s*$", re.I | re.M)
FROM_RE = re.compile(r"^(\s*FROM\s+)((?:--\S+\s+)*)(\S+)(.*)$", re.I | re.M)


class HarborImageError(ContainerError):
    """The environment cannot be built here; the message names the image or file and what to do."""


def image_map() -> dict[str, str]:
    """``polar-base`` and ``debian:bookworm-slim`` (the public image it is made from) -> the project's base
    image, plus ``POLAR_IMAGE_MAP``'s pairs (which win)."""
    from polar_env.tasks.images import PUBLIC_BASE, base_image

    pairs = {POLAR_BASE_ALIAS: base_image(), PUBLIC_BASE: base_image()}
    for item in filter(None, (s.strip() for s in EnvSettings.read().image_map.split(","))):
        name, sep, local = item.partition("=")
        if not sep or not name.strip() or not local.strip():
            raise HarborImageError(f"{MAP_ENV}: {item!r} is not NAME=LOCAL_IMAGE")
        pairs[name.strip()] = local.strip()
    return pairs


def rewrite_from(dockerfile: str, mapping: dict[str, str]) -> tuple[str, list[str]]:
    """The Dockerfile with mapped ``FROM`` images, and the external images it then starts from
    (a ``FROM`` naming an earlier stage is not an image)."""
    stages: set[str] = set()
    bases: list[str] = []

    def sub(m: re.Match[str]) -> str:
        image = mapping.get(m.group(3), m.group(3))
        alias = re.match(r"\s+AS\s+(\S+)", m.group(4), re.I)
        if m.group(3) not in stages and "$" not in image:
            bases.append(image)
        if alias:
            stages.add(alias.group(1))
        return f"{m.group(1)}{m.group(2)}{image}{m.group(4)}"

    return FROM_RE.sub(sub, dockerfile), bases


def _content_key(env_dir: Path, dockerfile: str, base_ids: list[str]) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in env_dir.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(env_dir)).encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(dockerfile.encode() + b"\0" + "\0".join(base_ids).encode())
    return h.hexdigest()[:16]


def _image_id(engine: str, image: str) -> str:
    return engine_run([engine, "image", "inspect", "--format", "{{.Id}}", image]).decode().strip()


def ensure_harbor_image(task: Task, engine: str = "podman") -> str:
    """The task's image: its ``docker_image`` (never pulled), else ``environment/`` built unless cached."""
    assert task.harbor is not None
    env = task.harbor.config.environment
    if env.docker_image:
        return env.docker_image
    compose = task_compose(task.harbor, task.instance_id)
    if compose is not None and compose.context is not None:  # docker-compose.yaml's main service's build
        return build_image(
            compose.context,
            task.instance_id.lower(),
            task.workdir,
            dockerfile_name=compose.dockerfile,
            engine=engine,
            timeout_s=env.build_timeout_sec,
            what=task.instance_id,
        )
    return build_image(
        task.harbor.environment_dir,
        task.instance_id.lower(),
        task.workdir,
        engine=engine,
        timeout_s=env.build_timeout_sec,
        what=task.instance_id,
    )


def verifier_image(task: Task, engine: str = "podman") -> tuple[str, bool]:
    """A separate verifier's image, in Harbor's order, and whether it holds the tests itself:
    ``[verifier.environment] docker_image`` (tests in it), else one built from ``tests/`` where that
    has a Dockerfile (tests in it), else a fresh one of the task's own environment (tests copied in)."""
    assert task.harbor is not None
    venv = task.harbor.config.verifier.environment
    tests = task.harbor.tests_dir
    if venv is not None and venv.docker_image:
        return venv.docker_image, True
    if (tests / "Dockerfile").is_file():
        timeout = (venv or task.harbor.config.environment).build_timeout_sec
        return build_image(
            tests,
            f"{task.instance_id.lower()}-verifier",
            "/tests",
            engine=engine,
            timeout_s=timeout,
            what=f"{task.instance_id} (tests/Dockerfile)",
        ), True
    return ensure_harbor_image(task, engine), False


def build_image(
    env_dir: Path,
    name: str,
    workdir: str,
    *,
    engine: str,
    timeout_s: float,
    what: str,
    dockerfile_name: str = "Dockerfile",
) -> str:
    """``env_dir/<dockerfile_name>`` built in the context ``env_dir`` as
    ``localhost/polar-harbor/<name>:<content key>`` unless cached; every ``FROM`` mapped and present
    locally (else one error naming it, for ``what``)."""
    dockerfile, bases = rewrite_from((env_dir / dockerfile_name).read_text(), image_map())
    # Docker creates a WORKDIR; podman's builder may not keep an empty one, and a container cannot
    # start in a missing workdir. The image's own USER is kept: it is the agent's (tasks/runtime.py).
    users = USER_RE.findall(dockerfile)
    dockerfile += f"\nUSER root\nRUN mkdir -p {shlex.quote(workdir)}\n" + (
        f"USER {users[-1]}\n" if users else ""
    )
    if not bases:
        raise HarborImageError(f"{env_dir / dockerfile_name}: no FROM line")
    for base in bases:
        if not image_exists(engine, base):
            raise HarborImageError(
                f"{what}: {env_dir.name}/{dockerfile_name} starts FROM {base}, which is not in {engine} and "
                f"cannot be pulled here: map it to a local image with {MAP_ENV}='{base}=LOCAL_IMAGE' "
                f"(e.g. LOCAL_IMAGE={image_map()[POLAR_BASE_ALIAS]}), or `{engine} tag LOCAL_IMAGE {base}`; "
                f"docs/tasks.md, 'Harbor task folders'"
            )
    key = _content_key(env_dir, dockerfile, [_image_id(engine, b) for b in bases])
    tag = f"localhost/polar-harbor/{name}:{key}"
    if image_exists(engine, tag):
        return tag
    with tempfile.TemporaryDirectory(prefix="polar-harbor-image-") as tmp:
        ctx = Path(tmp) / "context"
        shutil.copytree(env_dir, ctx, symlinks=True)
        (ctx / dockerfile_name).write_text(dockerfile)
        engine_run(
            [engine, "build", "--network", "host", "-f", str(ctx / dockerfile_name), "-t", tag, str(ctx)],
            timeout_s=timeout_s,
        )
    return tag


def agent_user(task: Task, engine: str = "podman") -> tuple[int, str]:
    """The agent's (uid, name), as Harbor runs it: ``[agent] user`` where the task names one, else the
    image's own user (``USER``; none or ``root`` is root). A name is looked up in the task's image. Root
    is allowed: the task's containers run in a user namespace of their own (tasks/runtime.py)."""
    assert task.harbor is not None
    user = task.harbor.config.agent.user
    if user is None:
        user = (
            engine_run([engine, "image", "inspect", "--format", "{{.Config.User}}", task.image])
            .decode()
            .strip()
        )
    name = str(user).split(":")[0] or "root"
    if name in ("0", "root"):
        return 0, "root"
    if name.isdigit():
        return int(name), ""
    try:
        out = engine_run(
            [
                engine,
                "run",
                "--rm",
                *label_args(),
                "--network",
                "none",
                "--entrypoint",
                "id",
                task.image,
                "-u",
                name,
            ],
            timeout_s=120,
        )
    except ContainerError as exc:
        raise HarborImageError(
            f"{task.instance_id}: user {user!r} (task.toml [agent] user, else the image's USER) "
            f"is not a user of its image {task.image}: {exc}"
        ) from None
    return int(out.decode().strip()), name
