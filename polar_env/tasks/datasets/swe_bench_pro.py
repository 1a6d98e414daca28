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
"""

from __future__ import annotations

from polar_env.tasks.datasets.base import DatasetSpec, Procedure, field, make_task
from polar_env.tasks.models import Task

NAME = "swe-bench-pro"
IMAGE_REPO = "jefzda/sweap-images"


def prompt(row: dict) -> str:
    """create_problem_statement's template."""
    return (
        f"{field(row, 'problem_statement', dataset=NAME)}\n\nRequirements:\n{row.get('requirements') or ''}"
        f"\n\nNew interfaces introduced:\n{row.get('interface') or ''}"
    )


def to_task(row: dict) -> Task:
    files = field(row, "selected_test_files_to_run", list, dataset=NAME)
    return make_task(
        NAME,
        instance_id=field(row, "instance_id", dataset=NAME),
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
    )


PROCEDURE = Procedure(
    reproduced=False,
    instead="SWE-bench's procedure in /app with the row's test command and SWE-bench's pytest parser, not "
    "the instance's run_script.sh and parser.py (not in the row)",
)
SPEC = DatasetSpec(
    NAME,
    "ScaleAI/SWE-bench_Pro",
    "test",
    to_task=to_task,
    procedure=PROCEDURE,
    matches=lambda row: "dockerhub_tag" in row,
)
