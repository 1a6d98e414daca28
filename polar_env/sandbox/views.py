"""Read-only inputs shown in a sandbox without their host paths (as host root).

A bind mount's line in ``/proc/self/mountinfo`` names its source's path within its file system: the
cache's ``rootfs/<key>/usr``, the harness install, a task venv's ``envs/<task id>`` (the task, to
code that would special-case it). An overlay is a file system of its own: its root reads ``/`` and
its options name its layers as the mounter spelt them, here ``/proc/self/fd/N`` (each layer passed
as a descriptor). So, as host root, each read-only input is an overlay of its source, mounted inside
the sandbox's own tmpfs (unmounted with it) and bound from there. Unprivileged nothing can be
mounted: the sources are bound as they are (their paths show). A Unix socket cannot be reached
through an overlay (its inode is the overlay's, not the listener's): the proxy's socket dir is a
tmpfs of its own instead (`socket_dir`), whose root reads ``/`` as well.

A sealed harness's Python install (``forwarder.py``, "Sealed harness"; `holds_python_packages`: its
site-packages are where other releases of task packages live) is shown with one more layer on top,
`sealed_layer`: an empty directory of root and the harness group, mode 0750, which gives the view's
root its owner and mode. Only the harness (its effective gid that group) enters it; the agent's
commands, run by a shell as the sandbox gid, find nothing they may read below ``/opt/harness``. A
Node.js install is shown as it is: Node tests its own files with ``access(2)`` (``fs.existsSync``),
which checks the real gid, the one the agent's commands inherit, so no gid can admit the one and not
the others; its files are scanned for answers instead (``tasks/answers.py``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from polar_env.cache import cache_root
from polar_env.sandbox.bwrap_argv import SandboxUnavailable
from polar_env.sandbox.rootfs import NODE_INSIDE, RootfsMissing, host_node, sandbox_root

EMPTY = ".empty"  # an overlay with no upper layer needs two lower ones: the second is an empty dir


class ViewUnavailable(SandboxUnavailable):
    """The overlay could not be mounted: an infrastructure fault."""


def mount_tmpfs(at: Path, size: int, name: str) -> None:
    """A tmpfs of ``size`` bytes at ``at`` named ``name`` (host root only)."""
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755,nosuid,nodev", name, str(at)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise ViewUnavailable(f"cannot mount a tmpfs at {at}: {proc.stderr.strip()}")


def socket_dir(path: Path) -> bool:
    """``path`` made; as host root, and when empty (nothing is hidden), a tmpfs of its own, so the
    sandboxes that bind it see no host path. True when mounted: the caller unmounts it (`unmount`)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or os.path.ismount(path) or any(path.iterdir()):
        return False
    mount_tmpfs(path, 1 << 20, "polar-proxy")
    return True


def unmount(path: Path) -> None:
    """Lazily: a straggler's open file cannot keep it mounted."""
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


def empty_layer(layers: Sequence[Path], fallback: Path) -> Path:
    """An empty directory for an overlay of ``layers``: the cache's where all of them share its file
    system (such an overlay shows its files with one st_dev and their own inode numbers, as a plain
    tree does), else ``fallback``."""
    shared = cache_root() / EMPTY
    try:
        shared.mkdir(parents=True, exist_ok=True)
        dev = shared.stat().st_dev
        if all(layer.stat().st_dev == dev for layer in layers) and not any(shared.iterdir()):
            return shared
    except OSError:
        pass  # a missing layer is mount_view's to report
    fallback.mkdir(exist_ok=True)
    return fallback


def mount_view(layers: Sequence[Path], at: Path) -> Path:
    """``layers`` (the first on top) as one read-only overlay at ``at``, its options naming only
    descriptors. ``at``'s parent must be in the caller's tmpfs: the empty layer is made there unless
    the cache shares the layers' file system."""
    at.mkdir(parents=True, exist_ok=True)
    empty = empty_layer(layers, at.parent / EMPTY)
    fds: list[int] = []
    try:
        try:
            for layer in (*layers, empty):
                fds.append(os.open(layer, os.O_RDONLY | os.O_DIRECTORY))
        except OSError as exc:
            raise ViewUnavailable(f"cannot show {exc.filename}: {exc.strerror}") from None
        lower = ":".join(f"/proc/self/fd/{fd}" for fd in fds)
        proc = subprocess.run(
            ["mount", "-t", "overlay", "polar-ro", "-o", f"ro,lowerdir={lower}", str(at)],
            pass_fds=fds,
            capture_output=True,
            text=True,
        )
    finally:
        for fd in fds:
            os.close(fd)
    if proc.returncode != 0:
        raise ViewUnavailable(
            f"cannot mount a read-only view of {', '.join(map(str, layers))}: {proc.stderr.strip()}"
        )
    return at


def sealed_layer(gid: int, under: Path | None = None) -> Path:
    """An empty directory owned by root and group ``gid``, mode 0750, in the cache (bubblewrap's leased
    gids are a bounded pool) or ``under`` (a container's own dir: its user namespace's gids are fresh
    per container): the top layer that makes a view the harness group's alone."""
    layer = (under or cache_root() / "harness-seal") / str(gid)
    layer.mkdir(parents=True, exist_ok=True)
    st = layer.stat()
    if (st.st_uid, st.st_gid) != (0, gid):
        os.chown(layer, 0, gid)
    if st.st_mode & 0o7777 != 0o750:
        os.chmod(layer, 0o750)
    return layer


def holds_python_packages(install: Path) -> bool:
    """Whether a harness install is a Python one (a venv, or a portable interpreter's prefix)."""
    return any(install.glob("lib/python3*/site-packages"))


def harness_view(install: Path, at: Path, sealed_gid: int | None, layer_under: Path | None = None) -> Path:
    """``install`` as a read-only view at ``at``; with ``sealed_gid``, its root that (host) group's alone."""
    return mount_view(
        [*([sealed_layer(sealed_gid, layer_under)] if sealed_gid is not None else []), install], at
    )


def node_layer() -> Path | None:
    """A directory holding the host's node at ``NODE_INSIDE`` under ``/usr`` (``local/bin/node``), in
    the cache: a hard link where the file systems allow, else a copy; keyed by the binary's identity."""
    node = host_node()
    if node is None:
        return None
    st = node.stat()
    key = hashlib.sha256(f"{node}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    layer = cache_root() / "node" / key
    inside = layer / Path(NODE_INSIDE).relative_to("/usr")
    if inside.is_file():
        if layer.stat().st_mode & 0o777 != 0o755:  # made 0700 by an earlier version: /usr unreadable
            layer.chmod(0o755)
        return layer
    layer.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=layer.parent))  # one per maker: threads too
    tmp.chmod(0o755)  # the top layer's root is the view's: /usr, which every uid must read
    made = tmp / inside.relative_to(layer)
    made.parent.mkdir(parents=True)
    try:
        os.link(node, made)
    except OSError:
        shutil.copy2(node, made)
    try:
        tmp.rename(layer)
    except OSError:  # another sandbox made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return layer


def system_view(at: Path) -> Path:
    """``at``/usr (the sandbox root's, the host's node inside) and ``at``/etc, as overlays."""
    try:
        root = sandbox_root()
    except RootfsMissing as exc:
        raise ViewUnavailable(str(exc)) from None
    node = node_layer()
    mount_view([*([node] if node else []), root / "usr"], at / "usr")
    mount_view([root / "etc"], at / "etc")
    return at
