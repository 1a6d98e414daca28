"""An image's files, read from the host (what the answer scan reads, tasks/answers.py).

As host root, podman mounts the image itself (``podman image mount``): nothing copied. Docker has no
such mount and rootless podman may not mount, so there the image is exported instead: a container of it
created (nothing of it run), its file system streamed out (``export``) and unpacked into a temporary
directory, regular files and directories only (a link is not followed, a device not made), each made
readable to the scanner whatever its mode in the image, no path outside the directory.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

from polar_env.cache import cache_root
from polar_env.sandbox.container import ContainerError, engine_run, label_args


def mountable(engine: str) -> bool:
    """Whether ``engine`` mounts images on the host: podman as host root."""
    return engine == "podman" and os.geteuid() == 0


def _readable(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """tarfile's ``data`` filter (no path outside ``dest``, no owner kept) on regular files and directories
    only, each readable to whoever unpacks it."""
    if not (member.isreg() or member.isdir()):
        return None
    member = tarfile.data_filter(member, dest)
    return member.replace(mode=0o755 if member.isdir() else 0o644, deep=False)


def export_files(engine: str, image: str, dest: Path) -> None:
    """``image``'s regular files and directories unpacked into ``dest`` (`_readable`), from a container
    created for it and removed after."""
    box = engine_run([engine, "create", *label_args(), "--network", "none", image, "true"]).decode().strip()
    try:
        with subprocess.Popen(
            [engine, "export", box], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        ) as proc:
            assert proc.stdout is not None
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                tar.extractall(dest, filter=_readable)
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        if proc.returncode != 0:
            raise ContainerError(f"{engine} export of {image} failed: {err.strip()[-500:]}")
    except (tarfile.TarError, OSError) as exc:
        raise ContainerError(f"{engine} export of {image}: {type(exc).__name__}: {exc}") from None
    finally:
        engine_run([engine, "rm", "-f", box])


@contextlib.contextmanager
def image_files(engine: str, image: str) -> Iterator[Path]:
    """The root of ``image``'s file system on the host, for as long as the block runs: mounted where the
    engine can (`mountable`), else exported into a temporary directory of Polar's cache (on disk, not a
    tmpfs: an image may be gigabytes), removed after."""
    if mountable(engine):
        root = Path(engine_run([engine, "image", "mount", image]).decode().strip())
        try:
            yield root
        finally:
            engine_run([engine, "image", "unmount", image])
        return
    cache_root().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="image-files-", dir=cache_root()) as tmp:
        export_files(engine, image, Path(tmp))
        yield Path(tmp)
