"""SWE-bench Pro (``ScaleAI/SWE-bench_Pro``): SWE-bench's shape in lower case, images by tag, /app.

Checked against github.com/scaleapi/SWE-bench_Pro-os@ca10a60 (``README.md``, ``swe_bench_pro_eval.py``,
``helper_code/create_problem_statement.py``, ``helper_code/image_uri.py``,
``run_scripts/<instance_id>/``). A row has ``instance_id`` (``instance_<owner>__<repo>-<sha>-v<hash>``),
``repo``, ``base_commit``, ``patch``, ``test_patch``, ``problem_statement``, ``requirements``,
``interface``, ``repo_language``, ``fail_to_pass``/``pass_to_pass`` and ``selected_test_files_to_run``
(list literals in strings: the harness ``eval``s them), ``before_repo_set_cmd`` and ``dockerhub_tag``.
The agent is told the problem statement, then ``Requirements:`` and ``New interfaces introduced:``
(``create_problem_statement``). The image is ``jefzda/sweap-images:<dockerhub_tag>``, the repository at
``/app``. The harness resets ``/app`` to ``base_commit``, applies the patch, runs the last line of
``before_repo_set_cmd``, then ``bash /workspace/run_script.sh <selected files, comma-joined>`` and
``python /workspace/parser.py`` on its output; ``run_script.sh`` and ``parser.py`` are per instance in
that repository (not in the row); resolved when every fail_to_pass and pass_to_pass test is PASSED.

Polar runs that procedure: the instance's two scripts (a row's own ``run_script``/``parser`` columns, else
``run_scripts/<instance_id>/`` of ``$POLAR_SWE_BENCH_PRO_SCRIPTS`` or beside the rows file: SWE-bench_Pro-os's
layout) placed at ``/workspace`` by the grader and locked, the test command on the selected files, its
output parsed by ``parser.py`` in a fresh container of the image, the verdict Pro's. The last line of
``before_repo_set_cmd`` checks the test files out of the fix's commit, which no workspace's history holds
(sandbox/history.py): the row's ``test_patch`` is those files' change, applied SWE-bench's way instead. A row
whose scripts are not found is refused at grading, named at load.
"""

from __future__ import annotations

from pathlib import Path

from polar_env.environment import EnvSettings
from polar_env.tasks.datasets.base import DatasetSpec, Procedure, field, make_task
from polar_env.tasks.models import ROWS_DIR, Task

NAME = "swe-bench-pro"
IMAGE_REPO = "jefzda/sweap-images"
# where Pro's harness puts the instance's scripts: (path in the container, the row's column, the file name)
SCRIPTS = (
    ("/workspace/run_script.sh", "run_script", "run_script.sh"),
    ("/workspace/parser.py", "parser", "parser.py"),
)


def scripts(row: dict, instance_id: str) -> dict[str, str]:
    """The instance's ``run_script.sh`` and ``parser.py`` (path in the container -> text): the row's own
    columns, else SWE-bench_Pro-os's ``run_scripts/<instance_id>/`` (``$POLAR_SWE_BENCH_PRO_SCRIPTS``, else
    ``run_scripts/`` beside the rows file)."""
    dirs = [
        d
        for d in (EnvSettings.read().pro_scripts, row.get(ROWS_DIR) and Path(row[ROWS_DIR]) / "run_scripts")
        if d
    ]
    found: dict[str, str] = {}
    for inside, column, name in SCRIPTS:
        if isinstance(row.get(column), str):
            found[inside] = row[column]
        elif file := next((f for d in dirs if (f := Path(d) / instance_id / name).is_file()), None):
            found[inside] = file.read_text()
    return found


def prompt(row: dict) -> str:
    """create_problem_statement's template."""
    return (
        f"{field(row, 'problem_statement', dataset=NAME)}\n\nRequirements:\n{row.get('requirements') or ''}"
        f"\n\nNew interfaces introduced:\n{row.get('interface') or ''}"
    )


def to_task(row: dict) -> Task:
    files = field(row, "selected_test_files_to_run", list, dataset=NAME)
    iid = field(row, "instance_id", dataset=NAME)
    return make_task(
        NAME,
        instance_id=iid,
        repo=field(row, "repo", dataset=NAME),
        base_commit=field(row, "base_commit", dataset=NAME),
        problem_statement=prompt(row),
        patch=field(row, "patch", dataset=NAME),
        test_patch=field(row, "test_patch", dataset=NAME),
        FAIL_TO_PASS=field(row, "fail_to_pass", list, dataset=NAME),
        PASS_TO_PASS=field(row, "pass_to_pass", list, dataset=NAME),
        image=f"{IMAGE_REPO}:{field(row, 'dockerhub_tag', dataset=NAME)}",
        workdir="/app",
        test_cmd="bash /workspace/run_script.sh",
        test_directives=[",".join(str(f) for f in files)],
        log_parser="swe-bench-pro:parser.py",
        grader_files=scripts(row, iid),
    )


PROCEDURE = Procedure(
    grader_files=tuple(inside for inside, _, _ in SCRIPTS),
    script_parser="/workspace/parser.py",
    verified="a stand-in image in Pro's layout (/app, the image's own Python) with the instance's "
    "run_script.sh and parser.py beside the rows, gold 1.0 and no-op 0 by `polar rollout` (gold also under "
    "apptainer), its procedure only (the test command is the instance's script: no strict mode) "
    "(tests/tasks/test_dataset_standins.py)",
)
SPEC = DatasetSpec(
    NAME,
    "ScaleAI/SWE-bench_Pro",
    "test",
    to_task=to_task,
    procedure=PROCEDURE,
    matches=lambda row: "dockerhub_tag" in row,
)
