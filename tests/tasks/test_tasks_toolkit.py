"""Bring your own task, exactly as docs/tasks.md says: its ``bash`` blocks run verbatim, in order, in an
empty directory (build, validate, a gold rollout, polar check). Then what the toolkit refuses: a
defective task is reported as a task defect, and the rules the doc states (single top-level folder,
paths relative to the task file, base_commit, the interpreter) hold."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from repo_paths import REPO

from polar_env.tasks.env import EnvBuildError, _interpreter
from polar_env.tasks.loader import TaskLoadError, load_tasks
from polar_env.tasks.tree import materialize, strip_single_top

DOC = REPO / "docs" / "tasks.md"
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
needs_sandbox = pytest.mark.needs("bwrap", "npm")


def doc_script() -> str:
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 5, "the walk-through's commands are bash blocks"
    return f'polar() {{ "{sys.executable}" -m polar_env.cli "$@"; }}\nset -euo pipefail\n' + "\n".join(blocks)


@pytest.mark.slow
@needs_sandbox
def test_the_docs_walkthrough_builds_validates_and_trains(tmp_path: Path):
    proc = subprocess.run(
        ["bash", "-c", doc_script()], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=1800
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    (row,) = [json.loads(line) for line in (tmp_path / "mytasks" / "tasks.jsonl").read_text().splitlines()]
    assert row["FAIL_TO_PASS"] == ["tests/test_calc.py::test_mean_of_two"]
    assert row["PASS_TO_PASS"] == ["tests/test_calc.py::test_single_value"]
    assert row["base_archive"] == "acme__calc-1/base.tar.gz" and len(row["base_commit"]) == 40
    with tarfile.open(tmp_path / "mytasks" / row["base_archive"]) as tar:
        assert "calc/__init__.py" in tar.getnames()  # the sdist's calc-0.1.0/ folder is the root
    assert "acme__calc-1: OK" in proc.stdout and "1/1 tasks valid" in proc.stdout
    summary = json.loads((tmp_path / "runs" / "mytasks" / "summary.json").read_text())
    assert summary["resolved"] == 1 and summary["status"]["completed"] == 1

    # the same task, broken: FAIL_TO_PASS names a test the base tree already passes
    bad = {**row, "instance_id": "acme__calc-2", "FAIL_TO_PASS": row["PASS_TO_PASS"]}
    broken = tmp_path / "mytasks" / "broken.jsonl"
    broken.write_text(json.dumps(bad) + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "polar_env.cli", "tasks", "validate", str(broken)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "acme__calc-2: TASK DEFECT" in proc.stdout and "empty patch already passes" in proc.stdout


def test_an_archive_with_one_top_folder_has_it_as_root(tmp_path: Path):
    (tmp_path / "t" / "pkg-1.2.3" / "pkg").mkdir(parents=True)
    (tmp_path / "t" / "pkg-1.2.3" / "pkg" / "m.py").write_text("x = 1\n")
    (tmp_path / "t" / "pkg-1.2.3" / "setup.py").write_text("")
    strip_single_top(tmp_path / "t")
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["pkg", "setup.py"]
    strip_single_top(tmp_path / "t")  # two entries: already a root, left alone
    assert (tmp_path / "t" / "pkg" / "m.py").is_file()


def test_paths_are_relative_to_the_task_file_and_base_commit_is_explained(tmp_path: Path, monkeypatch):
    bundled = load_tasks("bundled")[0]
    where = tmp_path / "set"
    (where / "a").mkdir(parents=True)
    shutil.copy(bundled.base_archive, where / "a" / "base.tar.gz")
    row = bundled.model_dump(mode="json")
    row["base_archive"] = "a/base.tar.gz"
    (where / "tasks.jsonl").write_text(json.dumps(row) + "\n")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    (task,) = load_tasks(str(where / "tasks.jsonl"))
    assert task.base_archive == str(where / "a" / "base.tar.gz")
    row["base_archive"] = "missing/base.tar.gz"
    (where / "tasks.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(TaskLoadError, match="relative to the task file"):
        load_tasks(str(where / "tasks.jsonl"))

    upstream = task.model_copy(update={"base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607"})
    with pytest.raises(RuntimeError, match="not the upstream commit"):
        materialize(upstream, tmp_path / "tree")


def test_an_interpreter_outside_usr_is_refused_with_the_rule(tmp_path: Path, monkeypatch):
    shim = tmp_path / "bin" / "python3.9"
    shim.parent.mkdir()
    shim.write_text("#!/bin/sh\necho 'pyenv: python3.9: command not found' >&2; exit 127\n")
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim.parent}:{os.environ['PATH']}")
    if Path("/usr/bin/python3.9").exists():
        pytest.skip("this host has a system python3.9")
    with pytest.raises(EnvBuildError, match="not Debian.s /usr/bin/python3.9 here and in the sandbox root"):
        _interpreter("3.9")
