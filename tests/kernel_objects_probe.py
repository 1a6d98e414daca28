"""Kernel objects one sandbox could leave for the next: run inside a sandbox as ``python3 probe.py make|look
TAG``.

``make`` tries to leave, under names derived from TAG, a key in its uid's user keyring (the channel an
adversary used: a hidden test file stored in a key during grading, read by the next episode; and,
where ``add_key`` is refused but ``keyctl`` is not, as under podman's default profile, a named keyring
linked into the user keyring: its name is the payload), a SysV message queue, a POSIX message queue,
a POSIX shared memory file and a listening abstract Unix socket, and prints what it made as one JSON
line (and writes ``--made-file``); it then keeps them until ``--until-file`` exists or ``--wait-fd`` reaches
its end (after a byte on ``--ready-fd``). ``look`` prints, as one JSON line, which of them it sees: the key or
keyring listed in ``/proc/keys`` or found by ``keyctl``, the queues by their names, the shm file, the socket
by connecting. ``exhaust`` takes every inotify instance its uid may have and holds them;
``one-instance`` says whether one more can be had. ``make-key`` makes the keys alone (the host control);
``clean`` invalidates the keys TAG names (run on the host as the uid that made them). Stdlib and ctypes only:
the sandbox's own python3 runs it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import socket
import time
import zlib

libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": {"add_key": 248, "keyctl": 250}, "aarch64": {"add_key": 217, "keyctl": 219}}[
    os.uname().machine
]
KEY_SPEC_USER_KEYRING = -4
KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_LINK, KEYCTL_SEARCH, KEYCTL_INVALIDATE = 1, 8, 10, 21
IPC_CREAT = 0o1000
O_CREAT, O_RDWR, O_RDONLY = os.O_CREAT, os.O_RDWR, os.O_RDONLY


def names(tag: str) -> dict[str, object]:
    ipc_key = zlib.crc32(tag.encode()) & 0x7FFFFFFF
    return {
        "key": f"polar-probe-{tag}",
        "ipc_key": ipc_key,
        "mq": f"/polar-probe-{tag}",
        "shm": f"/dev/shm/polar-probe-{tag}",
        "abstract": f"\0polar-probe-{tag}",
    }


def _err() -> str:
    return os.strerror(ctypes.get_errno())


def _keyctl(*args) -> int:
    return libc.syscall(NR["keyctl"], *args)


def _search(kind: bytes, name: str) -> int:
    return _keyctl(KEYCTL_SEARCH, KEY_SPEC_USER_KEYRING, kind, name.encode(), 0)


def make_key(tag: str) -> dict[str, str]:
    """A user key and a named keyring in the user keyring (all the host control makes: the rest would
    outlive it in the host's namespaces)."""
    n = names(tag)
    out: dict[str, str] = {}
    payload = b"hidden FAIL_TO_PASS test file"
    kid = libc.syscall(
        NR["add_key"], b"user", n["key"].encode(), payload, len(payload), KEY_SPEC_USER_KEYRING
    )
    out["key"] = "made" if kid >= 0 else _err()
    ring = _keyctl(KEYCTL_JOIN_SESSION_KEYRING, n["key"].encode())
    out["keyring"] = (
        "made" if ring >= 0 and _keyctl(KEYCTL_LINK, ring, KEY_SPEC_USER_KEYRING) >= 0 else _err()
    )
    return out


def make(tag: str, made_file: str, until_file: str | None, ready_fd: int | None, wait_fd: int | None) -> None:
    n = names(tag)
    out = make_key(tag)
    out["sysv_msg"] = "made" if libc.msgget(n["ipc_key"], IPC_CREAT | 0o666) >= 0 else _err()
    libc.mq_open.restype = ctypes.c_int
    mq = libc.mq_open(n["mq"].encode(), O_CREAT | O_RDWR, 0o666, None)
    out["posix_mq"] = "made" if mq >= 0 else _err()
    try:
        with open(n["shm"], "w") as handle:
            handle.write("x")
        out["posix_shm"] = "made"
    except OSError as exc:
        out["posix_shm"] = exc.strerror or str(exc)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(n["abstract"])
        server.listen(8)
        out["abstract"] = "made"
    except OSError as exc:
        out["abstract"] = exc.strerror or str(exc)
    print("MADE " + json.dumps(out), flush=True)
    open(made_file, "w").close()
    if ready_fd is not None:
        os.write(ready_fd, b"1")
        os.close(ready_fd)
    if wait_fd is not None:
        os.read(wait_fd, 1)
    deadline = time.monotonic() + 120
    while until_file and not os.path.exists(until_file) and time.monotonic() < deadline:
        time.sleep(0.1)


def look(tag: str) -> None:
    n = names(tag)
    seen: dict[str, bool] = {}
    try:
        listed = open("/proc/keys").read()
    except OSError:
        listed = ""
    seen["key"] = n["key"] in listed or _search(b"user", n["key"]) >= 0 or _search(b"keyring", n["key"]) >= 0
    seen["sysv_msg"] = libc.msgget(n["ipc_key"], 0) >= 0
    libc.mq_open.restype = ctypes.c_int
    seen["posix_mq"] = libc.mq_open(n["mq"].encode(), O_RDONLY, 0, None) >= 0
    seen["posix_shm"] = os.path.exists(n["shm"])
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.connect(n["abstract"])
        seen["abstract"] = True
    except OSError:
        seen["abstract"] = False
    print("SEEN " + json.dumps(seen), flush=True)


def exhaust(made_file: str, until_file: str) -> None:
    """Takes every inotify instance its uid may have (the per-user budget), reports how many, holds them.

    A process may also stop at its own fd limit (RLIMIT_NOFILE), with the same EMFILE, before the uid's
    budget is spent (a host whose max_user_instances exceeds it): it then forks a child that drops its
    copies of the held descriptors (the parent keeps the instances) and goes on, until a process that
    holds none still gets none. That last one reports, so the error it names is the per-user budget."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard := resource.getrlimit(resource.RLIMIT_NOFILE)[1], hard))
    total = 0
    while True:
        fds = []
        while (fd := libc.inotify_init1(0)) >= 0:
            fds.append(fd)
        error = _err()
        if not fds:
            break
        total += len(fds)
        if child := os.fork():
            os.waitpid(child, 0)
            os._exit(0)
        for fd in fds:
            os.close(fd)
    print("EXHAUSTED " + json.dumps({"instances": total, "then": error}), flush=True)
    open(made_file, "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(until_file) and time.monotonic() < deadline:
        time.sleep(0.1)


def one_instance() -> None:
    fd = libc.inotify_init1(0)
    print("INOTIFY " + json.dumps({"made": fd >= 0, "error": "" if fd >= 0 else _err()}), flush=True)


def clean(tag: str) -> None:
    for kind in (b"user", b"keyring"):
        for _ in range(10):
            if (kid := _search(kind, names(tag)["key"])) < 0:
                break
            _keyctl(KEYCTL_INVALIDATE, kid)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["make", "make-key", "look", "clean", "exhaust", "one-instance"])
    ap.add_argument("tag", nargs="?", default="")
    ap.add_argument("--made-file", default="/tmp/made")
    ap.add_argument("--until-file")
    ap.add_argument("--ready-fd", type=int)
    ap.add_argument("--wait-fd", type=int)
    args = ap.parse_args()
    if args.what == "make":
        make(args.tag, args.made_file, args.until_file, args.ready_fd, args.wait_fd)
    elif args.what == "exhaust":
        exhaust(args.made_file, args.until_file)
    elif args.what == "one-instance":
        one_instance()
    elif args.what == "make-key":
        print("MADE " + json.dumps(make_key(args.tag)), flush=True)
    else:
        (look if args.what == "look" else clean)(args.tag)
