"""Shared by the sandbox/harness tests: a real aiohttp server on a Unix socket, like the proxy's."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from polar_env.sandbox.bubblewrap import FORWARDER_INSIDE

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class UnixHTTPServer:
    """Records every request; ``handler`` decides the reply."""

    def __init__(self, sock_dir: Path, handler: Handler, name: str = "proxy.sock"):
        self.sock_dir = sock_dir
        self.path = sock_dir / name
        self.handler = handler
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._runner: web.AppRunner | None = None

    async def _record(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path_qs, dict(request.headers)))
        return await self.handler(request)

    async def __aenter__(self) -> UnixHTTPServer:
        self.sock_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.sock_dir, 0o755)
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._record)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.UnixSite(self._runner, str(self.path), backlog=1024, shutdown_timeout=0.5).start()
        os.chmod(self.path, 0o777)  # the sandbox uid connects to it
        return self

    async def __aexit__(self, *exc) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


async def reply_json(status: int, body: str) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=status, text=body, content_type="application/json")

    return handler


def clock_stopped_until(happened: Callable[[], bool], *, at_most_s: float = 300.0) -> Callable[[], float]:
    """A deadline's ``paused_s`` (``sandbox.base.Deadline``, the staged driver's run-slot pause) that
    holds the clock still until ``happened()`` (polled whenever the deadline is checked), and for at
    most ``at_most_s``: a hang test's deadline then counts from the hang itself, not from a harness
    start-up whose length the machine's load decides (no margin to wait out on a quiet machine)."""
    start = time.monotonic()
    seen: list[float] = []

    def paused_s() -> float:
        if not seen and happened():
            seen.append(time.monotonic())
        return min((seen[0] if seen else time.monotonic()) - start, at_most_s)

    return paused_s


async def hang(request: web.Request) -> web.Response:
    await request.read()
    await asyncio.sleep(3600)
    return web.Response(status=500)


