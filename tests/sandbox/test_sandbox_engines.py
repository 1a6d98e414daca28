"""Container (docker/podman) and Apptainer sandboxes: the argv they build, unit-tested without an engine
(tests/sandbox/test_containers_podman.py runs them on a real podman)."""

from __future__ import annotations

import csv
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from polar_env.sandbox.apptainer import ApptainerBox, ApptainerSandbox
from polar_env.sandbox.base import SandboxSpec, exclude_pathspecs, run_process_tree
from polar_env.sandbox.container import ContainerSandbox, git_diff_script, git_snapshot_script
from polar_env.sandbox.seccomp import KEYRING_CALLS, container_profile, without_keyring

SPEC = SandboxSpec(
    proxy_socket_dir=Path("/run/polar/sock"),
    harness_dir=Path("/cache/harnesses/codex-1"),
    memory_bytes=1 << 30,
    pids_max=512,
)


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def test_every_container_carries_polar_s_label_and_the_run_s_own(monkeypatch):
    monkeypatch.setenv("POLAR_CONTAINER_LABELS", "job=grpo-7, team=rl")
    argv = ContainerSandbox(SPEC, "img", "polar-x", engine="podman").create_argv()
    assert _pairs(argv, "--label") == ["polar_env=1", "job=grpo-7", "team=rl"]
    monkeypatch.setenv("POLAR_CONTAINER_LABELS", "job=grpo-7,oops")
    with pytest.raises(ValueError, match="key=value labels, not 'oops'"):
        ContainerSandbox(SPEC, "img", "polar-x", engine="podman").create_argv()


@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_container_create_argv_isolates_and_mounts(engine):
    sb = ContainerSandbox(
        SPEC, "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest", "polar-x", engine=engine
    )
    argv = sb.create_argv()
    assert argv[:2] == [engine, "create"]
    assert _pairs(argv, "--network") == ["none"]
    assert _pairs(argv, "--hostname") == ["sandbox"] and _pairs(argv, "--workdir") == ["/testbed"]
    assert _pairs(argv, "--memory") == [str(1 << 30)] and _pairs(argv, "--pids-limit") == ["512"]
    mounts = _pairs(argv, "-v")
    assert "/cache/harnesses/codex-1:/opt/harness:ro" in mounts
    assert "/run/polar/sock:/run/proxy:ro" in mounts
    assert any(m.endswith(":/opt/polar/forwarder.py:ro") for m in mounts)
    assert "TZ=UTC" in _pairs(argv, "-e")
    assert argv[-3:] == ["swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest", "sleep", "infinity"]
    assert "--privileged" not in argv and _pairs(argv, "--cap-drop") == ["ALL"]
    # what the root setup execs need (chown, git as root in a uid-1000 tree), and an episode's container
    # (it has a proxy socket) what its root forwarder needs to seal the harness: the uid has none
    assert _pairs(argv, "--cap-add") == ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SYS_PTRACE", "SETGID", "SETUID"]
    assert "DAC_READ_SEARCH" not in argv  # open_by_handle_at: the host's files behind the binds
    grading = ContainerSandbox(
        replace(SPEC, proxy_socket_dir=None), "img", "polar-g", engine=engine
    ).create_argv()
    assert _pairs(grading, "--cap-add") == ["CHOWN", "DAC_OVERRIDE", "FOWNER"]
    # the engine's default seccomp profile, the kernel keyring refused where it was not (podman's allows
    # keyctl)
    profile = {"podman": [f"seccomp={container_profile('podman')}"], "docker": []}[engine]
    assert _pairs(argv, "--security-opt") == ["no-new-privileges", *profile]
    tmpfs = _pairs(argv, "--tmpfs")
    assert tmpfs[0].startswith("/home/agent:") and not any("uid=" in t for t in tmpfs)  # podman refuses uid=
    assert all(t.endswith(f",size={SPEC.disk_bytes}") for t in tmpfs)  # the writable paths' quota


