"""The sandboxes' seccomp filter: no process inside may trace or read the memory of another, nor use the
kernel keyring.

``ptrace``, ``process_vm_readv``, ``process_vm_writev`` and ``pidfd_getfd`` (which copies another
process's file descriptor, e.g. the harness's socket to the forwarder) fail with EPERM for everything
in the sandbox (the agent's tools cannot attach to the harness, the forwarder or each other). So do
``add_key``, ``request_key`` and ``keyctl``, as in docker's and podman's default profiles: keyrings
are not namespaced by anything a sandbox unshares (a uid's user keyring is one per user namespace,
and as host root every sandbox of one uid shares the host's), so a key stored by one episode or
grading run (a hidden test file, say) would be read by the next. Every other syscall is allowed. Any ABI but
the host's native one (x86-64 or aarch64; i386 or x32 entry points) is refused outright, so a compat syscall
number cannot slip past. (``/proc/<pid>/mem`` of a process of the same uid stays open: the forwarder's origin
proof needs the harness dumpable.) The program is classic BPF, the format bwrap's ``--seccomp FD`` loads.
"""

from __future__ import annotations

import hashlib
import json
import platform
import struct
from pathlib import Path

from polar_env.cache import cache_root, write_atomic

_LD_ABS_W, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06
_ALLOW, _EPERM = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
_X32_BIT = 0x40000000
# AUDIT_ARCH_* and (ptrace, process_vm_readv, process_vm_writev, pidfd_getfd; add_key, request_key, keyctl)
# per native ABI
_ABIS = {
    "x86_64": (0xC000003E, (101, 310, 311, 438, 248, 249, 250)),
    "aarch64": (0xC00000B7, (117, 270, 271, 438, 217, 218, 219)),
}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes:
    """The filter for ``machine`` (default: this host's); a ``ValueError`` for an unknown one."""
    machine = machine or platform.machine()
    if machine not in _ABIS:
        raise ValueError(f"no seccomp filter for {machine}: known {', '.join(_ABIS)}")
    arch, denied = _ABIS[machine]
    n = len(denied)
    # layout: 0 load arch; 1 arch ok?; 2 load nr; 3 x32?; 4..4+n-1 denied?; 4+n allow; 5+n eperm
    eperm = 5 + n
    insns = [
        _insn(_LD_ABS_W, 0, 0, 4),
        _insn(_JEQ, 0, eperm - 2, arch),
        _insn(_LD_ABS_W, 0, 0, 0),
        _insn(_JGE, eperm - 4, 0, _X32_BIT),
    ]
    for i, nr in enumerate(denied):
        here = 4 + i
        insns.append(_insn(_JEQ, eperm - here - 1, 0, nr))
    insns += [_insn(_RET, 0, 0, _ALLOW), _insn(_RET, 0, 0, _EPERM)]
    return b"".join(insns)


def program_file() -> Path:
    """The filter written once into the cache (content-addressed), for bwrap to read."""
    data = program()
    path = cache_root() / "rootfs" / f"seccomp-{hashlib.sha256(data).hexdigest()[:16]}.bpf"
    return path if path.is_file() else write_atomic(path, data)


# The container engines' own profiles: docker's built-in one refuses the keyring calls; podman's
# (containers-common's seccomp.json) allows ``keyctl``, through which a container can still name a
# keyring, link it into its uid's user keyring and read another's names: a channel between containers
# of one uid. A podman container gets that profile with the three refused (EPERM), nothing else changed.
KEYRING_CALLS = ("add_key", "request_key", "keyctl")
PODMAN_PROFILES = (Path("/etc/containers/seccomp.json"), Path("/usr/share/containers/seccomp.json"))


class ProfileMissing(RuntimeError):
    """The engine's default seccomp profile was not found: no container is started without one."""


def without_keyring(profile: dict) -> dict:
    """An OCI seccomp profile (docker/podman JSON) with the keyring calls refused (EPERM) wherever it allowed
    them."""
    rules = []
    for rule in profile.get("syscalls", []):
        names = [n for n in rule.get("names", []) if n not in KEYRING_CALLS]
        if names:
            rules.append({**rule, "names": names})
    rules.append({"names": list(KEYRING_CALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": 1})
    return {**profile, "syscalls": rules}


def container_profile(engine: str) -> Path | None:
    """The ``--security-opt seccomp=`` file for ``engine``'s containers (None: its built-in default
    already refuses the keyring calls); written once into the cache, content-addressed."""
    if engine != "podman":
        return None
    source = next((p for p in PODMAN_PROFILES if p.is_file()), None)
    if source is None:
        raise ProfileMissing(
            f"podman's default seccomp profile is in none of {', '.join(map(str, PODMAN_PROFILES))}"
            f" (containers-common): cannot refuse the keyring calls in its containers"
        )
    data = json.dumps(without_keyring(json.loads(source.read_text())), sort_keys=True).encode()
    path = cache_root() / "seccomp" / f"podman-{hashlib.sha256(data).hexdigest()[:16]}.json"
    return path if path.is_file() else write_atomic(path, data)
