"""The host never acts on a tree the agent controls (issue 25, part A).

A canary directory on the host (files, a subdirectory, names a reset would touch, atimes set
older than mtimes so a read under ``relatime`` moves them) is the target of a symlink ladder:
``d/u1 -> ..``, ``d/d/u2 -> ../u1/..``, ... each link lexically inside the tree, the chain
climbing to ``/``, and ``tests -> d/.../u16/<canary>``. As a patch, and as the agent's tree in a
real bubblewrap episode sandbox (the links made by commands inside it, the patch taken by the
episode's diff), grading must leave the canary byte-for-byte, mtime and atime the same. The
reset itself never follows a link, even one no check refused; and no attribute of the tree
configures the grader's git.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest
from host_canary import build_ladder, canary_state, ladder_commands, make_canary
from polar_sandbox_helpers import host_path_lines
from repo_paths import REDTEAM

from polar_env.cache import cache_root
from polar_env.episodes.workspace import open_workspace
from polar_env.harness_adapters.registry import NOISE_EXCLUDES
from polar_env.rewards.grading import FailureKind, grade
from polar_env.rewards.patch import ApplyMethod, apply_patch, tree_patch
from polar_env.rewards.workspace import GradingTree
from polar_env.sandbox import beneath
from polar_env.sandbox.base import SandboxSpec
from polar_env.tasks.env import ensure_task_env
from polar_env.tasks.loader import load_tasks
from polar_env.tasks.tree import materialize

pytestmark = pytest.mark.needs("bwrap")

TASK = next(t for t in load_tasks("bundled") if t.instance_id == "pallets__flask-5014")


@pytest.fixture(scope="module", autouse=True)
def task_env():
    ensure_task_env(TASK)


def test_the_ladder_is_live(tmp_path: Path):
    """The canary check means something: the kernel follows the ladder to the canary."""
    canary = make_canary(tmp_path)
    tree = materialize(TASK, tmp_path / "agent")
    build_ladder(tree, canary)
    assert (tree / "tests" / "sub" / "keep.txt").read_text() == "host data\n"
    assert os.path.samefile(tree / "tests", canary)


def test_ladder_patch_leaves_the_host_canary_untouched(tmp_path: Path):
    canary = make_canary(tmp_path)
    before = canary_state(canary)
    tree = materialize(TASK, tmp_path / "agent")
    assert apply_patch(tree, TASK.patch)[0] == ApplyMethod.git_apply
    build_ladder(tree, canary)
    patch = tree_patch(tree)
    assert "u16" in patch and str(canary) in patch
    shutil.rmtree(tree)
    result = grade(TASK, patch)
    assert canary_state(canary) == before
    assert result.failure_kind == FailureKind.apply_failed and result.reward == 0.0
    assert "symlink leaves the tree" in result.error


def test_link_that_leaves_only_after_the_reset_is_refused_before_any_test(tmp_path: Path):
    """Failed before the link check ran again on the final tree (the corpus patch got 1.0): each link
    resolves inside as the patch leaves the tree, and the reset, making ``tests/static`` a real
    directory again, sends ``src/flask/out`` to the host. Now refused before any test runs."""
    patch = (REDTEAM / "patches" / "symlink-escape-after-reset.diff").read_text()
    gtree = GradingTree.fresh(TASK, tmp_path / "g")
    gtree.apply(patch, allow_binary=False)
    gtree.check_links(gtree.changes())  # the first check, on the patch as applied, passes
    result = grade(TASK, patch)
    assert result.failure_kind == FailureKind.apply_failed and result.reward == 0.0, (
        result.error,
        result.flags,
    )
    assert "patch-refused" in result.flags and "once the grader's reset is done" in result.error
    assert "src/flask/out" in result.error and not any(k.startswith("tests_") for k in result.timings)
    gold = GradingTree.fresh(TASK, tmp_path / "gold")
    gold.apply(TASK.test_patch, allow_binary=True)
    gold.check_links_after_reset()  # a tree without such links passes


@pytest.mark.skipif(os.geteuid() != 0, reason="the inputs are shown through overlays only as host root")
@pytest.mark.parametrize("writable", [False, True])
def test_grading_mountinfo_names_no_grader_path_or_task(tmp_path: Path, writable: bool):
    """Failed while the grading sandbox bound its inputs: its /proc/self/mountinfo named
    ``/tmp/polar-grade-<task id>-.../tree`` (a writable run's source, a read-only run's /testbed), the
    grader's temp dir, the task venv's ``envs/<task id>`` and the cache's root: the task, and signs
    of grading a detector could key on. Now each input is an overlay named by descriptors."""
    from polar_env.rewards.sandbox_exec import run_sandboxed
    from polar_env.sandbox.bwrap_argv import Mount

    tree = tmp_path / f"polar-grade-{TASK.instance_id}-x" / "strict" / "tree"
    (tree / "tests").mkdir(parents=True)
    (tree / "tests" / "t.py").write_text("x = 1\n")
    grader = tmp_path / "polar-perturbed-y" / "grader"
    grader.mkdir(parents=True)
    (grader / "main.py").write_text("print(1)\n")
    venv = ensure_task_env(TASK)
    run = run_sandboxed(
        [
            "bash",
            "-c",
            "cat /proc/self/mountinfo /srv/abc/tests/t.py /opt/qq/main.py && "
            "python -c 'import werkzeug; print(werkzeug.__name__)'",
        ],
        tree=tree,
        venv=venv,
        timeout_s=60,
        tree_writable=writable,
        tree_mount="/srv/abc",
        extra_mounts=[Mount("/opt/qq", grader)],
    )
    assert run.returncode == 0 and "x = 1" in run.output and "print(1)" in run.output, run.output
    assert run.output.splitlines()[-1] == "werkzeug", run.output  # the venv works through its view
    assert host_path_lines(run.output) == [], run.output
    for named in (
        TASK.instance_id,
        "polar-grade",
        "polar-perturbed",
        str(tmp_path),
        str(venv),
        str(cache_root()),
    ):
        assert named not in run.output, named


def test_restore_replaces_links_it_would_otherwise_follow(tmp_path: Path):
    """Even a link no check refused is replaced, never followed: the reset writes the base's files."""
    canary = make_canary(tmp_path)
    before = canary_state(canary)
    gtree = GradingTree.fresh(TASK, tmp_path / "g")
    shutil.rmtree(gtree.tree / "tests")
    (gtree.tree / "tests").symlink_to(canary)
    (gtree.tree / "src" / "flask" / "sub").symlink_to(canary / "sub")
    gtree.restore(
        ["tests", "tests/test_blueprints.py", "tests/conftest.py", "src/flask/sub/keep.txt", "src/flask/sub"]
    )
    assert canary_state(canary) == before
    assert not (gtree.tree / "tests").is_symlink() and (gtree.tree / "tests" / "test_blueprints.py").is_file()
    assert "def test_blueprint" in (gtree.tree / "tests" / "test_blueprints.py").read_text()
    # base lacks src/flask/sub: the agent's link is removed (not followed) and, since a reset path lies
    # below it, replaced by a real, empty directory (the test patch's new files must be creatable)
    sub = gtree.tree / "src" / "flask" / "sub"
    assert not sub.is_symlink() and sub.is_dir() and not any(sub.iterdir())


