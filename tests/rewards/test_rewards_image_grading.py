"""Grading in the task's image: which script and image, decided by the pinned ``swebench`` package for the
rows it knows (tested against the package itself), and by the row's own test command otherwise. The
runs themselves are in tests/sandbox/test_containers_podman.py."""

from __future__ import annotations

import json
from pathlib import Path

from repo_paths import FIXTURES
from swebench.harness.utils import make_test_spec
from swebench.task.checks import expected_image

from polar_env.rewards.grader import grade_task
from polar_env.rewards.image_grading import custom_eval_script, grading_plan
from polar_env.tasks.loader import load_bundled, load_jsonl
from polar_env.tasks.runtime import task_image

ROW = FIXTURES / "swebench_verified_astropy-12907.json"


def _verified_task(tmp_path: Path, row: dict):
    path = tmp_path / "verified.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (task,) = load_jsonl(path)
    return task


def test_a_verified_row_gets_exactly_swebench_script_and_image(tmp_path: Path):
    """A SWE-bench Verified row (astropy__astropy-12907 as the dataset has it, with the evaluation
    columns swebench 5 reads): the eval script and image are the package's own."""
    row = json.loads(ROW.read_text())
    task = _verified_task(tmp_path, row)
    image, script, spec = grading_plan(task, task_image(task))
    theirs = make_test_spec(row)
    assert script == theirs.eval_script and image == theirs.image
    assert spec.log_parser == "parse_log_astropy" and spec.FAIL_TO_PASS == json.loads(row["FAIL_TO_PASS"])


def test_a_classic_verified_row_runs_in_swebench_image_with_its_test_command(tmp_path: Path):
    row = {
        k: v
        for k, v in json.loads(ROW.read_text()).items()
        if k not in ("image", "eval_script", "log_parser", "eval_type")
    }
    task = _verified_task(tmp_path, row)
    assert task_image(task) == expected_image(task.instance_id)  # the name swebench's harness derives
    image, script, spec = grading_plan(task, task_image(task))
    assert spec is None and image == expected_image(task.instance_id)
    assert f"git checkout {task.base_commit} -- astropy/modeling/tests/test_separable.py" in script
    assert (
        ">>>>> Start Test Output" in script
        and "pytest -rA astropy/modeling/tests/test_separable.py" in script
    )


def test_custom_rows_reset_apply_and_run_between_the_markers():
    task = next(t for t in load_bundled() if t.instance_id == "psf__requests-5414")
    script = custom_eval_script(task)
    lines = script.splitlines()
    assert lines[:2] == ["#!/bin/bash", "set -uxo pipefail"]
    reset = f"git checkout {task.base_commit} -- tests/test_requests.py"
    assert lines.count(reset) == 2  # before the test patch and after the run, as SWE-bench's scripts do
    start = lines.index("echo '>>>>> Start Test Output'")
    assert lines.index("git apply -v - <<'EOF_POLAR_TEST_PATCH'") < start
    assert lines[start + 1] == task.full_test_command()


def test_apptainer_without_a_base_archive_is_graded_in_its_image_and_masked_where_apptainer_is_missing(
    tmp_path: Path, monkeypatch
):
    """No apptainer on PATH: the image grader cannot start, an infrastructure failure naming apptainer, never
    the agent's 0 (tests/sandbox/test_containers_podman.py grades through a stand-in)."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("POLAR_BASE_CACHE", str(tmp_path / "bases"))
    task = load_bundled()[0].model_copy(update={"base_archive": None, "image": "example/task:1"})
    result = grade_task(task, task.patch, kind="apptainer")
    assert result.failure_kind == "infrastructure" and result.reward == 0.0 and "apptainer" in result.error
