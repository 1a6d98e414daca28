"""Warm workspaces: a task's base tree is unpacked and committed once per node, cloned per episode.

The counts come from spying on the unpack/commit/snapshot functions (an observation only: they
still run); everything else is real: bubblewrap workspaces on a bundled task, the real diff.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
from collections import Counter
from pathlib import Path

import pytest

from polar_env.episodes.workspace import open_workspace
from polar_env.rewards import workspace as grading_workspace
from polar_env.sandbox import gitdiff
from polar_env.sandbox.base import SandboxSpec
from polar_env.sandbox.bubblewrap import BubblewrapSandbox
from polar_env.tasks import base_trees
from polar_env.tasks import tree as task_tree
from polar_env.tasks.loader import load_bundled

pytestmark = pytest.mark.needs("bwrap")

TASK = next(t for t in load_bundled() if t.instance_id == "psf__requests-6028")
EDIT = [
    "sh",
    "-c",
    "printf 'x = 1\\n' >> requests/api.py && printf 'new\\n' > NEW.txt && rm README.md "
    "&& printf '\\000\\001bin' > blob.bin",
]


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own node cache (the default, ``$POLAR_CACHE/bases``, is shared by every run)."""
    monkeypatch.setenv("POLAR_BASE_CACHE", str(tmp_path / "bases"))
    return tmp_path / "bases"


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """How often a task tree is unpacked, committed and snapshotted (each call still runs)."""
    seen: Counter = Counter()
    for module, name, label in (
        (task_tree, "strip_single_top", "unpack"),
        (task_tree, "init_single_commit", "commit"),
        (gitdiff, "snapshot", "snapshot"),
    ):
        real = getattr(module, name)

        def spy(*args, _real=real, _label=label, **kwargs):
            seen[_label] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    return seen


def _bases(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.is_dir())


async def test_only_the_first_open_of_a_task_unpacks_or_commits(
    tmp_path: Path, cache: Path, calls: Counter, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(grading_workspace, "_BASES", {})  # this process has no grading base of the task yet
    spec = SandboxSpec(scratch_root=tmp_path)
    for _ in range(3):
        ws = await open_workspace(TASK, spec, sandbox="bubblewrap")
        assert (Path(ws.ref.root) / "testbed" / "requests" / "api.py").is_file()
        assert ws.ref.clone in ("reflink", "copy")
        await ws.close()
    grading_workspace.GradingTree.fresh(
        TASK, tmp_path / "graded"
    )  # the grader's base comes from the same warm base
    assert calls == {"unpack": 1, "commit": 1, "snapshot": 1}
    assert len(_bases(cache)) == 1


async def test_concurrent_opens_of_a_task_build_its_base_once(
    tmp_path: Path, cache: Path, calls: Counter, monkeypatch: pytest.MonkeyPatch
):
    both_asked = threading.Barrier(2, timeout=30)  # neither builds before both have asked for the base
    real_key = base_trees.base_key

    def key_when_both_ask(task):
        both_asked.wait()
        return real_key(task)

    monkeypatch.setattr(base_trees, "base_key", key_when_both_ask)
    spec = SandboxSpec(scratch_root=tmp_path)
    a, b = await asyncio.gather(
        open_workspace(TASK, spec, sandbox="bubblewrap"), open_workspace(TASK, spec, sandbox="bubblewrap")
    )
    try:
        assert calls["commit"] == 1 and calls["unpack"] == 1
        assert len(_bases(cache)) == 1 and not list(cache.glob(".build-*"))
        assert a.ref.root != b.ref.root
    finally:
        await a.close()
        await b.close()


async def test_a_clone_is_independent_of_the_base_and_of_other_episodes(tmp_path: Path, cache: Path):
    spec = SandboxSpec(scratch_root=tmp_path)
    a = await open_workspace(TASK, spec, sandbox="bubblewrap")
    b = await open_workspace(TASK, spec, sandbox="bubblewrap")
    base = base_trees.BaseTree(cache / _bases(cache)[0])
    try:
        before = (base.tree / "requests" / "api.py").read_bytes()
        res = await a.sandbox.run(EDIT, timeout_s=60)  # the agent, as the sandbox uid, edits its tree
        assert res.exit_code == 0, res.stderr_tail
        a_tree, b_tree = Path(a.ref.root) / "testbed", Path(b.ref.root) / "testbed"
        assert (a_tree / "requests" / "api.py").read_bytes().endswith(b"x = 1\n")
        for tree in (b_tree, base.tree):
            assert (tree / "requests" / "api.py").read_bytes() == before
            assert (tree / "README.md").exists() and not (tree / "NEW.txt").exists()
        for tree in (a_tree, b_tree):  # no inode shared with the base: a copy or a reflink, never a hard link
            st = (tree / "setup.py").stat()
            assert st.st_ino != (base.tree / "setup.py").stat().st_ino or st.st_dev != base.tree.stat().st_dev
            assert st.st_nlink == 1
        assert b"x = 1" in await a.sandbox.diff() and await b.sandbox.diff() == b""
    finally:
        await a.close()
        await b.close()
    assert (base.tree / "requests" / "api.py").read_bytes() == before  # closing leaves the base alone


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox runs as another uid only on a root host")
async def test_the_sandbox_uid_cannot_write_the_base(tmp_path: Path, cache: Path):
    spec = SandboxSpec(scratch_root=tmp_path)
    ws = await open_workspace(TASK, spec, sandbox="bubblewrap")
    await ws.close()
    base = cache / _bases(cache)[0]
    assert (cache.stat().st_uid, cache.stat().st_mode & 0o777) == (0, 0o700)
    assert {p.lstat().st_uid for p in base.rglob("*")} == {0}
    target = base / "tree" / "setup.py"
    proc = subprocess.run(
        [
            "setpriv",
            f"--reuid={spec.uid}",
            f"--regid={spec.uid}",
            "--clear-groups",
            "sh",
            "-c",
            f"echo pwned >> {target}",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "Permission denied" in proc.stderr
    assert b"pwned" not in target.read_bytes()


async def test_the_patch_is_the_same_as_from_a_fresh_unpack(tmp_path: Path):
    """The warm clone's diff, for the same edits, is byte for byte the cold path's (unpack, copy,
    snapshot)."""
    cold = BubblewrapSandbox.create(
        task_tree.materialize(TASK, tmp_path / "cold-tree"), spec=SandboxSpec(scratch_root=tmp_path / "cold")
    )
    warm = await open_workspace(TASK, SandboxSpec(scratch_root=tmp_path / "warm"), sandbox="bubblewrap")
    try:
        listing = ["sh", "-c", "ls -lAR --time-style=+%s .; stat -c '%U %a %n' requests/*"]
        cold_ls, warm_ls = (
            await cold.run(listing, timeout_s=60),
            await warm.sandbox.run(listing, timeout_s=60),
        )
        assert "setup.py" in cold_ls.stdout_tail and "agent agent" in cold_ls.stdout_tail
        assert warm_ls.stdout_tail == cold_ls.stdout_tail  # same entries, modes, owner, mtimes, order
        for sb in (cold, warm.sandbox):
            res = await sb.run(EDIT, timeout_s=60)
            assert res.exit_code == 0, res.stderr_tail
        patch = await cold.diff()
        assert b"NEW.txt" in patch and b"GIT binary patch" in patch and b"deleted file" in patch
        assert await warm.sandbox.diff() == patch
    finally:
        await cold.destroy()
        await warm.close()
