"""Relay 127.0.0.1:PORT inside a sandbox to the proxy's Unix socket; stdlib only.

The sandbox has no network, only ``lo``; the proxy's socket directory is bind-mounted in. Harnesses
speak TCP, so this relays each TCP connection to a blocking Unix-socket connection. It binds
before it reports ready (a line on stderr) and, given ``-- CMD...``, starts CMD only then and exits
with CMD's status, so the harness never races the listener. Run with /usr/bin/python3 (docs/architecture.md,
"An episode").

**Call origin.** Given the proxy's origin key (``POLAR_ORIGIN_KEY`` in its environment: taken out
before CMD starts, and the forwarder made non-dumpable so no process of the sandbox's user can read
it from ``/proc``), it tags every HTTP request with ``x-polar-origin: ORIGIN KEY``, any such header
the client sent removed. ORIGIN is proven from the connection's peer process (``/proc/net/tcp``,
then the process holding that socket): ``harness`` when it is the process of CMD's tree that made
the episode's first call (no tool runs before the model asked for one), ``tool`` for any other
process of CMD's tree (a command the harness ran), ``unknown`` when it cannot be told (a process
that hid its descriptors, or is not in CMD's tree). Only ``harness`` calls train by default
(docs/training.md, "Which chains train").
A root harness (``--user 0:GID``: a container whose image's user is root, in a user namespace of its
own) keeps root's capabilities but never ``CAP_SYS_PTRACE`` or ``CAP_SETPCAP``: both leave its bounding
set before the exec, so neither it nor a tool it runs traces another process or reads a sealed one's
``/proc``. It keeps ``CAP_SETGID`` (in its own namespace, as Harbor's root has it), so any group is
its tools' to take: a root harness's install is not sealed but scanned (``tasks/answers.py``).
**Sealed harness.** The agent's tools run as the harness's uid, so by default they could read (and
write) the harness's memory, environment and descriptors through ``/proc``, and make a call look
like the harness's, and read the install it runs from (a Python harness's site-packages hold other
releases of task packages: ``requests`` among them). Given ``SUPERVISING`` (the bubblewrap sandbox
grants it to this process alone, as host root; a container runs this process as its root, and
``--user`` names the uid CMD runs as), the forwarder clears it from the ambient set, so CMD inherits
none, and starts CMD with its effective (and saved) gid one above its real gid: the harness group
(`harness_gid`). The kernel marks a process that execs with real and effective ids apart not
dumpable, at every exec of CMD's tree that keeps them apart, so its ``/proc/<pid>`` entries are
root's and no process without ``CAP_SYS_PTRACE`` opens them; and a Python harness's install is shown
with its top directory the harness group's alone (mode 0750: ``views.sealed_layer``), which only a
process whose effective gid is that group enters (a Node.js install cannot be: ``views.py``). A shell drops
the difference, real, effective and saved gids all set to the real one (bash and dash both), so the agent's
commands are ordinary processes of the sandbox gid, which can neither open the harness's ``/proc`` entries nor
enter its install, and which the forwarder, holding ``CAP_SYS_PTRACE`` and ``CAP_DAC_READ_SEARCH``, can still
read to prove each call's origin. A program the harness starts without a shell keeps the harness's ids (it is
part of the harness: the loader's secure mode, and the install readable), and so do the harness's own
in-process file tools. Such an exec also runs in the loader's secure mode:
the harness's dynamic loader drops ``LD_*`` and ``TMPDIR`` and ignores ``$ORIGIN`` (Node.js ignores
``NODE_OPTIONS``), which no adapter relies on.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable

READY = "POLAR_FORWARDER_READY"
KILLED = "POLAR_HARNESS_KILLED_BY"
ORIGIN_ENV = "POLAR_ORIGIN_KEY"
ORIGIN_HEADER = b"x-polar-origin"
MAX_HEAD = 1 << 20  # a request head larger than this is not HTTP a harness sends
PR_SET_DUMPABLE = 4
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_SETGID, CAP_SETPCAP, CAP_SYS_PTRACE = 1, 2, 6, 8, 19
PR_CAPBSET_DROP = 24
SUPERVISING = (1 << CAP_DAC_READ_SEARCH) | (1 << CAP_SETGID) | (1 << CAP_SYS_PTRACE)
# a container's root forwarder reads with DAC_OVERRIDE (the container keeps it for its setup) instead of
# DAC_READ_SEARCH, which a container must never hold (open_by_handle_at reaches the host's files)
SUPERVISING_IN_CONTAINER = (1 << CAP_DAC_OVERRIDE) | (1 << CAP_SETGID) | (1 << CAP_SYS_PTRACE)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


class _Reader:
    """Buffered reads from a socket: lines, exact counts, what is left."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buf = sock, b""

    def fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def until(self, marker: bytes, limit: int) -> bytes | None:
        while (end := self.buf.find(marker)) < 0:
            if len(self.buf) > limit or not self.fill():
                return None
        out, self.buf = self.buf[: end + len(marker)], self.buf[end + len(marker) :]
        return out

    def copy(self, n: int, dst: socket.socket) -> bool:
        while n > 0:
            if not self.buf and not self.fill():
                return False
            part, self.buf = self.buf[:n], self.buf[n:]
            dst.sendall(part)
            n -= len(part)
        return True


