"""The real CLIs from npm inside bubblewrap: they start, reach only the proxy socket, and the
runner classifies their endings (error with stderr tail, timeout with the tree killed)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from polar_sandbox_helpers import UnixHTTPServer, clock_stopped_until, hang, processes_matching, reply_json

from polar_env.harness_adapters import adapter_names, get_adapter
from polar_env.harness_adapters.runner import SANDBOX_PYTHON, run_episode_in_sandbox
from polar_env.sandbox.base import SandboxSpec
from polar_env.sandbox.bubblewrap import FORWARDER_INSIDE, BubblewrapSandbox

pytestmark = [pytest.mark.slow, pytest.mark.needs("bwrap", "npm")]
# the hang deadline's clock starts at the harness's first request (however long its start-up took
# on a loaded machine) and runs this long after it
HANG_DEADLINE_S = 4.0
HARNESSES = adapter_names()


@pytest.fixture(scope="module", params=HARNESSES)
def adapter(request):
    a = get_adapter(request.param)
    a.install()  # once into the shared cache; a no-op afterwards
    return a


def _sandbox(adapter, tmp_path: Path) -> BubblewrapSandbox:
    task = tmp_path / "task"
    task.mkdir(exist_ok=True)
    (task / "hello.py").write_text("print('hi')\n")
    sock = tmp_path / "sock"
    sock.mkdir(exist_ok=True)
    return BubblewrapSandbox.create(
        task,
        spec=SandboxSpec(
            proxy_socket_dir=sock, harness_dir=adapter.install_dir(), scratch_root=tmp_path / "scratch"
        ),
    )


async def test_cli_starts_inside_sandbox(adapter, tmp_path: Path):
    """Started as an episode starts it, by the forwarder (a Python install is the sealed harness's alone)."""
    sb = _sandbox(adapter, tmp_path)
    try:
        res = await sb.run(
            [
                SANDBOX_PYTHON,
                FORWARDER_INSIDE,
                "--socket",
                "/run/proxy/none",
                "--port",
                "18080",
                "--",
                *adapter.version_command(),
            ],
            timeout_s=120,
        )
    finally:
        await sb.destroy()
    assert res.exit_code == 0, res.stderr_tail
    assert adapter.version in res.stdout_tail + res.stderr_tail


async def test_harness_error_is_recorded_with_stderr_tail(adapter, tmp_path: Path):
    """A 400 from the 'proxy' is not retried by any harness; each run ends as ``error``."""
    body = '{"error": {"type": "invalid_request_error", "message": "polar-test-refusal"}}'
    sb = _sandbox(adapter, tmp_path)
    try:
        async with UnixHTTPServer(tmp_path / "sock", await reply_json(400, body)) as server:
            run = await run_episode_in_sandbox(
                adapter,
                sb,
                proxy_socket_dir=tmp_path / "sock",
                session_id="sid-7",
                session_key="key-7",
                model_name="policy",
                prompt="Create out.txt",
                timeout_s=120,
            )
    finally:
        await sb.destroy()
    assert run.status == "error", (run.stdout_tail[-2000:], run.stderr_tail[-2000:])
    assert run.error and (run.exit_code != 0 or "polar-test-refusal" in run.error or "400" in run.error)
    assert server.requests, "the harness reached the proxy socket through the forwarder"
    for _method, path, headers in server.requests:
        assert path.startswith("/s/sid-7/"), path
        auth = "".join(headers.get(h, "") for h in ("Authorization", "x-api-key", "x-goog-api-key"))
        assert "key-7" in auth


async def test_hanging_harness_is_killed_at_deadline(adapter, tmp_path: Path):
    marker = f"polar-hang-{uuid.uuid4().hex[:8]}"
    sb = _sandbox(adapter, tmp_path)
    try:
        async with UnixHTTPServer(tmp_path / "sock", hang) as server:
            until_request = clock_stopped_until(lambda: bool(server.requests))
            run = await run_episode_in_sandbox(
                adapter,
                sb,
                proxy_socket_dir=tmp_path / "sock",
                session_id="sid-h",
                session_key="key-h",
                model_name="policy",
                prompt=f"Say {marker}",
                timeout_s=HANG_DEADLINE_S,
                paused_s=until_request,
            )
    finally:
        await sb.destroy()
    assert run.status == "timeout" and run.exit_code is None
    assert server.requests  # it was waiting on the model when the deadline hit
    # killed at the deadline after the request: its clock is checked every HANG_DEADLINE_S while it stands
    # still
    after_request = run.duration_s - until_request()
    assert HANG_DEADLINE_S - 1 < after_request < 2 * HANG_DEADLINE_S + 15, (run.duration_s, after_request)
    for _ in range(50):
        if not processes_matching(marker):
            break
        await asyncio.sleep(0.1)
    assert processes_matching(marker) == []
