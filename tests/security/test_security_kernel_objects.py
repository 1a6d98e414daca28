"""Nothing one sandbox makes in the kernel is seen by the next (keys, SysV and POSIX IPC, abstract sockets),
and no sandbox spends a per-user budget of its siblings (inotify instances).

An adversary stored the hidden FAIL_TO_PASS file in a kernel key during grading and read it in the
next episode: as host root every sandbox of one uid shared the host's user keyring, and the seccomp
filter allowed ``add_key``/``keyctl``. Each test makes the objects in one sandbox (held alive), looks
for them from another of the same kind (episode, grading, podman container), and has a control that
shows the look would see them: from the maker's own sandbox (its namespaces), and for keys, a key made
the way the sandbox no longer can (on the host as the looking sandbox's own host uid, sandbox/identity.py;
in podman, in containers without Polar's profile: podman's default allows ``keyctl``, through which a
named keyring carries the data).
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from repo_paths import TESTS

from polar_env.rewards.sandbox_exec import SANDBOX_UID, Mount, run_sandboxed
from polar_env.sandbox.base import SandboxSpec
from polar_env.sandbox.bubblewrap import BubblewrapSandbox

PROBE = TESTS / "kernel_objects_probe.py"
PROBE_INSIDE = "/opt/polar-probe/probe.py"
OBJECTS = ("sysv_msg", "posix_mq", "abstract")  # made in every sandbox, each in its own namespace
NONE_SEEN = {"key": False, "sysv_msg": False, "posix_mq": False, "posix_shm": False, "abstract": False}
pytestmark = pytest.mark.needs("bwrap", "sandbox-root")


def _line(out: str, prefix: str) -> dict:
    found = next((ln for ln in out.splitlines() if ln.startswith(prefix + " ")), None)
    assert found is not None, out[-3000:]
    return json.loads(found[len(prefix) + 1 :])


def _on_host(uid: int, *args: str) -> subprocess.CompletedProcess:
    """The probe on the host as ``uid``, outside any sandbox (no seccomp filter): the key control."""
    return subprocess.run(
        [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "/usr/bin/python3",
            str(PROBE),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _tag() -> str:
    return uuid.uuid4().hex[:10]


root_only = pytest.mark.skipif(
    os.geteuid() != 0, reason="as host root every sandbox of a uid shares its keyring"
)


@root_only
async def test_episode_sandboxes_share_no_kernel_object(tmp_path: Path):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "f").write_text("x\n")
    spec = SandboxSpec(scratch_root=tmp_path / "scratch", disk_bytes=64 << 20)
    maker, looker = BubblewrapSandbox.create(tree, spec=spec), BubblewrapSandbox.create(tree, spec=spec)
    tag, control = _tag(), _tag()
    try:
        for sb in (maker, looker):
            await sb.copy_in(PROBE, "/tmp/probe.py")
        # the maker holds its objects until the host writes /tmp/done; its own look is the control
        held = asyncio.create_task(
            maker.run(
                [
                    "bash",
                    "-c",
                    f"python3 /tmp/probe.py make {tag} --until-file /tmp/done & "
                    f"while [ ! -e /tmp/made ]; do sleep 0.1; done; "
                    f"python3 /tmp/probe.py look {tag}; wait",
                ],
                timeout_s=180,
            )
        )
        made_at = maker.root / "tmp"
        await asyncio.to_thread(_wait_for, lambda: (made_at / "made").exists() or held.done(), 120)
        looker_uid = looker.identity.host_uid if looker.identity else spec.uid
        assert (
            _on_host(looker_uid, "make-key", control).returncode == 0
        )  # a key of the looker's own uid, no filter
        seen = await looker.run(
            ["bash", "-c", f"python3 /tmp/probe.py look {tag}; python3 /tmp/probe.py look {control}"],
            timeout_s=120,
        )
        (made_at / "done").touch()
        ran = await held
    finally:
        _on_host(looker.identity.host_uid if looker.identity else spec.uid, "clean", control)
        await maker.destroy()
        await looker.destroy()
    made = _line(ran.stdout_tail, "MADE")
    assert made["key"] == made["keyring"] == "Operation not permitted", made  # the filter refuses the keyring
    assert all(made[o] == "made" for o in OBJECTS), made
    assert all(_line(ran.stdout_tail, "SEEN")[o] for o in OBJECTS), (
        ran.stdout_tail
    )  # control: the maker's own
    looks = [json.loads(ln[5:]) for ln in seen.stdout_tail.splitlines() if ln.startswith("SEEN ")]
    assert looks[0] == NONE_SEEN, looks
    assert looks[1]["key"] is True, looks  # control: a key of the looker's own uid is listed there


@root_only
async def test_a_sandbox_spends_no_per_user_budget_of_its_siblings(tmp_path: Path):
    """One sandbox takes all 128 inotify instances its uid may have; the next still gets one (each
    runs as a host uid of its own, sandbox/identity.py). Control: in the first, one more is refused."""
    tree = tmp_path / "tree"
    tree.mkdir()
    spec = SandboxSpec(scratch_root=tmp_path / "scratch", disk_bytes=64 << 20)
    spender, sibling = BubblewrapSandbox.create(tree, spec=spec), BubblewrapSandbox.create(tree, spec=spec)
    try:
        for sb in (spender, sibling):
            await sb.copy_in(PROBE, "/tmp/probe.py")
        held = asyncio.create_task(
            spender.run(
                [
                    "bash",
                    "-c",
                    "python3 /tmp/probe.py exhaust --until-file /tmp/done & "
                    "while [ ! -e /tmp/made ]; do sleep 0.1; done; "
                    "python3 /tmp/probe.py one-instance; wait",
                ],
                timeout_s=180,
            )
        )
        await asyncio.to_thread(
            _wait_for, lambda: (spender.root / "tmp" / "made").exists() or held.done(), 120
        )
        next_one = await sibling.run(["python3", "/tmp/probe.py", "one-instance"], timeout_s=60)
        (spender.root / "tmp" / "done").touch()
        ran = await held
        owners = {(sb.root / "testbed").stat().st_uid for sb in (spender, sibling)}
    finally:
        await spender.destroy()
        await sibling.destroy()
    spent = _line(ran.stdout_tail, "EXHAUSTED")
    assert spent["instances"] > 0 and spent["then"] == "Too many open files", spent
    assert _line(ran.stdout_tail, "INOTIFY") == {"made": False, "error": "Too many open files"}  # control
    assert _line(next_one.stdout_tail, "INOTIFY") == {"made": True, "error": ""}, next_one.stdout_tail
    assert len(owners) == 2 and not owners & {0, spec.uid}, owners  # two host uids of their own


def _wait_for(done, timeout_s: float) -> None:
    import time

    end = time.monotonic() + timeout_s
    while not done() and time.monotonic() < end:
        time.sleep(0.1)


async def _read_byte_or_line(fd: int) -> bytes:
    readable, _, _ = await asyncio.to_thread(select.select, [fd], [], [], 120)
    assert readable, "the sandbox never reported"
    return os.read(fd, 64)


@root_only
async def test_grading_sandboxes_share_no_kernel_object(tmp_path: Path):
    """Two grading runs (the tested code's sandbox, uid nobody inside): the second sees nothing of the
    first. The key control: a key made as the second run's own host uid (read from its uid_map while it
    waits) is listed there."""
    tree, venv, probe_dir = tmp_path / "tree", tmp_path / "venv", tmp_path / "probe"
    for d in (tree, venv, probe_dir):
        d.mkdir()
    shutil.copy(PROBE, probe_dir / "probe.py")
    mounts = [Mount("/opt/polar-probe", probe_dir)]
    tag, control = _tag(), _tag()
    ready_r, ready_w = os.pipe()  # the maker: made
    wait_r, wait_w = os.pipe()  # the maker holds until this closes
    uid_r, uid_w = os.pipe()  # the looker: its host uid
    go_r, go_w = os.pipe()  # the looker looks once this closes
    host_uid = None
    try:
        script = (
            f"python3 {PROBE_INSIDE} make {tag} --ready-fd {ready_w} --wait-fd {wait_r} & "
            f"while [ ! -e /tmp/made ]; do sleep 0.1; done; python3 {PROBE_INSIDE} look {tag}; wait"
        )
        held = asyncio.create_task(
            asyncio.to_thread(
                run_sandboxed,
                script,
                tree=tree,
                venv=venv,
                timeout_s=180,
                extra_mounts=mounts,
                pass_fds=(ready_w, wait_r),
            )
        )
        assert await _read_byte_or_line(ready_r) == b"1"
        looking = asyncio.create_task(
            asyncio.to_thread(
                run_sandboxed,
                f"awk '$1 == {SANDBOX_UID} {{print $2}}' /proc/self/uid_map >&{uid_w}; exec {uid_w}>&-; "
                f"cat <&{go_r}; python3 {PROBE_INSIDE} look {tag}; python3 {PROBE_INSIDE} look {control}",
                tree=tree,
                venv=venv,
                timeout_s=120,
                extra_mounts=mounts,
                pass_fds=(uid_w, go_r),
            )
        )
        host_uid = int(await _read_byte_or_line(uid_r))
        assert host_uid != SANDBOX_UID  # a uid of its own
        assert _on_host(host_uid, "make-key", control).returncode == 0
        os.close(go_w)
        seen = await looking
    finally:
        for fd in (wait_w, ready_r, ready_w, wait_r, uid_r, uid_w, go_r):  # the maker's wait ends
            os.close(fd)
        if host_uid is not None:
            _on_host(host_uid, "clean", control)
    ran = await held
    made = _line(ran.output, "MADE")
    assert made["key"] == made["keyring"] == "Operation not permitted", made
    assert all(made[o] == "made" for o in OBJECTS), made
    assert all(_line(ran.output, "SEEN")[o] for o in OBJECTS), ran.output  # control: the maker's own
    looks = [json.loads(ln[5:]) for ln in seen.output.splitlines() if ln.startswith("SEEN ")]
    assert looks[0] == NONE_SEEN and looks[1]["key"] is True, looks


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("podman") is None or os.geteuid() != 0, reason="needs podman as host root")
async def test_podman_containers_share_no_kernel_object(tmp_path: Path):
    """Two episode containers of one uid: the second sees nothing of the first. Controls: a second exec
    in the maker's container sees its objects; containers on podman's own default profile (which
    allows ``keyctl``) pass a named keyring from one to the other."""
    from polar_env.sandbox.container import ContainerSandbox
    from polar_env.tasks.images import ensure_base_image

    base = await asyncio.to_thread(ensure_base_image, "podman")
    # an episode's container (the forwarder's caps), in the base image (its /var/tmp as the workdir)
    spec = SandboxSpec(disk_bytes=64 << 20, proxy_socket_dir=tmp_path, workdir="/var/tmp")
    maker, looker = [
        await asyncio.to_thread(
            ContainerSandbox.create,
            None,
            spec=spec,
            image=base,
            engine="podman",
            extra_ro_mounts=[(str(PROBE.parent), "/opt/polar-probe")],
            snapshot=False,
        )
        for _ in range(2)
    ]
    probe = f"/opt/polar-probe/{PROBE.name}"
    tag, control = _tag(), _tag()
    try:
        held = asyncio.create_task(
            maker.run(["python3", probe, "make", tag, "--until-file", "/tmp/done"], timeout_s=180)
        )
        for _ in range(600):
            if (await maker.run(["test", "-e", "/tmp/made"], timeout_s=60)).exit_code == 0 or held.done():
                break
            await asyncio.sleep(0.2)
        own = await maker.run(["python3", probe, "look", tag], timeout_s=60)
        seen = await looker.run(["python3", probe, "look", tag], timeout_s=60)
        await maker.run(["touch", "/tmp/done"], timeout_s=60)
        ran = await held
        # control: podman's default profile, two containers of the same uid (not Polar's)
        plain = [
            "podman",
            "run",
            "--rm",
            "--network",
            "none",
            "--user",
            f"{spec.uid}:{spec.uid}",
            "-v",
            f"{PROBE.parent}:/opt/polar-probe:ro",
            base,
            "python3",
            probe,
        ]
        plain_made = subprocess.run([*plain, "make", control], capture_output=True, text=True, timeout=120)
        plain_seen = subprocess.run([*plain, "look", control], capture_output=True, text=True, timeout=120)
    finally:
        _on_host(spec.uid, "clean", control)  # the control's containers run as the host's uid 1000
        await maker.destroy()
        await looker.destroy()
    made = _line(ran.stdout_tail, "MADE")
    assert made["key"] == made["keyring"] == "Operation not permitted", made
    assert all(made[o] == "made" for o in (*OBJECTS, "posix_shm")), made
    assert all(_line(own.stdout_tail, "SEEN")[o] for o in (*OBJECTS, "posix_shm")), own.stdout_tail
    assert _line(seen.stdout_tail, "SEEN") == NONE_SEEN, seen.stdout_tail
    assert _line(plain_made.stdout, "MADE")["keyring"] == "made", plain_made.stdout + plain_made.stderr
    assert _line(plain_seen.stdout, "SEEN")["key"] is True, plain_seen.stdout + plain_seen.stderr