def processes_matching(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker`` (to prove a tree was killed)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = (
                    Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                )
            except OSError:
                continue
            if marker in cmdline:
                pids.append(int(entry))
    return pids


NET_PROBE = """
import socket, urllib.request
def tcp(host, port, fam=socket.AF_INET):
    s = socket.socket(fam); s.settimeout(3)
    try:
        s.connect((host, port)); return "CONNECTED"
    except OSError as e:
        return "FAILED"
results = {
    "outside_v4": tcp("93.184.216.34", 443), "outside_v6": tcp("2606:4700::1111", 443, socket.AF_INET6),
    "host_loopback": tcp("127.0.0.1", HOST_PORT), "metadata": tcp("169.254.169.254", 80),
}
try:
    socket.getaddrinfo("pypi.org", 443); results["dns"] = "RESOLVED"
except OSError:
    results["dns"] = "FAILED"
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.sendto(b"x", ("8.8.8.8", 53)); results["udp"] = "SENT"
except OSError:
    results["udp"] = "FAILED"
try:
    urllib.request.urlopen("https://pypi.org/simple/flask/", timeout=5); results["pypi"] = "REACHED"
except OSError:
    results["pypi"] = "FAILED"
req = urllib.request.Request("http://127.0.0.1:18080/s/x/v1/models")
results["proxy"] = urllib.request.urlopen(req, timeout=10).read().decode()
for k, v in results.items():
    print(k, v)
"""


async def probe_network(sandbox, sock_dir: Path) -> dict[str, str]:
    """Every way out an agent would try, from inside ``sandbox`` (whose proxy socket dir is ``sock_dir``):
    outside addresses, a host loopback port, cloud metadata, DNS, UDP, PyPI, and the proxy through the
    forwarder (``proxy``: its answer). Every other value is ``FAILED`` when the sandbox is sealed."""
    py = "/usr/bin/python3"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    try:
        async with UnixHTTPServer(sock_dir, await reply_json(200, '"proxy-ok"')):
            res = await sandbox.run(
                [
                    py,
                    FORWARDER_INSIDE,
                    "--socket",
                    "/run/proxy/proxy.sock",
                    "--port",
                    "18080",
                    "--",
                    py,
                    "-c",
                    NET_PROBE.replace("HOST_PORT", str(listener.getsockname()[1])),
                ],
                timeout_s=90,
            )
    finally:
        listener.close()
    assert res.exit_code == 0, res.stderr_tail
    return dict(line.split(" ", 1) for line in res.stdout_tail.splitlines())


# a stand-in harness started by the forwarder: a tool command through bash (as every harness runs
# the agent's commands) and a program it runs directly, each opening the harness's /proc entries
SEALED_HARNESS = r"""
import ctypes, json, os, subprocess
me = os.getpid()
tool = ("for f in mem environ; do (exec 3</proc/%d/$f) 2>/dev/null && echo $f=opened || echo $f=denied; "
        "done; ls /proc/%d/fd >/dev/null 2>&1 && echo fd=listed || echo fd=denied; id -g | sed s/^/gid=/; "
        "grep -E '^Cap(Prm|Eff|Amb)' /proc/self/status | tr -d ':\t' | sed 's/0*$/=0/'") % (me, me)
direct = ("import sys\ntry:\n open('/proc/%d/environ','rb')\n print('opened')\nexcept OSError as e:\n"
          " print(e.strerror)") % me
print("SEALED " + json.dumps({
    "dumpable": ctypes.CDLL(None).prctl(3, 0, 0, 0, 0),
    "bash_tool": dict(ln.split("=", 1) for ln in subprocess.run(["bash", "-c", tool], capture_output=True,
                                                                text=True).stdout.split()),
    "direct_child": subprocess.run(["python3", "-c", direct], capture_output=True,
                                   text=True).stdout.strip()}))
"""
# what a sealed harness's probe sees (its tools run as the sandbox gid 1000; the harness has group 1001 beside
# it)
SEALED = {
    "dumpable": 0,
    "direct_child": "Permission denied",
    "bash_tool": {
        "mem": "denied",
        "environ": "denied",
        "fd": "denied",
        "gid": "1000",
        "CapPrm": "0",
        "CapEff": "0",
        "CapAmb": "0",
    },
}


async def sealed_harness_probe(sandbox) -> dict:
    """SEALED_HARNESS run as the harness: by the forwarder, as an episode starts it."""
    from polar_env.harness_adapters.runner import SANDBOX_PYTHON

    res = await sandbox.run(
        [
            SANDBOX_PYTHON,
            FORWARDER_INSIDE,
            "--socket",
            "/run/proxy/none",
            "--port",
            "18080",
            "--",
            "python3",
            "-c",
            SEALED_HARNESS,
        ],
        timeout_s=60,
    )
    line = next((ln for ln in res.stdout_tail.splitlines() if ln.startswith("SEALED ")), None)
    assert line is not None, (res.stdout_tail[-2000:], res.stderr_tail[-2000:])
    return json.loads(line[7:])


# what the agent could leave for a privileged Python to import: a .pth in its user site (HOME) and a
# module shadowing the stdlib on a PYTHONPATH it can write; each records the capabilities it ran with
PLANT = """
set -e
site=$(PY -c 'import site; print(site.getusersitepackages())')
mkdir -p "$site" /tmp/polar-pp
echo 'import os; os.system("grep CapEff /proc/self/status > /tmp/polar-ran-pth")' > "$site/polar-plant.pth"
echo 'import os; os.system("grep CapEff /proc/self/status > /tmp/polar-ran-pythonpath")' \
> /tmp/polar-pp/argparse.py
"""
PLANTED_ENV = {"PYTHONPATH": "/tmp/polar-pp"}
# what an isolated forwarder gives: the agent's own python3 runs both plants, the forwarder neither
PLANTS_IGNORED = {"control": ["polar-ran-pth", "polar-ran-pythonpath"], "forwarder": [], "forwarder_exit": 0}


async def forwarder_plant_probe(sandbox) -> dict[str, object]:
    """Which plants ran: ``control`` (the agent's own python3, importing argparse) and ``forwarder``
    (the forwarder started as an episode starts it, its harness ``true``), and the forwarder's exit
    code (a planted argparse breaks it)."""
    from polar_env.harness_adapters.runner import SANDBOX_PYTHON

    ran = 'cd /tmp && for f in polar-ran-*; do [ -e "$f" ] && echo "$f"; done; rm -f polar-ran-*'
    assert (await sandbox.run(["sh", "-c", PLANT.replace("PY", SANDBOX_PYTHON)], timeout_s=60)).exit_code == 0
    await sandbox.run([SANDBOX_PYTHON, "-c", "import argparse"], env=PLANTED_ENV, timeout_s=60)
    out: dict[str, object] = {
        "control": (await sandbox.run(["sh", "-c", ran], timeout_s=60)).stdout_tail.split()
    }
    started = await sandbox.run(
        [SANDBOX_PYTHON, FORWARDER_INSIDE, "--socket", "/run/proxy/none", "--port", "18080", "--", "true"],
        env=PLANTED_ENV,
        timeout_s=60,
    )
    out["forwarder"] = (await sandbox.run(["sh", "-c", ran], timeout_s=60)).stdout_tail.split()
    out["forwarder_exit"] = started.exit_code
    return out


# file systems whose mounts may show a sub-path as their root: the sandbox's own tmpfs (its files at
# their paths inside), bwrap's new root, and the kernel's proc and devices
_OWN_ROOTS = {("tmpfs", "polar-sandbox"), ("tmpfs", "tmpfs"), ("proc", "proc"), ("devtmpfs", "devtmpfs")}


def host_path_lines(mountinfo: str) -> list[str]:
    """The mountinfo lines that name something of the host: a bind from a host file system (its root
    field is the source's path there), or an overlay whose layers are spelt as paths, not descriptors."""
    bad = []
    for line in mountinfo.splitlines():
        if " - " not in line:
            continue
        fields, (fstype, source, options) = line.split(" - ")[0].split(), line.split(" - ")[1].split()[:3]
        own_root = fields[3] == "/" or (fstype, source) in _OWN_ROOTS
        layers = [
            opt.split("=", 1)[1] for opt in options.split(",") if opt.startswith(("lowerdir=", "upperdir="))
        ]
        named = any(
            not re.fullmatch(r"/proc/self/fd/\d+", layer) for spec in layers for layer in spec.split(":")
        )
        if not own_root or named:
            bad.append(line)
    return bad
