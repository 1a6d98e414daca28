"""Build SWE-bench-layout task images locally, cached by content: no image registry is needed.

Layout (what SWE-bench's images have and what grading in the image expects): the task's base tree
at ``/testbed`` (one commit, as ``tasks.tree`` makes it), its pinned test environment in a venv at
``/opt/venv`` (first on PATH), ``python3`` and ``git`` from Debian. The base image is the
bubblewrap sandboxes' root (``polar_env.sandbox.rootfs``, a minbase Debian from ``debootstrap``)
imported into the engine; each task image is built from a
generated Containerfile with ``--network host`` so pip reaches the package index at build time
(never at run time: episodes and grading run with ``--network none``).

Cache keys: every image's tag is a hash of everything that goes into it (the Containerfile, the
base tree archive, the base image's key), so a machine that has the image reuses it and one that
does not builds it, and a changed input can never reuse a stale image.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from polar_env.sandbox.container import ContainerError, engine_run, image_exists
from polar_env.sandbox.rootfs import (
    NODE_INSIDE,
    READY,
    RootfsMissing,
    build_wheels,
    ensure_rootfs,
    recipe_key,
)
from polar_env.tasks.models import Task
from polar_env.tasks.tree import materialize

CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
VENV = "/opt/venv"
PIP_WHEEL = "pip.whl"  # its name in the build context
HOST_WHEELS = Path("/usr/share/python-wheels")


def _key(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def base_image() -> str:
    """``polar-base:<key>``, the sandbox root's recipe key."""
    return f"localhost/polar-base:{recipe_key()}"


def ensure_base_image(engine: str = "podman", *, mirror: str | None = None) -> str:
    """Import the sandbox root (built first if missing: debootstrap needs root) unless the engine has it."""
    name = base_image()
    if image_exists(engine, name):
        return name
    try:
        root = ensure_rootfs(mirror=mirror)
    except RootfsMissing as exc:
        raise ContainerError(str(exc)) from None
    tar = subprocess.Popen(
        ["tar", "-C", str(root), f"--exclude=./{READY}", f"--exclude=.{NODE_INSIDE}", "-c", "."],
        stdout=subprocess.PIPE,
    )
    imp = subprocess.run(
        [engine, "import", "--change", 'CMD ["/bin/bash"]', "-", name],
        stdin=tar.stdout,
        capture_output=True,
        text=True,
    )
    tar.wait()
    if imp.returncode != 0 or tar.returncode != 0:
        raise ContainerError(f"{engine} import failed: {imp.stderr.strip()[-2000:]}")
    return name


def containerfile(task: Task, base: str) -> str:
    """The task image: base tree at /testbed, pinned requirements in /opt/venv (no pip left in it). The
    base has no pip wheels (``sandbox/rootfs.py``): the venv is made without pip and the requirements
    installed by pip run from its wheel, bound for that one step (no layer keeps it)."""
    reqs = " ".join(shlex.quote(r) for r in task.environment.requirements)
    lines = [
        f"FROM {base}",
        "COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt",
        "COPY testbed /testbed",
    ]
    venv = f"python3 -m venv --without-pip {VENV}"
    if reqs:
        venv = (
            f"--mount=type=bind,source={PIP_WHEEL},target=/tmp/{PIP_WHEEL} {venv} && "
            f"PIP_CERT=/etc/ssl/certs/ca-certificates.crt {VENV}/bin/python /tmp/{PIP_WHEEL}/pip install "
            f"--no-deps --disable-pip-version-check --no-input -q {reqs}"
        )
    lines += [
        f"RUN {venv}",
        f"ENV PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        f"ENV VIRTUAL_ENV={VENV}",
        "WORKDIR /testbed",
    ]
    return "\n".join(lines) + "\n"


def pip_wheel() -> Path:
    """The sandbox root's pip wheel, kept beside it for image builds (``rootfs.build_wheels``), else the
    host's (the same Debian suite's python3-venv)."""
    found = sorted(build_wheels().glob("pip-*.whl")) or sorted(HOST_WHEELS.glob("pip-*.whl"))
    if not found:
        raise ContainerError(f"no pip wheel in {build_wheels()} or {HOST_WHEELS}: run scripts/setup.sh")
    return found[-1]


