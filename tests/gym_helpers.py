"""What the NeMo Gym end-to-end tests share: free ports, waiting on logs, stopping process groups,
and looking at the host the way an operator would (sandbox processes, model calls in flight)."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

_HANDED: set[int] = set()


def free_port() -> int:
    """A free port that stays free until the server given it binds it (seconds later, after a start-up):
    below the kernel's ephemeral range, so no bind to port 0 anywhere on the machine (another test job's
    servers) is handed it meanwhile, and never one this process handed out before. A port from the
    ephemeral range once went to another process in that window (Gym's head server: address in use)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(20000, low)
        if port in _HANDED:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED.add(port)
        return port
    raise RuntimeError(f"no free port in 20000-{low}")


def interruptible() -> None:
    """A child's ``preexec_fn``: SIGINT and SIGQUIT back to their defaults, as under a terminal (a
    process started in the background of a non-interactive shell inherits them ignored, and neither
    bash nor Python then lets SIGINT through)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def wait_for(path: Path, needle: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if needle in text:
            return
        if proc.poll() is not None:
            pytest.fail(f"process exited {proc.returncode} before {needle!r}:\n{text[-6000:]}")
        time.sleep(1)
    pytest.fail(f"no {needle!r} within {timeout_s}s:\n{path.read_text(errors='replace')[-6000:]}")


def stop(proc: subprocess.Popen, sig: int = signal.SIGINT, timeout_s: float = 90) -> None:
    """Signal the process (its own session) and wait; SIGKILL the whole group if it will not go."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _program(cmd: str) -> str:
    return os.path.basename(cmd.split(" ", 1)[0])


def sandbox_processes(under: Path) -> list[str]:
    """Sandboxes still running whose workspace is under ``under`` (their bwrap argv binds it)."""
    return [
        f"{pid}: {cmd[:200]}"
        for pid in os.listdir("/proc")
        if pid.isdigit()
        if _program(cmd := _cmdline(pid)) == "bwrap" and str(under) in cmd
    ]


def harness_pids(under: Path) -> list[int]:
    """The harness processes (the forwarder's children) of the sandboxes under ``under``."""
    forwarders = set()
    for pid in os.listdir("/proc"):
        if (
            pid.isdigit()
            and "/opt/polar/forwarder.py" in (cmd := _cmdline(pid))
            and _program(cmd) not in ("bwrap", "setpriv")
        ):
            forwarders.add(int(pid))
    sandboxed = {int(p.split(":")[0]) for p in sandbox_processes(under)}
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid in forwarders and _descends_from(ppid, sandboxed):
            out.append(int(pid))
    return out


def _descends_from(pid: int, ancestors: set[int]) -> bool:
    while pid > 1:
        if pid in ancestors:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
    return False


def requests_waiting(port: int) -> int:
    """Connections to 127.0.0.1:``port`` whose request sits unread in the listener's receive queue:
    with the server stopped (SIGSTOP), each is a model call in flight."""
    waiting = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, queues = fields[1], fields[3], fields[4]
        if local.endswith(f":{port:04X}") and state == "01" and int(queues.split(":")[1], 16) > 0:
            waiting += 1
    return waiting


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.5) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    pytest.fail(f"timed out after {timeout_s}s waiting for {what}")


GYM_ROOT = Path(__file__).resolve().parents[1] / "nemo_gym_env"  # what NEMO_GYM_EXTRA_ROOTS points at


def compose(path: Path, *, inner_first: bool = True) -> dict:
    """A Gym config the way NeMo Gym reads it, before interpolation: the files its ``config_paths`` pull
    in (relative to ``GYM_ROOT``) merged with it, then every ``_inherit_from`` node replaced by its
    source merged with the node, the source removed. ``inner_first`` is Gym's order since 0.5.1 (the
    file overrides what it pulls in); older Gyms merged the other way, which must not matter."""
    import yaml

    top = yaml.safe_load(path.read_text())
    inner = [yaml.safe_load((GYM_ROOT / p).read_text()) for p in top.pop("config_paths", [])]
    merged: dict = {}
    for part in [*inner, top] if inner_first else [top, *inner]:
        merged = _merge(merged, part)
    frozen = dict(merged)
    for name, node in list(frozen.items()):
        if isinstance(node, dict) and "_inherit_from" in node:
            source = node["_inherit_from"]
            merged.pop(source, None)
            merged[name] = _merge(frozen[source], {k: v for k, v in node.items() if k != "_inherit_from"})
    return merged


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out