def _tagged_head(head: bytes, tag: bytes) -> tuple[bytes, int | None, bool]:
    """The request head with every origin header dropped and ours added; its body length (None:
    chunked) and whether the connection switches protocol after it."""
    lines = head[:-4].split(b"\r\n")
    kept, length, chunked, upgrade = [lines[0]], 0, False, False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        key = name.strip().lower()
        if key == ORIGIN_HEADER:
            continue
        if key == b"content-length":
            length = int(value.strip() or b"0")
        elif key == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
        elif key == b"upgrade":
            upgrade = True
        kept.append(line)
    kept.append(ORIGIN_HEADER + b": " + tag)
    return b"\r\n".join(kept) + b"\r\n\r\n", None if chunked else length, upgrade


def _relay_requests(client: socket.socket, upstream: socket.socket, tag: bytes) -> None:
    """Client to proxy, request by request (HTTP/1.1 keep-alive), each head re-tagged."""
    reader = _Reader(client)
    try:
        while (head := reader.until(b"\r\n\r\n", MAX_HEAD)) is not None:
            head, length, upgrade = _tagged_head(head, tag)
            upstream.sendall(head)
            if length is None:  # chunked: size line, data + CRLF, ..., the 0 chunk and its trailers
                while (line := reader.until(b"\r\n", MAX_HEAD)) is not None:
                    upstream.sendall(line)
                    size = int(line.split(b";")[0].strip() or b"0", 16)
                    if size == 0:  # then trailer lines, up to an empty one
                        while (trailer := reader.until(b"\r\n", MAX_HEAD)) not in (None, b"\r\n"):
                            upstream.sendall(trailer)
                        if trailer is None:
                            return
                        upstream.sendall(trailer)
                        break
                    if not reader.copy(size + 2, upstream):
                        return
            elif not reader.copy(length, upstream):
                return
            if upgrade:
                upstream.sendall(reader.buf)
                _pipe(client, upstream)
                return
    except (OSError, ValueError):
        pass
    finally:
        try:
            upstream.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _hex_ip(ip: str) -> str:
    """An IPv4 address as ``/proc/net/tcp`` writes it (the address's 32 bits in host order)."""
    return f"{struct.unpack('=I', socket.inet_aton(ip))[0]:08X}"


