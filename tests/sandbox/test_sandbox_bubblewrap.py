"""The bubblewrap sandbox, for real: uid, isolation, forwarder, deadline, diff, limits."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp import web
from polar_sandbox_helpers import UnixHTTPServer, processes_matching

from polar_env.harness_adapters.registry import NOISE_EXCLUDES
from polar_env.sandbox import gitdiff
from polar_env.sandbox.base import SandboxSpec
from polar_env.sandbox.bubblewrap import FORWARDER_INSIDE, BubblewrapSandbox
from polar_env.sandbox.cgroups import CgroupLimits

pytestmark = pytest.mark.needs("bwrap")

PY = "/usr/bin/python3"


@pytest.fixture
def task_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "task"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "mod.py").write_text("def f():\n    return 1\n")
    (tree / "README").write_text("task\n")
    return tree


@pytest.fixture
async def sandbox(task_tree: Path, tmp_path: Path):
    spec = SandboxSpec(proxy_socket_dir=tmp_path / "sock", scratch_root=tmp_path / "scratch")
    (tmp_path / "sock").mkdir()
    sb = BubblewrapSandbox.create(task_tree, spec=spec)
    yield sb
    await sb.destroy()


async def test_runs_in_testbed_as_unprivileged_user(sandbox: BubblewrapSandbox):
    res = await sandbox.run(
        ["sh", "-c", "id -u; id -un; pwd; hostname; echo $HOME $TZ; cat README"], timeout_s=30
    )
    assert res.exit_code == 0, res.stderr_tail
    uid, user, cwd, host, env, readme = res.stdout_tail.split("\n")[:6]
    assert int(uid) != 0 and user == "agent"
    assert cwd == "/testbed" and host == "sandbox" and env == "/home/agent UTC" and readme == "task"


async def test_secrets_and_readonly_paths(sandbox: BubblewrapSandbox):
    script = (
        "import os\n"
        "for p in ['/etc/shadow', '/root']:\n"
        "    try:\n        os.listdir(p) if os.path.isdir(p) else open(p).read(); print('READ', p)\n"
        "    except OSError as e: print('DENIED', p, e.errno)\n"
        "for p in ['/usr/x', '/etc/x', '/x', '/opt/polar/x', '/run/proxy/x', '/proc/sys/kernel/hostname']:\n"
        "    try:\n        open(p, 'w').write('x'); print('WROTE', p)\n"
        "    except OSError as e: print('DENIED', p, e.errno)\n"
        "for p in ['/testbed/new.txt', '/tmp/t', '/home/agent/h']:\n"
        "    open(p, 'w').write('ok'); print('WROTE', p)\n"
    )
    res = await sandbox.run([PY, "-c", script], timeout_s=30)
    assert res.exit_code == 0, res.stderr_tail
    lines = res.stdout_tail.splitlines()
    assert not [
        ln
        for ln in lines
        if ln.startswith(
            ("READ", "WROTE /usr", "WROTE /etc", "WROTE /x", "WROTE /opt", "WROTE /run", "WROTE /proc")
        )
    ], lines
    assert {"WROTE /testbed/new.txt", "WROTE /tmp/t", "WROTE /home/agent/h"} <= set(lines)
    assert (sandbox.testbed / "new.txt").read_text() == "ok"


async def test_network_isolated_but_proxy_reachable_through_forwarder(
    sandbox: BubblewrapSandbox, tmp_path: Path
):
    host_listener = socket.socket()
    host_listener.bind(("127.0.0.1", 0))
    host_listener.listen()
    host_port = host_listener.getsockname()[1]

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text=f"proxy saw {request.path} key={request.headers.get('Authorization')}")

    probe = (
        "import socket, urllib.request\n"
        "def tcp(host, port):\n"
        "    s = socket.socket(); s.settimeout(3)\n"
        "    try:\n        s.connect((host, port)); return 'CONNECTED'\n"
        "    except OSError as e: return f'FAILED {type(e).__name__}'\n"
        f"print('outside', tcp('1.1.1.1', 80))\n"
        f"print('hostloop', tcp('127.0.0.1', {host_port}))\n"
        "try:\n    socket.getaddrinfo('pypi.org', 443); print('dns RESOLVED')\n"
        "except OSError as e: print('dns FAILED', type(e).__name__)\n"
        "req = urllib.request.Request('http://127.0.0.1:18080/s/abc/v1/ping', headers={'Authorization': "
        "'Bearer k'})\nprint('proxy', urllib.request.urlopen(req, timeout=10).read().decode())\n"
    )
    try:
        async with UnixHTTPServer(tmp_path / "sock", hello) as server:
            res = await sandbox.run(
                [
                    PY,
                    FORWARDER_INSIDE,
                    "--socket",
                    "/run/proxy/proxy.sock",
                    "--port",
                    "18080",
                    "--",
                    PY,
                    "-c",
                    probe,
                ],
                timeout_s=60,
            )
    finally:
        host_listener.close()
    assert res.exit_code == 0, res.stderr_tail
    out = dict(line.split(" ", 1) for line in res.stdout_tail.splitlines())
    assert out["outside"].startswith("FAILED")
    assert out["hostloop"].startswith("FAILED")
    assert out["dns"].startswith("FAILED")
    assert out["proxy"] == "proxy saw /s/abc/v1/ping key=Bearer k"
    assert server.requests[0][:2] == ("GET", "/s/abc/v1/ping")
    assert "POLAR_FORWARDER_READY 127.0.0.1:18080" in res.stderr_tail


@pytest.mark.slow
async def test_forwarder_carries_parallel_requests_and_large_bodies(
    sandbox: BubblewrapSandbox, tmp_path: Path
):
    async def echo_len(request: web.Request) -> web.Response:
        body = await request.read()
        return web.Response(text=str(len(body)))

    probe = (
        "import urllib.request, concurrent.futures\n"
        "def post(n):\n"
        "    data = b'x' * n\n"
        "    return urllib.request.urlopen(urllib.request.Request('http://127.0.0.1:18080/s/a/v1', "
        "data=data), timeout=60).read().decode()\n"
        "with concurrent.futures.ThreadPoolExecutor(32) as ex:\n"
        "    sizes = [1000 * i for i in range(40)] + [20 * 1024 * 1024]\n"
        "    got = list(ex.map(post, sizes))\n"
        "print('OK' if got == [str(s) for s in sizes] else f'BAD {got}')\n"
    )
    async with UnixHTTPServer(tmp_path / "sock", echo_len):
        res = await sandbox.run(
            [
                PY,
                FORWARDER_INSIDE,
                "--socket",
                "/run/proxy/proxy.sock",
                "--port",
                "18080",
                "--",
                PY,
                "-c",
                probe,
            ],
            timeout_s=120,
        )
    assert res.exit_code == 0, res.stderr_tail
    assert res.stdout_tail.strip() == "OK"


async def test_deadline_kills_the_whole_tree(sandbox: BubblewrapSandbox):
    marker = f"77{os.getpid() % 1000:03d}1"
    script = (
        f"trap '' TERM HUP; setsid sleep {marker} & nohup sleep {marker}2 >/dev/null 2>&1 & "
        f"(trap '' TERM; sleep {marker}3) & echo started; sleep {marker}4"
    )
    res = await sandbox.run(["bash", "-c", script], timeout_s=2)
    assert res.timed_out and res.exit_code is None
    assert "started" in res.stdout_tail
    assert 1.5 < res.duration_s < 15
    for _ in range(50):
        if not processes_matching(f"sleep {marker}"):
            break
        await asyncio.sleep(0.1)
    assert processes_matching(f"sleep {marker}") == []


async def test_diff_is_binary_safe_and_drops_noise(sandbox: BubblewrapSandbox):
    script = (
        "printf 'def f():\\n    return 2\\n' > pkg/mod.py && printf '\\000\\001\\002' > blob.bin && "
        "mkdir -p .codex .claude .pi pkg/__pycache__ build && echo n > .codex/x && echo n > .claude/x && "
        "echo n > .pi/x && echo n > pkg/__pycache__/mod.cpython-311.pyc && echo n > pkg/stray.pyc && "
        "echo n > build/out.o && rm README"
    )
    res = await sandbox.run(["sh", "-c", script], timeout_s=30)
    assert res.exit_code == 0, res.stderr_tail
    patch = (
        await sandbox.diff(NOISE_EXCLUDES)
    ).decode()  # build artefacts + every harness's noise dirs, as episodes diff
    assert "+    return 2" in patch and "-    return 1" in patch
    assert "GIT binary patch" in patch and "blob.bin" in patch
    assert "deleted file mode" in patch and "a/README" in patch
    for noise in (".codex", ".claude", ".pi/", "__pycache__", "stray.pyc", "build/out.o"):
        assert noise not in patch, noise
    assert not (sandbox.testbed / ".git").exists()  # the base snapshot lives outside the tree


async def test_the_host_runs_no_git_on_the_agents_tree(sandbox: BubblewrapSandbox, monkeypatch):
    """The patch is made by git inside a bubblewrap of its own (the tree read-only, as the sandbox
    uid): during ``diff`` the host starts no git, only bwrap, and the patch is byte for byte what
    host git makes of the same tree. The agent's tree carries its own git config and hooks, which
    neither run."""
    script = (
        "printf 'def f():\\n    return 2\\n' > pkg/mod.py && printf '\\000\\001' > blob.bin && ln -s "
        "/etc/shadow leak && mkdir -p .git/hooks && printf '[core]\\n\\tfsmonitor = touch /tmp/ran\\n' > "
        ".git/config && printf '* filter=evil\\n' > .gitattributes && rm README"
    )
    assert (await sandbox.run(["sh", "-c", script], timeout_s=30)).exit_code == 0
    started: list[list[str]] = []
    real_run = subprocess.run

    def spy(argv, *args, **kwargs):
        started.append([str(a) for a in argv])
        return real_run(argv, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", spy)
    patch = await sandbox.diff()
    monkeypatch.undo()
    assert started and all("bwrap" in " ".join(argv) for argv in started), started
    assert not any(os.path.basename(argv[0]) == "git" for argv in started)
    assert patch == gitdiff.diff(sandbox.testbed, sandbox.git_dir)  # what host git made before
    assert b"+    return 2" in patch and b"GIT binary patch" in patch and b"+/etc/shadow" in patch
    assert not (sandbox.root / "tmp" / "ran").exists()


async def test_diff_applies_to_a_fresh_copy(sandbox: BubblewrapSandbox, task_tree: Path, tmp_path: Path):
    await sandbox.run(["sh", "-c", "echo 'new' > pkg/added.py && sed -i s/1/3/ pkg/mod.py"], timeout_s=30)
    patch = await sandbox.diff()
    fresh = tmp_path / "fresh"
    shutil.copytree(task_tree, fresh)
    proc = await asyncio.create_subprocess_exec(
        "git", "apply", "--binary", "-", cwd=fresh, stdin=asyncio.subprocess.PIPE
    )
    await proc.communicate(patch)
    assert proc.returncode == 0
    assert (fresh / "pkg" / "added.py").read_text() == "new\n"
    assert "return 3" in (fresh / "pkg" / "mod.py").read_text()


async def test_copy_in_out_stdin_and_bounded_output(sandbox: BubblewrapSandbox, tmp_path: Path):
    src = tmp_path / "cfg.toml"
    src.write_text("a = 1\n")
    await sandbox.copy_in(src, "/home/agent/.codex/config.toml")
    res = await sandbox.run(
        ["sh", "-c", "cat ~/.codex/config.toml; cat; echo made > /tmp/out.txt"],
        stdin=b"from-stdin\n",
        timeout_s=30,
    )
    assert res.stdout_tail == "a = 1\nfrom-stdin\n"
    await sandbox.copy_out("/tmp/out.txt", tmp_path / "out.txt")
    assert (tmp_path / "out.txt").read_text() == "made\n"
    with pytest.raises(ValueError):
        await sandbox.copy_in(src, "/etc/evil")
    flood = await sandbox.run(
        ["sh", "-c", "head -c 30000000 /dev/zero | tr '\\0' y"], timeout_s=60, max_output_bytes=4096
    )
    assert flood.exit_code == 0 and flood.stdout_bytes == 30_000_000 and len(flood.stdout_tail) == 4096


async def test_identical_environment_across_sandboxes(task_tree: Path, tmp_path: Path):
    probe = [
        "sh",
        "-c",
        "id; hostname; pwd; env | sort; ls -la /home/agent /testbed | sed 's/ [A-Z][a-z][a-z] .*//'",
    ]
    outs = []
    for i in range(2):
        sb = BubblewrapSandbox.create(task_tree, spec=SandboxSpec(scratch_root=tmp_path / f"s{i}"))
        try:
            outs.append((await sb.run(probe, timeout_s=30)).stdout_tail)
        finally:
            await sb.destroy()
    assert outs[0] == outs[1]
    assert "HOME=/home/agent" in outs[0] and "TZ=UTC" in outs[0] and "polar-bwrap" not in outs[0]


async def test_destroy_removes_host_state(task_tree: Path, tmp_path: Path):
    sb = BubblewrapSandbox.create(task_tree, spec=SandboxSpec(scratch_root=tmp_path / "s"))
    root = sb.root
    assert (root / "testbed" / "README").exists()
    await sb.destroy()
    await sb.destroy()  # idempotent
    assert not root.exists()
    with pytest.raises(RuntimeError):
        await sb.run(["true"], timeout_s=5)


def _limits_on_this_host() -> CgroupLimits:
    probe = CgroupLimits(f"probe-{os.getpid()}", 1 << 30, 64)
    probe.remove()
    return probe


LIMITS = _limits_on_this_host()


@pytest.mark.slow
@pytest.mark.skipif(
    LIMITS.mode is None, reason=f"neither cgroup v2 nor v1 limits work here: {LIMITS.skipped}"
)
async def test_memory_and_pids_limits(task_tree: Path, tmp_path: Path, record_property):
    """Enforced through whichever cgroup version this host delegates, per controller; the test says which."""
    spec = SandboxSpec(memory_bytes=128 << 20, pids_max=32, scratch_root=tmp_path / "s")
    sb = BubblewrapSandbox.create(task_tree, spec=spec)
    mode, versions = sb.cgroups.mode, sb.cgroups.versions
    record_property("cgroup_mode", mode)
    print(
        f"cgroup limits: {mode} {versions}"
        + (f" (v2 not used: {sb.cgroups.v2_unavailable})" if mode != "v2" else "")
    )
    try:
        assert sb.limits_applied == ["memory", "pids", "disk"] and mode in ("v1", "v2", "v2+v1")
        assert [int(sb.cgroups.knob(c).read_text()) for c in ("memory", "pids")] == [128 << 20, 32]
        oom = await sb.run(
            [PY, "-c", "b = bytearray(400 << 20); b[::4096] = b'x' * len(b[::4096]); print('survived')"],
            timeout_s=60,
        )
        assert oom.exit_code != 0 and "survived" not in oom.stdout_tail
        spawn = (
            "import subprocess\nkids = []\nfor _ in range(60):\n    try:\n"
            "        kids.append(subprocess.Popen(['sleep', '30']))\n    except OSError:\n        break\n"
            "print(len(kids))\nfor k in kids:\n    k.kill()\n"
        )
        forks = await sb.run([PY, "-c", spawn], timeout_s=60)
        assert 0 < int(forks.stdout_tail.strip()) < 32, forks
        ok = await sb.run([PY, "-c", "b = bytearray(32 << 20); print('fine')"], timeout_s=60)
        assert ok.stdout_tail.strip() == "fine"
        groups = list(sb.cgroups.dirs)
    finally:
        await sb.destroy()
    assert sb.cgroups.dirs == [] and not any(p.exists() for p in groups)


def test_forwarder_is_stdlib_only():
    src = Path(sys.modules[BubblewrapSandbox.__module__].__file__).with_name("forwarder.py").read_text()
    imports = {
        line.split()[1].split(".")[0] for line in src.splitlines() if line.startswith(("import ", "from "))
    }
    assert imports and imports <= set(sys.stdlib_module_names)  # images have python3, not our packages
