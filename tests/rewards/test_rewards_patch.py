"""Patch extraction from an agent tree and patch application to a fresh tree (real git/patch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar_env.rewards.patch import ApplyMethod, apply_patch, tree_patch
from polar_env.tasks.tree import git, init_single_commit


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    tree = tmp_path / "repo"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "mod.py").write_text("".join(f"line {i}\n" for i in range(1, 21)))
    (tree / "pkg" / "blob.bin").write_bytes(bytes(range(256)))
    (tree / "README").write_text("readme\n")
    init_single_commit(tree)
    return tree


def copy_base(src: Path, dest: Path) -> Path:
    """A fresh tree at the same base (what the grader starts from)."""
    git(src, "worktree", "add", "-q", "--detach", str(dest), "HEAD")
    return dest


def test_unchanged_tree_gives_empty_patch(repo: Path):
    assert tree_patch(repo) == ""


def test_extracts_edits_new_files_deletions_and_binary(repo: Path, tmp_path: Path):
    (repo / "pkg" / "mod.py").write_text((repo / "pkg" / "mod.py").read_text().replace("line 5\n", "five\n"))
    (repo / "pkg" / "new.py").write_text("NEW = 1\n")  # untracked: must be included
    (repo / "README").unlink()
    (repo / "pkg" / "blob.bin").write_bytes(bytes(reversed(range(256))) + b"\x00tail")
    patch = tree_patch(repo)
    assert "+five" in patch and "pkg/new.py" in patch and "deleted file mode" in patch
    assert "GIT binary patch" in patch

    fresh = copy_base(repo, tmp_path / "fresh")
    method, _ = apply_patch(fresh, patch)
    assert method == ApplyMethod.git_apply
    for rel in ("pkg/mod.py", "pkg/new.py", "pkg/blob.bin"):
        assert (fresh / rel).read_bytes() == (repo / rel).read_bytes()
    assert not (fresh / "README").exists()


def test_harness_noise_is_dropped(repo: Path):
    for rel in (
        ".codex/config.toml",
        ".claude/settings.json",
        ".pi/agent/models.json",
        "pkg/__pycache__/mod.cpython-311.pyc",
        "pkg/stale.pyc",
        ".pytest_cache/v/cache",
        "build/lib/x.py",
        "pkg.egg-info/PKG-INFO",
    ):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("noise\n")
    (repo / "pkg" / "real.py").write_text("REAL = 1\n")
    patch = tree_patch(repo)
    assert "pkg/real.py" in patch
    for noise in (".codex", ".claude", ".pi/", "__pycache__", ".pyc", ".pytest_cache", "build/", "egg-info"):
        assert noise not in patch


def test_source_in_a_nested_build_or_dist_dir_is_graded(repo: Path):
    """Build output is dropped at the root only: pip keeps real code in ``operations/build/``."""
    for rel in ("pkg/build/wheel.py", "pkg/dist/meta.py", "build/out.py"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("FIXED = True\n")
    patch = tree_patch(repo)
    assert "pkg/build/wheel.py" in patch and "pkg/dist/meta.py" in patch
    assert "build/out.py" not in patch.replace("pkg/build/", "")


def test_agent_commits_and_index_are_counted_but_not_touched(repo: Path):
    (repo / "pkg" / "mod.py").write_text("committed\n")
    git(repo, "commit", "-qam", "agent commit")
    (repo / "pkg" / "staged.py").write_text("S = 1\n")
    git(repo, "add", "pkg/staged.py")
    status_before = git(repo, "status", "--porcelain").stdout
    patch = tree_patch(repo)
    assert "+committed" in patch and "pkg/staged.py" in patch
    assert git(repo, "status", "--porcelain").stdout == status_before


def test_fuzzy_patch_is_refused_not_fuzzed(repo: Path):
    # Context line "line 7" is wrong ("seven"): `patch --fuzz` would take it; the grader does not.
    patch = (
        "diff --git a/pkg/mod.py b/pkg/mod.py\n--- a/pkg/mod.py\n+++ b/pkg/mod.py\n"
        "@@ -7,7 +7,7 @@\n seven\n line 8\n line 9\n-line 10\n+ten\n line 11\n line 12\n line 13\n"
    )
    method, log = apply_patch(repo, patch)
    assert method == ApplyMethod.none and "patch does not apply" in log
    assert "ten\n" not in (repo / "pkg" / "mod.py").read_text()


def test_non_applying_patch_reports_none(repo: Path):
    patch = (
        "diff --git a/pkg/mod.py b/pkg/mod.py\n--- a/pkg/mod.py\n+++ b/pkg/mod.py\n"
        "@@ -1,3 +1,3 @@\n alpha\n-beta\n+gamma\n delta\n"
    )
    before = (repo / "pkg" / "mod.py").read_text()
    method, _ = apply_patch(repo, patch)
    assert method == ApplyMethod.none
    assert (repo / "pkg" / "mod.py").read_text() == before