# The public image Polar's base is made from (sandbox/rootfs.py: a Debian bookworm minbase with
# `PACKAGES`): what exported task folders start FROM, mapped back to the local base where no registry
# is reachable (tasks/harbor_image.py `image_map`).
PUBLIC_BASE = "debian:bookworm-slim"
AGENT_USER = "agent"  # the exported image's non-root user, uid 1000 as Polar's sandbox uid


def public_containerfile(task: Task) -> str:
    """The task image as a Dockerfile that builds anywhere: FROM `PUBLIC_BASE`, the base's packages
    installed where they are missing (the local base has them: nothing is fetched) and pip's wheel
    store removed as the local base has it (``sandbox/rootfs.py``), a non-root `AGENT_USER` (uid 1000)
    owning the tree, then the same layers as `containerfile`."""
    from polar_env.sandbox.rootfs import PACKAGES, WHEEL_STORE

    packages = " ".join(PACKAGES)
    body = containerfile(task, PUBLIC_BASE).split("\n", 1)[1].replace("WORKDIR /testbed\n", "")
    return (
        f"FROM {PUBLIC_BASE}\n"
        f"RUN (command -v python3 git patch >/dev/null && python3 -c 'import venv' 2>/dev/null || "
        f"(apt-get update && apt-get install -y --no-install-recommends {packages} && rm -rf "
        f"/var/lib/apt/lists/*)) && rm -rf /{WHEEL_STORE}\n"
        f"RUN id -u {AGENT_USER} >/dev/null 2>&1 || useradd -m -u 1000 -s /bin/bash {AGENT_USER}\n"
        f"{body}RUN chown -R {AGENT_USER}: /testbed\nWORKDIR /testbed\n"
    )


def task_image_name(task: Task, base: str) -> str:
    """``polar-task/<id>:<key>``; the key hashes the Containerfile and the base tree archive."""
    if not task.base_archive:
        raise ValueError(f"{task.instance_id}: no base tree archive to build an image from")
    archive = hashlib.sha256(Path(task.base_archive).read_bytes()).hexdigest()
    return f"localhost/polar-task/{task.instance_id.lower()}:{_key(containerfile(task, base), archive)}"


def ensure_task_image(task: Task, engine: str = "podman") -> str:
    """The task's image, built (from the base image, itself built if missing) unless cached."""
    base = ensure_base_image(engine)
    name = task_image_name(task, base)
    if image_exists(engine, name):
        return name
    with tempfile.TemporaryDirectory(prefix="polar-image-") as tmp:
        ctx = Path(tmp)
        materialize(task, ctx / "testbed")
        shutil.copy2(CA_BUNDLE, ctx / "ca-certificates.crt")
        if task.environment.requirements:
            shutil.copy2(pip_wheel(), ctx / PIP_WHEEL)
        (ctx / "Containerfile").write_text(containerfile(task, base))
        env_args = [
            a
            for k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")
            if os.environ.get(k)
            for a in ("--build-arg", f"{k}={os.environ[k]}")
        ]
        engine_run(
            [
                engine,
                "build",
                "--network",
                "host",
                "-f",
                str(ctx / "Containerfile"),
                "-t",
                name,
                *env_args,
                str(ctx),
            ],
            timeout_s=1800,
        )
    return name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m polar_env.tasks.images",
        description="Build (or reuse) the base image and task images.",
    )
    ap.add_argument("what", choices=["base", "tasks"])
    ap.add_argument("--tasks", default="bundled", help="bundled | FILE.jsonl (rows with a base_archive)")
    ap.add_argument("--task-ids", nargs="*", default=None)
    ap.add_argument("--engine", default="podman")
    args = ap.parse_args(argv)
    try:
        if args.what == "base":
            print(ensure_base_image(args.engine))
            return 0
        from polar_env.tasks.loader import load_tasks

        for task in load_tasks(args.tasks):
            if args.task_ids is None or task.instance_id in args.task_ids:
                task.image = ensure_task_image(task, args.engine)
                print(json.dumps(task.model_dump(mode="json")))
    except (ContainerError, ValueError) as exc:
        print(f"polar images: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
