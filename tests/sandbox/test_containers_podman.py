"""Container workspaces on a real engine (podman, set up by scripts/setup_podman.sh).

The images are built from scratch or reused by their cache key (``polar_env.tasks.images``): two
bundled tasks in SWE-bench's layout. Then, for real: an episode per harness in the container
through the proxy, with the scripted gold policy, graded inside the image (reward 1.0), an empty
patch (reward 0), ``polar rollout --sandbox podman`` and ``polar eval`` on a JSONL whose rows name
the images, the isolation of the container (only the proxy is reachable) and its deadline (nothing
left running inside or outside), and the cleanup of a container whose creation failed.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from own_containers import own_containers
from polar_sandbox_helpers import (
    PLANTS_IGNORED,
    SEALED,
    forwarder_plant_probe,
    probe_network,
    processes_matching,
    sealed_harness_probe,
)
from proxy_client import make_proxy
from repo_paths import REPO

from polar_env.backends.scripted import ScriptedBackend
from polar_env.episodes import EpisodeSettings, run_episode
from polar_env.episodes.workspace import engine_available, open_workspace
from polar_env.harness_adapters.policies import make_policy
from polar_env.rewards.flags import is_tamper
from polar_env.rewards.grader import grade_task
from polar_env.sandbox.base import SandboxSpec
from polar_env.sandbox.container import ContainerError, ContainerSandbox
from polar_env.tasks.harbor import load_task_dir
from polar_env.tasks.images import base_image, ensure_task_image, task_image_name
from polar_env.tasks.loader import TERMINAL_DIR, load_bundled
from polar_env.tasks.runtime import history_target

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not engine_available("podman"), reason="needs podman (scripts/setup_podman.sh)"),
]
ENGINE = "podman"
TASK_IDS = ("psf__requests-5414", "pallets__flask-5014")


def _containers() -> set[str]:
    return {n for n in own_containers(ENGINE) if n.startswith("polar-")}


@pytest.fixture(scope="module")
def imaged():
    """The two bundled tasks as image rows (no base archive: they can only run in their image)."""
    tasks = {t.instance_id: t for t in load_bundled() if t.instance_id in TASK_IDS}
    return {
        iid: t.model_copy(update={"image": ensure_task_image(t, ENGINE), "base_archive": None})
        for iid, t in tasks.items()
    }


@pytest.fixture(scope="module")
def task_file(imaged, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tasks") / "tasks.jsonl"
    path.write_text("".join(t.model_dump_json() + "\n" for t in imaged.values()))
    return path


@pytest.fixture
async def scripted_proxy(request, local_backend, renderer, imaged, tmp_path: Path):
    """A proxy whose turns the scripted policy ``request.param`` writes (gold: replays the fix; noop: one
    ``ls`` and a final answer), scored by the real model."""
    backend = ScriptedBackend(
        local_backend, make_policy(request.param, list(imaged.values())), context_window=256
    )
    proxy = make_proxy(
        renderer, backend, tmp_path / "ledger", admin_secret=secrets.token_urlsafe(16), max_context=32768
    )
    sock = Path(f"/tmp/polar-t-{uuid.uuid4().hex[:8]}")
    sock.mkdir(mode=0o755)
    await proxy.start(unix_socket=sock / "proxy.sock", port=None)
    yield proxy
    await proxy.stop()
    shutil.rmtree(sock, ignore_errors=True)


def test_images_are_cached_by_content(imaged):
    task = imaged["psf__requests-5414"]
    assert task.image.startswith("localhost/polar-task/psf__requests-5414:")
    assert base_image().startswith("localhost/polar-base:")
    bundled = next(t for t in load_bundled() if t.instance_id == task.instance_id)
    started = time.monotonic()
    assert ensure_task_image(bundled, ENGINE) == task.image and time.monotonic() - started < 30  # reused
    changed = bundled.model_copy(
        update={
            "environment": bundled.environment.model_copy(
                update={"requirements": [*bundled.environment.requirements, "six==1.16.0"]}
            )
        }
    )
    assert task_image_name(changed, base_image()) != task.image  # another input, another key
    layout = subprocess.run(
        [
            ENGINE,
            "run",
            "--rm",
            "--network",
            "none",
            task.image,
            "sh",
            "-c",
            "git -C /testbed rev-parse HEAD && python -c 'import pytest, sys; print(sys.prefix)'",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert layout.returncode == 0, layout.stderr
    commit, prefix = layout.stdout.split()
    assert commit == task.base_commit  # the same one-commit tree as the bubblewrap workspace
    assert prefix == "/opt/venv"  # the test environment is the image's


@pytest.mark.parametrize(
    "harness, scripted_proxy",
    [("codex", "gold"), ("claude-code", "gold"), ("pi", "noop")],
    indirect=["scripted_proxy"],
)
async def test_episode_in_the_container_graded_in_the_image(harness, scripted_proxy, imaged, tmp_path: Path):
    """Gold turns resolve the task (reward 1.0, graded in the image); noop turns leave an empty patch (0).
    Pi's gold episode runs through `polar rollout` below."""
    task = imaged["psf__requests-5414"]
    before = _containers()
    result = await run_episode(
        scripted_proxy,
        task,
        episode_id=f"ep-{harness}",
        settings=EpisodeSettings(harness=harness, sandbox=ENGINE, timeout=300),
        scratch_root=tmp_path,
    )
    traj = result.trajectory
    assert traj.status == "completed", (traj.error, result.harness and result.harness.stderr_tail[-2000:])
    assert traj.metadata.workspace == ENGINE and traj.metadata.image == task.image
    assert traj.stats.calls >= 2
    # the harness, sealed by a root forwarder, is still told apart from its tools
    assert {call.origin for call in traj.calls} == {"harness"}, [call.origin for call in traj.calls]
    if harness == "pi":
        assert result.patch == "" and traj.reward == 0.0 and result.grade.failure_kind == "empty_patch"
    else:
        assert result.patch.startswith("diff --git")
        assert traj.reward == 1.0 and result.grade.resolved and result.grade.apply_method == "git_apply"
    assert _containers() == before  # the episode's container and the grading container are gone


