"""Dataset loaders: one row in each dataset's own schema (tests/fixtures/datasets/, hand-written in the shape
the dataset's card and harness code give, docs/tasks.md names the sources: nothing is fetched) -> a Polar
task with the image, workdir, test command and parser that dataset's convention gives; a malformed row is
one error naming the field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from repo_paths import FIXTURES

from polar_env.rewards.image_grading import custom_eval_script
from polar_env.tasks import datasets
from polar_env.tasks.datasets import DATASETS, DatasetRowError, detect, procedure_of
from polar_env.tasks.loader import TaskLoadError, load_tasks

ROWS = FIXTURES / "datasets"

EXPECTED = {  # name: (instance_id, image, workdir, test command prefix, log parser)
    "swe-gym": (
        "Project-MONAI__MONAI-6969",
        "xingyaoww/sweb.eval.x86_64.project-monai_s_monai-6969",
        "/testbed",
        "pytest -rA  tests/test_utils.py",
        "parse_log_pytest",
    ),
    "swe-rebench": (
        "oemof__tespy-653",
        "swerebench/sweb.eval.x86_64.oemof_1776_tespy-653",
        "/testbed",
        "pytest --no-header -rA",
        "parse_log_pytest",
    ),
    "swe-rebench-v2": (
        "tokio-rs__bytes-732",
        "docker.io/swerebenchv2/tokio-rs-bytes:732-291df5a",
        "/bytes",
        "cargo test -- --nocapture",
        "parse_log_cargo",
    ),
    "swe-smith": (
        "getmoto__moto.694ce1f4.pr_7331",
        "jyangballin/swesmith.x86_64.getmoto_1776_moto.694ce1f4",
        "/testbed",
        "pytest --disable-warnings --color=no --tb=no --verbose",  # conda activated first (its procedure)
        "swesmith:pytest-verbose",
    ),
    "r2e-gym": (
        "aiohttp__f0d74880deec",
        "namanjain12/aiohttp_final:f0d74880deec8fcd982bce639c93c5e130d41198",
        "/testbed",
        "bash /run_tests.sh",  # R2E-Gym's run_tests.sh, put there by the grader (tasks/datasets/r2e_gym.py)
        "r2e:pytest",
    ),
    "swe-bench-pro": (
        None,
        "jefzda/sweap-images:qutebrowser.qutebrowser-qutebrowser__qutebrowser-f91ace96223cac8"
        "161c16dd061907e138fe85111-v059c6fdc75567943479b23ebca7c07b5e9a7f34c",
        "/app",
        "bash /workspace/run_script.sh tests/unit/utils/test_log.py,tests/unit/utils/test_qtlog.py",
        "swe-bench-pro:parser.py",
    ),
    "multi-swe-bench": (
        "cli__cli-513",
        "mswebench/cli_m_cli:pr-513",
        "/home/cli",
        "bash /home/fix-run.sh",
        "multi-swe-bench:cli/cli",
    ),
}


def _row(name: str) -> dict:
    return json.loads((ROWS / f"{name}.jsonl").read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_row_maps_to_task(name: str):
    iid, image, workdir, cmd, parser = EXPECTED[name]
    (task,) = load_tasks(f"{name}:{ROWS / f'{name}.jsonl'}")
    assert (task.image, task.workdir, task.log_parser) == (image, workdir, parser)
    assert task.full_test_command().startswith(cmd)
    if iid:
        assert task.instance_id == iid
    assert task.problem_statement.strip() and task.FAIL_TO_PASS
    assert DATASETS[name].to_task(_row(name)) == task


def test_dataset_specific_fields():
    (pro,) = load_tasks(f"swe-bench-pro:{ROWS / 'swe-bench-pro.jsonl'}")
    assert pro.problem_statement == (
        "Qt warning filtering is in the wrong module\n\nRequirements:\n- Move the filter "
        "to qutebrowser/utils/qtlog.py\n\nNew interfaces introduced:\n"
        "def hide_qt_warning(pattern, logger='qt')"
    )  # create_problem_statement's form
    assert pro.test_directives == [
        "tests/unit/utils/test_log.py,tests/unit/utils/test_qtlog.py"
    ]  # one argument
    assert pro.FAIL_TO_PASS == [
        "tests/unit/utils/test_qtlog.py::TestHideQtWarning::test_unfiltered"
    ]  # a literal
    (r2e,) = load_tasks(f"r2e-gym:{ROWS / 'r2e-gym.jsonl'}")
    assert r2e.FAIL_TO_PASS == [
        "TestText.test_text_charset",
        "test_text_default",
    ]  # the tests expected to pass
    (smith,) = load_tasks(f"swe-smith:{ROWS / 'swe-smith.jsonl'}")
    assert smith.base_commit == smith.instance_id and smith.test_patch == ""  # the instance's branch
    assert smith.test_directives == [""]  # the whole suite, as SWE-smith's eval runs it
    assert smith.patch == (  # the gold fix: the row's bug patch reversed
        "diff --git a/moto/core/responses.py b/moto/core/responses.py\n--- a/moto/core/responses.py\n"
        "+++ b/moto/core/responses.py\n@@ -1 +1 @@\n-x = 2\n+x = 1\n"
    )
    (msb,) = load_tasks(f"multi-swe-bench:{ROWS / 'multi-swe-bench.jsonl'}")
    assert msb.FAIL_TO_PASS == ["TestPRView_web", "TestPRView_webFlag"] and msb.PASS_TO_PASS == ["TestPRList"]
    assert msb.base_commit == "9e7a1c1f1f06ee7f6ea9e2c9cc4cd3f8c7d64b47"
    assert msb.problem_statement.startswith("gh pr view --web opens nothing")
    # the row's run and test-patch stages, for its verdict; the package's class names the image and parses
    assert msb.expected_statuses == {"TestPRView_web": "NONE/FAIL", "TestPRList": "PASS/PASS"}
    parse = procedure_of(msb).parser(msb)
    assert parse is not None and parse(
        "--- PASS: TestPRList (0.01s)\n--- FAIL: TestPRView_web (0.00s)\n"
    ) == {
        "TestPRList": "PASS",
        "TestPRView_web": "FAIL",
    }
    (rebench,) = load_tasks(f"swe-rebench:{ROWS / 'swe-rebench.jsonl'}")
    assert rebench.environment.env == {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}  # the fork's locale prefix
    (v2,) = load_tasks(f"swe-rebench-v2:{ROWS / 'swe-rebench-v2.jsonl'}")
    assert v2.full_test_command().strip() == "cargo test -- --nocapture"  # no test files appended
    two = _row("swe-rebench-v2")
    two["install_config"]["test_cmd"] = ["cargo build", "cargo test"]
    assert DATASETS["swe-rebench-v2"].to_task(two).test_cmd == "cargo build && cargo test"
    assert [n for n, s in DATASETS.items() if s.procedure.reproduced] == [
        "swe-bench-pro",
        "multi-swe-bench",
        "r2e-gym",
        "swe-smith",
        "swe-rebench-v2",
        "swe-rebench",
        "swe-gym",
    ]
    assert not procedure_of(v2).reproduced  # V2's own, but this row's parser (cargo's) is not Polar's


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_plain_jsonl_rows_are_recognised_by_schema(name: str, tmp_path: Path):
    assert detect(_row(name)) is DATASETS[name]
    f = tmp_path / "rows.jsonl"
    f.write_text(json.dumps(_row(name)) + "\n")
    (task,) = load_tasks(str(f))
    assert (task.image, task.dataset) == (EXPECTED[name][1], name)
    written = tmp_path / "written.jsonl"  # a row Polar wrote keeps its image and dataset
    written.write_text(task.model_dump_json() + "\n")
    assert load_tasks(str(written)) == [task]


def test_swe_bench_rows_keep_their_path():
    verified = json.loads((ROWS.parent / "swebench_verified_astropy-12907.json").read_text())
    assert detect(verified) is None  # SWE-bench's own schema: not SWE-Gym's, though the columns are the same
    assert detect({**_row("swe-gym"), "repo": "astropy/astropy"}) is None  # the repository tells them apart


def test_each_dataset_grades_by_its_procedure():
    """SWE-Gym's eval script activates its conda env before anything else (SWE-bench's eval script does);
    a Polar-built image's row has no activation."""
    (gym,) = load_tasks(f"swe-gym:{ROWS / 'swe-gym.jsonl'}")
    lines = custom_eval_script(gym).splitlines()
    assert lines[2:5] == ["source /opt/miniconda3/bin/activate", "conda activate testbed", "cd /testbed"]
    bundled = load_tasks("bundled")[0]
    assert "activate" not in custom_eval_script(bundled) and procedure_of(bundled).activate == ""
    wrapped = procedure_of(gym).in_environment('printf "%s," "$@"')
    run = subprocess.run(
        [
            "bash",
            "-c",
            wrapped.replace("source /opt/miniconda3/bin/activate", "echo activated").replace(
                "conda activate testbed", 'echo "args:$#"'
            ),
            "bash",
            "a b",
            "c",
        ],
        capture_output=True,
        text=True,
    )
    # the activation sees no arguments and writes to stderr; the script gets its own back, stdout its own
    assert (run.stdout, run.stderr.split()) == ("a b,c,", ["activated", "args:0"]), run