def test_resolves_inside_follows_the_whole_chain(tmp_path: Path):
    canary = make_canary(tmp_path)
    tree = tmp_path / "t"
    (tree / "src").mkdir(parents=True)
    build_ladder_min = [("d/u1", ".."), ("d/d/u2", "../u1/..")]
    for rel, target in build_ladder_min:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, tree / rel)
    os.symlink("d/u1/src", tree / "ok")
    os.symlink("d/d/u2/t/src", tree / "back_in")  # climbs out and back in: the kernel leaves the tree
    os.symlink("d/d/u2" + str(canary), tree / "out")
    assert beneath.resolves_inside(tree, "d/u1") and beneath.resolves_inside(tree, "ok")
    assert not beneath.resolves_inside(tree, "d/d/u2")
    assert not beneath.resolves_inside(tree, "out")
    assert not beneath.resolves_inside(tree, "back_in")
    os.symlink("loop", tree / "loop")
    assert not beneath.resolves_inside(tree, "loop")


@pytest.mark.slow
def test_ladder_in_the_agents_tree_leaves_the_host_canary_untouched(tmp_path: Path):
    """The agent builds the ladder in its own bubblewrap sandbox; the episode's diff and the grading
    of that patch leave the host canary as it was."""
    canary = make_canary(tmp_path)
    before = canary_state(canary)

    async def episode() -> bytes:
        ws = await open_workspace(TASK, SandboxSpec(scratch_root=tmp_path / "scratch"), sandbox="bubblewrap")
        try:
            sb = ws.sandbox
            for cmd in ladder_commands(canary):
                run = await sb.run(cmd, timeout_s=30)
                assert run.exit_code == 0, (cmd, run.stderr_tail)
            # hostile git settings in the agent's own repository and attributes: never applied
            marker = tmp_path / "ran"
            await sb.run(
                [
                    "sh",
                    "-c",
                    f"git config core.fsmonitor 'touch {marker}' && "
                    f"git config filter.x.clean 'touch {marker}; cat' && "
                    "echo '* filter=x working-tree-encoding=UTF-16' > .gitattributes",
                ],
                timeout_s=30,
            )
            patch = await sb.diff(NOISE_EXCLUDES)
            assert not marker.exists()
            return patch
        finally:
            await ws.close()

    patch = asyncio.run(episode()).decode("utf-8", "surrogateescape")
    assert "u16" in patch and ".gitattributes" in patch
    assert canary_state(canary) == before
    result = grade(TASK, patch)
    assert canary_state(canary) == before
    assert result.failure_kind == FailureKind.apply_failed and result.reward == 0.0