def _socket_inode(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """The inode of the client's end of a loopback TCP connection (from ``/proc/net/tcp``)."""
    want_local, want_remote = f"{_hex_ip(peer[0])}:{peer[1]:04X}", f"{_hex_ip(local[0])}:{local[1]:04X}"
    try:
        with open("/proc/net/tcp") as handle:
            for line in handle.readlines()[1:]:
                fields = line.split()
                if fields[1] == want_local and fields[2] == want_remote:
                    return int(fields[9])
    except OSError:
        return None
    return None


def _holder(inode: int) -> int | None:
    """The process holding socket ``inode`` (None: none readable does)."""
    target = f"socket:[{inode}]"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return int(pid)
        except OSError:
            continue
    return None


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def descends(pid: int, root: int) -> bool:
    """Whether process ``pid`` is ``root`` or one of its descendants."""
    while pid != root:
        parent = _parent(pid)
        if parent is None or pid <= 1:
            return False
        pid = parent
    return True


class Origin:
    """The origin key, the harness's pid (known once CMD started) and the process that made the
    episode's first call: the harness's caller (no tool can run before the model asked for one)."""

    def __init__(self, key: str | None):
        self.key = key.encode() if key else None
        self.harness_pid: int | None = None
        self.caller_pid: int | None = None
        self._lock = threading.Lock()

    def classify(self, pid: int | None) -> str:
        """``harness`` for the harness's caller, ``tool`` for any other process of the harness's
        tree, ``unknown`` when the peer is not found or not in the tree."""
        if pid is None or self.harness_pid is None or not descends(pid, self.harness_pid):
            return "unknown"
        with self._lock:
            if self.caller_pid is None:
                self.caller_pid = pid
        return "harness" if pid == self.caller_pid else "tool"

    def of(self, client: socket.socket) -> str:
        """Who opened ``client``'s connection."""
        inode = _socket_inode(client.getpeername(), client.getsockname())
        return self.classify(_holder(inode) if inode is not None else None)


def _serve_one(client: socket.socket, socket_path: str, origin: Origin | None = None) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(socket_path)  # blocking: a busy proxy queues us in its backlog
    except OSError as exc:
        print(f"polar-forwarder: cannot reach {socket_path}: {exc}", file=sys.stderr, flush=True)
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
    back.start()
    if origin is not None and origin.key is not None:
        _relay_requests(client, upstream, origin.of(client).encode() + b" " + origin.key)
    else:
        _pipe(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _accept_loop(server: socket.socket, socket_path: str, origin: Origin | None = None) -> None:
    while True:
        client, _ = server.accept()
        threading.Thread(target=_serve_one, args=(client, socket_path, origin), daemon=True).start()


def effective_caps() -> int:
    """This process's effective capability bits (``CapEff`` in ``/proc/self/status``)."""
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1], 16) for line in handle if line.startswith("CapEff:"))


def harness_gid(gid: int) -> int:
    """The effective gid a sealed harness runs with, beside its real ``gid``: the group its install is shown
    to."""
    return gid + 1


def _starter(user: tuple[int, int] | None, seal: bool) -> Callable[[], None] | None:
    """What CMD's child does before its exec (no other thread exists yet): drop from root to
    ``user`` (uid, gid), and when sealing take the harness group as effective and saved gid, apart
    from the real one, which leaves the exec not dumpable."""
    if user is None and not seal:
        return None

    def start() -> None:
        uid, gid = user or (os.geteuid(), os.getegid())
        if user is not None:
            os.setgroups([])
        effective = harness_gid(gid) if seal else gid
        os.setresgid(gid, effective, effective)
        if user is not None and uid == 0:  # a root harness (a container's own root): it, and every tool it
            libc = ctypes.CDLL(None, use_errno=True)  # runs, can never trace another process or regain that
            for cap in (CAP_SYS_PTRACE, CAP_SETPCAP):
                if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                    raise OSError(
                        ctypes.get_errno(), "cannot drop a capability from a root harness's bounding set"
                    )
        if user is not None:
            os.setresuid(uid, uid, uid)  # from root to another uid: every capability goes with it

    return start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--socket", required=True, help="the proxy's Unix socket path")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--user", help="UID:GID to start CMD as (this process runs as root: containers)")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS: run after ready")
    args = parser.parse_args(argv)
    origin = Origin(os.environ.pop(ORIGIN_ENV, None))
    libc = ctypes.CDLL(None, use_errno=True)
    if origin.key is not None:  # nothing of this process (its environment) is readable by the sandbox's user
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    uid, _, gid = (args.user or "").partition(":")
    user = (int(uid), int(gid)) if args.user else None
    caps = effective_caps()
    supervising = any(caps & needed == needed for needed in (SUPERVISING, SUPERVISING_IN_CONTAINER))
    if supervising:  # CMD inherits none of them
        libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((args.host, args.port))
    server.listen(1024)
    print(f"{READY} {args.host}:{args.port}", file=sys.stderr, flush=True)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        _accept_loop(server, args.socket, origin)
        return 0
    try:  # before the accept thread: calls queue in the backlog, and _seal runs in a one-thread fork
        child = subprocess.Popen(cmd, preexec_fn=_starter(user, supervising))
    except FileNotFoundError as exc:
        print(f"polar-forwarder: {exc}", file=sys.stderr, flush=True)
        return 127
    origin.harness_pid = child.pid
    threading.Thread(target=_accept_loop, args=(server, args.socket, origin), daemon=True).start()
    code = child.wait()
    if code < 0:
        print(f"{KILLED} {signal.Signals(-code).name}", file=sys.stderr, flush=True)
        return 128 - code
    return code


if __name__ == "__main__":
    sys.exit(main())