async def test_empty_patch_earns_nothing_in_the_image(imaged):
    task = imaged["psf__requests-5414"]
    empty = await asyncio.to_thread(grade_task, task, "", kind=ENGINE)
    assert empty.reward == 0.0 and empty.failure_kind == "empty_patch"
    broken = "diff --git a/nosuch.py b/nosuch.py\n--- a/nosuch.py\n+++ b/nosuch.py\n@@ -1 +1 @@\n-a\n+b\n"
    refused = await asyncio.to_thread(grade_task, task, broken, kind=ENGINE)
    assert refused.reward == 0.0 and refused.failure_kind == "apply_failed"
    test_edit = task.test_patch  # applying the tests alone fixes nothing
    unresolved = await asyncio.to_thread(grade_task, task, test_edit, kind=ENGINE)
    assert unresolved.reward == 0.0 and not unresolved.resolved
    assert unresolved.fail_to_pass and set(unresolved.fail_to_pass.values()) != {"PASSED"}


PASS_EVERYTHING = (
    "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
    "    report = (yield).get_result()\n    report.outcome = 'passed'\n"
)


def _new_file_patch(path: str, text: str) -> str:
    lines = text.splitlines(keepends=True)
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
        f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{line}" for line in lines)
    )


async def test_apptainer_episodes_run_as_the_agent_and_are_diffed_in_the_image(
    imaged, apptainer_log: Path, tmp_path: Path
):
    """Run by root, an apptainer episode's commands run as uid 1000 (never root) on a tree that uid owns,
    and its patch is made by git inside the image as that uid, the tree bound read-only (never host git
    on the agent's tree)."""
    task = imaged["pallets__flask-5014"]
    ws = await open_workspace(task, SandboxSpec(scratch_root=tmp_path / "ws"), sandbox="apptainer")
    try:
        edit = await ws.sandbox.run(["sh", "-c", "id -u && echo '# mine' >> CHANGES.rst"], timeout_s=60)
        assert edit.exit_code == 0 and edit.stdout_tail.split() == ["1000"], edit.stderr_tail
        patch = await ws.sandbox.diff()
        assert b"+# mine" in patch and patch.count(b"diff --git") == 1
    finally:
        await ws.close()
    diff_call = apptainer_log.read_text().splitlines()[-1]
    assert (
        "--security uid:1000,gid:1000" in diff_call
        and ":/testbed:ro" in diff_call
        and "write-tree" in diff_call
    )
    assert not list((tmp_path / "ws").iterdir())