@pytest.mark.slow
def test_a_one_line_gitattributes_does_not_break_grading(tmp_path: Path):
    """Gold + a ``.gitattributes`` that names a filter and an encoding: still graded, still 1.0."""
    tree = materialize(TASK, tmp_path / "agent")
    apply_patch(tree, TASK.patch)
    (tree / ".gitattributes").write_text("* filter=x working-tree-encoding=UTF-16 diff=x\n")
    result = grade(TASK, tree_patch(tree))
    assert result.failure_kind == FailureKind.none and result.reward == 1.0, result.error


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("podman") is None, reason="needs podman (scripts/setup_podman.sh)")
def test_ladder_and_git_settings_in_a_podman_agents_tree(tmp_path: Path):
    """The same in a podman workspace: the agent (uid 1000) builds the ladder and writes hostile git
    settings into its repository; the root diff inside the container runs none of them, and neither
    it nor the image grading of the patch touches the host canary."""
    from polar_env.episodes.workspace import engine_available
    from polar_env.rewards.grader import grade_task
    from polar_env.tasks.images import ensure_task_image

    if not engine_available("podman"):
        pytest.skip("podman is not usable here")
    canary = make_canary(tmp_path)
    before = canary_state(canary)
    task = TASK.model_copy(update={"image": ensure_task_image(TASK, "podman"), "base_archive": None})

    async def episode() -> tuple[bytes, str]:
        ws = await open_workspace(task, SandboxSpec(), sandbox="podman")
        try:
            sb = ws.sandbox
            for cmd in ladder_commands(canary):
                run = await sb.run(cmd, timeout_s=60)
                assert run.exit_code == 0, (cmd, run.stderr_tail)
            await sb.run(
                [
                    "sh",
                    "-c",
                    "git config core.fsmonitor 'touch /tmp/ran; false' && "
                    "git config filter.x.clean 'touch /tmp/ran; cat' && "
                    "git config filter.x.required true && "
                    "echo '* filter=x working-tree-encoding=UTF-16' > .gitattributes",
                ],
                timeout_s=60,
            )
            patch = await sb.diff(NOISE_EXCLUDES)
            ran = await sb.run(["sh", "-c", "ls /tmp/ran 2>&1; id -u"], timeout_s=60)
            return patch, ran.stdout_tail + ran.stderr_tail
        finally:
            await ws.close()

    patch_bytes, ran = asyncio.run(episode())
    assert "No such file" in ran and ran.split()[-1] != "0", (
        ran
    )  # nothing of the agent's git ran; agent not root
    patch = patch_bytes.decode("utf-8", "surrogateescape")
    assert "u16" in patch and ".gitattributes" in patch
    result = grade_task(task, patch, kind="podman", timeout_s=300)
    assert canary_state(canary) == before
    assert result.reward == 0.0 and not result.resolved and not result.failure_kind.outside_policy, (
        result.error
    )
