"""Where an episode runs (per task, under --sandbox), and the one-line errors when it cannot run here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import REPO

from polar_env.episodes.workspace import (
    attach_workspace,
    check_engine,
    engine_available,
    open_workspace,
    workspace_kind,
)
from polar_env.sandbox.apptainer import apptainer_image
from polar_env.sandbox.base import SandboxSpec
from polar_env.sandbox.container import ContainerSandbox
from polar_env.tasks.loader import load_bundled
from polar_env.tasks.runtime import WorkspaceUnavailable
from polar_env.wire.gym_resources import WorkspaceRef


@pytest.fixture(scope="module")
def bundled():
    return load_bundled()[0]


def test_workspace_is_chosen_per_task(bundled, monkeypatch):
    imaged = bundled.model_copy(update={"base_archive": None, "image": "localhost/polar-task/x:1"})
    assert workspace_kind(bundled) == "bubblewrap"  # a base archive: a tree, whatever engines exist
    assert workspace_kind(bundled, "podman") == "podman"  # forced: every task in its image
    assert workspace_kind(imaged, "docker") == "docker"
    with pytest.raises(WorkspaceUnavailable, match="bubblewrap needs a base archive"):
        workspace_kind(imaged, "bubblewrap")
    with pytest.raises(WorkspaceUnavailable, match="unknown sandbox"):
        workspace_kind(bundled, "vm")
    monkeypatch.setenv("PATH", "/nonexistent")  # no engine at all
    with pytest.raises(WorkspaceUnavailable, match="no container engine found"):
        workspace_kind(imaged)
    with pytest.raises(WorkspaceUnavailable, match="podman is not installed"):
        check_engine("podman")


def test_attach_rebuilds_the_opener_sandbox_from_its_ref(tmp_path: Path):
    ref = WorkspaceRef(
        kind="podman", container="polar-abc", image="img", path="/venv/bin:/usr/bin", uid=1000, gid=1000
    )
    spec = SandboxSpec(proxy_socket_dir=tmp_path)
    sb = attach_workspace(WorkspaceRef.model_validate_json(ref.model_dump_json()), spec)
    assert isinstance(sb, ContainerSandbox) and sb.engine == "podman" and sb.name == "polar-abc"
    assert sb.exec_argv(["true"], {})[-2:] == ["polar-abc", "true"]
    with pytest.raises(FileNotFoundError, match="no sandbox workspace"):
        attach_workspace(WorkspaceRef(root=str(tmp_path / "gone"), uid=1, gid=1), spec)


@pytest.mark.needs("bwrap", "sandbox-root")
async def test_an_attached_bubblewrap_workspace_runs_as_its_openers_identity(bundled, tmp_path: Path):
    """Another process attaching to a bubblewrap workspace (the Gym agent server) runs as the identity
    the opener leased (sandbox/identity.py: the tree's owner), so what it writes is the opener's to diff."""
    ws = await open_workspace(bundled, SandboxSpec(scratch_root=tmp_path / "s", disk_bytes=64 << 20))
    try:
        attached = attach_workspace(WorkspaceRef.model_validate_json(ws.ref.model_dump_json()), SandboxSpec())
        res = await attached.run(["bash", "-c", "id -u; echo attached > /testbed/written"], timeout_s=60)
        patch = (await ws.sandbox.diff()).decode()
    finally:
        await ws.close()
    assert res.exit_code == 0 and res.stdout_tail.split()[0] == "1000", (res.stdout_tail, res.stderr_tail)
    assert "b/written" in patch, patch
    if os.geteuid() == 0:  # a leased host uid, shown as 1000 inside to both
        assert attached.identity is not None and attached.identity.host_uid == ws.sandbox.identity.host_uid


def test_apptainer_takes_registry_names_as_docker_uris():
    assert (
        apptainer_image("swebench/sweb.eval.x86_64.a:latest") == "docker://swebench/sweb.eval.x86_64.a:latest"
    )
    assert apptainer_image("/images/t.sif") == "/images/t.sif"
    assert apptainer_image("docker://x/y:1") == "docker://x/y:1"


def _polar(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "polar_env.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=300,
    )


def _one_line_exit_2(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_rollout_errors_are_one_line_exit_2(tmp_path: Path, bundled):
    _one_line_exit_2(
        _polar("rollout", "--tasks", "nosuch.jsonl", "--out", str(tmp_path / "o")),
        "nosuch.jsonl does not exist",
    )
    offline = {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "POLAR_CACHE": str(tmp_path / "cache"),
        "HF_HOME": str(tmp_path / "hf"),
    }
    _one_line_exit_2(
        _polar("rollout", "--tasks", "verified", "--out", str(tmp_path / "o"), env=offline),
        "cannot load",
        "--tasks bundled",
    )
    row = bundled.model_copy(update={"base_archive": None, "image": "localhost/polar-test/no-such-image:0"})
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(row.model_dump_json() + "\n")
    _one_line_exit_2(
        _polar(
            "rollout",
            "--tasks",
            str(tasks),
            "--sandbox",
            "podman",
            "--out",
            str(tmp_path / "o"),
            env={"PATH": "/nonexistent"},
        ),
        "podman is not installed",
        "scripts/setup_podman.sh",
    )
    if engine_available("podman"):
        _one_line_exit_2(
            _polar("rollout", "--tasks", str(tasks), "--sandbox", "podman", "--out", str(tmp_path / "o")),
            "no-such-image:0' is not in podman",
            "docs/tasks.md",
        )


def test_eval_errors_are_one_line_exit_2(tmp_path: Path, bundled):
    _one_line_exit_2(
        _polar("eval", "--tasks", "bundled", "--predictions", str(tmp_path / "nosuch.jsonl")),
        "nosuch.jsonl does not exist",
    )
    row = bundled.model_copy(update={"base_archive": None, "image": "localhost/polar-test/no-such-image:0"})
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(row.model_dump_json() + "\n")
    preds = tmp_path / "preds.jsonl"
    preds.write_text(json.dumps({"instance_id": row.instance_id, "model_patch": row.patch}) + "\n")
    _one_line_exit_2(
        _polar(
            "eval",
            "--tasks",
            str(tasks),
            "--predictions",
            str(preds),
            "--sandbox",
            "docker",
            env={"PATH": "/nonexistent"},
        ),
        "docker is not installed",
    )


def test_doctor_reports_container_engines_and_their_fix(monkeypatch):
    from polar_env.cli.doctor import doctor_report

    monkeypatch.setenv("PATH", "/nonexistent")
    rows = {r.component: r for r in doctor_report()}
    assert {"podman (optional)", "docker (optional)", "apptainer (optional)"} <= set(rows)
    assert not rows["podman (optional)"].installed
    assert "scripts/setup.sh" in rows["podman (optional)"].fix_command


FAKE_APPTAINER = """#!/usr/bin/env python3
# Stand-in for apptainer (it cannot be installed here): `exec ... --bind DEST:/polar-out IMAGE cp -a
# /testbed/. /polar-out/` copies the tree whose path the .sif file holds; `exec ... --bind TREE:/testbed
# ... IMAGE /bin/sh -c SCRIPT` (the history reduction) runs the script on TREE; every call is logged.
import os, shutil, subprocess, sys
argv = sys.argv[1:]
with open(os.environ["FAKE_APPTAINER_LOG"], "a") as log:
    log.write(" ".join(argv) + "\\n")
bind = argv.index("--bind")
dest, inside = argv[bind + 1].split(":")[:2]
if argv[-3:-1] == ["/bin/sh", "-c"]:
    sys.exit(subprocess.run(["sh", "-c", argv[-1].replace(f"top={inside};", f"top={dest};")]).returncode)
image = argv[bind + 2]
assert argv[bind + 3:] == ["cp", "-a", "/testbed/.", "/polar-out/"], argv
shutil.copytree(open(image).read().strip(), dest, dirs_exist_ok=True)
"""


async def test_apptainer_workspaces_clone_the_images_tree_copied_out_once(
    tmp_path: Path, bundled, monkeypatch
):
    """An apptainer task's workspaces clone one warm base per node and image (tasks/base_trees.py):
    the image's tree is copied out of it once, not per episode, and each workspace's tree is its own.
    ``apptainer`` itself is a stand-in on PATH (see FAKE_APPTAINER)."""
    from polar_env.episodes.workspace import open_workspace

    tree = tmp_path / "image-tree"
    tree.mkdir()
    (tree / "app.py").write_text("x = 1\n")
    sif = tmp_path / "task.sif"
    sif.write_text(str(tree))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apptainer").write_text(FAKE_APPTAINER)
    (bin_dir / "apptainer").chmod(0o755)
    log = tmp_path / "apptainer.log"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_APPTAINER_LOG", str(log))
    monkeypatch.setenv("POLAR_BASE_CACHE", str(tmp_path / "bases"))
    task = bundled.model_copy(update={"base_archive": None, "image": str(sif)})
    spaces = [
        await open_workspace(task, SandboxSpec(scratch_root=tmp_path / "ws"), sandbox="apptainer")
        for _ in range(2)
    ]
    try:
        calls = [line for line in log.read_text().splitlines() if line.startswith("exec ")]
        copied, reduced = calls  # copied out of the image, and its history reduced, once for both
        assert "cp -a" in copied and reduced.endswith("/bin/sh -c set -u")
        assert all(ws.ref.kind == "apptainer" and ws.ref.clone in ("reflink", "copy") for ws in spaces)
        spaces[0].sandbox.host_path("/testbed/app.py").write_text("x = 2\n")
        # clones share nothing: one's edit is its own (their diffs: tests/sandbox/test_containers_podman.py)
        assert spaces[1].sandbox.host_path("/testbed/app.py").read_text() == "x = 1\n"
    finally:
        for ws in spaces:
            await ws.close()
    assert not list((tmp_path / "ws").iterdir()) and (tree / "app.py").read_text() == "x = 1\n"