def test_unreproduced_procedures_are_named_once(caplog, tmp_path: Path):
    datasets._noticed.clear()
    f = tmp_path / "rows.jsonl"
    unclassed = {**_row("multi-swe-bench"), "repo": "cli-fork"}  # a repository the package has no class for
    rows = (unclassed, _row("swe-gym"), unclassed, _row("multi-swe-bench"), _row("swe-rebench-v2"))
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with caplog.at_level("WARNING"):
        load_tasks(str(f))
        load_tasks(str(f))
        load_tasks(f"swe-rebench-v2:{ROWS / 'swe-rebench-v2.jsonl'}")
    said = [r.getMessage() for r in caplog.records if "does not reproduce" in r.getMessage()]
    assert len(said) == 2, said  # once per dataset and reason, however often its rows load
    assert said[0].startswith("multi-swe-bench:") and "no class 'cli/cli-fork'" in said[0], said
    # V2's own procedure, but not for a row whose parser Polar lacks: said for that row and rows like it
    v2 = DATASETS["swe-rebench-v2"].to_task(_row("swe-rebench-v2")).instance_id
    assert said[1].startswith(
        f"swe-rebench-v2: Polar does not reproduce this dataset's own grading procedure for {v2}"
    )


def test_validate_names_each_rows_dataset_and_what_is_verified(tmp_path: Path):
    """``polar tasks validate`` on a mixed file: every row's dataset and what is verified for it first; rows
    whose image is not here are named, not checked (exit 2)."""
    f = tmp_path / "mixed.jsonl"
    names = ["swe-gym", "swe-smith", "multi-swe-bench", "swe-rebench-v2"]
    f.write_text("".join(json.dumps(_row(n)) + "\n" for n in names))
    proc = subprocess.run(
        [sys.executable, "-m", "polar_env.cli", "tasks", "validate", str(f), "--sandbox", "podman"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    gym, smith, msb, v2 = (DATASETS[n].to_task(_row(n)).instance_id for n in names)
    assert f"{gym}: dataset swe-gym: procedure reproduced; verified: a stand-in image" in lines[0]
    assert f"{smith}: dataset swe-smith: procedure reproduced; verified: a stand-in image" in lines[1]
    assert f"{msb}: dataset multi-swe-bench: procedure reproduced; verified: a stand-in image" in lines[2]
    assert lines[3].startswith(
        f"{v2}: dataset swe-rebench-v2: procedure not reproduced (none: its log parser 'parse_log_cargo'"
    ), lines
    if "podman is not installed" not in proc.stderr:  # where podman runs, each row is then named unchecked
        assert (
            f"{gym}: NOT CHECKED: image 'xingyaoww/sweb.eval.x86_64.project-monai_s_monai-6969' is not "
            "in podman"
        ) in proc.stdout and proc.stdout.endswith("0/4 tasks valid, 4 not checked (no image here)\n"), (
            proc.stdout
        )


@pytest.mark.parametrize(
    ("name", "drop", "field"),
    [
        ("swe-rebench", ("install_config", "test_cmd"), "install_config.test_cmd"),
        ("swe-rebench", ("install_config", "log_parser"), "install_config.log_parser"),
        ("swe-rebench-v2", ("image_name",), "image_name"),
        ("swe-rebench-v2", ("install_config", "test_cmd"), "install_config.test_cmd"),
        ("swe-smith", ("image_name",), "image_name"),
        ("r2e-gym", ("commit_hash",), "commit_hash"),
        ("swe-bench-pro", ("dockerhub_tag",), "dockerhub_tag"),
        ("multi-swe-bench", ("fix_patch",), "fix_patch"),
        ("multi-swe-bench", ("base", "sha"), "base.sha"),
        ("multi-swe-bench", ("test_patch_result",), "test_patch_result"),  # its verdict reads it
        ("swe-bench-pro", ("selected_test_files_to_run",), "selected_test_files_to_run"),
        ("swe-gym", ("FAIL_TO_PASS",), "FAIL_TO_PASS"),
    ],
)
def test_malformed_row_is_one_error_naming_the_field(
    name: str, drop: tuple[str, ...], field: str, tmp_path: Path
):
    row = _row(name)
    holder = row
    for key in drop[:-1]:
        holder = holder[key]
    del holder[drop[-1]]
    with pytest.raises(DatasetRowError, match=f"missing field '{field}'"):
        DATASETS[name].to_task(row)
    f = tmp_path / "rows.jsonl"
    f.write_text(json.dumps(row) + "\n")
    with pytest.raises(TaskLoadError, match=f"{name} row 1: .*'{field}'"):
        load_tasks(f"{name}:{f}")


def test_a_multi_swe_bench_row_whose_lists_contradict_its_results_is_malformed():
    """An f2p test the row's own test-patch stage passed (the package's evaluation resolves no such row): one
    error naming the test; the row as published loads."""
    row = _row("multi-swe-bench")
    DATASETS["multi-swe-bench"].to_task(row)
    row["test_patch_result"] = {**row["test_patch_result"], "passed_tests": ["TestPRList", "TestPRView_web"]}
    row["test_patch_result"]["failed_tests"] = []
    with pytest.raises(
        DatasetRowError, match="f2p_tests lists 'TestPRView_web', which its test_patch_result"
    ):
        DATASETS["multi-swe-bench"].to_task(row)


def test_wrong_type_and_unreachable_hub(monkeypatch, tmp_path: Path):
    row = _row("multi-swe-bench") | {"number": "513"}
    with pytest.raises(DatasetRowError, match="field 'number' must be int"):
        DATASETS["multi-swe-bench"].to_task(row)
    with pytest.raises(DatasetRowError, match="field 'fail_to_pass' is neither JSON nor a Python literal"):
        DATASETS["swe-bench-pro"].to_task(_row("swe-bench-pro") | {"fail_to_pass": "['unclosed"})
    monkeypatch.setenv("POLAR_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(TaskLoadError, match="cannot load nebius/SWE-rebench split 'test'"):
        load_tasks("swe-rebench")
