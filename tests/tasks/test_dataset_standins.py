"""The datasets past Verified, end to end on local stand-ins of their published images
(tests/dataset_standins.py): a row in the dataset's own schema, ``polar rollout --tasks NAME:FILE.jsonl``
with the gold and the no-op policy in podman, graded by that dataset's procedure in strict mode. The
image's layout is checked first (the control, `LAYOUT_CHECKS`): where the repository and the task's Python
are, and where the image keeps the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dataset_standins import in_image, standin_row
from repo_paths import REPO

from polar_env.episodes.workspace import engine_available
from polar_env.rewards.grader import grade_task
from polar_env.tasks.datasets import DATASETS
from polar_env.tasks.loader import load_bundled, load_tasks

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not engine_available("podman"), reason="needs podman (scripts/setup_podman.sh)"),
]
ENGINE = "podman"
TASK_ID = "psf__requests-5414"  # its bundled image is shared with test_containers_podman and test_history_e2e


def _polar(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "polar_env.cli", *args], capture_output=True, text=True, env=env, timeout=900
    )


# what each stand-in must show before a rollout believes it (the control), as root in the image: bash that
# exits 0 where the layout is the dataset's
LAYOUT_CHECKS = {
    # pytest is the conda env's only (nothing of it on PATH), the activation finds it; the fix in the history
    "swe-gym": "! command -v pytest python && source /opt/miniconda3/bin/activate && conda activate testbed "
    '&& [ "$(command -v pytest)" = /opt/miniconda3/envs/testbed/bin/pytest ] '
    "&& cd /testbed && git log --all --format=%s | grep -qx 'the fix'",
    # the repository at /<repo>, no /testbed, the image's Python importing it from there; the fix only in
    # the reflog (a reset clone), no ref reaching it
    "swe-rebench-v2": '[ "$PWD" = /requests ] && [ ! -e /testbed ] && python -c "import requests, sys; '
    "sys.exit(requests.__file__ != '/requests/requests/__init__.py')\" "
    "&& ! git log --all --format=%s | grep -q fix && git log -g --format=%s | grep -qx 'the fix'",
    # the tests in /r2e_tests and run_tests.sh in the tree (what R2E-Gym's harness hides), the Python in
    # /testbed/.venv, HEAD detached at the base, the fix on a branch
    "r2e-gym": "[ -f /r2e_tests/test_requests.py ] && [ -f /testbed/run_tests.sh ] "
    '&& [ "$(command -v python)" = /testbed/.venv/bin/python ] && cd /testbed '
    "&& ! git symbolic-ref -q HEAD && git log --all --format=%s | grep -qx 'the fix'",
    # SWE-bench's conda layout, HEAD on main (the clean snapshot), the instance a branch whose tip removed
    # the F2P test file its parent (the bug) still has
    "swe-smith": "source /opt/miniconda3/bin/activate && conda activate testbed && command -v pytest "
    '&& cd /testbed && [ "$(git symbolic-ref --short HEAD)" = main ] '
    "&& b=$(git for-each-ref --format='%(refname:short)' refs/heads | grep -vx main) "
    '&& git cat-file -e "$b~1:tests/test_requests.py" && ! git cat-file -e "$b:tests/test_requests.py"',
    # the repository at /app, the image's own Python importing it from there, the fix on a branch
    "swe-bench-pro": '[ "$PWD" = /app ] && [ ! -e /testbed ] && python -c "import requests, sys; '
    "sys.exit(requests.__file__ != '/app/requests/__init__.py')\" "
    "&& git log --all --format=%s | grep -qx 'the fix'",
    # the repository at /home/<repo> (a clone detached at the base, the fix on main), the image's Python
    # importing it from there, the class's scripts and the gold fix in /home
    "multi-swe-bench": '[ "$PWD" = /home/flask ] && [ ! -e /testbed ] && python -c "import flask, sys; '
    "sys.exit(flask.__file__ != '/home/flask/src/flask/__init__.py')\" "
    "&& git apply --check /home/test.patch /home/fix.patch && grep -q 'apply.*/home/fix.patch' "
    "/home/fix-run.sh && ! git symbolic-ref -q HEAD && git log --all --format=%s | grep -qx 'the fix'",
}
LAYOUT_CHECKS["swe-rebench"] = LAYOUT_CHECKS["swe-gym"]  # the same image layout
# datasets graded by their own procedure only (its test command is the image's script: no strict mode)
PROCEDURE_ONLY = {"r2e-gym", "swe-bench-pro", "multi-swe-bench"}
# the bundled task each stand-in is built from, where it is not TASK_ID: Multi-SWE-bench's row names one of
# the package's classes, whose parser reads flask's summary lines (none of requests' fits its tests)
STANDIN_TASKS = {"multi-swe-bench": "pallets__flask-5014"}


@pytest.fixture(scope="module")
def rows_of(tmp_path_factory):
    """``rows_of(NAME)``: a file of one row of the bundled requests task in dataset NAME's schema, its image
    the stand-in under the name NAME's loader gives it (built once, its layout checked once)."""
    bundled = {t.instance_id: t for t in load_bundled()}
    made: dict[str, Path] = {}

    def make(dataset: str) -> Path:
        if dataset not in made:
            row = standin_row(bundled[STANDIN_TASKS.get(dataset, TASK_ID)], dataset, ENGINE)
            image = DATASETS[dataset].to_task(row).image
            check = subprocess.run(
                in_image(ENGINE, image, LAYOUT_CHECKS[dataset]), capture_output=True, text=True
            )
            assert check.returncode == 0, (dataset, check.stdout, check.stderr)
            made[dataset] = tmp_path_factory.mktemp(dataset) / "rows.jsonl"
            if dataset == "swe-bench-pro":  # its scripts where SWE-bench_Pro-os keeps them: run_scripts/<id>/
                scripts = made[dataset].parent / "run_scripts" / row["instance_id"]
                scripts.mkdir(parents=True)
                (scripts / "run_script.sh").write_text(row.pop("run_script"))
                (scripts / "parser.py").write_text(row.pop("parser"))
            made[dataset].write_text(json.dumps(row) + "\n")
        return made[dataset]

    return make


