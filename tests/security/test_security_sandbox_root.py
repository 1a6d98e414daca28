"""The sandbox root holds no answers, shows no episode path, lets nothing ptrace the harness, and caps disk.

Run as an agent would, inside the real bubblewrap sandbox (the episode's, on the built sandbox
root): a search of the whole sandbox filesystem for a distinctive added line of every bundled gold
patch (with a control proving the search finds the fix in the host's own ``/usr``), the mount table,
ptrace against the harness's interpreters, and a disk filler. The last test
does the same probe from a real Pi episode whose scripted policy runs it as its shell command.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from polar_sandbox_helpers import (
    PLANTS_IGNORED,
    SEALED,
    forwarder_plant_probe,
    host_path_lines,
    sealed_harness_probe,
)
from repo_paths import REPO

from polar_env.sandbox.base import SandboxSpec
from polar_env.sandbox.bubblewrap import BubblewrapSandbox
from polar_env.sandbox.bwrap_argv import BwrapCommand, SandboxUnavailable, can_seal
from polar_env.sandbox.rootfs import rootfs_dir, sandbox_root
from polar_env.sandbox.seccomp import program
from polar_env.sandbox.views import node_layer, socket_dir, unmount
from polar_env.tasks.loader import load_bundled
from polar_env.tasks.tree import materialize

pytestmark = pytest.mark.needs("bwrap", "sandbox-root")
TASKS = {t.instance_id: t for t in load_bundled()}


def _text(tree: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in tree.rglob("*") if p.is_file())


def _needles(tmp_path: Path, sandbox_task: str) -> dict[str, str]:
    """Per bundled task, the longest line its gold patch adds that its base tree does not hold, nor
    the base tree in the sandbox (a later base of the same repo holds an earlier task's fix by history)."""
    here = _text(materialize(TASKS[sandbox_task], tmp_path / "bases" / "sandbox"))
    out = {}
    for iid, task in TASKS.items():
        base = _text(materialize(task, tmp_path / "bases" / iid))
        added = [
            ln[1:].strip()
            for ln in task.patch.splitlines()
            if ln.startswith("+") and not ln.startswith("+++")
        ]
        fresh = [ln for ln in added if len(ln) >= 20 and ln not in base]
        assert fresh, f"{iid}: no distinctive added line in its gold patch"
        if unseen := [ln for ln in fresh if ln not in here]:
            out[iid] = max(unseen, key=len)
    assert sandbox_task in out and len(out) >= len(TASKS) - 1, out
    return out


# what the agent runs: every file of the sandbox searched for the needles (not /proc, /sys, /dev)
SEARCH = (
    "grep -rIlF -f /tmp/polar-needles --exclude=polar-needles "
    "--exclude-dir=proc --exclude-dir=sys --exclude-dir=dev / 2>/dev/null; echo SEARCHED"
)
# ptrace (seccomp) and /proc/<pid>/mem + environ against a Python and a Node process
TRACE = r"""
python3 -c 'import time; time.sleep(60)' & PY=$!
node -e 'setTimeout(() => {}, 60000)' & NODE=$!
sleep 1
python3 - $PY $NODE <<'EOF'
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
out = {"seccomp": open("/proc/self/status").read().split("Seccomp:")[1].split()[0],
       "self_exe": os.readlink("/proc/self/exe"), "self_fds": len(os.listdir("/proc/self/fd"))}
# pidfd_getfd (438 on x86-64 and aarch64) of the process's fd 0, through a pidfd_open (434) pidfd
def getfd(pid):
    pidfd = libc.syscall(434, pid, 0)
    if pidfd < 0:
        return "pidfd_open: " + os.strerror(ctypes.get_errno())
    return os.strerror(ctypes.get_errno()) if libc.syscall(438, pidfd, 0, 0) < 0 else "copied"
out["self_pidfd_getfd"] = getfd(os.getpid())  # allowed on oneself but for seccomp
for name, pid in zip(("python", "node"), sys.argv[1:]):
    out[name + "_ptrace"] = os.strerror(ctypes.get_errno()) if libc.ptrace(16, int(pid), 0, 0) else "attached"
    out[name + "_pidfd_getfd"] = getfd(int(pid))
    for f in ("mem", "environ"):
        try:
            open(f"/proc/{pid}/{f}", "rb").close()
            out[f"{name}_{f}"] = "opened"
        except OSError as exc:
            out[f"{name}_{f}"] = exc.strerror
print("TRACE " + json.dumps(out))
EOF
kill $PY $NODE
"""


def _check_trace(out: dict) -> None:
    assert out["seccomp"] == "2" and out["self_exe"] == "/usr/bin/python3.11" and out["self_fds"] >= 3, out
    for name in ("python", "node", "self"):
        if name != "self":
            assert out[f"{name}_ptrace"] == "Operation not permitted", out
        assert out[f"{name}_pidfd_getfd"] == "Operation not permitted", out
    # /proc/<pid>/mem of the agent's own processes (these two, started by its shell) stays open to it:
    # they are its own; the harness's is not (test_the_forwarder_seals_the_harness_from_its_tools)


def _mount_roots(mountinfo: str) -> dict[str, str]:
    """mount point -> the root of the mount within its source filesystem (field 4)."""
    return {line.split()[4]: line.split()[3] for line in mountinfo.splitlines() if " - " in line}


@pytest.fixture
async def sandbox(tmp_path: Path):
    task = TASKS["psf__requests-6028"]
    scratch = tmp_path / f"polar-ws-{task.instance_id}-x"  # as episodes/workspace.py names it
    sb = BubblewrapSandbox.create(
        materialize(task, tmp_path / "tree"), spec=SandboxSpec(scratch_root=scratch, disk_bytes=64 << 20)
    )
    yield sb
    await sb.destroy()


async def test_no_bundled_fix_is_readable_anywhere_in_the_sandbox(sandbox, tmp_path: Path):
    needles = _needles(tmp_path, "psf__requests-6028")
    (tmp_path / "needles").write_text("\n".join(needles.values()) + "\n")
    # control: the same search finds the requests fixes in the host's own /usr (Debian's python3-requests),
    # which is why the sandbox must not mount it
    host_pkg = Path("/usr/lib/python3/dist-packages/requests")
    if host_pkg.is_dir():
        hit = subprocess.run(
            ["grep", "-rIlF", "-f", str(tmp_path / "needles"), str(host_pkg)], capture_output=True, text=True
        ).stdout
        assert hit.strip(), "control: the needles should find the fix in the host's python3-requests"
    await sandbox.copy_in(tmp_path / "needles", "/tmp/polar-needles")
    res = await sandbox.run(["bash", "-c", SEARCH], timeout_s=300)
    assert res.stdout_tail.strip().splitlines() == ["SEARCHED"], res.stdout_tail
    res = await sandbox.run(["bash", "-c", "cd / && python3 -c 'import requests'"], timeout_s=60)
    assert res.exit_code != 0 and "No module named 'requests'" in res.stderr_tail
    res = await sandbox.run(
        ["bash", "-c", "ls /usr/lib/python3/dist-packages 2>/dev/null | wc -l"], timeout_s=60
    )
    assert res.stdout_tail.strip() == "0"  # Debian's own python3 packages: none in the root


async def test_mountinfo_names_no_episode_path(tmp_path: Path):
    """Failed while the read-only inputs were binds: their lines named the cache's
    ``rootfs/<key>/usr``, the host's ``/usr/bin/node``, the harness install and the proxy's socket dir.
    Now they are overlays named by descriptors and a tmpfs of the proxy's own."""
    task = TASKS["psf__requests-6028"]
    harness = tmp_path / "harness-install"  # a Python one: sealed as host root
    (harness / "bin").mkdir(parents=True)
    (harness / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (harness / "bin" / "tool").write_text("shown\n")
    sock = tmp_path / "sock"
    assert socket_dir(sock)  # as the proxy makes it
    sb = BubblewrapSandbox.create(
        materialize(task, tmp_path / "tree"),
        spec=SandboxSpec(
            scratch_root=tmp_path / f"polar-ws-{task.instance_id}-x",
            disk_bytes=64 << 20,
            harness_dir=harness,
            proxy_socket_dir=sock,
        ),
    )
    try:
        res = await sb.run(
            [
                "bash",
                "-c",
                "cat /proc/self/mountinfo; cat /opt/harness/bin/tool 2>/dev/null || echo sealed; "
                "node -e 'console.log(6*7)'",
            ],
            timeout_s=60,
        )
        devs = await sb.run(["stat", "-c", "%d", "/usr", "/usr/bin/env", "/usr/local/bin/node"], timeout_s=60)
        sb.system, sb.harness = None, harness  # control: the inputs bound as they are name their paths
        control = subprocess.run(
            sb.bwrap_argv(["cat", "/proc/self/mountinfo"], {}), capture_output=True, text=True
        )
    finally:
        await sb.destroy()
        unmount(sock)
    # the install is the sealed harness's alone (test_every_harness_view_holds_no_answer_for_its_tools)
    shown = "sealed" if can_seal() else "shown"
    assert res.exit_code == 0 and res.stdout_tail.splitlines()[-2:] == [shown, "42"], res.stdout_tail
    roots = _mount_roots(res.stdout_tail)
    # the writable paths and generated files come from the sandbox's own tmpfs: their roots are neutral
    assert {
        m: roots[m] for m in ("/testbed", "/home/agent", "/tmp", "/etc/passwd", "/opt/polar/forwarder.py")
    } == {
        "/testbed": "/testbed",
        "/home/agent": "/home",
        "/tmp": "/tmp",
        "/etc/passwd": "/etc/passwd",
        "/opt/polar/forwarder.py": "/opt/forwarder.py",
    }
    assert {roots[m] for m in ("/usr", "/etc", "/opt/harness", "/run/proxy")} == {"/"}
    assert host_path_lines(res.stdout_tail) == [], res.stdout_tail
    for bad in (
        str(sb.root),
        "psf__requests-6028",
        "polar-ws-",
        "polar-bwrap-",
        str(REPO),
        str(tmp_path),
        str(sandbox_root()),
        "/usr/bin/node",
    ):
        assert bad not in res.stdout_tail, bad
    assert len(host_path_lines(control.stdout)) >= 4, control.stdout  # usr, etc, harness, node
    # /usr's layers (the cache's root and node) and its empty layer share one file system: its files
    # show the overlay's st_dev as its directories do (an empty layer on the tmpfs gave files another)
    assert devs.exit_code == 0 and len(set(devs.stdout_tail.split())) == 1, devs.stdout_tail


@pytest.mark.parametrize("left_by_earlier_version", [False, True], ids=["fresh", "0700"])
async def test_usr_is_the_agents_to_read_with_the_node_layer_made_anew(
    tmp_path: Path, monkeypatch, left_by_earlier_version: bool
):
    """Failed on a fresh cache: the node layer's root, made by mkdtemp (0700), is the top layer of
    ``/usr``, whose view takes its mode, so the agent's uid could load no library (a warm cache's
    older 0755 layer hid it). An earlier version's 0700 layer is repaired."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "rootfs").symlink_to(rootfs_dir().parent)  # the built root, a node layer of its own
    monkeypatch.setenv("POLAR_CACHE", str(cache))
    if left_by_earlier_version:
        node_layer().chmod(0o700)
    sb = BubblewrapSandbox.create(
        materialize(TASKS["psf__requests-6028"], tmp_path / "tree"),
        spec=SandboxSpec(scratch_root=tmp_path / "scratch", disk_bytes=64 << 20),
    )
    try:
        res = await sb.run(["bash", "-c", "id -u; stat -c %a /usr; node -e 'console.log(6*7)'"], timeout_s=60)
    finally:
        await sb.destroy()
    assert res.exit_code == 0 and res.stdout_tail.split() == ["1000", "755", "42"], res
    assert node_layer().parent == cache / "node"


async def test_the_forwarder_imports_nothing_the_agent_wrote(sandbox):
    """The forwarder holds privileges: a ``.pth`` in the agent's user site or a module shadowing the
    stdlib on PYTHONPATH would run with them. Its interpreter is isolated (``-I``); the agent's own
    python3 runs both (the control)."""
    assert await forwarder_plant_probe(sandbox) == PLANTS_IGNORED


async def test_nothing_traces_the_harness_interpreters(sandbox):
    res = await sandbox.run(["bash", "-c", TRACE], timeout_s=120)
    line = next(ln for ln in res.stdout_tail.splitlines() if ln.startswith("TRACE "))
    _check_trace(json.loads(line[6:]))


async def test_the_forwarder_seals_the_harness_from_its_tools(sandbox):
    """As host root: the harness is not dumpable, so neither a shell command it runs nor a program
    it starts directly opens its memory, environment or descriptors; the tools hold no capability."""
    out = await sealed_harness_probe(sandbox)
    if os.geteuid() != 0:  # unprivileged bwrap grants the forwarder nothing: the harness stays dumpable
        assert out["dumpable"] == 1, out
        return
    assert out == SEALED, out


@pytest.mark.skipif(os.geteuid() != 0, reason="only host root keeps capabilities for the forwarder")
def test_a_root_without_the_capabilities_starts_the_forwarder_with_none(monkeypatch):
    """Root in a container may lack CAP_SYS_PTRACE: setpriv would refuse to keep it, so nothing is
    kept (the harness then runs unsealed) rather than no episode starting."""
    from polar_env.sandbox import bwrap_argv

    command = BwrapCommand([], workdir="/", env={}, uid=1000, gid=1000, supervisor=True)
    assert "--ambient-caps=+sys_ptrace,+dac_read_search,+setgid" in command.argv(["true"])
    monkeypatch.setattr(bwrap_argv, "effective_caps", lambda: bwrap_argv.SUPERVISING & ~(1 << 19))
    argv = command.argv(["true"])
    assert not any(a.startswith("--ambient-caps") for a in argv) and "--inh-caps=-all" in argv


async def test_disk_filler_ends_at_the_quota_and_the_diff_still_works(sandbox):
    res = await sandbox.run(
        [
            "bash",
            "-c",
            "echo fixed >> /testbed/README.md && "
            "for d in /tmp /home/agent /testbed; do dd if=/dev/zero of=$d/fill bs=1M count=800; done; "
            "du -sc /tmp/fill /home/agent/fill /testbed/fill | tail -1",
        ],
        timeout_s=120,
    )
    assert res.stderr_tail.count("No space left on device") == 3, res.stderr_tail
    total_kib = int(res.stdout_tail.split()[-2])
    assert total_kib <= 64 * 1024, total_kib  # 3 x 800 MB asked, the quota given
    assert "disk" in sandbox.limits_applied
    await sandbox.run(["rm", "-f", "/tmp/fill", "/home/agent/fill", "/testbed/fill"], timeout_s=60)
    assert "+fixed" in (await sandbox.diff()).decode()  # the snapshot lives off the quota


def test_root_python_is_the_hosts_debian_python():
    """The venvs (harnesses', tasks') are made by the host's /usr/bin/python3.11; the root's must run them."""
    ver = "import sys; print(sys.version.split()[0])"
    host = subprocess.run(["/usr/bin/python3.11", "-c", ver], capture_output=True, text=True).stdout
    cmd = BwrapCommand(
        [], workdir="/", env={"PATH": "/usr/bin:/bin"}, uid=os.getuid() or 65534, gid=os.getgid() or 65534
    )
    inside = subprocess.run(cmd.argv(["/usr/bin/python3.11", "-c", ver]), capture_output=True, text=True)
    assert inside.returncode == 0 and inside.stdout == host, inside.stderr


def test_a_missing_root_is_one_clear_message(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("POLAR_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(SandboxUnavailable, match=r"sandbox root .* is not built: run scripts/setup.sh"):
        BwrapCommand([], workdir="/", env={}, uid=1000, gid=1000).argv(["true"])


def test_seccomp_program_is_known_per_abi():
    assert len(program("x86_64")) % 8 == 0 and program("x86_64") != program("aarch64")
    # each ABI refuses pidfd_getfd (438 on both) and the keyring: add_key, request_key, keyctl
    for machine, keyring in (("x86_64", {248, 249, 250}), ("aarch64", {217, 218, 219})):
        prog = program(machine)
        insns = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
        assert {k for code, _, _, k in insns if code == 0x15} >= {438, *keyring}, (
            machine
        )  # JEQs to the EPERM return
    with pytest.raises(ValueError, match="no seccomp filter for riscv64"):
        program("riscv64")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npm") is None, reason="needs npm for the harness")
async def test_probe_from_a_real_pi_episode(embedded_dir: Path, renderer, tmp_path: Path):
    """Pi runs the probe as its shell command; what it saw comes back in the patch (probe.json)."""
    from reliability_helpers import scripted_proxy

    from polar_env.episodes import EpisodeSettings, run_episode
    from polar_env.harness_adapters.policies import DONE, shell_call

    needles = "\n".join(_needles(tmp_path, "psf__requests-6028").values()) + "\n"
    # the probe: search, mounts, uid, ptrace against its own harness (Pi's node) and forwarder
    probe = (
        f"echo {base64.b64encode(needles.encode()).decode()} | base64 -d > /tmp/polar-needles; "
        f"{{ {SEARCH}; }} > /testbed/search.txt; cat /proc/self/mountinfo > /testbed/mountinfo.txt; "
        f"id -u > /testbed/uid.txt; {{ {TRACE} }} > /testbed/trace.txt 2>&1; "
        "for p in $(pgrep -f '[/]opt/harness') $(pgrep -f '[f]orwarder.py'); do for f in mem environ; do "
        "(exec 3</proc/$p/$f) 2>/dev/null && echo OPEN $p $f || echo DENIED $p $f; done; done > "
        "/testbed/harness.txt"
    )

    def policy(session_id: str | None, call_number: int, prompt_text: str) -> str:
        return DONE if "<tool_response>" in prompt_text else shell_call(prompt_text, probe)

    async with scripted_proxy(embedded_dir, renderer, policy, tmp_path) as proxy:
        result = await run_episode(
            proxy,
            TASKS["psf__requests-6028"],
            episode_id="probe.s0",
            settings=EpisodeSettings(
                harness="pi",
                timeout=300,
                max_tokens=4096,
            ),
            scratch_root=tmp_path / "scratch",
            grade=False,
        )
    files = dict(re.findall(r"^\+\+\+ b/(\S+)\n@@[^\n]*\n((?:\+[^\n]*\n?)*)", result.patch, re.MULTILINE))
    text = {name: "".join(ln[1:] + "\n" for ln in body.splitlines()) for name, body in files.items()}
    assert text["search.txt"].split() == ["SEARCHED"], text["search.txt"]
    assert text["uid.txt"].strip() != "0"
    # (the proxy's socket dir, bound read-only, is the one per-run host path left: tmp_path/sock here)
    assert (
        "psf__requests-6028" not in text["mountinfo.txt"]
        and str(tmp_path / "scratch") not in text["mountinfo.txt"]
    )
    _check_trace(json.loads(next(ln[6:] for ln in text["trace.txt"].splitlines() if ln.startswith("TRACE "))))
    tried = text["harness.txt"].splitlines()
    assert len(tried) >= 4, "the probe found Pi's node and the forwarder"
    if os.geteuid() == 0:  # sealed (unprivileged bwrap grants the forwarder nothing to seal it with)
        assert all(line.startswith("DENIED") for line in tried), text["harness.txt"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("podman") is None, reason="needs podman (scripts/setup_podman.sh)")
async def test_container_agent_is_not_root_and_its_git_config_never_runs(tmp_path: Path):
    """In the base image (the same root, imported): the agent's uid, the setup's git
    state, a hostile ``core.fsmonitor``/clean filter the agent writes, and the HOME/tmp quota."""
    from polar_env.sandbox.container import ContainerSandbox
    from polar_env.tasks.images import ensure_base_image

    base = ensure_base_image("podman")
    image = "localhost/polar-test-testbed:" + base.rsplit(":", 1)[1]  # a task image's /testbed, nothing else
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Containerfile").write_text(f"FROM {base}\nRUN mkdir /testbed\n")
    subprocess.run(
        ["podman", "build", "-q", "-t", image, str(tmp_path / "ctx")], check=True, capture_output=True
    )
    tree = materialize(TASKS["psf__requests-6028"], tmp_path / "tree")
    sb = ContainerSandbox.create(tree, spec=SandboxSpec(disk_bytes=64 << 20), image=image, engine="podman")
    try:
        res = await sb.run(
            ["sh", "-c", "id -u; cat $HOME/.gitconfig 2>&1; touch /var/lib/polar-git/x"], timeout_s=60
        )
        uid, *rest = res.stdout_tail.splitlines()
        assert uid == "1000", res.stdout_tail
        assert (
            "No such file" in rest[0] and "safe.directory" not in res.stdout_tail
        )  # nothing in the agent's HOME
        assert "Permission denied" in res.stderr_tail  # the setup's git dir is not the agent's to write
        hostile = (
            "git config core.fsmonitor 'touch /tmp/ran-fsmonitor-$(id -u); false' && "
            "git config filter.x.clean 'touch /tmp/ran-filter-$(id -u); cat' && "
            "echo '* filter=x' > .gitattributes && "
            "printf '[core]\\n\\tfsmonitor = touch /tmp/ran-home-$(id -u)\\n' > $HOME/.gitconfig && "
            "echo changed >> README.md"
        )
        res = await sb.run(["sh", "-c", hostile], timeout_s=60)
        assert res.exit_code == 0, res.stderr_tail
        patch = (await sb.diff()).decode()
        assert "+changed" in patch and ".gitattributes" in patch
        res = await sb.run(["sh", "-c", "ls /tmp/ran-* 2>/dev/null | wc -l"], timeout_s=60)
        assert res.stdout_tail.strip() == "0"  # neither the tree's config nor the agent's HOME ran as root
        res = await sb.run(
            ["sh", "-c", "dd if=/dev/zero of=/tmp/fill bs=1M count=800; du -sk /tmp/fill"], timeout_s=120
        )
        assert "No space left on device" in res.stderr_tail and int(res.stdout_tail.split()[0]) <= 64 * 1024
    finally:
        await sb.destroy()
