"""Warm task images: a task image with its git history reduced to the base (`sandbox/history.py`),
its tree handed to the sandbox uid and its base recorded, committed once per node; every episode's
container, and every grading container, starts from it.

An episode's container used to start from the task's image and then, as root, ``chown -R`` the
whole workdir to the sandbox uid (on an overlay filesystem, a copy-up of every file) and snapshot it
with git (hashing every file): per episode, for the same bytes. Now the first episode of an image
on a node does both once, in a container it commits as ``localhost/polar-warm:<key>``; each
episode's container starts from that image (the engine's overlay is the per-episode clone) and has
only its HOME, a fresh tmpfs, to hand over. The key covers the image's id (not its name: a retagged
image gets a fresh warm image), the uid, the workdir and what the history is reduced to, with the
reduction script's digest (a changed reduction makes fresh warm images; one image may serve several
bases: SWE-smith's instances are branches of one image) and the files its dataset's harness keeps from the
agent, removed before the history (R2E-Gym's tests and test script); a lock file per key makes
concurrent episodes (threads or processes) build it once. A warm image is listed in the pulled-image ledger
(``sandbox/pulled_images.py``) with its own size, so ``polar tasks pull``'s disk budget prunes it too.

A warm image whose files hold a copy of its task's answer outside the task's tree gets one more layer
without them (`without_paths`, ``<key>-pruned``: tasks/answers.py decides what goes), made the same
once-per-node way.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import stat
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from polar_env.cache import cache_root
from polar_env.sandbox.base import SandboxSpec
from polar_env.sandbox.container import (
    REMOVE_PATHS,
    ContainerError,
    ContainerSandbox,
    engine_run,
    image_exists,
    label_args,
)
from polar_env.sandbox.history import TO_HEAD, HistoryTarget
from polar_env.sandbox.image_files import mountable

log = logging.getLogger(__name__)
WARM_REPO = "localhost/polar-warm"
LAYOUT = "2"  # bump when what a warm image holds changes (the setup script, the snapshot's layout)


def warm_image_name(
    engine: str, image: str, spec: SandboxSpec, target: HistoryTarget = TO_HEAD, hidden: Sequence[str] = ()
) -> str:
    image_id = engine_run([engine, "image", "inspect", "--format", "{{.Id}}", image]).decode().strip()
    removed = "".join(f"\0{p}" for p in hidden)  # none (most tasks): the key stays as it was
    key = hashlib.sha256(
        f"{LAYOUT}\0{image_id}\0{spec.uid}\0{spec.workdir}\0{target.key()}{removed}".encode()
    ).hexdigest()[:24]
    return f"{WARM_REPO}:{key}"


_known: dict[
    tuple[str, str, int, str, HistoryTarget, tuple[str, ...]], str
] = {}  # this process's warm images: no engine call per episode


def warm_image(
    engine: str, image: str, spec: SandboxSpec, target: HistoryTarget = TO_HEAD, hidden: Sequence[str] = ()
) -> str:
    """``image``'s warm image on this node for a task whose history is reduced to ``target``
    (`runtime.history_target`) and whose ``hidden`` files (`runtime.hidden_paths`) are gone,
    committed now if there is none yet (once, whoever asks at once);
    remembered for the process (an image retagged meanwhile is seen by the next process). A repository
    that cannot be reduced to ``target`` raises `container.HistoryNotReduced` (the task is refused) and
    commits nothing."""
    known = (engine, image, spec.uid, spec.workdir, target, tuple(hidden))
    if (warm := _known.get(known)) is not None and image_exists(engine, warm):
        return warm
    warm = warm_image_name(engine, image, spec, target, hidden)
    _built_once(engine, warm, lambda: _commit(engine, image, spec, warm, target, hidden))
    _known[known] = warm
    return warm


def _built_once(engine: str, name: str, build: Callable[[], None]) -> None:
    """``build`` (which commits ``name``) unless ``name`` exists, once whoever asks at once (a lock file
    per name); the image listed in the pulled-image ledger with its size, its use recorded."""
    from polar_env.sandbox.pulled_images import PulledImages

    if not image_exists(engine, name):
        locks = cache_root() / "warm-images"
        locks.mkdir(parents=True, exist_ok=True)
        with open(locks / f"{name.rsplit(':', 1)[1]}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
            if not image_exists(engine, name):  # not committed while we waited
                build()
                size = (
                    engine_run([engine, "image", "inspect", "--format", "{{.Size}}", name]).decode().strip()
                )
                PulledImages().record(name, int(size or 0))
    PulledImages().touch(name)


def without_paths(engine: str, image: str, paths: Sequence[str]) -> str:
    """``image`` with ``paths`` (absolute, in the image) removed, as a layer of its own committed once per
    node (``localhost/polar-warm:<key>-pruned``). As host root on podman, made from the host: a container
    of ``image`` is created (nothing of it runs), its file system mounted, each path removed (never through
    a link: a path whose parent is no directory of the image is refused) and found gone, then committed.
    Elsewhere (docker, rootless podman: no mount from the host) the image's own ``sh`` removes them, as
    root in a container with no network, each found gone after (an image whose entrypoint does not run
    that command keeps them: the answer scan after refuses its task); the commit puts the image's user
    back (its command becomes the removal's: every container Polar starts names its own). Raises
    `ContainerError` where a path is still there."""
    image_id = engine_run([engine, "image", "inspect", "--format", "{{.Id}}", image]).decode().strip()
    tops = outermost(paths)
    key = hashlib.sha256("\0".join([LAYOUT, image_id, *tops]).encode()).hexdigest()[:24]
    pruned = f"{WARM_REPO}:{key}-pruned"

    def build() -> None:
        if mountable(engine):
            box = engine_run([engine, "create", *label_args(), "--network", "none", image, "true"])
        else:  # as root for the removal; the image's own user put back on the commit
            removal = ["--user", "0", image, "sh", "-c", REMOVE_PATHS, "sh", *tops]
            box = engine_run([engine, "create", *label_args(), "--network", "none", *removal])
        box = box.decode().strip()
        try:
            change: list[str] = []
            if mountable(engine):
                root = Path(engine_run([engine, "mount", box]).decode().strip())
                try:
                    for path in tops:
                        remove_beneath(root, path)
                finally:
                    engine_run([engine, "unmount", box])
            else:
                engine_run([engine, "start", "--attach", box])
                user = engine_run([engine, "image", "inspect", "--format", "{{.Config.User}}", image])
                change = ["--change", f"USER {user.decode().strip() or 'root'}"]
            engine_run([engine, "commit", *change, box, pruned])
        finally:
            engine_run([engine, "rm", "-f", box])

    _built_once(engine, pruned, build)
    return pruned


def outermost(paths: Sequence[str]) -> list[str]:
    """``paths`` without those beneath another of them, sorted."""
    return sorted({p for p in paths if not any(p.startswith(q.rstrip("/") + "/") for q in paths)})


def remove_beneath(root: Path, path: str) -> None:
    """``path`` (absolute, within ``root``) removed, a directory with all it holds; every parent must be a
    real directory (no link is followed), and the path must be gone after."""
    parts = Path(path.lstrip("/")).parts
    if not parts or ".." in parts:
        raise ContainerError(f"cannot remove {path!r} from an image")
    target = root
    for part in parts:
        if not stat.S_ISDIR(os.lstat(target).st_mode):
            raise ContainerError(f"cannot remove {path}: {target.relative_to(root)} is no directory")
        target = target / part
    if stat.S_ISDIR(os.lstat(target).st_mode):
        shutil.rmtree(target)
    else:
        target.unlink()
    if os.path.lexists(target):
        raise ContainerError(f"{path} is still in the image after its removal")


def _commit(
    engine: str, image: str, spec: SandboxSpec, warm: str, target: HistoryTarget, hidden: Sequence[str]
) -> None:
    """The setup every episode's container did (the history reduced, ContainerSandbox.setup_script), in
    one container without the episode's mounts, committed (its tmpfs HOME and /tmp are not part of an
    image); never in a user namespace (its shifted owners would be committed), as nothing but that setup
    runs in it."""
    box = ContainerSandbox.create(
        None,
        spec=replace(spec, proxy_socket_dir=None, harness_dir=None, userns=False, host_dirs=()),
        image=image,
        engine=engine,
        history_target=target,
        setup_only=True,
        hidden=hidden,
    )
    try:
        log.info("warm image %s of %s: %s", warm, image, box.history or "no git history to reduce")
        engine_run([engine, "commit", box.name, warm])
    finally:
        box.remove()
