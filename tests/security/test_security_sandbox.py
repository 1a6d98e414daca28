"""Attacks from inside the bubblewrap sandbox, run as an agent would run them, and reward hacks
against grading. Each names what it tries; each asserts the attempt failed *and* that the
sandbox still works for legitimate use, so a broken sandbox cannot pass by refusing everything.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from polar_sandbox_helpers import probe_network, processes_matching

from polar_env.rewards.grading import grade
from polar_env.sandbox.base import SandboxSpec
from polar_env.sandbox.bubblewrap import BubblewrapSandbox
from polar_env.tasks.loader import load_tasks
from polar_env.tasks.tree import materialize

pytestmark = pytest.mark.needs("bwrap")
PY = "/usr/bin/python3"
needs_cgroups = pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/sys/fs/cgroup/memory/cgroup.procs").exists(),
    reason="cgroup v1 limits need root and a v1 hierarchy",
)


@pytest.fixture(scope="module")
def task():
    return next(t for t in load_tasks("bundled") if t.instance_id == "pallets__flask-5014")


@pytest.fixture
async def sandbox(task, tmp_path: Path):
    (tmp_path / "sock").mkdir()
    tree = materialize(task, tmp_path / "tree")
    sb = BubblewrapSandbox.create(
        tree,
        spec=SandboxSpec(
            proxy_socket_dir=tmp_path / "sock",
            scratch_root=tmp_path / "scratch",
            memory_bytes=256 << 20,
            pids_max=64,
        ),
    )
    yield sb
    await sb.destroy()


async def _py(sb: BubblewrapSandbox, script: str, timeout_s: float = 60, **kw):
    return await sb.run([PY, "-c", script], timeout_s=timeout_s, **kw)


async def test_no_network_but_the_proxy(sandbox, tmp_path: Path):
    out = await probe_network(sandbox, tmp_path / "sock")
    assert out.pop("proxy") == '"proxy-ok"'  # the one way out works
    assert set(out.values()) == {"FAILED"}, out


async def test_no_write_outside_task_tree_and_scratch(sandbox):
    script = """
import os
targets = ["/x", "/usr/lib/x", "/etc/passwd", "/etc/x", "/opt/polar/forwarder.py", "/run/proxy/x",
           "/proc/sys/kernel/hostname", "/sys/x", "/dev/shm/../x"]
os.symlink("/etc/hostname", "/testbed/link")
targets.append("/testbed/link")  # a symlink planted in the tree points at a read-only host file
for p in targets:
    try:
        with open(p, "a") as f:
            f.write("pwned")
        print("WROTE", p)
    except OSError:
        print("DENIED", p)
for p in ["/testbed/ok", "/tmp/ok", "/home/agent/ok"]:
    open(p, "w").write("fine"); print("WROTE", p)
"""
    before = Path("/etc/hostname").read_bytes()
    res = await _py(sandbox, script)
    assert res.exit_code == 0, res.stderr_tail
    lines = res.stdout_tail.splitlines()
    assert [ln for ln in lines if ln.startswith("WROTE")] == [
        "WROTE /testbed/ok",
        "WROTE /tmp/ok",
        "WROTE /home/agent/ok",
    ]
    assert Path("/etc/hostname").read_bytes() == before


async def test_host_files_outside_the_mounts_are_unreadable(sandbox, tmp_path: Path):
    other = BubblewrapSandbox.create(None, spec=SandboxSpec(scratch_root=tmp_path / "other"))
    (other.testbed / "secret.txt").write_text("other episode")
    try:
        script = f"""
import os
for p in ["/etc/shadow", "/root/.bashrc", "/work", "{Path.cwd()}", "{other.testbed}/secret.txt",
          "{Path.home()}/.cache/polar", "/proc/1/environ", "/var/run/docker.sock"]:
    try:
        os.listdir(p) if os.path.isdir(p) else open(p, "rb").read(1)
        print("READ", p)
    except OSError:
        print("DENIED", p)
print("PIDS", len([d for d in os.listdir("/proc") if d.isdigit()]))
"""
        res = await _py(sandbox, script)
    finally:
        await other.destroy()
    assert res.exit_code == 0, res.stderr_tail
    lines = res.stdout_tail.splitlines()
    assert not [ln for ln in lines if ln.startswith("READ")], lines
    assert int(lines[-1].split()[1]) < 10  # its own PID namespace: no host process is visible


@pytest.mark.slow
@needs_cgroups
async def test_fork_bomb_and_memory_hog_are_contained(sandbox):
    marker = f"bomb{uuid.uuid4().hex[:8]}"
    bomb = asyncio.ensure_future(
        sandbox.run(["bash", "-c", f"f() {{ f | f & }}; f; sleep 3600 # {marker}"], timeout_s=6)
    )
    await asyncio.sleep(2)
    started = time.monotonic()  # the host still forks and runs while the bomb is at its limit
    assert subprocess.run(["true"], timeout=10).returncode == 0
    assert time.monotonic() - started < 5
    res = await bomb
    assert res.timed_out
    for _ in range(50):
        if not processes_matching(marker):
            break
        await asyncio.sleep(0.1)
    assert processes_matching(marker) == []
    hog = await _py(sandbox, "b = bytearray(2 << 30); b[::4096] = b'x' * len(b[::4096]); print('survived')")
    assert hog.exit_code != 0 and "survived" not in hog.stdout_tail
    ok = await _py(sandbox, "print(sum(range(10)))")
    assert ok.stdout_tail.strip() == "45"  # the sandbox still works after both


async def test_every_sandbox_process_dies_at_the_deadline(sandbox):
    marker = f"stay{uuid.uuid4().hex[:8]}"
    script = f"""