def test_the_keyring_is_refused_in_an_engine_profile_and_nothing_else_changes():
    profile = {
        "defaultAction": "SCMP_ACT_ERRNO",
        "syscalls": [
            {"names": ["read", "keyctl", "ptrace"], "action": "SCMP_ACT_ALLOW"},
            {"names": ["add_key"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
        ],
    }
    out = without_keyring(profile)
    assert out["defaultAction"] == "SCMP_ACT_ERRNO"
    assert out["syscalls"] == [
        {"names": ["read", "ptrace"], "action": "SCMP_ACT_ALLOW"},
        {"names": list(KEYRING_CALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": 1},
    ]
    assert container_profile("docker") is None  # docker's built-in profile refuses all three already


def test_container_agent_is_root_only_in_a_user_namespace_of_its_own():
    """Root in a container is host root unless the container has its own user namespace: a root agent
    (a Harbor image's user) gets one, a fresh range of host uids per container, and its forwarder keeps
    SETPCAP to drop PTRACE from the harness's bounding set; its HOME is the image's /root (no tmpfs: the
    engine cannot copy into one in a user namespace)."""
    with pytest.raises(ValueError, match="must not be 0 outside a user namespace"):
        ContainerSandbox(replace(SPEC, uid=0), "img", "polar-x")
    one, two = (
        ContainerSandbox(replace(SPEC, uid=0, userns=True, home="/root"), "img", "polar-x") for _ in range(2)
    )
    argv = one.create_argv()
    base = one.userns_base
    assert _pairs(argv, "--uidmap") == [f"0:{base}:65536"] and _pairs(argv, "--gidmap") == [f"0:{base}:65536"]
    assert base >= 1 << 20 and one.host_uid(0) == base and one.host_uid(1000) == base + 1000
    assert one.userns_base != two.userns_base  # a range of its own (collisions: 1 in 30000)
    assert "SETPCAP" in _pairs(argv, "--cap-add") and _pairs(argv, "--tmpfs") == []  # HOME, /tmp: the image's
    assert "--uidmap" not in ContainerSandbox(SPEC, "img", "polar-y").create_argv()


def test_container_host_dirs_are_bound_from_the_host():
    sb = ContainerSandbox(
        replace(SPEC, userns=True, host_dirs=("/logs/verifier", "/tests")), "img", "polar-x"
    )
    binds = [v for v in _pairs(sb.create_argv(), "-v") if v.endswith(("/logs/verifier", "/tests"))]
    assert binds == [f"{sb.host_dir('/logs/verifier')}:/logs/verifier", f"{sb.host_dir('/tests')}:/tests"]
    assert sb.host_dir("/tests").parent.name == "polar-x"


def test_container_exec_runs_unprivileged_with_fixed_env_and_deadline():
    sb = ContainerSandbox(SPEC, "img", "polar-x", path="/opt/conda/bin:/usr/bin:/bin")
    argv = sb.exec_argv(["codex", "exec", "hi"], {"CODEX_HOME": "/home/agent/.codex"}, timeout_s=30.5)
    assert argv[:2] == ["docker", "exec"] and "-i" not in argv
    assert _pairs(argv, "-u") == ["1000:1000"] and _pairs(argv, "-w") == ["/testbed"]
    env = _pairs(argv, "-e")
    assert {"HOME=/home/agent", "USER=agent", "TZ=UTC", "CODEX_HOME=/home/agent/.codex"} <= set(env)
    path = next(e for e in env if e.startswith("PATH="))
    assert path.startswith("PATH=/opt/harness/node_modules/.bin:")
    assert path.endswith(":/opt/conda/bin:/usr/bin:/bin")  # the image's own PATH is kept
    i = argv.index("polar-x")
    assert argv[i + 1 :] == ["timeout", "-s", "KILL", "31", "codex", "exec", "hi"]
    assert sb.exec_argv(["x"], {}, interactive=True)[2] == "-i"


def test_container_copy_and_rm_argv(tmp_path: Path):
    sb = ContainerSandbox(SPEC, "img", "polar-x")
    assert sb.cp_in_argv(tmp_path, "/testbed") == ["docker", "cp", f"{tmp_path}/.", "polar-x:/testbed"]
    f = tmp_path / "f"
    f.write_text("x")
    assert sb.cp_in_argv(f, "/tmp/f") == ["docker", "cp", str(f), "polar-x:/tmp/f"]
    assert sb.cp_out_argv("/testbed/a", tmp_path / "a") == [
        "docker",
        "cp",
        "polar-x:/testbed/a",
        str(tmp_path / "a"),
    ]
    assert sb.rm_argv() == ["docker", "rm", "-f", "-t", "0", "polar-x"]
    # by the uid itself (root has no CAP_KILL), with the system's sh, not one on the image's PATH
    assert sb.kill_user_argv()[:8] == [
        "docker",
        "exec",
        "-u",
        "1000:1000",
        "-e",
        "PATH=/usr/bin:/bin",
        "polar-x",
        "/bin/sh",
    ]
    assert sb.kill_user_argv("1234:1234")[3] == "1234:1234"
    with pytest.raises(ValueError):
        ContainerSandbox.create(None, spec=SPEC)
    with pytest.raises(ValueError, match="unknown container engine"):
        ContainerSandbox(SPEC, "img", "x", engine="lxc")


def test_git_scripts_snapshot_and_diff_for_real(tmp_path: Path):
    """The in-container git scripts, run here with sh against a real repo at a stand-in workdir."""
    repo = tmp_path / "testbed"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "a.py").write_text("x = 1\n")
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"], cwd=repo, check=True
    )
    git_dir = tmp_path / "polar-git"
    # The agent's own repository config and attributes: none of it may run or break the diff.
    ran = tmp_path / "ran"
    for key, value in (
        ("core.fsmonitor", f"touch {ran}; false"),
        ("filter.x.clean", f"touch {ran}; cat"),
        ("filter.x.required", "true"),
        ("core.hooksPath", str(tmp_path)),
    ):
        subprocess.run(["git", "config", key, value], cwd=repo, check=True)
    snap = git_snapshot_script(str(repo), str(git_dir))
    subprocess.run(["sh", "-c", snap], check=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    (repo / "a.py").write_text("x = 2\n")
    (repo / ".codex").mkdir()
    (repo / ".codex" / "s").write_text("noise")
    (repo / ".gitattributes").write_text("* filter=x working-tree-encoding=UTF-16\n")
    script = git_diff_script(str(repo), [".codex"], str(git_dir))
    out = subprocess.run(
        ["sh", "-c", script],
        check=True,
        capture_output=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    ).stdout
    assert b"+x = 2" in out and b".codex" not in out and b".gitattributes" in out
    assert not ran.exists()  # (the check below is git with the repo's config: it runs the fsmonitor)
    head = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    assert "a.py" in head  # the repo's own index was not touched by the snapshot


def test_apptainer_exec_argv(tmp_path: Path):
    sb = ApptainerSandbox(SPEC, "docker://swebench/sweb.eval.x86_64.pallets_1776_flask-5014:latest", tmp_path)
    argv = sb.exec_argv(["pi", "--version"], {"PI_OFFLINE": "1"})
    assert argv[:3] == ["apptainer", "exec", "--containall"]
    assert "--cleanenv" in argv and _pairs(argv, "--network") == ["none"] and "--net" in argv
    assert _pairs(argv, "--hostname") == ["sandbox"] and _pairs(argv, "--pwd") == ["/testbed"]
    assert _pairs(argv, "--home") == [f"{tmp_path / 'home'}:/home/agent"]
    binds = _pairs(argv, "--bind")
    assert f"{tmp_path / 'testbed'}:/testbed" in binds
    assert "/cache/harnesses/codex-1:/opt/harness:ro" in binds and "/run/polar/sock:/run/proxy:ro" in binds
    assert "PI_OFFLINE=1" in _pairs(argv, "--env") and "TZ=UTC" in _pairs(argv, "--env")
    assert argv[-3:] == [
        "docker://swebench/sweb.eval.x86_64.pallets_1776_flask-5014:latest",
        "pi",
        "--version",
    ]
    assert "--net" not in ApptainerSandbox(SPEC, "x.sif", tmp_path, isolate_network=False).exec_argv(
        ["t"], {}
    )
    extract = sb.extract_argv(tmp_path / "out")
    assert extract[-4:] == ["cp", "-a", "/testbed/.", "/polar-out/"]


async def test_apptainer_host_side_task_tree_and_its_diff_in_the_image(tmp_path: Path, monkeypatch):
    """The tree is a host copy, the agent's uid's where the host is root (commands run as that uid, never
    root); the diff is git inside the image as that uid, the tree and the snapshot read-only, writing only
    a scratch dir (tests/sandbox/test_containers_podman.py runs it through a podman-backed stand-in)."""
    tree = tmp_path / "task"
    tree.mkdir()
    (tree / "m.py").write_text("a\n")
    sb = ApptainerSandbox.create(tree, spec=SandboxSpec(scratch_root=tmp_path / "s"), image="x.sif")
    try:
        assert sb.host_path("/testbed/m.py").read_text() == "a\n"
        assert sb.testbed.stat().st_uid == (1000 if os.geteuid() == 0 else os.geteuid())
        monkeypatch.setattr("os.geteuid", lambda: 0)
        assert _pairs(sb.exec_argv(["id"], {}), "--security") == ["uid:1000,gid:1000"]
        diff = sb.diff_argv(tmp_path / "scratch")
        assert _pairs(diff, "--security") == ["uid:1000,gid:1000"] and _pairs(diff, "--network") == ["none"]
        assert _pairs(diff, "--bind") == [
            f"{sb.testbed}:/testbed:ro",
            f"{sb.git_dir}:/polar/git:ro",
            f"{tmp_path / 'scratch'}:/polar/scratch",
        ]
        envs = dict(e.split("=", 1) for e in _pairs(diff, "--env"))
        assert envs["GIT_DIR"] == "/polar/git" and envs["GIT_OBJECT_DIRECTORY"] == "/polar/scratch/objects"
        assert diff[-4:-1] == ["x.sif", "/bin/sh", "-c"] and "write-tree" in diff[-1]
    finally:
        await sb.destroy()
    assert not sb.root.exists()


async def test_the_one_runner_merges_keeps_head_and_tail_and_passes_the_supervisors_pipe():
    """`run_process_tree` as the graders use it: stderr in the one stream, its head and tail kept and the
    middle counted (a marker says what was dropped), a pipe the supervisor holds written by the child."""
    r, w = os.pipe()
    try:
        script = (
            f"echo first; echo err >&2; head -c 300000 /dev/zero | tr '\\0' x; echo; echo last; "
            f"printf 1 >&{w}"
        )
        ran = await run_process_tree(
            ["bash", "-c", script],
            timeout_s=30,
            stdin=None,
            max_output_bytes=1000,
            head_bytes=100,
            merge_output=True,
            pass_fds=(w,),
        )
    finally:
        os.close(w)
    with os.fdopen(r, "rb") as f:
        assert f.read() == b"1"
    assert ran.exit_code == 0 and ran.stderr_tail == "" and ran.stdout_tail.startswith("first\nerr\n")
    assert ran.stdout_tail.endswith("x\nlast\n") and "[polar grader: output truncated" in ran.stdout_tail
    stats = ran.output_stats
    assert stats.bytes == ran.stdout_bytes > 300000 and stats.dropped_bytes == stats.bytes - 1100
    late = await run_process_tree(["sleep", "30"], timeout_s=0.5, stdin=None, max_output_bytes=100)
    assert late.timed_out and late.exit_code is None and late.duration_s < 10


def _box(tmp_path: Path) -> ApptainerBox:
    base_git = tmp_path / "base.git"
    base_git.mkdir()
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "m.py").write_text("a\n")
    return ApptainerBox.create(
        "docker://x/task:1",
        spec=SandboxSpec(scratch_root=tmp_path / "s"),
        base_tree=tmp_path / "tree",
        base_git=base_git,
    )


async def test_apptainer_grading_box_argv_binds_and_locks(tmp_path: Path, monkeypatch):
    """The grader's apptainer box (rewards/image_grading.py): no network, the tree and the base snapshot
    (read-only) bound, a path `provide`d outlives each exec, a copy lands in its host dir; as host root the
    tests run as the spec's uid and a root step as root with the system PATH; unprivileged, `lock` binds
    the paths read-only instead (the tested code cannot write them either way); an --env value with a
    comma stays one variable (apptainer reads the flag as CSV)."""
    box = _box(tmp_path)
    try:
        monkeypatch.setattr("os.geteuid", lambda: 0)
        argv = box.exec_argv(["python", "-V"], {"A": "x,y", "B": 'say "hi"'})
        assert argv[:3] == ["apptainer", "exec", "--containall"] and argv[-3:] == [
            "docker://x/task:1",
            "python",
            "-V",
        ]
        assert "--cleanenv" in argv and "--net" in argv and _pairs(argv, "--network") == ["none"]
        assert _pairs(argv, "--security") == ["uid:1000,gid:1000"]
        assert _pairs(argv, "--bind") == [
            f"{box.root / 'testbed'}:/testbed",
            f"{tmp_path / 'base.git'}:/var/lib/polar-git:ro",
        ]
        envs = _pairs(argv, "--env")
        assert next(csv.reader([envs[-2]])) == ["A=x,y"] and next(csv.reader([envs[-1]])) == ['B=say "hi"']
        assert not any(e.startswith("PATH=") for e in envs)  # the image's own PATH (its toolchain)
        root_step = box.exec_argv(["chown", "x"], {}, user="0")
        assert "--security" not in root_step and "PATH=/usr/bin:/bin" in _pairs(root_step, "--env")
        await box.provide("/srv/abc")
        await box.copy_in(tmp_path / "tree" / "m.py", "/srv/abc/sub/m.py")
        assert (box.binds["/srv/abc"] / "sub" / "m.py").read_text() == "a\n"
        with pytest.raises(ValueError, match="not under a path the box binds"):
            await box.copy_in(tmp_path / "tree" / "m.py", "/opt/elsewhere/m.py")
        with pytest.raises(ValueError):
            await box.copy_in(tmp_path / "tree" / "m.py", "/srv/abc/../../etc/passwd")
        monkeypatch.setattr("os.geteuid", lambda: 1234)
        await box.lock(["/testbed", "/srv/abc/sub"])
        unprivileged = box.exec_argv(["pytest"], {})
        assert "--security" not in unprivileged
        assert set(_pairs(unprivileged, "--bind")) == {
            f"{box.root / 'testbed'}:/testbed:ro",
            f"{box.binds['/srv/abc']}:/srv/abc:ro",
            f"{tmp_path / 'base.git'}:/var/lib/polar-git:ro",
        }
    finally:
        await box.destroy()
    assert not box.root.exists() and (tmp_path / "tree" / "m.py").exists()


def test_pathspecs():
    assert exclude_pathspecs([".pi"]) == [".", ":(exclude,glob)**/.pi", ":(exclude,glob)**/.pi/**"]


def test_container_root_execs_get_the_system_path_not_the_images():
    """Root's sh, chown, head, kill are /usr/bin's and /bin's, never an image PATH directory's (one the
    agent may write); an exec given its own PATH (a task's verifier: the image's less what the agent can
    write) gets that one, without the harness's bin dirs."""
    sb = ContainerSandbox(SPEC, "img", "polar-x", path="/opt/conda/bin:/usr/bin:/bin")

    def path(argv: list[str]) -> str:
        return next(e for e in _pairs(argv, "-e") if e.startswith("PATH="))

    for user in ("0", "root", "0:0"):
        assert path(sb.exec_argv(["sh", "-c", "true"], {"PATH": "/evil"}, user=user)) == "PATH=/usr/bin:/bin"
    assert (
        path(sb.exec_argv(["bash", "t.sh"], {}, user="0", path="/opt/conda/bin:/bin"))
        == "PATH=/opt/conda/bin:/bin"
    )
    assert path(sb.exec_argv(["bash", "t.sh"], {}, user="1000", path="/bin")) == "PATH=/bin"
    assert path(sb.exec_argv(["x"], {}, user="1000")).endswith(":/opt/conda/bin:/usr/bin:/bin")


def test_container_keepalive_is_a_recorded_pid():
    from polar_env.sandbox.container import ContainerError, keepalive_pid

    assert keepalive_pid(b"7\n") == 7 and keepalive_pid(b"") is None  # no init: PID 1 is the keep-alive
    with pytest.raises(ContainerError, match="2 children"):
        keepalive_pid(b"7\n9\n")
