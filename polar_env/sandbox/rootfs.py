"""The sandbox root: a minimal Debian rootfs in Polar's cache, mounted instead of the host's /usr and /etc.

The host's ``/usr`` holds whatever its admin installed (Debian's ``python3-requests`` carries the
fixes of bundled requests tasks), so no sandbox mounts it. Both bubblewrap sandboxes (episode and
grading) and the podman base image (``tasks/images.py``) use this one root: a ``debootstrap``
minbase of the same suite as the host's Debian, with what the harnesses and graders need. Its
``python3.X`` is Debian's, the interpreter the harness and task venvs are made by on the host, so
their ``/usr/bin/python3.X`` symlinks resolve inside. The task's own dependencies come from its venv.

Nothing in it is an answer: ``python3-venv`` brings pip's wheel store (``/usr/share/python-wheels``),
whose pip vendors a newer ``requests`` holding both bundled requests tasks' fixes. No sandbox needs it
(the venvs are made on the host, ``--without-pip``), so the root keeps none: the wheels are moved beside
it (`build_wheels`), where only an image build reads them (``tasks/images.py``). Each task's episodes
still scan the root for its answer (``tasks/answers.py``).

The directory is ``<cache>/rootfs/<key>``, the key a hash of the recipe (suite, packages, the
post-processing below), so a changed recipe builds a new root and never reuses a stale one. It is
built once by setup (``python -m polar_env.sandbox.rootfs``, root needed for debootstrap) and made
read-only for everyone else.

Nothing of the root is execute-only: the forwarder proves a call's origin by reading the harness's
``/proc/<pid>/fd`` as the same uid (docs/training.md), which a not-dumpable harness would refuse;
ptrace between sandbox processes is refused by the seccomp filter instead (``seccomp.py``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from polar_env.cache import cache_root

SUITE = "bookworm"
# python3 + venv for the tests, the forwarder and the Python harnesses; git + patch for the agent and
# the grader; libstdc++6 for Node.js (the host's binary is bound in); procps (ps, kill) for tools
PACKAGES = ("python3", "python3-venv", "git", "patch", "ca-certificates", "libstdc++6", "procps")
RECIPE_VERSION = "5"  # bump when the post-processing changes
READY = ".polar-rootfs-ready"
NODE_INSIDE = "/usr/local/bin/node"  # on the sandbox PATH, where ``#!/usr/bin/env node`` finds it
WHEEL_STORE = "usr/share/python-wheels"  # pip's and setuptools' wheels (python3-venv): moved out of the root


class RootfsMissing(RuntimeError):
    """The sandbox root is not built: one line that says how to build it."""


def recipe_key() -> str:
    h = hashlib.sha256("\0".join([RECIPE_VERSION, SUITE, "minbase", *PACKAGES]).encode())
    return h.hexdigest()[:16]


def rootfs_dir() -> Path:
    return cache_root() / "rootfs" / recipe_key()


def sandbox_root() -> Path:
    """The built root, or a ``RootfsMissing`` naming the setup step."""
    root = rootfs_dir()
    if not (root / READY).is_file():
        raise RootfsMissing(
            f"the sandbox root {root} is not built: run scripts/setup.sh "
            f"(or, as root, python -m polar_env.sandbox.rootfs)"
        )
    return root


def build_wheels() -> Path:
    """Where the root's pip wheels are kept, out of every sandbox's reach: for image builds only."""
    return rootfs_dir().with_name(f"{recipe_key()}.wheels")


def host_node() -> Path | None:
    """The host's ``node`` binary (the npm harnesses run on it; it is no answer)."""
    found = shutil.which("node")
    return Path(os.path.realpath(found)) if found else None


def debootstrap(dest: Path, *, mirror: str | None = None) -> None:
    """A minbase rootfs with ``PACKAGES`` at ``dest`` (apt's caches removed)."""
    if shutil.which("debootstrap") is None:
        raise RootfsMissing("debootstrap is not installed: apt-get install debootstrap")
    argv = ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(dest)]
    proc = subprocess.run(argv + ([mirror] if mirror else []), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RootfsMissing(f"debootstrap failed: {proc.stderr.strip()[-2000:]}")
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        shutil.rmtree(dest / cache, ignore_errors=True)
    wheels = build_wheels()
    shutil.rmtree(wheels, ignore_errors=True)
    if (dest / WHEEL_STORE).is_dir():
        shutil.move(dest / WHEEL_STORE, wheels)
    (dest / NODE_INSIDE.lstrip("/")).touch()  # the mount point of the host's node (/usr is read-only inside)


def ensure_rootfs(*, mirror: str | None = None) -> Path:
    """Build the root unless it is there (idempotent; a half-built one is redone)."""
    root = rootfs_dir()
    if (root / READY).is_file():
        return root
    if os.geteuid() != 0:
        raise RootfsMissing(
            f"building the sandbox root {root} needs root (debootstrap): run scripts/setup.sh as root"
        )
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        debootstrap(tmp, mirror=mirror)
        (tmp / READY).write_text(recipe_key() + "\n")
        os.chmod(tmp, 0o755)
        shutil.rmtree(root, ignore_errors=True)
        tmp.rename(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for stale in root.parent.iterdir():  # roots of earlier recipes, and their wheels
        if (
            stale != root
            and ((stale / READY).is_file() or stale.name.endswith(".wheels"))
            and stale != build_wheels()
        ):
            shutil.rmtree(stale, ignore_errors=True)
    return root


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m polar_env.sandbox.rootfs",
        description="Build (or reuse) the sandbox root in Polar's cache.",
    )
    ap.add_argument("--mirror", default=None, help="a Debian mirror URL (default: debootstrap's)")
    args = ap.parse_args(argv)
    try:
        print(ensure_rootfs(mirror=args.mirror))
    except RootfsMissing as exc:
        print(f"polar rootfs: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
