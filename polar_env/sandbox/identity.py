"""A bubblewrap sandbox's own host identity (as host root): a uid leased for its life, shown inside as the
spec's.

The kernel counts some things per user: inotify instances (128 by default), pipe buffer pages,
message-queue bytes, pending signals, keys. Sandboxes that run as one host uid share one budget, so
an episode could spend its siblings' (a harness that watches files then cannot start) or leave them a
signal. So, as host root, each sandbox leases a host uid of its own from a pool (`lease`: a lock file
per uid under ``/run/polar/identities``, held while the sandbox lives, released when its opener
closes it or dies), owns its files by it, and runs every command in a user namespace of its own that
the leased uid created (so what is counted for the namespace's owner is counted for that uid alone)
and that maps the spec's ids onto it: inside, the agent is still uid 1000, group 1000, and the
harness group 1001 (`forwarder.harness_gid`), the same on every rollout (first prompts do not
change). Host root and its group map to themselves, so the sandbox root's files show as root's; no
process of a sandbox runs as 0 (setpriv drops to the spec's uid before anything of the task runs,
and the namespace gives none of them a capability outside it). Unprivileged bubblewrap has one
uid to give (the caller's): its sandboxes share it.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# host uids POOL_START, +2, ...: each with its group and, +1, its harness group; a range no host user and no
# subordinate-id range (/etc/subuid: 100000 + 65536 per user by default) reaches
POOL_START, POOL_SIZE = 2_000_000, 8192
LEASES = Path("/run/polar/identities")


class IdentityUnavailable(RuntimeError):
    """No host uid left in the pool, or no user namespace could be made: an infrastructure fault."""


@dataclass
class Identity:
    """``inside`` ids (the spec's uid and gid) shown for ``host`` ids; ``lock``: the lease, held by the
    sandbox's opener (None for a sandbox attached by another process)."""

    inside_uid: int
    inside_gid: int
    host_uid: int
    lock: int | None = None

    @property
    def host_gid(self) -> int:
        return self.host_uid

    @property
    def host_harness_gid(self) -> int:
        """The host gid of the harness group (inside: ``inside_gid + 1``)."""
        return self.host_uid + 1

    def release(self) -> None:
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None

    def maps(self) -> tuple[str, str]:
        """``uid_map`` and ``gid_map`` of the sandbox's user namespace."""
        return (
            f"0 0 1\n{self.inside_uid} {self.host_uid} 1\n",
            f"0 0 1\n{self.inside_gid} {self.host_gid} 1\n{self.inside_gid + 1} {self.host_harness_gid} 1\n",
        )


def lease(inside_uid: int, inside_gid: int) -> Identity:
    """The first host uid of the pool no live sandbox holds, locked for the caller's sandbox."""
    if inside_uid == 0 or inside_gid == 0:
        raise ValueError("a sandbox's uid and gid inside must not be 0")
    LEASES.mkdir(parents=True, exist_ok=True, mode=0o700)
    for host_uid in range(POOL_START, POOL_START + 2 * POOL_SIZE, 2):
        fd = os.open(LEASES / str(host_uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return Identity(inside_uid, inside_gid, host_uid, fd)
    raise IdentityUnavailable(f"all {POOL_SIZE} sandbox identities under {LEASES} are in use")


def attached(host_uid: int, inside_uid: int, inside_gid: int) -> Identity:
    """The identity of a sandbox another process opened (its tree's owner is ``host_uid``)."""
    return Identity(inside_uid, inside_gid, host_uid)


@contextmanager
def user_namespace(identity: Identity) -> Iterator[int]:
    """A descriptor of a fresh user namespace created by ``identity``'s host uid and mapping it (for
    bwrap's ``--userns``), closed on exit. A helper made it (``unshare --user``, as that uid) and
    waits on its stdin while this process writes its maps; it exits once the descriptor is open."""
    helper = subprocess.Popen(
        ["unshare", "--user", "--", "/bin/sh", "-c", "echo ready && read x"],
        user=identity.host_uid,
        group=identity.host_gid,
        extra_groups=[],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin"},
    )
    try:
        assert helper.stdout is not None and helper.stdin is not None
        if helper.stdout.readline() != b"ready\n":
            raise IdentityUnavailable(
                f"unshare --user failed: {helper.communicate(timeout=10)[1].decode()[-500:]}"
            )
        uid_map, gid_map = identity.maps()
        for name, text in (("uid_map", uid_map), ("gid_map", gid_map)):
            with open(f"/proc/{helper.pid}/{name}", "w") as handle:
                handle.write(text)
        fd = os.open(f"/proc/{helper.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise IdentityUnavailable(
            f"cannot make a user namespace for uid {identity.host_uid}: {exc}"
        ) from None
    finally:
        if helper.stdin is not None:
            helper.stdin.close()
        helper.wait(timeout=60)
    try:
        yield fd
    finally:
        os.close(fd)
