"""The datasets' own procedures as Polar runs them, without an image. SWE-rebench V2: its own Python log
parsers and its exact verdict, the eval script in the row's ``/<repo>``, a row whose parser Polar lacks
refused at grading (not scored 0), a command list not taken for one pytest run by the strict mode. R2E-Gym:
its parser and every-status verdict, its gold patch rendered from the parsed commit, its hidden files (and
their refusal where Polar cannot remove them). The images: tests/tasks/test_dataset_standins.py."""

from __future__ import annotations

import json

import pytest
from repo_paths import FIXTURES

from polar_env.outcomes import FailureKind
from polar_env.rewards.image_grading import custom_eval_script, grade_in_image
from polar_env.rewards.strict_run import StrictUnsupported, pytest_args
from polar_env.tasks.datasets import DATASETS, procedure_of
from polar_env.tasks.datasets.swe_rebench_v2_parsers import (
    exactly_passed,
    parse_pytest,
    parse_pytest_options,
    parse_pytest_v2,
    resolves,
)
from polar_env.tasks.loader import load_tasks

V2 = DATASETS["swe-rebench-v2"]


def _python_row(**config) -> dict:
    row = json.loads((FIXTURES / "datasets" / "swe-rebench-v2.jsonl").read_text())
    row["repo"], row["language"] = "psf/requests", "python"
    row["install_config"] = {**row["install_config"], "log_parser": "parse_log_pytest", **config}
    return row


LOG = "\n".join(
    [
        "tests/test_a.py::test_one PASSED",
        "PASSED tests/test_a.py::test_one",
        "PASSED tests/test_a.py::test_path[/tmp/x/y/data.txt]",
        "FAILED tests/test_a.py::test_two - AssertionError: 1 != 2",
        "SKIPPED [1] tests/test_a.py:9: no network",
        "\x1b[32mPASSED\x1b[0m tests/test_a.py::test_three",
    ]
)


def test_v2_parsers_read_pytest_summaries_as_v2_does():
    assert parse_pytest(LOG) == {
        "tests/test_a.py::test_one": "PASSED",
        "tests/test_a.py::test_path[/tmp/x/y/data.txt]": "PASSED",
        "tests/test_a.py::test_two": "FAILED",
        "[1]": "SKIPPED",  # V2 keeps the skipped summary's word (swebench 5 drops it)
    }
    assert "tests/test_a.py::test_path[/data.txt]" in parse_pytest_options(LOG)  # the path's last part only
    v2 = parse_pytest_v2(LOG)
    assert v2["tests/test_a.py::test_three"] == "PASSED"  # colour codes dropped
    assert v2["tests/test_a.py::test_one"] == "PASSED"


def test_v2_verdict_is_exact():
    f2p, p2p = ["t::a"], ["t::b", "t::c (0.5s)"]
    assert exactly_passed({"t::a": "PASSED", "t::b": "PASSED", "t::c": "PASSED"}, f2p, p2p)
    # every listed test passing is not enough: a test V2 did not list passed too
    assert not exactly_passed(
        {"t::a": "PASSED", "t::b": "PASSED", "t::c": "PASSED", "t::d": "PASSED"}, f2p, p2p
    )
    assert not exactly_passed({"t::a": "PASSED", "t::b": "PASSED", "t::c": "FAILED"}, f2p, p2p)


def test_python_row_is_graded_its_way_in_its_repo_directory():
    task = V2.to_task(_python_row(test_cmd=["pytest -rA tests/test_requests.py"]))
    proc = procedure_of(task)
    assert proc.reproduced and proc.resolves is resolves and proc.parser(task) is parse_pytest
    script = custom_eval_script(task)
    assert "cd /requests\n" in script and "/testbed" not in script and "activate" not in script
    assert pytest_args(task) == ["-rA", "tests/test_requests.py"]  # the strict mode runs it
    two = V2.to_task(_python_row(test_cmd=["pip install -e .", "pytest -rA tests"]))
    with pytest.raises(StrictUnsupported, match="more than one command"):
        pytest_args(two)


def test_a_row_whose_parser_polar_lacks_is_refused_not_scored():
    """The cargo row of the fixture: V2's parser for it is not Polar's; grading says so as the task's defect
    before any container starts (no engine is asked for: the refusal comes first)."""
    task = V2.to_task(json.loads((FIXTURES / "datasets" / "swe-rebench-v2.jsonl").read_text()))
    assert not procedure_of(task).reproduced and "parse_log_cargo" in procedure_of(task).instead
    result = grade_in_image(task, task.patch, engine="podman", image=task.image)
    assert result.failure_kind == FailureKind.task_defect and "parse_log_cargo" in result.error, result