@pytest.mark.parametrize(
    ("dataset", "sandbox", "policy", "reward"),
    [
        ("swe-gym", ENGINE, "gold", 1.0),
        ("swe-gym", ENGINE, "noop", 0.0),
        ("swe-gym", "apptainer", "gold", 1.0),  # docker://<the image>, through tests/apptainer_standin.py
        ("swe-rebench", ENGINE, "gold", 1.0),
        ("swe-rebench", ENGINE, "noop", 0.0),
        ("swe-rebench-v2", ENGINE, "gold", 1.0),  # /requests, V2's parser and exact verdict
        ("swe-rebench-v2", ENGINE, "noop", 0.0),
        ("r2e-gym", ENGINE, "gold", 1.0),  # the hidden tests brought back, every status as expected
        ("r2e-gym", ENGINE, "noop", 0.0),
        ("swe-smith", ENGINE, "gold", 1.0),  # the bug reversed; its tests from the image's HEAD~1
        ("swe-smith", ENGINE, "noop", 0.0),
        ("swe-bench-pro", ENGINE, "gold", 1.0),  # run_scripts/<id>/ beside the rows; parser.py's verdict
        ("swe-bench-pro", ENGINE, "noop", 0.0),
        ("swe-bench-pro", "apptainer", "gold", 1.0),  # its scripts placed in the box's own /workspace
        ("multi-swe-bench", ENGINE, "gold", 1.0),  # the patch at /home/fix.patch, the image's fix-run.sh
        ("multi-swe-bench", ENGINE, "noop", 0.0),
    ],
)
def test_rollout_on_the_datasets_stand_in(
    rows_of,
    dataset: str,
    sandbox: str,
    policy: str,
    reward: float,
    tmp_path: Path,
    request: pytest.FixtureRequest,
):
    """``polar rollout --tasks NAME:FILE.jsonl``: the gold patch 1.0, doing nothing 0, graded strictly in the
    image by the dataset's procedure (its conda env activated: there is no pytest without it)."""
    if sandbox == "apptainer":  # apptainer cannot be installed here: each exec a `podman run` of the image
        request.getfixturevalue("apptainer_log")
    out = tmp_path / "out"
    proc = _polar(
        "rollout",
        "--tasks",
        f"{dataset}:{rows_of(dataset)}",
        "--sandbox",
        sandbox,
        "--policy",
        policy,
        "--out",
        str(out),
        "--timeout",
        "300",
        "--score-window",
        "256",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (traj,) = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert traj["metadata"]["workspace"] == sandbox and traj["reward"] == reward, (
        traj["reward"],
        proc.stdout[-2000:],
    )
    grade = traj["grading"]
    if policy == "gold" and dataset in PROCEDURE_ONLY:
        assert grade["mode"] == "swebench" and not grade["modes"] and grade["resolved"], grade
    elif policy == "gold":  # both modes ran in the image, and the record's verdict is the strict one
        assert grade["mode"] == "strict" and set(grade["modes"]) == {"strict", "swebench"}, grade
        assert all(m["reward"] == 1.0 for m in grade["modes"].values()), grade
    else:
        assert grade["failure_kind"] == "empty_patch", grade


def test_a_special_casing_patch_earns_nothing_on_swe_gym(rows_of, tmp_path: Path):
    """``polar eval --tasks swe-gym:FILE.jsonl`` of the red-team corpus's special-casing patch for this task
    (fixed for the issue's example only): graded, not resolved."""
    patch = (REPO / "tests" / "redteam" / "patches" / "sc-issue-example-input.diff").read_text()
    preds = tmp_path / "preds.jsonl"
    preds.write_text(
        json.dumps({"instance_id": TASK_ID, "model_patch": patch, "model_name_or_path": "sc"}) + "\n"
    )
    proc = _polar(
        "eval",
        "--tasks",
        f"swe-gym:{rows_of('swe-gym')}",
        "--predictions",
        str(preds),
        "--sandbox",
        ENGINE,
        "--out",
        str(tmp_path / "r.json"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["resolved_ids"] == [] and report["error_instances"] == 0, report


@pytest.mark.parametrize(
    ("dataset", "hidden"),
    [("r2e-gym", "resists"), ("swe-smith", "not_applicable"), ("multi-swe-bench", "resists")],
)
def test_polar_tasks_audit_finds_no_test_of_the_dataset_in_the_workspace(
    rows_of, dataset: str, hidden: str, tmp_path: Path
):
    """``polar tasks audit``: the agent's workspace holds none of the tests the dataset keeps from it
    (R2E-Gym's /r2e_tests and run_tests.sh; SWE-smith's F2P test file, at the branch's HEAD~1;
    Multi-SWE-bench's /home files, the gold fix among them) and no commit
    beyond the base; the same history probe on the raw image finds the commits beyond (the control)."""
    from polar_env.cli.tasks_audit import HISTORY_PROBE, history_verdict

    rows = rows_of(dataset)
    (task,) = load_tasks(f"{dataset}:{rows}")
    out = tmp_path / "audit.json"
    proc = _polar("tasks", "audit", "--tasks", f"{dataset}:{rows}", "--sandbox", ENGINE, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (checks,) = [a["checks"] for a in json.loads(out.read_text())]
    assert checks["hidden-tests"]["verdict"] == hidden, checks
    assert checks["repository-history"]["verdict"] == "resists", checks
    raw = subprocess.run(
        in_image(ENGINE, task.image, f"set -- {task.workdir}; {HISTORY_PROBE}"),
        capture_output=True,
        text=True,
    )
    assert history_verdict(raw.stdout).verdict == "controls", raw.stdout


def test_r2e_gym_tests_cannot_be_replaced(rows_of, tmp_path: Path):
    """R2E-Gym's image holds its tests (/r2e_tests) and test script (run_tests.sh in the tree), which the raw
    image shows (the control); a patch that plants its own always-passing tests where the hidden ones go (and
    its own run_tests.sh) earns 0 by ``polar eval``, the image's tests run in their place."""
    from polar_env.cli.tasks_audit import HIDDEN_PROBE

    rows = rows_of("r2e-gym")
    (task,) = load_tasks(f"r2e-gym:{rows}")
    raw = subprocess.run(
        in_image(ENGINE, task.image, "set -- /r2e_tests /testbed/run_tests.sh; " + HIDDEN_PROBE),
        capture_output=True,
        text=True,
        check=True,
    )
    assert raw.stdout.split() == ["/r2e_tests", "/testbed/run_tests.sh"], raw.stdout
    planted = "".join(
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
        + f"@@ -0,0 +1,{len(body)} @@\n"
        + "".join(f"+{line}\n" for line in body)
        for path, body in {
            "r2e_tests/__init__.py": [""],
            "r2e_tests/test_requests.py": ["def test_everything():", "    pass"],
            "run_tests.sh": ["echo 'PASSED r2e_tests/test_requests.py::test_everything'"],
        }.items()
    )
    preds = tmp_path / "preds.jsonl"
    preds.write_text(
        json.dumps({"instance_id": task.instance_id, "model_patch": planted, "model_name_or_path": "x"})
        + "\n"
    )
    report_path = tmp_path / "report.json"
    proc = _polar(
        "eval",
        "--tasks",
        f"r2e-gym:{rows}",
        "--predictions",
        str(preds),
        "--sandbox",
        ENGINE,
        "--out",
        str(report_path),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["unresolved_ids"] == [task.instance_id] and report["error_instances"] == 0, report
    graded = grade_task(
        task, planted, kind=ENGINE
    )  # what ran: the image's tests, where the patch put its own
    assert graded.patch_applied and graded.reward == 0.0, graded
    assert set(graded.fail_to_pass.values()) - {"MISSING"}, graded.fail_to_pass
    assert "test_everything" not in graded.log_tail, graded.log_tail[-2000:]


def test_validate_checks_a_mixed_file_of_stand_in_rows(rows_of, tmp_path: Path):
    """``polar tasks validate FILE.jsonl`` on rows of five datasets in one plain file (each recognised by its
    schema, Pro's scripts in ``run_scripts/`` beside it): each row named with its dataset and what is
    verified for it, then checked in its image by its own procedure (gold resolves, the base does not)."""
    names = [
        "swe-rebench-v2",
        "r2e-gym",
        "swe-smith",
        "swe-bench-pro",
        "multi-swe-bench",
    ]  # (a SWE-Gym row of requests: SWE-bench's)
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(rows_of(n).read_text() for n in names))
    (tmp_path / "run_scripts").symlink_to(rows_of("swe-bench-pro").parent / "run_scripts")
    proc = _polar("tasks", "validate", str(mixed), "--sandbox", ENGINE)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ids = [load_tasks(f"{n}:{rows_of(n)}")[0].instance_id for n in names]
    for iid, name in zip(ids, names, strict=True):
        assert f"{iid}: dataset {name}: procedure reproduced; verified: a stand-in image" in proc.stdout
        assert f"{iid}: OK" in proc.stdout, proc.stdout
    assert proc.stdout.rstrip().endswith("5/5 tasks valid"), proc.stdout[-500:]
