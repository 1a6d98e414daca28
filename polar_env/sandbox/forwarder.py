"""Relay 127.0.0.1:PORT inside a sandbox to the proxy's Unix socket; stdlib only.

The sandbox has no network, only ``lo``; the proxy's socket directory is bind-mounted in. Harnesses
speak TCP, so this relays each TCP connection to a blocking Unix-socket connection. It binds
before it reports ready (a line on stderr) and, given ``-- CMD...``, starts CMD only then and exits
with CMD's status, so the harness never races the listener. Run with /usr/bin/python3 (docs/architecture.md, "An episode").
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import threading

READY = "POLAR_FORWARDER_READY"
KILLED = "POLAR_HARNESS_KILLED_BY"


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


def _serve_one(client: socket.socket, socket_path: str) -> None:
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
    _pipe(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _accept_loop(server: socket.socket, socket_path: str) -> None:
    while True:
        client, _ = server.accept()
        threading.Thread(target=_serve_one, args=(client, socket_path), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--socket", required=True, help="the proxy's Unix socket path")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS: run after ready")
    args = parser.parse_args(argv)
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((args.host, args.port))
    server.listen(1024)
    print(f"{READY} {args.host}:{args.port}", file=sys.stderr, flush=True)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        _accept_loop(server, args.socket)
        return 0
    threading.Thread(target=_accept_loop, args=(server, args.socket), daemon=True).start()
    try:
        code = subprocess.call(cmd)
    except FileNotFoundError as exc:
        print(f"polar-forwarder: {exc}", file=sys.stderr, flush=True)
        return 127
    if code < 0:
        print(f"{KILLED} {signal.Signals(-code).name}", file=sys.stderr, flush=True)
        return 128 - code
    return code


if __name__ == "__main__":
    sys.exit(main())
