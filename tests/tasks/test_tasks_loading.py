"""Task model and loaders: bundled set, JSONL files, and SWE-bench Verified's offline error."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from repo_paths import REPO as REPO_ROOT

from polar_env.tasks.loader import TaskLoadError, load_jsonl, load_tasks
from polar_env.tasks.models import Task, default_test_directives, patch_files
from polar_env.tasks.runtime import instance_image
from polar_env.tasks.tree import git, materialize

REQUIRED = {"pallets__flask-5014", "psf__requests-5414"}


def test_bundled_set_has_required_real_instances():
    tasks = {t.instance_id: t for t in load_tasks("bundled")}
    assert REQUIRED <= set(tasks)
    assert len({t.repo for t in tasks.values()}) >= 2
    for t in tasks.values():
        assert t.FAIL_TO_PASS and t.PASS_TO_PASS
        assert t.patch.startswith("diff --git") and t.test_patch.startswith("diff --git")
        assert all("==" in r for r in t.environment.requirements), "every dependency pinned exactly"
        assert Path(t.base_archive).is_file()
        # The gold patch touches no test file and the test patch only tests.
        assert not set(t.test_files()) & set(patch_files(t.patch))
        assert t.image == instance_image(t.instance_id)  # the name SWE-bench's harness uses


def test_bundled_task_records_sdist_checksum():
    for task_json in (REPO_ROOT / "polar_env/tasks/bundled").glob("*/task.json"):
        src = json.loads(task_json.read_text())["source"]
        assert len(src["sha256"]) == 64 and "==" in src["sdist"]


def test_flask_task_matches_upstream_instance():
    (t,) = [t for t in load_tasks("bundled") if t.instance_id == "pallets__flask-5014"]
    assert t.FAIL_TO_PASS == ["tests/test_blueprints.py::test_empty_name_not_allowed"]
    assert "raise ValueError" in t.patch and "src/flask/blueprints.py" in t.patch
    assert t.test_directives == ["tests/test_blueprints.py"]


@pytest.mark.parametrize("task", load_tasks("bundled"), ids=lambda t: t.instance_id)
def test_base_tree_has_one_commit_and_lacks_the_fix(task: Task, tmp_path: Path):
    with tarfile.open(task.base_archive) as tar:
        assert not any(m.name.split("/")[0] == ".git" for m in tar.getmembers()), "no shipped history"
    tree = materialize(task, tmp_path / "t")
    assert git(tree, "rev-list", "--all").stdout.decode().split() == [task.base_commit]
    assert git(tree, "tag").stdout == b"" and git(tree, "stash", "list").stdout == b""
    assert git(tree, "status", "--porcelain").stdout == b""
    # The fix is absent: the gold patch applies forward and not in reverse.
    patch_file = tmp_path / "gold.diff"
    patch_file.write_text(task.patch)
    assert git(tree, "apply", "--check", str(patch_file), check=False).returncode == 0
    assert git(tree, "apply", "--check", "-R", str(patch_file), check=False).returncode != 0


def test_materialize_is_reproducible(tmp_path: Path):
    task = load_tasks("bundled")[0]
    a = materialize(task, tmp_path / "a")
    b = materialize(task, tmp_path / "b")
    assert git(a, "rev-parse", "HEAD").stdout == git(b, "rev-parse", "HEAD").stdout


@pytest.mark.slow
@pytest.mark.parametrize("task_id", sorted(t.instance_id for t in load_tasks("bundled")))
def test_archives_are_byte_reproducible(task_id: str, tmp_path: Path):
    """Rebuilding a bundled task yields the identical archive and task record (F2P/P2P included)."""
    out = tmp_path / "bundled"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "scripts/build_bundled_tasks.py"),
            "--only",
            task_id,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    shipped = REPO_ROOT / "polar_env/tasks/bundled" / task_id

    def sha(p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest()

    assert sha(out / task_id / "base.tar.gz") == sha(shipped / "base.tar.gz")
    assert json.loads((out / task_id / "task.json").read_text()) == json.loads(
        (shipped / "task.json").read_text()
    )


def test_jsonl_rows_in_swe_bench_schema(tmp_path: Path):
    row = {
        "instance_id": "django__django-11099",
        "repo": "django/django",
        "version": "3.0",
        "base_commit": "d26b2424437dabeeca94d7900b37d2df4410da0c",
        "problem_statement": "UsernameValidator allows trailing newline in usernames",
        "patch": "",
        "test_patch": (
            "diff --git a/tests/auth_tests/test_validators.py b/tests/auth_tests/test_validators.py\n"
        ),
        "FAIL_TO_PASS": json.dumps(
            ["test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)"]
        ),
        "PASS_TO_PASS": "[]",
        "hints_text": "",
        "created_at": "2019-03-20T03:46:18Z",
        "environment_setup_commit": "419a78300f7cd27611196e1e464d50fd0385ff27",
    }
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(row) + "\n\n")
    (task,) = load_tasks(str(path))
    assert task.FAIL_TO_PASS == ["test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)"]
    assert task.test_directives == ["auth_tests.test_validators"]
    assert task.test_cmd.startswith("./tests/runtests.py")
    assert task.image == ""  # none named: SWE-bench's own image for the instance
    assert instance_image(task.instance_id) == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"


def test_jsonl_bad_row_names_the_line(tmp_path: Path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"instance_id": "x"}\n')
    with pytest.raises(TaskLoadError, match=r"bad.jsonl:1"):
        load_jsonl(path)


def test_unknown_spec_is_a_clear_error():
    with pytest.raises(TaskLoadError, match="bundled"):
        load_tasks("no-such-set")


def test_directives_for_pytest_repos_are_test_files():
    patch = (
        "diff --git a/tests/test_a.py b/tests/test_a.py\n--- a/x\n"
        "diff --git a/tests/data.json b/tests/data.json\n"
    )
    assert default_test_directives("psf/requests", patch) == ["tests/test_a.py"]


def test_verified_offline_error_is_clear(tmp_path: Path):
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "POLAR_CACHE": str(tmp_path / "polar"),
    }
    code = "from polar_env.tasks.loader import load_tasks\nload_tasks('verified')"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO_ROOT
    )
    assert proc.returncode != 0
    assert "TaskLoadError" in proc.stderr
    assert "HF_HUB_OFFLINE is set" in proc.stderr and "--tasks bundled" in proc.stderr


def test_verified_uses_polar_cache_when_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("POLAR_CACHE", str(tmp_path))
    cached = tmp_path / "tasks" / "swe-bench-verified-test.jsonl"
    cached.parent.mkdir(parents=True)
    flask = next(t for t in load_tasks("bundled") if t.instance_id == "pallets__flask-5014")
    cached.write_text(flask.model_dump_json(exclude={"base_archive"}) + "\n")
    (task,) = load_tasks("verified")
    assert task.instance_id == "pallets__flask-5014" and task.base_archive is None