R2E_LOG = """============================= test session starts ==============================
r2e_tests/test_1.py ..F
=========================== short test summary info ============================
PASSED r2e_tests/test_1.py::TestText::test_text_charset
PASSED r2e_tests/test_1.py::test_text_default
FAILED r2e_tests/test_1.py::test_flaky - AssertionError: no
ERROR r2e_tests/test_1.py::test_net - ConnectionError
\x1b[32mPASSED\x1b[0m r2e_tests/test_1.py::test_coloured
========================= 1 failed, 3 passed in 0.50s =========================
"""


def test_r2e_parser_and_verdict_are_r2e_gyms():
    from polar_env.tasks.datasets.r2e_gym import parse_log, resolves

    assert parse_log(R2E_LOG) == {
        "TestText.test_text_charset": "PASSED",
        "test_text_default": "PASSED",
        "test_flaky": "FAILED",
        "test_net": "ERROR",
        "test_coloured": "PASSED",  # the status word coloured: still read
    }
    assert parse_log(R2E_LOG.replace("short test summary info", "summary")) == {}  # no summary: nothing
    (task,) = load_tasks(f"r2e-gym:{FIXTURES / 'datasets' / 'r2e-gym.jsonl'}")
    want = dict(task.expected_statuses)
    assert resolves(want, task)
    assert not resolves({**want, "test_flaky": "PASSED"}, task)  # an expected failure that passes: 0
    assert not resolves({**want, "test_extra": "PASSED"}, task)  # a test R2E-Gym did not expect: 0
    assert not resolves({k: v for k, v in want.items() if k != "test_flaky"}, task)


def test_r2e_gold_patch_is_the_parsed_commits_source_files():
    """R2E-Gym's row carries the fix as a parsed commit: rendered back, the source files' diffs are the patch
    they were parsed from (each bundled task's), the test files' left out."""
    from dataset_standins import r2e_parsed_commit

    from polar_env.tasks.datasets.r2e_gym import gold_patch
    from polar_env.tasks.loader import load_bundled

    for task in load_bundled():
        assert gold_patch(r2e_parsed_commit(task.patch, "a" * 40, "b" * 40)) == task.patch, task.instance_id
        both = r2e_parsed_commit(task.patch + task.test_patch, "a" * 40, "b" * 40)
        assert gold_patch(both) == task.patch, task.instance_id


def test_r2e_hidden_files_are_refused_where_polar_cannot_remove_them():
    """A workspace of an R2E-Gym task: its image's tests and test script go from podman's and docker's
    warm images; apptainer mounts the image as it is, so the task is refused there (one line), before any
    image is looked for."""
    from polar_env.tasks.runtime import WorkspaceUnavailable, check_hidden, hidden_paths

    (task,) = load_tasks(f"r2e-gym:{FIXTURES / 'datasets' / 'r2e-gym.jsonl'}")
    assert hidden_paths(task)[:3] == ("/r2e_tests", "/testbed/run_tests.sh", "/testbed/r2e_tests")
    check_hidden(task, "podman")
    with pytest.raises(WorkspaceUnavailable, match="from podman and docker images only"):
        check_hidden(task, "apptainer")
    assert hidden_paths(V2.to_task(_python_row())) == ()


def test_swe_smith_parser_reads_verbose_lines():
    from polar_env.tasks.datasets.swe_smith import parse_verbose

    log = "\n".join(
        [
            "tests/test_a.py::test_one PASSED                                [ 33%]",
            "tests/test_a.py::test_two FAILED                                [ 66%]",
            "tests/test_a.py::test_three[a b] PASSED                         [100%]",  # an id with a space
            "PASSED tests/test_a.py::test_one",  # -rA's summary form: not SWE-smith's
        ]
    )
    assert parse_verbose(log) == {
        "tests/test_a.py::test_one": "PASSED",
        "tests/test_a.py::test_two": "FAILED",
    }