async def test_apptainer_tasks_are_graded_strictly_in_their_image(
    imaged, apptainer_log: Path, tmp_path: Path, monkeypatch
):
    """A task with no base archive, on apptainer, is graded in its image the strict way a container grades
    it (`ApptainerBox`: the tree and the grader's files bound in, locked before the tests run): the gold
    patch 1.0 in strict mode with no flag, the test patch alone and a conftest hook that passes every test
    0. The image's tree is copied out once for all grades, and nothing is left behind."""
    log = apptainer_log
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    task = imaged["pallets__flask-5014"]
    before = _containers()
    gold = await asyncio.to_thread(grade_task, task, task.patch, kind="apptainer")
    assert gold.resolved and gold.reward == 1.0 and gold.mode == "strict", (gold.failure_kind, gold.error)
    assert gold.modes["swebench"].reward == 1.0 and not [f for f in gold.flags if is_tamper(f)], gold.flags
    tests_only = await asyncio.to_thread(grade_task, task, task.test_patch, kind="apptainer")
    assert tests_only.reward == 0.0 and not tests_only.is_infrastructure_failure, tests_only.error
    forged = await asyncio.to_thread(
        grade_task, task, _new_file_patch("conftest.py", PASS_EVERYTHING), kind="apptainer"
    )
    assert forged.reward == 0.0 and not forged.is_infrastructure_failure, forged.error
    assert "conftest.py" in forged.reset_paths  # the strict reset took the hook out before the tests ran
    calls = log.read_text().splitlines()
    assert sum("/polar-out" in c for c in calls) == 1  # the image's tree copied out once, for every grade
    assert any("--security uid:1000,gid:1000" in c for c in calls)  # the tests never run as root
    assert _containers() == before and not list((tmp_path / "tmp").glob("polar-apptainer-grade-*"))


def _polar(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "polar_env.cli", *args], capture_output=True, text=True, env=env, timeout=900
    )