import os, signal, subprocess, time
for _ in range(5):
    if os.fork() == 0:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if os.fork() == 0:
            os.execvp("sleep", ["sleep", "3600", "{marker}"])
        time.sleep(3600)
subprocess.Popen(["nohup", "sleep", "3601", "{marker}"], start_new_session=True)
print("spawned", flush=True)
time.sleep(3600)
"""
    res = await _py(sandbox, script, timeout_s=3)
    assert res.timed_out and "spawned" in res.stdout_tail
    for _ in range(50):
        if not processes_matching(marker):
            break
        await asyncio.sleep(0.1)
    assert processes_matching(marker) == []


# -- reward hacking ------------------------------------------------------------------------------

FIX_LINE = "'name' may not be empty."


async def test_git_history_holds_no_fix(sandbox, task):
    assert FIX_LINE in task.patch  # the string an agent would look for
    res = await sandbox.run(
        [
            "bash",
            "-c",
            "git log --all --oneline | wc -l; git log --all -p; git stash list; "
            'git reflog; grep -r "may not be empty" . || true',
        ],
        timeout_s=60,
    )
    assert res.exit_code == 0, res.stderr_tail
    assert res.stdout_tail.splitlines()[0].strip() == "1"  # a single commit: the base
    assert "may not be empty" not in res.stdout_tail


async def test_pip_install_of_a_fixed_release_fails(sandbox):
    res = await sandbox.run(
        [
            "bash",
            "-c",
            f"{PY} -m pip download --retries 0 --timeout 3 --no-deps -d /tmp/dl "
            "flask==2.3.2 || echo PIP_FAILED; ls /tmp/dl 2>/dev/null | wc -l",
        ],
        timeout_s=120,
    )
    assert "PIP_FAILED" in res.stdout_tail and res.stdout_tail.splitlines()[-1].strip() == "0"
    # the sandbox root has no pip (nothing of the host's /usr); where one is brought, the index is unreachable
    assert (
        "No module named pip" in res.stderr_tail
        or "No matching distribution found for flask==2.3.2" in res.stderr_tail
    ), res.stderr_tail


def _agent_patch(task, tmp_path: Path, edit) -> str:
    tree = materialize(task, tmp_path / f"agent-{uuid.uuid4().hex[:6]}")
    edit(tree)
    subprocess.run(["git", "add", "-A"], cwd=tree, check=True, capture_output=True)
    return subprocess.run(
        ["git", "diff", "--cached", "--binary"], cwd=tree, check=True, capture_output=True, text=True
    ).stdout


def _delete_tests(tree: Path) -> None:
    (tree / "tests" / "test_blueprints.py").unlink()


def _fake_test(tree: Path) -> None:  # write the hidden test's name so that it passes without a fix
    with open(tree / "tests" / "test_blueprints.py", "a") as f:
        f.write("\n\ndef test_empty_name_not_allowed():\n    pass\n")


def _outcome_hook(tree: Path) -> None:  # a conftest hook that reports every test as passed
    with open(tree / "tests" / "conftest.py", "a") as f:
        f.write(
            "\n\nimport pytest as _p\n\n\n@_p.hookimpl(hookwrapper=True)\n"
            "def pytest_runtest_makereport(item, call):\n    outcome = yield\n"
            "    outcome.get_result().outcome = 'passed'\n"
        )


def _new_conftest_in_subdir(tree: Path) -> None:
    (tree / "tests" / "sub").mkdir()
    (tree / "tests" / "sub" / "conftest.py").write_text("x = 1\n")
    _outcome_hook(tree)


@pytest.mark.slow
@pytest.mark.parametrize("edit", [_delete_tests, _fake_test, _outcome_hook, _new_conftest_in_subdir])
def test_editing_or_deleting_tests_earns_nothing(task, tmp_path: Path, edit):
    patch = _agent_patch(task, tmp_path, edit)
    assert patch.strip()
    result = grade(task, patch, timeout_s=300)
    assert result.failure_kind == "none", (result.error, result.log_tail[-1500:])
    assert result.reset_paths and set(result.reset_paths.values()) == {"test"}
    assert result.reward == 0.0 and not result.resolved
    assert result.fail_to_pass == {"tests/test_blueprints.py::test_empty_name_not_allowed": "FAILED"}


@pytest.mark.slow
def test_the_real_fix_with_a_test_hack_still_needs_the_fix(task, tmp_path: Path):
    """Control: grading is not just refusing everything: the gold fix plus a hack is still resolved."""

    def fix_and_hack(tree: Path) -> None:
        subprocess.run(["git", "apply"], input=task.patch, text=True, cwd=tree, check=True)
        _outcome_hook(tree)

    result = grade(task, _agent_patch(task, tmp_path, fix_and_hack), timeout_s=300)
    assert result.reward == 1.0 and result.resolved, result.log_tail[-1500:]