def test_swe_smith_gold_is_the_bug_undone_as_git_undoes_it(tmp_path):
    """The row's patch introduces the bug; its reverse (the loader's gold patch) applied to the bug's tree
    gives the clean tree back, as ``git apply --reverse`` does: a changed file, a new one, a removed one and a
    mode change, each run of changed lines with its removals first."""
    import subprocess

    from polar_env.tasks.datasets.swe_smith import reverse_patch

    def git(*args: str, stdin: str | None = None) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=tmp_path,
            input=stdin,
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\ny = 2\nz = 3\n")
    (tmp_path / "gone.py").write_text("old = True\n")
    (tmp_path / "run.sh").write_text("echo hi\n")
    git("add", "-A")
    git("commit", "-qm", "clean")
    clean = git("rev-parse", "HEAD^{tree}").strip()
    (tmp_path / "a.py").write_text("x = 1\ny = 20\ny2 = 21\nz = 3\n")
    (tmp_path / "gone.py").unlink()
    (tmp_path / "new.py").write_text("bug = 1\n")
    (tmp_path / "run.sh").chmod(0o755)
    git("add", "-A")
    bug = git("diff", "--cached", "HEAD")
    git("commit", "-qm", "bug")
    gold = reverse_patch(bug)
    assert "-y = 20\n-y2 = 21\n+y = 2\n" in gold and "deleted file mode 100644" in gold, gold
    git("apply", "--index", "-", stdin=gold)
    assert git("write-tree").strip() == clean
    assert reverse_patch(gold) == bug


def test_swe_bench_pro_scripts_are_found_where_its_repository_keeps_them(tmp_path, monkeypatch):
    """SWE-bench Pro's rows do not carry the instance's run_script.sh and parser.py: they are read from
    SWE-bench_Pro-os's ``run_scripts/<instance_id>/`` beside the rows file, or where
    ``$POLAR_SWE_BENCH_PRO_SCRIPTS`` points; a row without them loads, is named unreproduced, and is refused
    at grading (a task defect, before any container)."""
    row = json.loads((FIXTURES / "datasets" / "swe-bench-pro.jsonl").read_text())
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(row) + "\n")
    monkeypatch.delenv("POLAR_SWE_BENCH_PRO_SCRIPTS", raising=False)
    (bare,) = load_tasks(f"swe-bench-pro:{rows}")
    proc = procedure_of(bare)
    assert not proc.reproduced and "/workspace/run_script.sh" in proc.instead, proc
    refused = grade_in_image(bare, bare.patch, engine="podman", image=bare.image)
    assert refused.failure_kind == FailureKind.task_defect and "run_script.sh" in refused.error, refused
    scripts = tmp_path / "run_scripts" / row["instance_id"]
    scripts.mkdir(parents=True)
    (scripts / "run_script.sh").write_text('#!/bin/bash\npytest -v "$@"\n')
    (scripts / "parser.py").write_text("print('parse')\n")
    (beside,) = load_tasks(f"swe-bench-pro:{rows}")
    assert beside.grader_files == {
        "/workspace/run_script.sh": '#!/bin/bash\npytest -v "$@"\n',
        "/workspace/parser.py": "print('parse')\n",
    }
    assert procedure_of(beside).reproduced and load_tasks(str(rows)) == [beside]  # plain FILE.jsonl too
    (tmp_path / "other").mkdir()
    moved = tmp_path / "other" / "rows.jsonl"
    moved.write_text(rows.read_text())
    monkeypatch.setenv("POLAR_SWE_BENCH_PRO_SCRIPTS", str(tmp_path / "run_scripts"))
    (by_env,) = load_tasks(f"swe-bench-pro:{moved}")
    assert by_env.grader_files == beside.grader_files


def test_multi_swe_bench_verdict_is_its_reports():
    """Multi-SWE-bench's verdict (report.py, gen_report.py) on the schema row: every listed test passing
    resolves; a test the test-patch stage passed now failing, a listed test missing, or a test the base run
    passed failing where the test patch did not run it does not; nothing parsed does not. Its eval script is
    the image's ``fix-run.sh`` alone (it applies the patches), and strict mode does not apply."""
    (task,) = load_tasks(f"multi-swe-bench:{FIXTURES / 'datasets' / 'multi-swe-bench.jsonl'}")
    resolves = procedure_of(task).resolves
    assert resolves is not None
    every = {"TestPRList": "PASS", "TestPRView_web": "PASS", "TestPRView_webFlag": "PASS"}
    assert resolves(every, task)
    assert not resolves({**every, "TestPRList": "FAIL"}, task)  # a new failure
    assert not resolves({k: v for k, v in every.items() if k != "TestPRView_webFlag"}, task)
    assert not resolves({}, task)
    ran_before = task.model_copy(
        update={"expected_statuses": {**task.expected_statuses, "TestOld": "PASS/NONE"}}
    )
    assert resolves(every, ran_before) and not resolves({**every, "TestOld": "FAIL"}, ran_before)  # anomalous
    script = custom_eval_script(task)
    assert "git apply" not in script and "bash /home/fix-run.sh 2>&1" in script, script
    with pytest.raises(StrictUnsupported):
        pytest_args(task)