def test_polar_rollout_and_eval_on_image_rows(task_file: Path, imaged, tmp_path: Path):
    """The user's commands: rows naming images, the Pi harness in podman, then `polar eval` in the image."""
    iid = "psf__requests-5414"
    proc = _polar(
        "rollout",
        "--tasks",
        str(task_file),
        "--task-ids",
        iid,
        "--sandbox",
        ENGINE,
        "--policy",
        "gold",
        "--out",
        str(tmp_path / "out"),
        "--timeout",
        "300",
        "--score-window",
        "256",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["episodes"] == 1 and summary["resolved"] == 1, proc.stdout[-2000:]
    (traj,) = [
        json.loads(line) for line in (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()
    ]
    assert traj["metadata"]["workspace"] == ENGINE and traj["reward"] == 1.0

    preds = tmp_path / "preds.jsonl"
    preds.write_text(
        json.dumps({"instance_id": iid, "model_patch": imaged[iid].patch, "model_name_or_path": "g"}) + "\n"
    )
    proc = _polar(
        "eval", "--tasks", str(task_file), "--predictions", str(preds), "--out", str(tmp_path / "r.json")
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["resolved_ids"] == [iid] and report["error_instances"] == 0


@pytest.fixture(params=["uid-1000", "root"])
async def box(request, imaged, tmp_path: Path):
    """An SWE task's container (the agent: uid 1000), and a Harbor task's whose image's user is root (the
    agent: root, in a user namespace of the container's own): every hardening test holds in both."""
    (tmp_path / "sock").mkdir(mode=0o755)
    spec = SandboxSpec(proxy_socket_dir=tmp_path / "sock", memory_bytes=512 << 20, pids_max=128)
    task = (
        imaged["pallets__flask-5014"]
        if request.param == "uid-1000"
        else load_task_dir(TERMINAL_DIR / "fix-median-bug")
    )
    ws = await open_workspace(task, spec, sandbox=ENGINE)
    assert ws.sandbox.spec.uid == (0 if request.param == "root" else 1000)
    yield ws.sandbox
    await ws.close()


NET_CAPS = (1 << 12) | (1 << 13) | (1 << 21)  # NET_ADMIN, NET_RAW, SYS_ADMIN: none, root or not


async def test_only_the_proxy_is_reachable_from_the_container(box, tmp_path: Path):
    out = await probe_network(box, tmp_path / "sock")
    assert out.pop("proxy") == '"proxy-ok"'  # the one way out works
    assert set(out.values()) == {"FAILED"}, out  # outside v4/v6, host loopback, metadata, DNS, UDP, PyPI
    who = await box.run(["sh", "-c", "id -u; cat /proc/self/status | grep CapEff"], timeout_s=30)
    uid, caps = who.stdout_tail.splitlines()
    if box.spec.uid:
        assert uid == "1000" and caps.split()[1] == "0000000000000000"  # unprivileged, no capabilities
    else:  # root in its own user namespace: no capability reaches the network or a mount
        assert uid == "0" and not int(caps.split()[1], 16) & NET_CAPS, caps
        host_uid = subprocess.run(
            ["ps", "-o", "uid=", "-p", str(box.init_pid())], capture_output=True, text=True
        )
        assert (
            int(host_uid.stdout) == box.userns_base >= 1 << 20
        )  # the container's root is no host uid of note


async def test_the_forwarder_seals_the_harness_from_its_tools(box):
    """The forwarder runs as the container's root and starts the harness as the sandbox uid, not
    dumpable: its tools, shell-run or started directly, open none of its /proc entries. A root harness
    (and every tool it runs) has no CAP_SYS_PTRACE: it traces nothing either."""
    seen = await sealed_harness_probe(box)
    if box.spec.uid:
        assert seen == SEALED
        return
    tool = seen["bash_tool"]
    assert seen["dumpable"] == 0 and seen["direct_child"] == "Permission denied", seen
    # a root tool may list the harness's fd numbers (that /proc directory is root's, as the tool is), but
    # opens neither its memory nor its environment (the origin key's place): both need CAP_SYS_PTRACE
    assert (tool["mem"], tool["environ"], tool["gid"]) == ("denied", "denied", "0"), (
        seen
    )  # the real gid: root
    caps = {
        k[6:]: k[:6] for k in tool if k.startswith("Cap")
    }  # "CapEff<hex>" (the probe's sed keeps them so)
    assert caps and all(not int(h or "0", 16) & (1 << 19) for h in caps), seen  # no CAP_SYS_PTRACE


async def test_the_forwarder_imports_nothing_the_agent_wrote(box):
    """The forwarder holds privileges: a ``.pth`` in the agent's user site or a module shadowing the
    stdlib on PYTHONPATH would run with them. Its interpreter is isolated (``-I``); the agent's own
    python3 runs both (the control)."""
    assert await forwarder_plant_probe(box) == PLANTS_IGNORED


async def test_the_deadline_leaves_nothing_running(box):
    marker = f"stay{uuid.uuid4().hex[:8]}"
    script = (
        f"import os, subprocess, time\nfor _ in range(3):\n    if os.fork() == 0:\n        os.setsid()\n"
        f"        os.execvp('sleep', ['sleep', '3600', '{marker}'])\n"
        f"subprocess.Popen(['nohup', 'sleep', '3601', '{marker}'], start_new_session=True)\n"
        f"print('spawned', flush=True)\ntime.sleep(3600)\n"
    )
    res = await box.run(["/usr/bin/python3", "-c", script], timeout_s=3)
    assert res.timed_out and "spawned" in res.stdout_tail
    for _ in range(50):
        if not processes_matching(marker):
            break
        await asyncio.sleep(0.1)
    assert processes_matching(marker) == []  # host view: covers the container's processes too
    inside = subprocess.run([ENGINE, "exec", box.name, "ps", "-eo", "args"], capture_output=True, text=True)
    assert marker not in inside.stdout
    again = await box.run(["echo", "alive"], timeout_s=30)
    assert again.stdout_tail.strip() == "alive"  # the workspace itself survives its command's deadline


def test_a_failed_create_leaves_no_container():
    before = _containers()
    with pytest.raises(ContainerError, match="failed"):  # the base image has no /testbed: setup fails
        ContainerSandbox.create(None, spec=SandboxSpec(), image=base_image(), engine=ENGINE)
    assert _containers() == before


async def test_gym_resources_server_seeds_a_container_the_agent_attaches_to(imaged, tmp_path: Path):
    """The NeMo Gym split of the same lifecycle: the resources server opens the container (with the agent's
    proxy socket dir mounted), the agent side attaches by name and edits, verify grades in the image."""
    from polar_env.resources_server.core import PolarResources, PolarResourcesConfig, attach_sandbox
    from polar_env.wire.gym_resources import WorkspaceMounts

    task = imaged["psf__requests-5414"]
    (tmp_path / "sock").mkdir(mode=0o755)
    before = _containers()
    core = PolarResources(PolarResourcesConfig(sandbox=ENGINE), tasks=[task])
    seeded = await core.seed(
        "ep", task.instance_id, mounts=WorkspaceMounts(proxy_socket_dir=str(tmp_path / "sock"))
    )
    assert seeded.workspace.kind == ENGINE and seeded.workspace.container in _containers()
    agent_side = attach_sandbox(seeded, SandboxSpec(proxy_socket_dir=tmp_path / "sock"))
    edit = await agent_side.run(["patch", "-p1"], stdin=task.patch.encode(), timeout_s=60)
    assert edit.exit_code == 0, edit.stderr_tail
    mounted = await agent_side.run(["test", "-d", "/run/proxy"], timeout_s=30)
    assert mounted.exit_code == 0  # the agent's socket dir was mounted at creation
    outcome = await core.verify("ep")
    assert outcome.reward == 1.0 and outcome.resolved and not outcome.mask_sample
    assert await core.close("ep") and _containers() == before


async def test_container_workspaces_start_from_a_warm_image_committed_once(imaged, monkeypatch):
    """The tree is handed to the sandbox uid and its base recorded once per node and image (a
    committed warm image, sandbox/warm_images.py); each workspace is a container of it whose setup
    neither re-owns nor re-snapshots the tree, and whose diff is its own. The engine's commands are
    only recorded (the real ones run)."""
    from polar_env.sandbox import container, warm_images

    ran: list[str] = []
    real = container.engine_run

    def recorded(argv, **kwargs):
        ran.append(" ".join(argv))
        return real(argv, **kwargs)

    monkeypatch.setattr(container, "engine_run", recorded)
    monkeypatch.setattr(warm_images, "engine_run", recorded)
    task = imaged["psf__requests-5414"]
    warm_images.warm_image(
        ENGINE, task.image, container_spec_of(task), history_target(task)
    )  # the first episode's
    ran.clear()
    spaces = [await open_workspace(task, SandboxSpec(), sandbox=ENGINE) for _ in range(2)]
    try:
        assert not any(" commit " in c or "write-tree" in c or "chown -hR" in c for c in ran), ran
        assert all(ws.ref.clone == "overlay" and ws.ref.image == task.image for ws in spaces)
        edit = await spaces[0].sandbox.run(["sh", "-c", "echo '# mine' >> requests/models.py"], timeout_s=30)
        assert edit.exit_code == 0, edit.stderr_tail
        first, second = [await ws.sandbox.diff() for ws in spaces]
        assert b"+# mine" in first and second == b""
        owner = await spaces[1].sandbox.run(["stat", "-c", "%u", "requests/models.py"], timeout_s=30)
        assert owner.stdout_tail.strip() == "1000"  # the tree is the agent's, as before
    finally:
        for ws in spaces:
            await ws.close()


async def test_a_container_workspaces_tree_has_a_disk_quota(imaged):
    """On podman as root a warm container's /testbed is an overlay of the image's tree whose writes land
    on a tmpfs of the spec's ``disk_bytes`` (`WorkdirQuota`): a 200 MB write stops at 32 MiB with ENOSPC
    (the host's disk never sees it), the tree stays the agent's and its diff its own, and closing the
    workspace unmounts the quota and gives the image's mount back."""
    task = imaged["psf__requests-5414"]
    ws = await open_workspace(task, SandboxSpec(disk_bytes=32 << 20), sandbox=ENGINE)
    quota = ws.sandbox.workdir_quota
    try:
        assert quota is not None and os.path.ismount(quota.root)
        fill = await ws.sandbox.run(["sh", "-c", "dd if=/dev/zero of=big bs=1M count=200"], timeout_s=60)
        assert fill.exit_code != 0 and "No space left" in fill.stderr_tail, fill.stderr_tail
        assert (quota.root / "upper" / "big").stat().st_size <= 32 << 20
        edit = await ws.sandbox.run(
            ["sh", "-c", "rm big && echo '# mine' >> requests/models.py && stat -c %u setup.py"], timeout_s=30
        )
        assert edit.exit_code == 0 and edit.stdout_tail.strip() == "1000", edit.stderr_tail
        patch = await ws.sandbox.diff()
        assert b"+# mine" in patch and b"big" not in patch
    finally:
        await ws.close()
    assert not quota.root.exists()


def container_spec_of(task):
    from polar_env.tasks.runtime import container_spec, task_spec

    return container_spec(task, task_spec(task, SandboxSpec()), ENGINE)
